package sim

import (
	"encoding/json"
	"fmt"
	"os"
	"testing"

	"github.com/llmgw/llmgw/engines"
	"github.com/llmgw/llmgw/engines/tokenizer"
	"github.com/llmgw/llmgw/internal/testfix"
)

// TestQwen3Tokenizer runs the sim with the real Qwen3 tokenizer.json and
// checks /tokenize against the shelf's reference ids (no special tokens
// added, as with add_special_tokens=false) and the chat path against the
// Qwen3 template's rendering of a user turn.
func TestQwen3Tokenizer(t *testing.T) {
	dir := testfix.Qwen3Dir(t)
	s := startSim(t, Config{Engine: engines.VLLM, KVEvents: KVEventsOff, Tokenizer: dir})
	var fx struct {
		Cases []struct {
			Text string   `json:"text"`
			IDs  []uint32 `json:"ids"`
		} `json:"cases"`
	}
	data, err := os.ReadFile(testfix.Path(t, "tokenizers/Qwen__Qwen3/encode_vectors.json"))
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(data, &fx); err != nil {
		t.Fatal(err)
	}
	c := client(t)
	for i, tc := range fx.Cases {
		t.Run(fmt.Sprint(i), func(t *testing.T) {
			body, _ := json.Marshal(map[string]any{"prompt": tc.Text, "add_special_tokens": false})
			res := do(t, c, "POST", "http://"+s.Addrs().HTTP+"/tokenize", string(body))
			var got struct {
				Tokens []uint32 `json:"tokens"`
			}
			if err := json.Unmarshal(res.body, &got); err != nil {
				t.Fatalf("%d %s: %v", res.status, res.body, err)
			}
			if fmt.Sprint(got.Tokens) != fmt.Sprint(tc.IDs) {
				t.Errorf("tokenize %q: got %v, want %v", tc.Text, got.Tokens, tc.IDs)
			}
		})
	}
	// Chat: <|im_start|>user\nhello<|im_end|>\n<|im_start|>assistant\n
	res := do(t, c, "POST", "http://"+s.Addrs().HTTP+"/v1/chat/completions", `{"messages":[{"role":"user","content":"hello"}],"max_tokens":1}`)
	var chat struct {
		Usage struct {
			PromptTokens int `json:"prompt_tokens"`
		} `json:"usage"`
	}
	if err := json.Unmarshal(res.body, &chat); err != nil || chat.Usage.PromptTokens != 9 {
		t.Errorf("chat prompt tokens: got %d (%s), want 9", chat.Usage.PromptTokens, res.body)
	}
}

// TestOutputWordsAreSingleTokens: each generated word is one token of the
// default (embedded Qwen3) tokenizer, so completion_tokens is the word count.
func TestOutputWordsAreSingleTokens(t *testing.T) {
	tok, err := tokenizer.Qwen3()
	if err != nil {
		t.Fatal(err)
	}
	for _, w := range outputWords {
		if ids := tok.Encode(nil, w); len(ids) != 1 {
			t.Errorf("%q encodes to %d tokens %v, want 1", w, len(ids), ids)
		}
	}
}
