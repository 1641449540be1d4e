package sim

import (
	"bytes"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/llmgw/llmgw/engines"
	"github.com/llmgw/llmgw/internal/golden"
	"github.com/llmgw/llmgw/internal/wait"
)

// conformanceCase is one request whose exact response bytes are pinned in a
// golden file: a regression check of the simulator's own output (written
// with -update), not evidence of an engine's contract — that is
// source_conformance_test.go's job.
type conformanceCase struct {
	name       string
	method     string
	path       string
	body       string
	wantStatus int
	wantCT     string // Content-Type prefix, "" = not checked
}

func runConformance(t *testing.T, prefix string, s *Sim, cases []conformanceCase) {
	t.Helper()
	c := client(t)
	base := "http://" + s.Addrs().HTTP
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			res := do(t, c, tc.method, base+tc.path, tc.body, "X-Request-Id: req-"+tc.name)
			if res.err != nil {
				t.Fatalf("read body: %v", res.err)
			}
			if res.status != tc.wantStatus {
				t.Errorf("status: got %d, want %d (body %s)", res.status, tc.wantStatus, res.body)
			}
			if ct := res.header.Get("Content-Type"); tc.wantCT != "" && !strings.HasPrefix(ct, tc.wantCT) {
				t.Errorf("Content-Type: got %q, want prefix %q", ct, tc.wantCT)
			}
			golden.File(t, "golden/"+prefix+"_"+tc.name, res.body)
		})
	}
}

const chatBody = `{"model":"Qwen/Qwen3-0.6B","messages":[{"role":"system","content":"Be brief."},{"role":"user","content":[{"type":"text","text":"What is a KV cache?"}]}],"max_tokens":4`

func TestVLLMConformance(t *testing.T) {
	s := startSim(t, Config{Engine: engines.VLLM, KVEvents: KVEventsOff, Seed: 7})
	runConformance(t, "vllm", s, []conformanceCase{
		{"chat_json", "POST", "/v1/chat/completions", chatBody + `}`, 200, "application/json"},
		{"chat_sse", "POST", "/v1/chat/completions", chatBody + `,"stream":true}`, 200, "text/event-stream"},
		{"chat_sse_usage_quirk", "POST", "/v1/chat/completions", chatBody + `,"stream":true,"stream_options":{}}`, 200, "text/event-stream"},
		{"chat_sse_no_usage", "POST", "/v1/chat/completions", chatBody + `,"stream":true,"stream_options":{"include_usage":false}}`, 200, "text/event-stream"},
		{"chat_sse_continuous", "POST", "/v1/chat/completions", chatBody + `,"stream":true,"stream_options":{"include_usage":true,"continuous_usage_stats":true}}`, 200, "text/event-stream"},
		{"completion_json", "POST", "/v1/completions", `{"prompt":"The capital of France is","max_tokens":3}`, 200, "application/json"},
		{"completion_ids", "POST", "/v1/completions", `{"prompt":[1,2,3,4,5],"max_tokens":2}`, 200, "application/json"},
		{"completion_natural_stop", "POST", "/v1/completions", `{"prompt":"Tell me a story"}`, 200, "application/json"},
		{"completion_sse", "POST", "/v1/completions", `{"prompt":"The capital of France is","max_tokens":3,"stream":true,"stream_options":{"include_usage":true}}`, 200, "text/event-stream"},
		{"models", "GET", "/v1/models", "", 200, "application/json"},
		{"tokenize_prompt", "POST", "/tokenize", `{"prompt":"hello world"}`, 200, "application/json"},
		{"tokenize_messages", "POST", "/tokenize", `{"messages":[{"role":"user","content":"hi"}],"return_token_strs":true}`, 200, "application/json"},
		{"tokenize_both_flags", "POST", "/tokenize", `{"messages":[{"role":"user","content":"hi"}],"continue_final_message":true}`, 400, "application/json"},
		{"detokenize", "POST", "/detokenize", `{"tokens":[2,3]}`, 200, "application/json"},
		{"health", "GET", "/health", "", 200, ""},
		{"err_malformed_json", "POST", "/v1/chat/completions", `{"messages":`, 400, "application/json"},
		{"err_empty_body", "POST", "/v1/chat/completions", ``, 400, "application/json"},
		{"err_missing_messages", "POST", "/v1/chat/completions", `{"model":"Qwen/Qwen3-0.6B"}`, 400, "application/json"},
		{"err_empty_messages", "POST", "/v1/chat/completions", `{"messages":[]}`, 400, "application/json"},
		{"err_wrong_type", "POST", "/v1/chat/completions", `{"messages":[{"role":"user","content":"x"}],"max_tokens":"ten"}`, 400, "application/json"},
		{"err_zero_max_tokens", "POST", "/v1/completions", `{"prompt":"x","max_tokens":0}`, 400, "application/json"},
		{"err_missing_prompt", "POST", "/v1/completions", `{"max_tokens":3}`, 400, "application/json"},
		{"err_batched_prompt", "POST", "/v1/completions", `{"prompt":["a","b"]}`, 400, "application/json"},
		{"err_unknown_model", "POST", "/v1/chat/completions", `{"model":"nope","messages":[{"role":"user","content":"x"}]}`, 404, "application/json"},
		{"err_unknown_route", "GET", "/v2/nothing", "", 404, "application/json"},
		{"err_method", "GET", "/v1/chat/completions", "", 405, "application/json"},
	})
}

