package cli

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/llmgw/llmgw/engines"
	"github.com/llmgw/llmgw/engines/sim"
	"github.com/llmgw/llmgw/engines/tokenizer"
	"github.com/llmgw/llmgw/gateway"
	"github.com/llmgw/llmgw/internal/wait"
)

// journeyPlan is the part of `llmgw plan -o json` the journey reads.
type journeyPlan struct {
	Topology   string `json:"topology"`
	Consistent bool   `json:"consistent"`
	Stages     []struct {
		N          int    `json:"n"`
		Capability string `json:"capability"`
		Runbook    string `json:"runbook"`
	} `json:"stages"`
	Blocked []struct {
		Capability, Reason string
	} `json:"blocked"`
}

// The operator's path, for every engine and topology the catalog supports,
// against receipt-less simulators (as silent as the real engines): `llmgw
// plan -o json`; every stage's rule applied with `plan -o yaml --stage N |
// rule apply -f -` and traffic served through the gateway by it; `runbook
// converged|pd --plan FILE`; and each stage's printed qualify: command run
// verbatim. Every one must PASS: a stage the plan emits is a promise.
func TestJourney(t *testing.T) {
	const model = "Qwen/Qwen3-0.6B"
	conv := func(e engines.Kind) sim.Config { return sim.Config{Engine: e, BlockSize: 16} }
	role := func(e engines.Kind, r string) sim.Config { return sim.Config{Engine: e, Role: r, BlockSize: 16} }
	trt := func(r string) sim.Config { return sim.Config{Engine: engines.TRTLLM, Role: r} }
	llama := sim.Config{Engine: engines.LlamaCpp, EnableMetrics: true}
	shapes := []struct {
		name     string
		cfgs     []sim.Config
		declared []string // roles declared with --endpoints (vLLM reports none)
		topology string
		stages   int
	}{
		{"vllm converged", []sim.Config{conv(engines.VLLM), conv(engines.VLLM), conv(engines.VLLM)}, nil, "converged", 3},
		{"vllm pd", []sim.Config{role(engines.VLLM, sim.RolePrefill), role(engines.VLLM, sim.RoleDecode)}, []string{"prefill", "decode"}, "pd", 2},
		{"sglang converged", []sim.Config{conv(engines.SGLang), conv(engines.SGLang), conv(engines.SGLang)}, nil, "converged", 2},
		{"sglang pd", []sim.Config{role(engines.SGLang, sim.RolePrefill), role(engines.SGLang, sim.RolePrefill), role(engines.SGLang, sim.RoleDecode)}, nil, "pd", 2},
		{"trtllm converged", []sim.Config{trt(sim.RoleBoth), trt(sim.RoleBoth), trt(sim.RoleBoth)}, nil, "converged", 3},
		{"trtllm pd", []sim.Config{trt(sim.RolePrefill), trt(sim.RoleDecode)}, nil, "pd", 2},
		{"llamacpp converged", []sim.Config{llama, llama, llama}, nil, "converged", 1},
	}
	for _, sh := range shapes {
		t.Run(sh.name, func(t *testing.T) {
			dir := t.TempDir()
			as := startFreshSims(t, sh.cfgs...)
			var eps []string
			for i, a := range as {
				ep := a.HTTP
				if sh.declared != nil {
					ep += "=" + sh.declared[i]
				}
				eps = append(eps, ep)
			}
			planArgs := []string{"plan", "--endpoints", strings.Join(eps, ","), "--timeout", "300ms"}
			if sh.cfgs[0].Engine == engines.VLLM {
				// vLLM reports no event socket on a read-only surface: the
				// operator names them.
				var ev, rp []string
				for _, a := range as {
					ev, rp = append(ev, a.Events), append(rp, a.Replay)
				}
				planArgs = append(planArgs, "--events", strings.Join(ev, ","), "--replay", strings.Join(rp, ","))
			}
			if sh.cfgs[0].Engine == engines.TRTLLM {
				// trtllm-serve has no tokenize surface: KV-exact needs the
				// model's tokenizer on the gateway host.
				tok, err := tokenizer.ExportQwen3(dir)
				if err != nil {
					t.Fatal(err)
				}
				planArgs = append(planArgs, "--kv-tokenizer", tok)
			}

			ios, out, errOut := TestIO()
			if code := Main(context.Background(), append(planArgs, "-o", "json"), ios); code != ExitOK {
				t.Fatalf("plan -o json: exit %d\n%s\n%s", code, errOut, out)
			}
			planJSON := out.Bytes()
			var p journeyPlan
			if err := json.Unmarshal(planJSON, &p); err != nil {
				t.Fatal(err)
			}
			if p.Topology != sh.topology || !p.Consistent || len(p.Stages) != sh.stages {
				t.Fatalf("plan: topology %s, consistent %v, %d stages (want %s, %d); blocked %+v", p.Topology, p.Consistent, len(p.Stages), sh.topology, sh.stages, p.Blocked)
			}
			planFile := filepath.Join(dir, "plan.json")
			if err := os.WriteFile(planFile, planJSON, 0o600); err != nil {
				t.Fatal(err)
			}

			gw, err := gateway.New(gateway.Config{Listen: "127.0.0.1:0", Admin: "127.0.0.1:0", StateDir: filepath.Join(dir, "state"), Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
			if err != nil {
				t.Fatal(err)
			}
			if err := gw.Start(context.Background()); err != nil {
				t.Fatal(err)
			}
			defer gw.Close()
			client := &http.Client{Timeout: 20 * time.Second}
			for _, st := range p.Stages {
				ios, out, errOut := TestIO()
				if code := Main(context.Background(), append(planArgs, "-o", "yaml", "--stage", fmt.Sprint(st.N)), ios); code != ExitOK {
					t.Fatalf("plan -o yaml --stage %d: exit %d\n%s", st.N, code, errOut)
				}
				ruleYAML := out.Bytes()
				ios, out, errOut = TestIO()
				ios.In = bytes.NewReader(ruleYAML)
				if code := Main(context.Background(), []string{"rule", "apply", "-f", "-", "--admin", "http://" + gw.AdminAddr()}, ios); code != ExitOK {
					t.Fatalf("stage %d (%s): rule apply -f -: exit %d\n%s%s\n%s", st.N, st.Capability, code, out, errOut, ruleYAML)
				}
				// Served traffic: a few chat requests through the rule,
				// each answered 200 once the rule's endpoints are ready.
				url := "http://" + gw.RuleAddr("plan") + "/v1/chat/completions"
				for i := range 3 {
					body := fmt.Sprintf(`{"model":%q,"messages":[{"role":"user","content":"journey stage %d request %d"}],"max_tokens":4}`, model, st.N, i)
					var last string
					wait.ForErr(t, 30*time.Second, fmt.Sprintf("stage %d request %d answered 200", st.N, i), func() error {
						resp, err := client.Post(url, "application/json", strings.NewReader(body))
						if err != nil {
							return err
						}
						b, _ := io.ReadAll(resp.Body)
						resp.Body.Close()
						last = fmt.Sprintf("%d %s (route %s)", resp.StatusCode, b, resp.Header.Get("X-Llmgw-Route"))
						if resp.StatusCode != http.StatusOK {
							return fmt.Errorf("stage %d (%s): %s", st.N, st.Capability, last)
						}
						return nil
					})
				}
			}

			// The runbooks run their own gateway; a TensorRT-LLM worker's
			// event queue is drained by one consumer only, so the journey's
			// gateway goes first (as an operator removes the rule).
			gw.Close()

			kind := "converged"
			if p.Topology == "pd" {
				kind = "pd"
			}
			ios, out, errOut = TestIO()
			if code := Main(context.Background(), []string{"runbook", kind, "--plan", planFile, "--out", filepath.Join(dir, "out")}, ios); code != ExitOK {
				t.Fatalf("runbook %s --plan: exit %d\n%s\n%s", kind, code, out, errOut)
			}
			for _, st := range p.Stages {
				t.Run(fmt.Sprintf("qualify stage %d %s", st.N, st.Capability), func(t *testing.T) {
					qualifyVerbatim(t, st.Runbook, filepath.Join(dir, "out"))
				})
			}
		})
	}
}
