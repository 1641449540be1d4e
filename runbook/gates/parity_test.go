package gates

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/llmgw/llmgw/engines"
	"github.com/llmgw/llmgw/engines/sim"
	"github.com/llmgw/llmgw/engines/tokenizer"
	"github.com/llmgw/llmgw/gateway"
	"github.com/llmgw/llmgw/gateway/rule"
	"github.com/llmgw/llmgw/internal/testfix"
	"github.com/llmgw/llmgw/internal/wait"
	"github.com/llmgw/llmgw/results"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m,
		// fasthttp and zmq4 housekeeping goroutines that end on their own
		// after their pools close.
		goleak.IgnoreAnyFunction("github.com/valyala/fasthttp.(*HostClient).connsCleaner"),
		goleak.IgnoreAnyFunction("github.com/valyala/fasthttp.(*workerPool).Start.func2"),
		goleak.IgnoreAnyFunction("github.com/valyala/fasthttp.(*TCPDialer).tcpAddrsClean"),
		goleak.IgnoreAnyFunction("github.com/valyala/fasthttp.updateServerDate.func1"),
		goleak.IgnoreAnyFunction("github.com/go-zeromq/zmq4.(*pubMWriter).run"),
	)
}

// startGateway runs an embedded gateway on kernel-chosen loopback ports.
func startGateway(t *testing.T) *gateway.Server {
	t.Helper()
	gw, err := gateway.New(gateway.Config{Listen: "127.0.0.1:0", Admin: "127.0.0.1:0", StateDir: t.TempDir(),
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	if err := gw.Start(t.Context()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { gw.Close() })
	return gw
}

func startSim(t *testing.T, cfg sim.Config) *sim.Sim {
	t.Helper()
	s, err := sim.Start(t.Context(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

func endpoint(t *testing.T, id string, s *sim.Sim, role int, events bool) rule.Endpoint {
	t.Helper()
	host, port, err := net.SplitHostPort(s.Addrs().HTTP)
	if err != nil {
		t.Fatal(err)
	}
	p, _ := strconv.Atoi(port)
	ep := rule.Endpoint{ID: id, EndpointIP: host, TargetPort: p, EPRole: rule.EPRole(role)}
	if events {
		ep.KVEventsEndpoint, ep.KVReplayEndpoint = s.Addrs().Events, s.Addrs().Replay
	}
	if role == 1 && s.Addrs().Bootstrap != "" {
		_, bp, _ := net.SplitHostPort(s.Addrs().Bootstrap)
		ep.BootstrapPort, _ = strconv.Atoi(bp)
	}
	return ep
}

func apply(t *testing.T, gw *gateway.Server, r *rule.Rule) {
	t.Helper()
	b, _ := json.Marshal(r)
	resp, err := http.Post("http://"+gw.AdminAddr()+"/v1/rules", "application/json", bytes.NewReader(b))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode/100 != 2 {
		body, _ := io.ReadAll(resp.Body)
		t.Fatalf("apply rule: %d %s", resp.StatusCode, body)
	}
}

// waitConnected waits until every KV endpoint of the rule has its event
// stream connected (the gate's precondition, checked by read-back steps).
func waitConnected(t *testing.T, gw *gateway.Server, name string) {
	t.Helper()
	wait.For(t, 10*time.Second, "rule "+name+": KV event streams connected", func() bool {
		st, err := gw.Rule(name)
		if err != nil {
			return false
		}
		for _, ep := range st.Status.Endpoints {
			if ep.KV != nil && !ep.KV.EventsConnected {
				return false
			}
		}
		return true
	})
}

func TestHashParityGate(t *testing.T) {
	seed0 := "0"
	cases := []struct {
		name    string
		engine  engines.Kind
		pd      bool
		simSeed string // the workers' PYTHONHASHSEED ("" = the rule's)
		// simTok is the workers' tokenizer ("" = their default, the
		// embedded Qwen3 one the rule's tokenizer.json is a copy of).
		simTok string
		// ruleTok is the rule's kvTokenizer ("" = the Qwen3 tokenizer.json).
		ruleTok  string
		chat     bool
		want     results.Status
		wantCode string
	}{
		{name: "vllm converged chat", engine: engines.VLLM, chat: true, want: results.StatusPass},
		{name: "vllm converged completions", engine: engines.VLLM, want: results.StatusPass},
		{name: "sglang converged", engine: engines.SGLang, chat: true, want: results.StatusPass},
		{name: "trtllm converged", engine: engines.TRTLLM, chat: true, want: results.StatusPass},
		{name: "vllm pd kvExactMode 1", engine: engines.VLLM, pd: true, chat: true, want: results.StatusPass},
		{name: "sglang pd kvExactMode 1", engine: engines.SGLang, pd: true, chat: true, want: results.StatusPass},
		{name: "trtllm pd kvExactMode 1", engine: engines.TRTLLM, pd: true, chat: true, want: results.StatusPass},
		{name: "vllm mismatched seed misses", engine: engines.VLLM, simSeed: "4242", chat: true, want: results.StatusFail, wantCode: CodeParityMiss},
		{name: "vllm engine tokenizer", engine: engines.VLLM, ruleTok: "engine", chat: true, want: results.StatusPass},
		// The workers tokenize with another model's vocabulary (Phi-3's, from
		// its GGUF, with its own chat template): the gateway's hashes cannot
		// be theirs, and the gate must say so.
		{name: "vllm worker with another tokenizer misses", engine: engines.VLLM, simTok: "tokenizers/gguf-vocab/ggml-vocab-phi-3.gguf", chat: true, want: results.StatusFail, wantCode: CodeParityMiss},
		{name: "vllm worker with another tokenizer misses completions", engine: engines.VLLM, simTok: "tokenizers/gguf-vocab/ggml-vocab-gpt-2.gguf", want: results.StatusFail, wantCode: CodeParityMiss},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			gw := startGateway(t)
			seed := seed0
			if tc.simSeed != "" {
				seed = tc.simSeed
			}
			zmq := tc.engine != engines.TRTLLM
			r := &rule.Rule{Name: "parity", ModelName: "m", KVEngineType: string(tc.engine), Sel: 8, KVExactMode: 3,
				KVTokenizer: tc.ruleTok, Probe: rule.ProbeConfig{Disabled: true}}
			if r.KVTokenizer == "" {
				r.KVTokenizer = testfix.Qwen3Dir(t)
			}
			if tc.engine == engines.VLLM {
				r.KVHashSeed = &seed0
			}
			if tc.engine == engines.TRTLLM {
				r.KVBlockSize = 32
			}
			role := 0
			if tc.pd {
				r.Sel, r.KVExactMode, r.PDDisaggMode, role = 0, 1, true, 1
			}
			// The engine's block size, as the rule says it (16 unless set):
			// SGLang's own default page size is 1, and the catalog launches
			// it with --page-size 16.
			cfg := sim.Config{Engine: tc.engine, Model: "m", HashSeed: seed, KVEvents: sim.KVEventsOff, BlockSize: max(r.KVBlockSize, 16)}
			if tc.simTok != "" {
				cfg.Tokenizer = testfix.Path(t, tc.simTok)
			}
			if zmq {
				cfg.KVEvents = "tcp://127.0.0.1:0"
			}
			if tc.pd {
				cfg.Role = sim.RolePrefill
			}
			for i := 1; i <= 2; i++ {
				r.Endpoints = append(r.Endpoints, endpoint(t, fmt.Sprintf("w%d", i), startSim(t, cfg), role, zmq))
			}
			if tc.pd {
				d := startSim(t, sim.Config{Engine: tc.engine, Model: "m", Role: sim.RoleDecode, KVEvents: sim.KVEventsOff})
				r.Endpoints = append(r.Endpoints, endpoint(t, "d1", d, 2, false))
			}
			apply(t, gw, r)
			waitConnected(t, gw, "parity")
			target := Target{AdminBase: "http://" + gw.AdminAddr(), Rule: "parity", Chat: tc.chat, Nonce: "t-" + string(tc.engine), Timeout: 3 * time.Second}
			out := Outcome(t.Context(), target)
			if out.Status != tc.want || (tc.wantCode != "" && out.Code != tc.wantCode) {
				t.Fatalf("outcome %s %s: %s; want %s %s", out.Status, out.Code, out.Reason, tc.want, tc.wantCode)
			}
			if len(out.Lanes) != 1 || len(out.Evidence) != 1 || out.Evidence[0].Name != "parity.json" {
				t.Fatalf("lanes %v evidence %d; want the parity lane and parity.json", out.Lanes, len(out.Evidence))
			}
			var p Parity
			if err := json.Unmarshal(out.Evidence[0].Data, &p); err != nil {
				t.Fatal(err)
			}
			if len(p.Computed) < 2 || len(p.RedKeys) != len(p.Computed) {
				t.Errorf("computed %d keys, red %d; want several, equal counts", len(p.Computed), len(p.RedKeys))
			}
			if !p.RedMiss {
				t.Errorf("the red arm matched %d published keys; want none", p.RedPresent)
			}
			if tc.want == results.StatusPass && (p.Holder == "" || p.Present[p.Holder] != len(p.Computed)) {
				t.Errorf("holder %q holds %d of %d keys", p.Holder, p.Present[p.Holder], len(p.Computed))
			}
			if tc.pd && tc.want == results.StatusPass && p.Holder == "d1" {
				t.Errorf("the decode endpoint cannot hold inventory in P/D")
			}
			if tc.want == results.StatusFail && p.GreenHit {
				t.Errorf("green arm hit with a mismatched seed or tokenizer")
			}
			if tc.chat && !strings.HasPrefix(p.Template, "<|im_start|>user\n") && tc.ruleTok == "" {
				t.Errorf("evidence template %.40q; want the gateway's rendered Qwen3 prompt", p.Template)
			}
		})
	}
}

func TestHashParityNotKVExact(t *testing.T) {
	gw := startGateway(t)
	s := startSim(t, sim.Config{Engine: engines.VLLM, Model: "m", KVEvents: sim.KVEventsOff})
	apply(t, gw, &rule.Rule{Name: "plain", ModelName: "m", KVEngineType: "vllm", Probe: rule.ProbeConfig{Disabled: true},
		Endpoints: []rule.Endpoint{endpoint(t, "w1", s, 0, false)}})
	out := Outcome(t.Context(), Target{AdminBase: "http://" + gw.AdminAddr(), Rule: "plain", Nonce: "x"})
	if out.Status != results.StatusBlocked || out.Code != CodeNotKVExact {
		t.Fatalf("outcome %s %s: %s; want BLOCKED %s", out.Status, out.Code, out.Reason, CodeNotKVExact)
	}
	out = Outcome(t.Context(), Target{AdminBase: "http://" + gw.AdminAddr(), Rule: "missing", Nonce: "x"})
	if out.Status != results.StatusFail || out.Code != CodeParityRead {
		t.Fatalf("unknown rule: outcome %s %s; want FAIL %s", out.Status, out.Code, CodeParityRead)
	}
}

func TestRedArmChangesEveryKey(t *testing.T) {
	seed := "0"
	cases := []struct {
		name, algo string
		block      int
	}{
		{"sha256_cbor", "sha256_cbor", 16},
		{"xxhash_cbor", "xxhash_cbor", 16},
		{"sha256_sglang", "sha256_sglang", 16},
		{"blockhash_trtllm", "blockhash_trtllm", 32},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			qwen, err := tokenizer.Qwen3()
			if err != nil {
				t.Fatal(err)
			}
			toks := qwen.Encode(nil, CanaryPrompt("n"))
			eff := &rule.Rule{KVHashAlgo: tc.algo, KVBlockSize: tc.block, KVHashSeed: &seed}
			green, err := BlockKeys(eff, toks)
			if err != nil {
				t.Fatal(err)
			}
			red, from, to := Flip(toks, 0)
			if from == to || toks[0] != from {
				t.Fatalf("flip %d→%d changed the input or nothing", from, to)
			}
			redKeys, err := BlockKeys(eff, red)
			if err != nil {
				t.Fatal(err)
			}
			if len(green) < 2 || len(redKeys) != len(green) {
				t.Fatalf("green %d keys, red %d", len(green), len(redKeys))
			}
			for i := range green {
				if green[i] == redKeys[i] {
					t.Errorf("block %d: key %d unchanged by the flip", i, green[i])
				}
			}
		})
	}
}

// TestTokenizeWithoutEndpoint: a gateway that cannot say how it tokenizes
// (no tokenize route) is errTokenizer (the gate is BLOCKED, never a guess);
// an unknown rule or a tokenize error is a plain read error (FAIL).
func TestTokenizeWithoutEndpoint(t *testing.T) {
	cases := []struct {
		name      string
		status    int
		body      string
		tokenizer bool // errTokenizer expected
	}{
		{"no route", http.StatusNotFound, `{"error":{"message":"gateway: no route: POST /v1/rules/r/tokenize"}}`, true},
		{"old gateway", http.StatusNotFound, `404 page not found`, true},
		{"unknown rule", http.StatusNotFound, `{"error":{"message":"gateway: rule not found: \"r\""}}`, false},
		{"tokenize failed", http.StatusBadRequest, `{"error":{"message":"chat template: boom"}}`, false},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				w.WriteHeader(tc.status)
				io.WriteString(w, tc.body)
			}))
			defer srv.Close()
			_, err := Tokenize(t.Context(), Target{AdminBase: srv.URL, Rule: "r", Client: srv.Client()}, []byte(`{}`))
			if err == nil || !errors.Is(err, ErrParity) || errors.Is(err, errTokenizer) != tc.tokenizer {
				t.Fatalf("err %v; want ErrParity, errTokenizer %v", err, tc.tokenizer)
			}
		})
	}
}