// TestSSEFraming checks the framing rules every OpenAI stream obeys: each
// event is "data: <compact JSON>\n\n", the last is "data: [DONE]\n\n".
func TestSSEFraming(t *testing.T) {
	// llama.cpp's framing (one chunk per event, usage without
	// prompt_tokens_details) is checked against its captures in
	// engines/llamacpp's conformance test.
	for _, kind := range []engines.Kind{engines.VLLM, engines.SGLang, engines.TRTLLM} {
		t.Run(string(kind), func(t *testing.T) {
			s := startSim(t, Config{Engine: kind, KVEvents: KVEventsOff})
			res := do(t, client(t), "POST", "http://"+s.Addrs().HTTP+"/v1/chat/completions", chatBody+`,"stream":true,"stream_options":{"include_usage":true}}`)
			if res.status != 200 {
				t.Fatalf("status %d: %s", res.status, res.body)
			}
			events := strings.Split(string(res.body), "\n\n")
			if last := events[len(events)-1]; last != "" {
				t.Fatalf("stream does not end with a blank line: %q", last)
			}
			events = events[:len(events)-1]
			if got := events[len(events)-1]; got != "data: [DONE]" {
				t.Errorf("last event: got %q, want data: [DONE]", got)
			}
			sawUsage := false
			for _, ev := range events[:len(events)-1] {
				payload, ok := strings.CutPrefix(ev, "data: ")
				if !ok || strings.Contains(payload, "\n") {
					t.Fatalf("bad event framing: %q", ev)
				}
				var m map[string]any
				if err := json.Unmarshal([]byte(payload), &m); err != nil {
					t.Fatalf("event is not JSON: %q: %v", payload, err)
				}
				if u, ok := m["usage"].(map[string]any); ok && u != nil {
					sawUsage = true
					if _, ok := u["prompt_tokens_details"].(map[string]any)["cached_tokens"]; !ok {
						t.Errorf("usage without prompt_tokens_details.cached_tokens: %s", payload)
					}
				}
			}
			if !sawUsage {
				t.Errorf("include_usage=true but no usage chunk")
			}
		})
	}
}

func TestPrefixCacheLowersTTFT(t *testing.T) {
	s := startSim(t, Config{Engine: engines.VLLM, KVEvents: KVEventsOff, PrefillPerToken: time.Microsecond})
	c := client(t)
	url := "http://" + s.Addrs().HTTP + "/v1/completions"
	prompt := strings.Repeat("the quick brown fox jumps over the lazy dog ", 20)
	var usages []struct{ cached, prompt int }
	for i := 0; i < 2; i++ {
		res := do(t, c, "POST", url, fmt.Sprintf(`{"prompt":%q,"max_tokens":1}`, prompt))
		var body struct {
			Usage struct {
				PromptTokens int `json:"prompt_tokens"`
				Details      struct {
					Cached int `json:"cached_tokens"`
				} `json:"prompt_tokens_details"`
			} `json:"usage"`
		}
		if err := json.Unmarshal(res.body, &body); err != nil {
			t.Fatalf("decode: %v: %s", err, res.body)
		}
		usages = append(usages, struct{ cached, prompt int }{body.Usage.Details.Cached, body.Usage.PromptTokens})
	}
	if usages[0].cached != 0 {
		t.Errorf("first request cached_tokens: got %d, want 0", usages[0].cached)
	}
	wantCached := (usages[1].prompt - 1) / 16 * 16
	if usages[1].cached != wantCached {
		t.Errorf("second request cached_tokens: got %d, want %d", usages[1].cached, wantCached)
	}
	rs := s.Receipts()
	if len(rs) != 2 {
		t.Fatalf("receipts: got %d, want 2", len(rs))
	}
	if !(rs[1].PrefillCostUS < rs[0].PrefillCostUS) {
		t.Errorf("modelled prefill cost did not drop on a hit: first %dus, second %dus", rs[0].PrefillCostUS, rs[1].PrefillCostUS)
	}
	if want := int64(usages[0].prompt); rs[0].PrefillCostUS != want {
		t.Errorf("first prefill cost: got %dus, want %dus (1us x %d tokens)", rs[0].PrefillCostUS, want, want)
	}
}

