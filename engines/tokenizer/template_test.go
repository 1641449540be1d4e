package tokenizer

import (
	"encoding/json"
	"path/filepath"
	"strings"
	"testing"

	"github.com/llmgw/llmgw/internal/testfix"
)

// TestChatTemplatesMatchJinja2 renders the catalog families' published
// chat templates (Qwen2.5, Llama-3.1, Gemma-2, EXAONE-3.5; Qwen3 has its own
// test) for generated conversations — with and without a system turn, with
// and without the generation prompt, with tools where the template has
// them, out-of-order turns — and compares byte for byte with Python Jinja2
// under transformers' apply_chat_template settings
// (testdata/chat-templates/gen_rendered.py). A template that raises
// (Gemma's "System role not supported") must fail here too.

func TestChatTemplatesMatchJinja2(t *testing.T) {
	files, err := filepath.Glob(filepath.Join(testfix.Path(t, "chat-templates/rendered"), "*.json"))
	if err != nil || len(files) != 4 {
		t.Fatalf("rendered cases: %v (%d files, want 4)", err, len(files))
	}
	for _, f := range files {
		var fx struct {
			Template  string            `json:"template"`
			Variables map[string]string `json:"variables"`
			Cases     []struct {
				Name      string          `json:"name"`
				Messages  []Message       `json:"messages"`
				GenPrompt bool            `json:"add_generation_prompt"`
				Tools     json.RawMessage `json:"tools"`
				Rendered  *string         `json:"rendered"`
				Error     string          `json:"error"`
			} `json:"cases"`
		}
		if err := json.Unmarshal(testfix.Read(t, "chat-templates/rendered/"+filepath.Base(f)), &fx); err != nil {
			t.Fatal(err)
		}
		t.Run(strings.TrimSuffix(fx.Template, ".jinja"), func(t *testing.T) {
			r, err := NewJinjaRenderer(string(testfix.Read(t, "chat-templates/"+fx.Template)), fx.Variables)
			if err != nil {
				t.Fatalf("NewJinjaRenderer: %v", err)
			}
			for _, tc := range fx.Cases {
				t.Run(tc.Name, func(t *testing.T) {
					var extra map[string]any
					if tc.Tools != nil {
						extra = map[string]any{"tools": JSONValue(tc.Tools)}
					}
					got, err := r.RenderWith(tc.Messages, tc.GenPrompt, extra)
					if tc.Rendered == nil {
						if err == nil || !strings.Contains(err.Error(), tc.Error) {
							t.Fatalf("RenderWith = %q, %v; want an error saying %q", got, err, tc.Error)
						}
						return
					}
					if err != nil {
						t.Fatalf("RenderWith: %v", err)
					}
					if got != *tc.Rendered {
						t.Errorf("rendered\n got %q\nwant %q", got, *tc.Rendered)
					}
				})
			}
		})
	}
}

// FuzzJSONToValue: a template variable decoded from arbitrary bytes is a
// value or an error, never a panic (key order is checked by
// TestChatTemplatesMatchJinja2's tool cases).
func FuzzJSONToValue(f *testing.F) {
	f.Add([]byte(`[{"type":"function","function":{"name":"f","parameters":{"b":1,"a":[true,null,1.5]}}}]`))
	f.Add([]byte(`{"z":{"y":{"x":"\u00e9"}}}`))
	f.Add([]byte(`[1,2`))
	f.Fuzz(func(t *testing.T, b []byte) {
		v, err := jsonToValue(b)
		if err != nil {
			return
		}
		_ = v.String()
	})
}

// BenchmarkRenderTemplates renders a 4-message chat (system, user,
// assistant, user; Gemma without the system turn it refuses) with each
// catalog family's published template.
func BenchmarkRenderTemplates(b *testing.B) {
	for _, name := range []string{"Qwen-Qwen2.5-7B-Instruct", "meta-llama-Llama-3.1-8B-Instruct", "google-gemma-2-2b-it", "LGAI-EXAONE-EXAONE-3.5-7.8B-Instruct"} {
		b.Run(name, func(b *testing.B) {
			r, err := NewJinjaRenderer(string(testfix.Read(b, "chat-templates/"+name+".jinja")), map[string]string{"bos_token": "<s>", "eos_token": "</s>"})
			if err != nil {
				b.Fatal(err)
			}
			msgs := []Message{
				{Role: "system", Content: "You are a helpful assistant."},
				{Role: "user", Content: "What is the capital of France?"},
				{Role: "assistant", Content: "The capital of France is Paris."},
				{Role: "user", Content: "And of Germany?"},
			}
			if strings.HasPrefix(name, "google-gemma") {
				msgs = msgs[1:]
			}
			for b.Loop() {
				if _, err := r.Render(msgs, true); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
