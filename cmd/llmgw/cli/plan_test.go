package cli

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/llmgw/llmgw/engines"
	"github.com/llmgw/llmgw/engines/sim"
	"github.com/llmgw/llmgw/gateway"
)

func startPlanSims(t *testing.T, cfgs ...sim.Config) (addrs, events, replay []string) {
	t.Helper()
	for _, c := range cfgs {
		s, err := sim.Start(context.Background(), c)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { s.Close() })
		a := s.Addrs()
		// The test's own traffic, so each worker publishes blocks.
		// Long enough for at least one full block of 32 Qwen3 tokens, so that
		// even the 32-token-block pool publishes a BlockStored the planner reads.
		body := `{"model":"Qwen/Qwen3-0.6B","prompt":"a prompt long enough to fill two blocks of thirty-two tokens each for the events the planner replays: the quick brown fox jumps over the lazy dog, then runs around the field twice, stops by the river to drink, and finally lies down under the old oak tree to sleep until the evening comes and the stars appear one by one in the darkening sky","max_tokens":1}`
		resp, err := http.Post("http://"+a.HTTP+"/v1/completions", "application/json", strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		addrs, events, replay = append(addrs, a.HTTP), append(events, a.Events), append(replay, a.Replay)
	}
	return addrs, events, replay
}