func TestReceiptsNonceAndHeaders(t *testing.T) {
	s := startSim(t, Config{Engine: engines.VLLM, KVEvents: KVEventsOff})
	c := client(t)
	url := "http://" + s.Addrs().HTTP + "/v1/chat/completions"
	tests := []struct {
		name      string
		body      string
		headers   []string
		wantNonce string
		wantID    string
	}{
		{"user field", `{"messages":[{"role":"user","content":"a"}],"user":"n-1"}`, []string{"X-Request-Id: rid-1"}, "n-1", "rid-1"},
		{"metadata wins", `{"messages":[{"role":"user","content":"a"}],"user":"u","metadata":{"nonce":"n-2"}}`, []string{"X-Request-Id: rid-2", "Authorization: Bearer secret"}, "n-2", "rid-2"},
		{"generated id", `{"messages":[{"role":"user","content":"a"}]}`, nil, "", ""},
	}
	for i, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			res := do(t, c, "POST", url, tc.body, tc.headers...)
			if res.status != 200 {
				t.Fatalf("status %d: %s", res.status, res.body)
			}
			r := s.Receipts()[i]
			if r.Nonce != tc.wantNonce {
				t.Errorf("nonce: got %q, want %q", r.Nonce, tc.wantNonce)
			}
			echo := res.header.Get("X-Request-Id")
			if tc.wantID != "" && (r.RequestID != tc.wantID || echo != tc.wantID) {
				t.Errorf("request id: receipt %q, echoed %q, want %q", r.RequestID, echo, tc.wantID)
			}
			if tc.wantID == "" && (len(r.RequestID) != 32 || echo != r.RequestID) {
				t.Errorf("generated request id: receipt %q, echoed %q, want 32 hex digits echoed", r.RequestID, echo)
			}
			if a, ok := r.Headers["Authorization"]; ok && a != "present" {
				t.Errorf("authorization header leaked into receipts: %q", a)
			}
		})
	}
	res := do(t, c, "GET", "http://"+s.Addrs().HTTP+"/_sim/receipts", "")
	var rs []Receipt
	if err := json.Unmarshal(res.body, &rs); err != nil || len(rs) != len(tests) {
		t.Fatalf("GET /_sim/receipts: %d receipts, err %v", len(rs), err)
	}
}

func TestDeterministicOutput(t *testing.T) {
	a := startSim(t, Config{Engine: engines.VLLM, KVEvents: KVEventsOff, Seed: 42})
	b := startSim(t, Config{Engine: engines.VLLM, KVEvents: KVEventsOff, Seed: 42})
	d := startSim(t, Config{Engine: engines.VLLM, KVEvents: KVEventsOff, Seed: 43})
	c := client(t)
	body := `{"prompt":"same prompt","max_tokens":30}`
	text := func(s *Sim) string {
		res := do(t, c, "POST", "http://"+s.Addrs().HTTP+"/v1/completions", body, "X-Request-Id: fixed")
		return string(res.body)
	}
	ta, tb, td := text(a), text(b), text(d)
	if ta != tb {
		t.Errorf("same seed, different output:\n%s\n%s", ta, tb)
	}
	if ta == td {
		t.Errorf("different seeds gave identical output: %s", ta)
	}
}

func TestConcurrencyQueue(t *testing.T) {
	// A long decode keeps the first stream in its slot while the second
	// request queues; both are observed through the metrics gauges.
	s := startSim(t, Config{Engine: engines.VLLM, KVEvents: KVEventsOff, MaxConcurrency: 1, DecodePerToken: 20 * time.Millisecond})
	c := client(t)
	url := "http://" + s.Addrs().HTTP + "/v1/completions"
	done := make(chan httpResult, 2)
	go func() { done <- do(t, c, "POST", url, `{"prompt":"one","max_tokens":20,"stream":true}`) }()
	wait.For(t, waitLimit, "first request running", func() bool { return s.running.Load() == 1 })
	go func() { done <- do(t, c, "POST", url, `{"prompt":"two","max_tokens":1}`) }()
	wait.For(t, waitLimit, "second request waiting", func() bool { return s.waiting.Load() == 1 })
	metrics := do(t, c, "GET", "http://"+s.Addrs().HTTP+"/metrics", "")
	for _, want := range []string{
		`vllm:num_requests_running{engine="0",model_name="Qwen/Qwen3-0.6B"} 1`,
		`vllm:num_requests_waiting{engine="0",model_name="Qwen/Qwen3-0.6B"} 1`,
	} {
		if !bytes.Contains(metrics.body, []byte(want)) {
			t.Errorf("metrics lack %q", want)
		}
	}
	for i := 0; i < 2; i++ {
		if r := <-done; r.status != 200 {
			t.Errorf("request %d: status %d", i, r.status)
		}
	}
	rs := s.Receipts()
	if len(rs) != 2 || rs[1].QueuedUS == 0 && rs[0].QueuedUS == 0 {
		t.Errorf("no receipt shows queueing: %+v", rs)
	}
}

func TestReceiptRing(t *testing.T) {
	l := receiptLog{limit: 3}
	for i := 0; i < 5; i++ {
		l.add(Receipt{Path: fmt.Sprint(i)})
	}
	got := l.snapshot()
	var paths []string
	for _, r := range got {
		paths = append(paths, r.Path)
	}
	if fmt.Sprint(paths) != "[2 3 4]" || got[0].Seq != 3 || got[2].Seq != 5 {
		t.Errorf("ring after 5 adds with limit 3: got %v (seqs %d..%d), want [2 3 4] (3..5)", paths, got[0].Seq, got[2].Seq)
	}
	l.reset()
	if n := len(l.snapshot()); n != 0 {
		t.Errorf("after reset: %d receipts", n)
	}
}
