package tokenizer

import (
	"math/rand/v2"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/llmgw/llmgw/internal/testfix"
)

// untilTokenizers are the real tokenizers of testdata: Qwen3's
// tokenizer.json and every GGUF vocabulary (byte-level and SentencePiece).
func untilTokenizers(t *testing.T) map[string]*HF {
	t.Helper()
	out := map[string]*HF{"qwen3": qwen3(t)}
	files, err := filepath.Glob(filepath.Join(testfix.Path(t, "tokenizers/gguf-vocab"), "*.gguf"))
	if err != nil || len(files) == 0 {
		t.Fatalf("no vocab files: %v", err)
	}
	for _, f := range files {
		tok, err := LoadGGUF(f)
		if err != nil {
			t.Fatalf("LoadGGUF %s: %v", f, err)
		}
		out[strings.TrimSuffix(strings.TrimPrefix(filepath.Base(f), "ggml-vocab-"), ".gguf")] = tok
	}
	return out
}

// randomPrompt mixes words, whitespace runs, digits, punctuation, non-ASCII
// text, combining marks and special-token text, the things that decide
// where pre-tokenizer pieces and added tokens fall.
func randomPrompt(rng *rand.Rand) string {
	parts := []string{"the", " gateway", " routes", "  ", "\n", "\n\n", "\t", " 12345", "3.14", "don't", "'s", "!!", "...", " é", "中文字", " 🙂", "e\u0301", "<|im_start|>", "<|im_end|>", "<|endoftext|>", "<s>", "</s>", " ", "ABC", "x_y", "     indented", "\r\n"}
	var b strings.Builder
	for n := rng.IntN(120); n > 0; n-- {
		b.WriteString(parts[rng.IntN(len(parts))])
	}
	return b.String()
}

// TestEncodeUntilIsAPrefixOfEncode: stopped after any number of units,
// EncodeUntil's ids are the first ids of Encode and its rest bound never
// exceeds what Encode appends for the rest; never stopped, it is Encode.
func TestEncodeUntilIsAPrefixOfEncode(t *testing.T) {
	for name, tok := range untilTokenizers(t) {
		t.Run(name, func(t *testing.T) {
			rng := rand.New(rand.NewPCG(7, 8))
			for iter := 0; iter < 400; iter++ {
				text := randomPrompt(rng)
				prefix := []uint32{1, 2} // ids already there (a BOS, a cached segment)
				full := tok.Encode(slices.Clone(prefix), text)
				all, rest, done := tok.EncodeUntil(slices.Clone(prefix), text, func([]uint32) bool { return true })
				if !done || rest != 0 || !slices.Equal(all, full) {
					t.Fatalf("never stopped on %q: done %v rest %d\n got %v\nwant %v", text, done, rest, all, full)
				}
				stopAt := rng.IntN(len(full) + 2)
				refused := false
				got, rest, done := tok.EncodeUntil(slices.Clone(prefix), text, func(ids []uint32) bool {
					if refused {
						t.Fatalf("more asked again after it refused, on %q", text)
					}
					if !slices.Equal(ids, full[:len(ids)]) {
						t.Fatalf("more saw ids that are not a prefix of Encode on %q", text)
					}
					refused = len(ids) >= stopAt
					return !refused
				})
				if !slices.Equal(got, full[:len(got)]) {
					t.Fatalf("stopped at %d on %q: ids are not a prefix of Encode\n got %v\nwant %v", stopAt, text, got, full)
				}
				if done == refused || (done && (rest != 0 || len(got) != len(full))) {
					t.Fatalf("done %v (more refused: %v) with %d of %d ids, rest %d, on %q", done, refused, len(got), len(full), rest, text)
				}
				if len(got)+rest > len(full) {
					t.Fatalf("bound %d+%d exceeds the %d ids of %q", len(got), rest, len(full), text)
				}
				// Counting cut short once the bound reaches want: the
				// same ids, a bound of at least want (or the whole
				// count), never above the truth.
				want := rng.IntN(rest + 2)
				got2, rest2, done2 := tok.EncodeUntilEnough(slices.Clone(prefix), text, func(ids []uint32) bool { return len(ids) < stopAt }, func(r int) bool { return r >= want })
				if !slices.Equal(got2, got) || done2 != done || rest2 > rest || (rest2 < want && rest2 != rest) {
					t.Fatalf("EncodeUntilEnough(want %d) on %q: %d ids rest %d done %v; EncodeUntil: %d ids rest %d done %v", want, text, len(got2), rest2, done2, len(got), rest, done)
				}
			}
		})
	}
}