// Three vLLM simulators: the plan is made (exit 0), its stage-1 YAML is
// accepted by `llmgw rule apply -f -` on an embedded gateway, and the
// runbook the plan names (through --plan) passes.
func TestPlanThreeVLLMApplyAndQualify(t *testing.T) {
	v := sim.Config{Engine: engines.VLLM}
	addrs, events, replay := startPlanSims(t, v, v, v)
	args := []string{"plan", "--endpoints", strings.Join(addrs, ","), "--events", strings.Join(events, ","), "--replay", strings.Join(replay, ","), "--timeout", "500ms"}

	ios, out, errOut := TestIO()
	if code := Main(context.Background(), append(args, "-o", "json"), ios); code != ExitOK {
		t.Fatalf("plan -o json: exit %d\n%s", code, errOut)
	}
	var p struct {
		Engine     string `json:"engine"`
		Topology   string `json:"topology"`
		Consistent bool   `json:"consistent"`
		Stages     []struct {
			Capability string `json:"capability"`
			Runbook    string `json:"runbook"`
		} `json:"stages"`
	}
	planJSON := out.Bytes()
	if err := json.Unmarshal(planJSON, &p); err != nil {
		t.Fatal(err)
	}
	if p.Engine != "vllm" || p.Topology != "converged" || !p.Consistent || len(p.Stages) != 3 {
		t.Fatalf("plan = %+v", p)
	}

	ios, out, errOut = TestIO()
	if code := Main(context.Background(), append(args, "-o", "table"), ios); code != ExitOK || !strings.Contains(out.String(), "stage 1  fullproxy") {
		t.Fatalf("plan table: exit %d\n%s\n%s", code, out, errOut)
	}

	ios, out, errOut = TestIO()
	if code := Main(context.Background(), append(args, "-o", "yaml"), ios); code != ExitOK {
		t.Fatalf("plan -o yaml: exit %d\n%s", code, errOut)
	}
	yamlRule := out.Bytes()

	dir := t.TempDir()
	gw, err := gateway.New(gateway.Config{Listen: "127.0.0.1:0", Admin: "127.0.0.1:0", StateDir: filepath.Join(dir, "state"), Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	if err := gw.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	defer gw.Close()
	ios, out, errOut = TestIO()
	ios.In = bytes.NewReader(yamlRule)
	if code := Main(context.Background(), []string{"rule", "apply", "-f", "-", "-o", "json", "--admin", "http://" + gw.AdminAddr()}, ios); code != ExitOK {
		t.Fatalf("rule apply -f - of the plan's stage 1: exit %d\n%s\n%s", code, errOut, yamlRule)
	}
	if !strings.Contains(out.String(), `"sel": 0`) || !strings.Contains(out.String(), `"path": "/health"`) {
		t.Errorf("applied rule read back = %s; want round robin with the health probe", out)
	}

	planFile := filepath.Join(dir, "plan.json")
	if err := os.WriteFile(planFile, planJSON, 0o600); err != nil {
		t.Fatal(err)
	}
	ios, out, errOut = TestIO()
	if code := Main(context.Background(), []string{"runbook", "converged", "--plan", planFile, "--out", filepath.Join(dir, "out")}, ios); code != ExitOK {
		t.Fatalf("runbook converged --plan: exit %d\n%s\n%s", code, out, errOut)
	}
	if !strings.Contains(out.String(), "attach") || !strings.Contains(out.String(), "rr") {
		t.Errorf("runbook output lacks the plan's tuple (attach, rr):\n%s", out)
	}
}

func TestPlanExitCodes(t *testing.T) {
	a, ae, ar := startPlanSims(t, sim.Config{Engine: engines.VLLM})
	b, be, br := startPlanSims(t, sim.Config{Engine: engines.VLLM, BlockSize: 32})
	l := startFreshSims(t, sim.Config{Engine: engines.LlamaCpp})
	cases := []struct {
		name string
		args []string
		code ExitCode
		want string
	}{
		{"block sizes differ", []string{"--endpoints", a[0] + "," + b[0], "--events", ae[0] + "," + be[0], "--replay", ar[0] + "," + br[0]}, ExitFail, "block_size (" + b[0] + " says 32, the pool 16)"},
		{"no endpoints", nil, ExitUsage, "--endpoints"},
		{"bad output", []string{"--endpoints", a[0], "-o", "xml"}, ExitUsage, "-o"},
		{"events list length", []string{"--endpoints", a[0] + "," + b[0], "--events", ae[0]}, ExitUsage, "--events has 1 items"},
		{"bad engine", []string{"--endpoints", a[0], "--engine", "tgi"}, ExitUsage, "unknown engine"},
		{"bad profile", []string{"--endpoints", a[0], "--profile", "nope"}, ExitUsage, "--profile"},
		{"yaml of a missing stage", []string{"--endpoints", a[0], "--events", ae[0], "-o", "yaml", "--stage", "9"}, ExitError, "no stage 9"},
		{"bad role", []string{"--endpoints", a[0] + "=leader"}, ExitUsage, "want converged, prefill"},
		{"llama.cpp without --metrics or --slots", []string{"--endpoints", l[0].HTTP}, ExitOK, "BLOCKED until every worker serves the engine's request evidence: " + l[0].HTTP + " GET /metrics: 501 (start it with --metrics); GET /slots: 501 (start it with --slots)"},
		{"profile model differs", []string{"--endpoints", a[0], "--events", ae[0], "--profile", "llama-3.1-8b-instruct"}, ExitFail, "profile"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			ios, out, errOut := TestIO()
			code := Main(context.Background(), append(append([]string{"plan"}, tc.args...), "--timeout", "500ms"), ios)
			if code != tc.code || !strings.Contains(errOut.String()+out.String(), tc.want) {
				t.Errorf("exit %d; want %d with %q\nstdout:\n%s\nstderr:\n%s", code, tc.code, tc.want, out, errOut)
			}
		})
	}
}

func TestRunbookPlanFlagRefusesMismatch(t *testing.T) {
	dir := t.TempDir()
	bad := filepath.Join(dir, "bad.json")
	os.WriteFile(bad, []byte(`{"x":1}`), 0o600)
	pdPlan := filepath.Join(dir, "pd.json")
	os.WriteFile(pdPlan, []byte(`{"engine":"sglang","topology":"pd","answers":[{"key":"engine"}],"stages":[{"n":1,"capability":"pd","runbook_mode":"pd"}],"prefill":["127.0.0.1:1"],"decode":["127.0.0.1:2"]}`), 0o600)
	cases := []struct {
		name string
		args []string
		want string
	}{
		{"not a plan", []string{"runbook", "converged", "--plan", bad}, "not a plan"},
		{"missing file", []string{"runbook", "converged", "--plan", filepath.Join(dir, "none.json")}, "--plan"},
		{"pd plan for converged", []string{"runbook", "converged", "--plan", pdPlan}, "no converged stage"},
		{"endpoints with plan", []string{"runbook", "pd", "--plan", pdPlan, "--prefill-endpoints", "127.0.0.1:3"}, "drop --launcher"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			ios, _, errOut := TestIO()
			if code := Main(context.Background(), append(tc.args, "--out", dir), ios); code != ExitUsage || !strings.Contains(errOut.String(), tc.want) {
				t.Errorf("exit %d; want 2 with %q\n%s", code, tc.want, errOut)
			}
		})
	}
}

// qualifyVerbatim runs a plan's printed qualify: command as printed (less
// the program name), with only --out added, and wants PASS.
func qualifyVerbatim(t *testing.T, line, out string) {
	t.Helper()
	args := strings.Fields(line)
	if len(args) < 2 || args[0] != "llmgw" {
		t.Fatalf("qualify line %q is not an llmgw command", line)
	}
	ios, stdout, errOut := TestIO()
	if code := Main(context.Background(), append(args[1:], "--out", out), ios); code != ExitOK {
		t.Fatalf("%s: exit %d\n%s\n%s", line, code, stdout, errOut)
	}
}