func TestParseInventory(t *testing.T) {
	cases := []struct {
		name    string
		body    string
		want    map[string]int
		wantErr bool
	}{
		{"two endpoints", `{"rule":"r","endpoints":[{"id":"a","sample_keys":[1,2]},{"id":"b","sample_keys":[]}]}`, map[string]int{"a": 2, "b": 0}, false},
		{"max uint64", `{"rule":"r","endpoints":[{"id":"a","sample_keys":[18446744073709551615]}]}`, map[string]int{"a": 1}, false},
		{"no rule", `{"endpoints":[]}`, nil, true},
		{"no id", `{"rule":"r","endpoints":[{"sample_keys":[1]}]}`, nil, true},
		{"duplicate", `{"rule":"r","endpoints":[{"id":"a"},{"id":"a"}]}`, nil, true},
		{"negative key", `{"rule":"r","endpoints":[{"id":"a","sample_keys":[-1]}]}`, nil, true},
		{"not json", `<html>`, nil, true},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			got, _, err := ParseInventory([]byte(tc.body))
			if (err != nil) != tc.wantErr {
				t.Fatalf("err = %v; want error %v", err, tc.wantErr)
			}
			for id, n := range tc.want {
				if len(got[id]) != n {
					t.Errorf("endpoint %s: got %d keys, want %d", id, len(got[id]), n)
				}
			}
		})
	}
}

func FuzzParseInventory(f *testing.F) {
	f.Add([]byte(`{"rule":"r","endpoints":[{"id":"a","sample_keys":[1,2]}]}`))
	f.Add([]byte(`{"rule":"r","endpoints":[{"id":"a"},{"id":"a"}]}`))
	f.Add([]byte(`{}`))
	f.Add([]byte(`null`))
	f.Fuzz(func(t *testing.T, b []byte) {
		inv, st, err := ParseInventory(b)
		if err != nil {
			if !errors.Is(err, ErrParity) {
				t.Fatalf("error %v does not wrap ErrParity", err)
			}
			return
		}
		if st.Rule == "" || len(inv) != len(st.Endpoints) {
			t.Fatalf("accepted an inventory without a rule or with duplicate endpoints: %d ids, %d endpoints", len(inv), len(st.Endpoints))
		}
		for _, ep := range st.Endpoints {
			if len(inv[ep.ID]) != len(ep.Sample) {
				t.Fatalf("endpoint %s: %d keys, decoded %d", ep.ID, len(inv[ep.ID]), len(ep.Sample))
			}
		}
	})
}
