package gateway

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/llmgw/llmgw/engines"
	"github.com/llmgw/llmgw/engines/sim"
	"github.com/llmgw/llmgw/internal/wait"
)

// TestKVTokenizeEndpoint: POST /v1/rules/{name}/tokenize answers the ids the
// worker itself computes (its /tokenize, same body) and the block keys the
// worker then publishes, every block of them, for a chat body; it needs the
// admin token like the mutating routes; a rule without KV-exact is refused.
func TestKVTokenizeEndpoint(t *testing.T) {
	s, err := sim.Start(t.Context(), sim.Config{Engine: engines.VLLM, Model: "m", KVEvents: "tcp://127.0.0.1:0", PrefillPerToken: time.Microsecond})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	gw := startGateway(t, "", func(c *Config) { c.AdminToken = "s3cret" })
	mustApply(t, gw, kvRule(t, "kv", "vllm", 16, []*sim.Sim{s}))
	mustApply(t, gw, "name: plain\nmodel_name: other\nsel: 0\nprobe: {disabled: true}\nendpoints:\n  - {endpointIP: 127.0.0.1, targetPort: 9}\n")
	rt := gw.rules["kv"]
	wait.For(t, 10*time.Second, "stream", func() bool { _, ok, _ := rt.kv.ready(0); return ok })

	body := chatBodyFor(kvPrompt("tokenize endpoint", 6), "what holds my prefix?")
	admin := "http://" + gw.AdminAddr() + "/v1/rules/"
	c := newClient(t)
	call := func(rule, token, body string) (int, []byte) {
		t.Helper()
		req, err := http.NewRequest(http.MethodPost, admin+rule+"/tokenize", strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		if token != "" {
			req.Header.Set("Authorization", "Bearer "+token)
		}
		resp, err := c.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, b
	}
	cases := []struct {
		name, rule, token, body string
		status                  int
	}{
		{"no token", "kv", "", body, http.StatusUnauthorized},
		{"unknown rule", "nope", "s3cret", body, http.StatusNotFound},
		{"not kv-exact", "plain", "s3cret", body, http.StatusBadRequest},
		{"no prompt", "kv", "s3cret", `{"model":"m"}`, http.StatusBadRequest},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			if st, b := call(tc.rule, tc.token, tc.body); st != tc.status {
				t.Errorf("status %d (%s), want %d", st, b, tc.status)
			}
		})
	}

	st, b := call("kv", "s3cret", body)
	if st != http.StatusOK {
		t.Fatalf("tokenize: %d %s", st, b)
	}
	var got KVTokenization
	if err := json.Unmarshal(b, &got); err != nil {
		t.Fatal(err)
	}
	if got.API != "chat" || !strings.HasPrefix(got.Prompt, "<|im_start|>system\n") || len(got.BlockKeys) != len(got.Tokens)/16 || len(got.BlockKeys) < 4 {
		t.Fatalf("answer api %q prompt %.40q, %d tokens, %d keys", got.API, got.Prompt, len(got.Tokens), len(got.BlockKeys))
	}
	// The worker's own /tokenize of the same messages gives the same ids.
	var msgs struct {
		Messages json.RawMessage `json:"messages"`
	}
	if err := json.Unmarshal([]byte(body), &msgs); err != nil {
		t.Fatal(err)
	}
	resp, wb := post(t, c, "http://"+s.Addrs().HTTP+"/tokenize", fmt.Sprintf(`{"model":"m","messages":%s,"add_generation_prompt":true}`, msgs.Messages))
	var wt struct {
		Tokens []uint32 `json:"tokens"`
	}
	if resp.StatusCode != http.StatusOK || json.Unmarshal([]byte(wb), &wt) != nil || !slices.Equal(wt.Tokens, got.Tokens) {
		t.Fatalf("worker /tokenize %d: %v\ngateway: %v", resp.StatusCode, wt.Tokens, got.Tokens)
	}
	// With tools (key order as sent) and chat_template_kwargs, the gateway
	// and the worker render and tokenize the same prompt.
	withTools := `{"model":"m","messages":[{"role":"user","content":"weather in Paris?"}],"tools":[{"type":"function","function":{"name":"get_weather","parameters":{"type":"object","properties":{"city":{"type":"string"}}}}}],"chat_template_kwargs":{"enable_thinking":false}}`
	st, b = call("kv", "s3cret", withTools)
	var gt KVTokenization
	if st != http.StatusOK || json.Unmarshal(b, &gt) != nil || !strings.Contains(gt.Prompt, `{"type": "function", "function": {"name": "get_weather"`) || !strings.HasSuffix(gt.Prompt, "<think>\n\n</think>\n\n") {
		t.Fatalf("tools: %d prompt %q", st, gt.Prompt)
	}
	resp, wb = post(t, c, "http://"+s.Addrs().HTTP+"/tokenize", strings.Replace(withTools, `"model":"m",`, `"model":"m","add_generation_prompt":true,`, 1))
	wt.Tokens = nil
	if resp.StatusCode != http.StatusOK || json.Unmarshal([]byte(wb), &wt) != nil || !slices.Equal(wt.Tokens, gt.Tokens) {
		t.Fatalf("tools: worker /tokenize %d: %v\ngateway: %v", resp.StatusCode, wt.Tokens, gt.Tokens)
	}
	// After the request is served, the worker has published every block.
	post(t, c, "http://"+gw.Addr()+"/v1/chat/completions", body)
	wait.For(t, 10*time.Second, "every block published", func() bool {
		for _, k := range got.BlockKeys {
			if !rt.kv.index.Contains(0, k) {
				return false
			}
		}
		return true
	})
}