// An SGLang pool of two prefills, each with its own bootstrap port, and a
// decode: the plan stages concurrent P/D with each prefill's port in the
// rule, and both `runbook pd --plan` and every stage's printed qualify
// line (which must name each prefill's port and, for KV-exact, each
// prefill's event socket) pass against the receipt-less simulators.
func TestPlanSGLangPDQualify(t *testing.T) {
	a := startFreshSims(t, sim.Config{Engine: engines.SGLang, Role: sim.RolePrefill, BlockSize: 16}, sim.Config{Engine: engines.SGLang, Role: sim.RolePrefill, BlockSize: 16},
		sim.Config{Engine: engines.SGLang, Role: sim.RoleDecode, BlockSize: 16})
	dir := t.TempDir()
	ios, out, errOut := TestIO()
	if code := Main(context.Background(), []string{"plan", "--endpoints", a[0].HTTP + "," + a[1].HTTP + "," + a[2].HTTP, "--timeout", "300ms", "-o", "json"}, ios); code != ExitOK {
		t.Fatalf("plan: exit %d\n%s", code, errOut)
	}
	planFile := filepath.Join(dir, "plan.json")
	os.WriteFile(planFile, out.Bytes(), 0o600)
	var p struct {
		Topology string `json:"topology"`
		Stages   []struct {
			Runbook string `json:"runbook"`
		} `json:"stages"`
	}
	json.Unmarshal(out.Bytes(), &p)
	if p.Topology != "pd" || len(p.Stages) != 2 {
		t.Fatalf("plan = %s", out)
	}
	ios, out, errOut = TestIO()
	if code := Main(context.Background(), []string{"runbook", "pd", "--plan", planFile, "--out", filepath.Join(dir, "out")}, ios); code != ExitOK {
		t.Fatalf("runbook pd --plan: exit %d\n%s\n%s", code, out, errOut)
	}
	for i, s := range p.Stages {
		t.Run(fmt.Sprintf("stage %d", i+1), func(t *testing.T) { qualifyVerbatim(t, s.Runbook, filepath.Join(dir, "out")) })
	}
}

// A pool the planner cannot stage (no engine answers as one, though its
// health surface answers 200): every output format exits 1, and health is
// known, not unknown.
func TestPlanNoStageExitsAlikeAndHealthKnown(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/health" {
			return
		}
		http.NotFound(w, r)
	}))
	defer srv.Close()
	addr := strings.TrimPrefix(srv.URL, "http://")
	for _, o := range []string{"table", "json", "yaml"} {
		t.Run(o, func(t *testing.T) {
			ios, out, errOut := TestIO()
			code := Main(context.Background(), []string{"plan", "--endpoints", addr, "--timeout", "300ms", "-o", o}, ios)
			if code != ExitError || !strings.Contains(errOut.String(), "no stage to apply") {
				t.Errorf("exit %d; want 1 (no stage to apply)\nstdout:\n%s\nstderr:\n%s", code, out, errOut)
			}
		})
	}
	ios, out, _ := TestIO()
	Main(context.Background(), []string{"plan", "--endpoints", addr, "--timeout", "300ms", "-o", "json"}, ios)
	var p struct {
		Answers []struct{ Key, Status, Value string } `json:"answers"`
	}
	json.Unmarshal(out.Bytes(), &p)
	for _, a := range p.Answers {
		if a.Key == "health" && (a.Status != "known" || a.Value != "true") {
			t.Errorf("health answer = %+v; want known true (GET /health answered 200)", a)
		}
	}
}

// startFreshSims starts receipt-less simulators and sends them nothing: a
// freshly started pool that has published no KV event yet.
func startFreshSims(t *testing.T, cfgs ...sim.Config) []sim.Addrs {
	t.Helper()
	var out []sim.Addrs
	for _, c := range cfgs {
		c.Silent = true
		s, err := sim.Start(context.Background(), c)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { s.Close() })
		out = append(out, s.Addrs())
	}
	return out
}

// Two fresh vLLM workers with block sizes 16 and 32 and no traffic: the
// block sizes come from vllm:cache_config_info, so the pool is
// inconsistent (exit 3) and the answer names the endpoint and its size, in
// every output format.
func TestPlanFreshVLLMBlockSizesDiffer(t *testing.T) {
	a := startFreshSims(t, sim.Config{Engine: engines.VLLM, BlockSize: 16}, sim.Config{Engine: engines.VLLM, BlockSize: 32})
	want := "block_size (" + a[1].HTTP + " says 32, the pool 16)"
	for _, o := range []string{"table", "json", "yaml"} {
		t.Run(o, func(t *testing.T) {
			ios, out, errOut := TestIO()
			code := Main(context.Background(), []string{"plan", "--endpoints", a[0].HTTP + "," + a[1].HTTP, "--events", a[0].Events + "," + a[1].Events,
				"--replay", a[0].Replay + "," + a[1].Replay, "--timeout", "300ms", "-o", o}, ios)
			if code != ExitFail || !strings.Contains(errOut.String(), want) {
				t.Errorf("exit %d; want 3 with %q\nstdout:\n%s\nstderr:\n%s", code, want, out, errOut)
			}
		})
	}
}
