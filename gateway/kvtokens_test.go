package gateway

import (
	"context"
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"

	"github.com/llmgw/llmgw/engines/tokenizer"
	"github.com/llmgw/llmgw/gateway/openai"
	"github.com/llmgw/llmgw/internal/testfix"
)

// TestTokenCacheEqualsWholeEncoding: segment-by-segment encoding through the
// cache gives exactly the ids of encoding the whole prompt, for the real
// Qwen3 tokenizer, on chat prompts that repeat and
// grow (so the cache is hit).
func TestTokenCacheEqualsWholeEncoding(t *testing.T) {
	hf, err := tokenizer.Qwen3()
	if err != nil {
		t.Fatal(err)
	}
	r, err := hf.ChatRenderer()
	if err != nil {
		t.Fatal(err)
	}
	toks := []struct {
		name   string
		tok    tokenizer.Tokenizer
		render tokenizer.Renderer
	}{{"qwen3", hf, r}}
	rng := rand.New(rand.NewPCG(1, 2))
	words := []string{"the", "cache", " kv", "prefix", "\n", "日本", "!!", "  ", "<|im_end|>", "x.[|", "123", "ünï"}
	for _, tc := range toks {
		t.Run(tc.name, func(t *testing.T) {
			c := mustTokenCache(t, 1<<20, tc.tok)
			if tc.name == "qwen3" && !slices.Contains(c.markers, "<|im_start|>") {
				t.Fatalf("markers %v lack <|im_start|>", c.markers)
			}
			var msgs []tokenizer.Message
			for turn := 0; turn < 30; turn++ {
				var b strings.Builder
				for i := 0; i < 1+rng.IntN(12); i++ {
					b.WriteString(words[rng.IntN(len(words))])
				}
				role := []string{"user", "assistant"}[turn%2]
				if turn == 0 {
					role = "system"
				}
				msgs = append(msgs, tokenizer.Message{Role: role, Content: b.String()})
				text, err := tc.render.Render(msgs, true)
				if err != nil {
					t.Fatal(err)
				}
				want := tc.tok.Encode(nil, text)
				got := c.encode(nil, text, tc.tok)
				if !slices.Equal(got, want) {
					t.Fatalf("turn %d: cached encoding differs\n text %q\n got  %v\n want %v", turn, text, got, want)
				}
			}
			st := c.Stats()
			if st.Hits == 0 {
				t.Errorf("a growing conversation never hit the cache")
			}
			t.Logf("%s: %d hits, %d misses", tc.name, st.Hits, st.Misses)
		})
	}
}

func FuzzTokenCacheEqualsWhole(f *testing.F) {
	f.Add("<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n")
	f.Add("x.[|system|]y<|im_end|><|im_end|>")
	tok, err := tokenizer.Qwen3()
	if err != nil {
		f.Fatal(err)
	}
	f.Fuzz(func(t *testing.T, text string) {
		c := mustTokenCache(t, 1<<20, tok)
		want := tok.Encode(nil, text)
		if got := c.encode(nil, text, tok); !slices.Equal(got, want) {
			t.Fatalf("%q: %v != %v", text, got, want)
		}
	})
}

// TestTokenCacheBoundedByBytes: the segment cache never holds more bytes
// than its bound, however long the prompts, and still answers correctly.
func TestTokenCacheBoundedByBytes(t *testing.T) {
	tok, err := tokenizer.Qwen3()
	if err != nil {
		t.Fatal(err)
	}
	c := mustTokenCache(t, 4096, tok)
	for i := 0; i < 200; i++ {
		text := fmt.Sprintf("<|im_start|>user\nturn %d %s<|im_end|>\n", i, strings.Repeat("word ", i%40))
		if got, want := c.encode(nil, text, tok), tok.Encode(nil, text); !slices.Equal(got, want) {
			t.Fatalf("turn %d: cached encoding differs", i)
		}
		if st := c.Stats(); st.Bytes > 4096 || st.Capacity != 4096 {
			t.Fatalf("turn %d: cache holds %d bytes in %d entries, arena %d, bound 4096", i, st.Bytes, st.Entries, st.Capacity)
		}
	}
	if st := c.Stats(); st.Entries == 0 || st.Hits == 0 {
		t.Fatalf("nothing cached, or nothing found: %+v", st)
	}
}

// TestKVTokenizerBOS: one BOS, never two. A chat prompt takes its BOS from
// the template's bos_token and the tokenizer adds none (vLLM encodes chat
// prompts with add_special_tokens=False); a completions prompt gets the
// tokenizer's BOS. Phi-3's GGUF has both a template that writes bos_token
// and add_bos_token; Qwen3 has neither.
func TestKVTokenizerBOS(t *testing.T) {
	cases := []struct {
		name, source, body string
		kind               openai.Kind
		wantFirst          []uint32 // expected leading ids
		bosCount           int      // how many BOS (id 1) ids in all
	}{
		{"phi-3 chat", "tokenizers/gguf-vocab/ggml-vocab-phi-3.gguf", `{"messages":[{"role":"user","content":"hi"}]}`, openai.Chat, []uint32{1, 32010}, 1},
		{"phi-3 completion", "tokenizers/gguf-vocab/ggml-vocab-phi-3.gguf", `{"prompt":"hi"}`, openai.Completion, []uint32{1}, 1},
		{"phi-3 completion of ids", "tokenizers/gguf-vocab/ggml-vocab-phi-3.gguf", `{"prompt":[7, 8]}`, openai.Completion, []uint32{7, 8}, 0},
		{"qwen3 chat", "", `{"messages":[{"role":"user","content":"hi"}]}`, openai.Chat, []uint32{151644}, 0},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			src := testfix.Qwen3Dir(t)
			if tc.source != "" {
				src = testfix.Path(t, tc.source)
			}
			kt, err := newKVTokenizer(src, "m", "", "", nil, nil, 0)
			if err != nil {
				t.Fatal(err)
			}
			ids, err := kt.tokens(context.Background(), nil, mustParse(t, tc.body), tc.kind)
			if err != nil {
				t.Fatal(err)
			}
			if len(ids) < len(tc.wantFirst) || !slices.Equal(ids[:len(tc.wantFirst)], tc.wantFirst) {
				t.Fatalf("ids %v; want them to start with %v", ids, tc.wantFirst)
			}
			n := 0
			for _, id := range ids {
				if id == 1 && tc.source != "" {
					n++
				}
			}
			if n != tc.bosCount {
				t.Errorf("ids %v hold %d BOS, want %d", ids, n, tc.bosCount)
			}
		})
	}
}

func mustTokenCache(t testing.TB, maxBytes int, tok tokenizer.Tokenizer) *tokenCache {
	t.Helper()
	c, err := newTokenCache(maxBytes, tok)
	if err != nil {
		t.Fatal(err)
	}
	return c
}
