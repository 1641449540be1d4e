package tokenizer

import (
	"encoding/json"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// TestSpecialTokenParity reproduces the ids a real vLLM produced for a
// completions prompt that opens with the literal "<|im_end|>". The fixture
// was recorded with the Qwen2.5-7B-Instruct tokenizer; the Qwen3
// tokenizer.json holds the same special ids (151643..151645) and the same
// BPE vocabulary and merges for ordinary text, so the Qwen3 tokenizer must
// give exactly those ids. The test checks both claims: the special-id table
// and the ids.
func TestSpecialTokenParity(t *testing.T) {
	tok := qwen3(t)
	var fx struct {
		Prompt        string            `json:"prompt"`
		SpecialIDs    map[string]uint32 `json:"special_token_ids"`
		VLLMIDs       []uint32          `json:"vllm_authoritative_ids"`
		VLLMLen       int               `json:"vllm_len"`
		DauletModeDif struct {
			SplitIDs []uint32 `json:"split_form_daulet_withspecial_ids"`
		} `json:"daulet_mode_diff"`
	}
	readFixture(t, "kv_hash/kv_special_token_parity.json", &fx)

	for text, want := range fx.SpecialIDs {
		t.Run("special id "+text, func(t *testing.T) {
			if got := tok.Encode(nil, text); !slices.Equal(got, []uint32{want}) {
				t.Errorf("Encode(%q) = %v, want [%d]", text, got, want)
			}
		})
	}
	t.Run("prompt ids", func(t *testing.T) {
		got := tok.Encode(nil, fx.Prompt)
		if !slices.Equal(got, fx.VLLMIDs) || len(got) != fx.VLLMLen {
			t.Errorf("Encode(%q)\n got %v\nwant %v (len %d)", fx.Prompt, got, fx.VLLMIDs, fx.VLLMLen)
		}
		if back := tok.Decode(got); back != fx.Prompt {
			t.Errorf("Decode = %q, want %q", back, fx.Prompt)
		}
	})
	t.Run("split form is ordinary BPE of the same text", func(t *testing.T) {
		// The "encode special tokens" mode the fixture rejects splits the
		// marker into six ordinary tokens; they must be the BPE ids of that
		// text followed by the same tail, which confirms the vocabularies
		// agree beyond the special ids.
		split := fx.DauletModeDif.SplitIDs
		got := tok.encodeOrdinary(nil, fx.Prompt)
		if !slices.Equal(got, split) {
			t.Errorf("ordinary encoding\n got %v\nwant %v", got, split)
		}
		if len(split) > 6 && !slices.Equal(split[6:], fx.VLLMIDs[1:]) {
			t.Errorf("split tail %v, want %v", split[6:], fx.VLLMIDs[1:])
		}
	})
}

// TestChatTemplateParity renders the cases of kv_chat_template_parity.json
// with a ChatML Jinja template that follows the Qwen2.5 rules written in
// that file (testdata/chatml_qwen25_rules.jinja), through the same Jinja
// renderer the HF tokenizers use, and checks the rendered string and that
// Encode(rendered) equals the ids vLLM's apply_chat_template produced.
func TestChatTemplateParity(t *testing.T) {
	tok := qwen3(t)
	var fx struct {
		SpecialIDs map[string]uint32 `json:"special_token_ids"`
		Cases      map[string]struct {
			Messages []struct {
				Role    string `json:"role"`
				Content string `json:"content"`
			} `json:"messages"`
			Rendered string   `json:"rendered_exact"`
			IDs      []uint32 `json:"templated_ids"`
			Len      int      `json:"templated_len"`
		} `json:"cases"`
	}
	readFixture(t, "kv_hash/kv_chat_template_parity.json", &fx)
	src, err := os.ReadFile(filepath.Join("testdata", "chatml_qwen25_rules.jinja"))
	if err != nil {
		t.Fatalf("read template: %v", err)
	}
	r, err := NewJinjaRenderer(string(src), map[string]string{"eos_token": "<|im_end|>"})
	if err != nil {
		t.Fatalf("NewJinjaRenderer: %v", err)
	}
	if len(fx.Cases) != 3 {
		t.Fatalf("fixture has %d cases, want 3", len(fx.Cases))
	}
	names := make([]string, 0, len(fx.Cases))
	for name := range fx.Cases {
		names = append(names, name)
	}
	slices.Sort(names)
	for _, name := range names {
		tc := fx.Cases[name]
		t.Run(name, func(t *testing.T) {
			msgs := make([]Message, len(tc.Messages))
			for i, m := range tc.Messages {
				msgs[i] = Message{Role: m.Role, Content: m.Content}
			}
			got, err := r.Render(msgs, true)
			if err != nil {
				t.Fatalf("Render: %v", err)
			}
			if got != tc.Rendered {
				t.Errorf("rendered\n got %q\nwant %q", got, tc.Rendered)
			}
			ids := tok.Encode(nil, got)
			if !slices.Equal(ids, tc.IDs) || len(ids) != tc.Len {
				t.Errorf("Encode(rendered)\n got %v\nwant %v (len %d)", ids, tc.IDs, tc.Len)
			}
		})
	}
	for text, want := range fx.SpecialIDs {
		if got := tok.Encode(nil, text); !slices.Equal(got, []uint32{want}) {
			t.Errorf("Encode(%q) = %v, want [%d]", text, got, want)
		}
	}
}

// TestQwen3ChatTemplate renders Qwen3's own template (from the fixture's
// tokenizer_config.json) for plain chats. The expected strings follow the
// template's rules: no default system turn; an assistant turn before the
// last user query loses its <think> block; with a generation prompt the
// assistant header is appended.
func TestQwen3ChatTemplate(t *testing.T) {
	tok := qwen3(t)
	r, err := tok.ChatRenderer()
	if err != nil {
		t.Fatalf("ChatRenderer: %v", err)
	}
	cases := []struct {
		name   string
		msgs   []Message
		genPro bool
		want   string
	}{
		{
			name:   "system and user",
			msgs:   []Message{{"system", "You are terse."}, {"user", "Hi"}},
			genPro: true,
			want:   "<|im_start|>system\nYou are terse.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n",
		},
		{
			name:   "user only has no default system",
			msgs:   []Message{{"user", "What is 2+2?"}},
			genPro: true,
			want:   "<|im_start|>user\nWhat is 2+2?<|im_end|>\n<|im_start|>assistant\n",
		},
		{
			name:   "multi-turn",
			msgs:   []Message{{"user", "What is 2+2?"}, {"assistant", "4"}, {"user", "And times 3?"}},
			genPro: true,
			want:   "<|im_start|>user\nWhat is 2+2?<|im_end|>\n<|im_start|>assistant\n4<|im_end|>\n<|im_start|>user\nAnd times 3?<|im_end|>\n<|im_start|>assistant\n",
		},
		{
			name:   "no generation prompt",
			msgs:   []Message{{"user", "Hi"}},
			genPro: false,
			want:   "<|im_start|>user\nHi<|im_end|>\n",
		},
		{
			name:   "earlier reasoning is dropped",
			msgs:   []Message{{"user", "hi"}, {"assistant", "<think>\nhmm\n</think>\n\nhello"}, {"user", "again"}},
			genPro: true,
			want:   "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\nhello<|im_end|>\n<|im_start|>user\nagain<|im_end|>\n<|im_start|>assistant\n",
		},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			got, err := r.Render(tc.msgs, tc.genPro)
			if err != nil {
				t.Fatalf("Render: %v", err)
			}
			if got != tc.want {
				t.Errorf("Render\n got %q\nwant %q", got, tc.want)
			}
			// A rendered chat encodes with its markers as single ids.
			ids := tok.Encode(nil, got)
			if n := strings.Count(got, "<|im_start|>"); countID(ids, 151644) != n {
				t.Errorf("Encode(rendered) has %d <|im_start|> ids, want %d", countID(ids, 151644), n)
			}
		})
	}
	t.Run("enable_thinking false via RenderWith", func(t *testing.T) {
		jr, ok := r.(*JinjaRenderer)
		if !ok {
			t.Fatalf("ChatRenderer() is %T, want *JinjaRenderer", r)
		}
		got, err := jr.RenderWith([]Message{{"user", "Hi"}}, true, map[string]any{"enable_thinking": false})
		want := "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n"
		if err != nil || got != want {
			t.Errorf("RenderWith = %q, %v; want %q", got, err, want)
		}
	})
	t.Run("renderer is cached", func(t *testing.T) {
		r2, err := tok.ChatRenderer()
		if err != nil || r2 != r {
			t.Errorf("second ChatRenderer() = %p, %v; want the same renderer %p", r2, err, r)
		}
	})
}

