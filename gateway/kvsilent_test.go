package gateway

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/llmgw/llmgw/engines"
	"github.com/llmgw/llmgw/engines/sim"
	"github.com/llmgw/llmgw/gateway/rule"
	"github.com/llmgw/llmgw/internal/testfix"
	"github.com/llmgw/llmgw/internal/wait"
)

// bareTokenizer copies the Qwen3 tokenizer.json alone into a directory of
// its own (no tokenizer_config.json beside it) and returns its path and the
// chat template its config held, written to a file of its own.
func bareTokenizer(t *testing.T) (tok, template string) {
	t.Helper()
	src := testfix.Qwen3Dir(t)
	data, err := os.ReadFile(src)
	if err != nil {
		t.Fatal(err)
	}
	cfg, err := os.ReadFile(filepath.Join(filepath.Dir(src), "tokenizer_config.json"))
	if err != nil {
		t.Fatal(err)
	}
	var c struct {
		ChatTemplate string `json:"chat_template"`
	}
	if err := json.Unmarshal(cfg, &c); err != nil || c.ChatTemplate == "" {
		t.Fatalf("the Qwen3 config has no chat template: %v", err)
	}
	dir := t.TempDir()
	tok = filepath.Join(dir, "tokenizer.json")
	template = filepath.Join(t.TempDir(), "qwen3.jinja")
	if err := os.WriteFile(tok, data, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(template, []byte(c.ChatTemplate), 0o644); err != nil {
		t.Fatal(err)
	}
	return tok, template
}

// TestKVExactTokenizerWithoutChatTemplate: a KV-exact rule whose tokenizer
// is a bare tokenizer.json (no chat template) used to be admitted and ready
// while every chat request missed (miss=tokenize). It is refused, naming
// the missing tokenizer_config.json; given kvChatTemplate it routes chat
// requests with hits.
func TestKVExactTokenizerWithoutChatTemplate(t *testing.T) {
	tok, tpl := bareTokenizer(t)
	cases := []struct {
		name     string
		template string
		wantCode string // "" = admitted and hitting
		wantMsg  string
	}{
		{name: "bare tokenizer.json is refused", wantCode: rule.CodeKVTokenizer, wantMsg: "tokenizer_config.json"},
		{name: "bare tokenizer.json with kvChatTemplate hits", template: tpl},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			s, err := sim.Start(t.Context(), sim.Config{Engine: engines.VLLM, Model: "m", KVEvents: "tcp://127.0.0.1:0", PrefillPerToken: time.Microsecond})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { s.Close() })
			y := kvTokenizerLine.ReplaceAllString(kvRule(t, "kv", "vllm", 16, []*sim.Sim{s}), fmt.Sprintf("kvTokenizer: %q\n", tok))
			if tc.template != "" {
				y += fmt.Sprintf("kvChatTemplate: %q\n", tc.template)
			}
			gw := startGateway(t, "", nil)
			_, err = gw.Apply(mustDecode(t, y), false)
			if tc.wantCode != "" {
				var ae *rule.AdmissionError
				if !errors.As(err, &ae) || ae.Code != tc.wantCode || !strings.Contains(ae.Message, tc.wantMsg) {
					t.Fatalf("Apply: %v; want a %s refusal naming %s", err, tc.wantCode, tc.wantMsg)
				}
				if _, err := gw.Rule("kv"); !errors.Is(err, ErrRuleNotFound) {
					t.Errorf("a refused rule is installed: %v", err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			rt := gw.rules["kv"]
			wait.For(t, 10*time.Second, "the event stream", func() bool { _, conn, _ := rt.kv.ready(0); return conn })
			c := newClient(t)
			url := "http://" + gw.Addr() + "/v1/chat/completions"
			system := kvPrompt("chat template", 8)
			if resp, out := post(t, c, url, chatBodyFor(system, "q1")); resp.StatusCode != 200 {
				t.Fatalf("warm: %d %s", resp.StatusCode, out)
			}
			wait.For(t, 10*time.Second, "inventory", func() bool { return rt.kv.index.Blocks(0) > 0 })
			resp, _ := post(t, c, url, chatBodyFor(system, "q2"))
			if route := resp.Header.Get("X-Llmgw-Route"); !strings.HasPrefix(route, "kv-exact hit=") {
				t.Errorf("follow-up route %q; want a kv-exact hit rendered with kvChatTemplate", route)
			}
		})
	}
}

// TestKVExactEngineTokenizerUsesTokenIDs: with kvTokenizer "engine", a
// completions prompt given as token ids is used as given, like the local
// tokenizers do; it used to be sent to /tokenize (miss=tokenize_engine).
func TestKVExactEngineTokenizerUsesTokenIDs(t *testing.T) {
	cases := []struct {
		name, prompt string
		wantCalls    int64
	}{
		{"one prompt of ids", `[1,2,3,4,5,6,7,8,9,10,11,12,13,14,15,16,17,18,19,20]`, 0},
		{"a list of prompts of ids", `[[1,2,3,4,5,6,7,8,9,10,11,12,13,14,15,16,17]]`, 0},
		{"text goes to /tokenize", `"hello"`, 1},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			var calls atomic.Int64
			srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				if r.URL.Path == "/tokenize" {
					calls.Add(1)
					w.Header().Set("Content-Type", "application/json")
					fmt.Fprint(w, `{"tokens":[1,2,3],"count":3,"max_model_len":4096}`)
					return
				}
				w.Header().Set("Content-Type", "application/json")
				fmt.Fprint(w, `{"id":"x","object":"text_completion","created":1,"model":"m","choices":[{"index":0,"text":"ok","finish_reason":"stop"}],"usage":{"prompt_tokens":1,"completion_tokens":1,"total_tokens":2}}`)
			}))
			t.Cleanup(srv.Close)
			h, p := hostPort(t, strings.TrimPrefix(srv.URL, "http://"))
			gw := startGateway(t, "", nil)
			mustApply(t, gw, fmt.Sprintf("name: kv\nmodel_name: m\nsel: 8\nkvEngineType: vllm\nkvExactMode: 3\nkvTokenizer: engine\nprobe: {disabled: true}\nendpoints:\n  - {id: w1, endpointIP: %s, targetPort: %d, kvEventsEndpoint: \"tcp://127.0.0.1:9\"}\n", h, p))
			resp, out := post(t, newClient(t), "http://"+gw.Addr()+"/v1/completions", `{"model":"m","max_tokens":1,"prompt":`+tc.prompt+`}`)
			if resp.StatusCode != 200 {
				t.Fatalf("%d %s", resp.StatusCode, out)
			}
			route := resp.Header.Get("X-Llmgw-Route")
			if calls.Load() != tc.wantCalls {
				t.Errorf("/tokenize called %d times (route %q); want %d", calls.Load(), route, tc.wantCalls)
			}
			if strings.Contains(route, "miss=tokenize") {
				t.Errorf("route %q: the prompt was not tokenized", route)
			}
		})
	}
}