func countID(ids []uint32, id uint32) int {
	n := 0
	for _, x := range ids {
		if x == id {
			n++
		}
	}
	return n
}

// TestQwen3TemplateMatchesJinja2 renders 40 generated conversations (system
// or not, user/assistant/tool roles, <think> and <tool_response> content,
// enable_thinking true/false/absent) with Qwen3's template and compares
// with Python Jinja2 under transformers' settings, recorded in
// testdata/qwen3_template_jinja2.json by gen_qwen3_template_cases.py.
func TestQwen3TemplateMatchesJinja2(t *testing.T) {
	tok := qwen3(t)
	r, err := tok.ChatRenderer()
	if err != nil {
		t.Fatalf("ChatRenderer: %v", err)
	}
	jr, ok := r.(*JinjaRenderer)
	if !ok {
		t.Fatalf("ChatRenderer() is %T, want *JinjaRenderer", r)
	}
	data, err := os.ReadFile(filepath.Join("testdata", "qwen3_template_jinja2.json"))
	if err != nil {
		t.Fatal(err)
	}
	var fx struct {
		Cases []struct {
			Name      string         `json:"name"`
			Messages  []Message      `json:"messages"`
			GenPrompt bool           `json:"add_generation_prompt"`
			Kwargs    map[string]any `json:"kwargs"`
			Rendered  string         `json:"rendered"`
		} `json:"cases"`
	}
	if err := json.Unmarshal(data, &fx); err != nil {
		t.Fatal(err)
	}
	if len(fx.Cases) != 40 {
		t.Fatalf("got %d cases, want 40", len(fx.Cases))
	}
	for _, tc := range fx.Cases {
		t.Run(tc.Name, func(t *testing.T) {
			got, err := jr.RenderWith(tc.Messages, tc.GenPrompt, tc.Kwargs)
			if err != nil {
				t.Fatalf("RenderWith: %v", err)
			}
			if got != tc.Rendered {
				t.Errorf("rendered\n got %q\nwant %q", got, tc.Rendered)
			}
		})
	}
}
