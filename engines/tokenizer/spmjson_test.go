package tokenizer

import (
	"encoding/json"
	"slices"
	"sort"
	"testing"
	"unicode/utf8"

	"github.com/llmgw/llmgw/internal/testfix"
)

// llamaTokenizerJSON builds the tokenizer.json that transformers'
// LlamaConverter writes for a SentencePiece BPE model (transformers,
// src/transformers/convert_slow_tokenizer.py: SentencePieceExtractor's
// merge generation, LlamaConverter's normalizer, decoder and special
// tokens, legacy mode), from the pieces and scores of the llama-spm GGUF
// vocabulary. No published Llama-2 tokenizer.json is in the repository;
// this exercises the tokenizer.json SentencePiece path (byte fallback,
// Prepend/Replace normalizers, merges by rank, added tokens) against the
// Hugging Face ids of the same vocabulary's test file.
func llamaTokenizerJSON(t testing.TB) []byte {
	t.Helper()
	meta, err := openGGUFMeta(testfix.Path(t, "tokenizers/gguf-vocab/ggml-vocab-llama-spm.gguf"))
	if err != nil {
		t.Fatal(err)
	}
	toks := meta.strings("tokenizer.ggml.tokens")
	scores := meta.floats("tokenizer.ggml.scores")
	vocab := make(map[string]int, len(toks))
	for id, p := range toks {
		vocab[p] = id
	}
	type merge struct {
		l, r  string
		score float64
	}
	var merges []merge
	for id, p := range toks { // vocab_scores in id order
		var local []merge
		for i := range p {
			if i == 0 {
				continue
			}
			l, r := p[:i], p[i:]
			if !utf8.ValidString(l) || !utf8.ValidString(r) {
				continue
			}
			if _, ok := vocab[l]; !ok {
				continue
			}
			if _, ok := vocab[r]; !ok {
				continue
			}
			local = append(local, merge{l, r, scores[id]})
		}
		sort.SliceStable(local, func(i, j int) bool {
			if vocab[local[i].l] != vocab[local[j].l] {
				return vocab[local[i].l] < vocab[local[j].l]
			}
			return vocab[local[i].r] < vocab[local[j].r]
		})
		merges = append(merges, local...)
	}
	// sorted(key=(score, len(l), len(r)), reverse=True), stable.
	sort.SliceStable(merges, func(i, j int) bool {
		a, b := merges[i], merges[j]
		if a.score != b.score {
			return a.score > b.score
		}
		if la, lb := utf8.RuneCountInString(a.l), utf8.RuneCountInString(b.l); la != lb {
			return la > lb
		}
		return utf8.RuneCountInString(a.r) > utf8.RuneCountInString(b.r)
	})
	pairs := make([][2]string, len(merges))
	for i, m := range merges {
		pairs[i] = [2]string{m.l, m.r}
	}
	doc := map[string]any{
		"added_tokens": []map[string]any{
			{"id": 0, "content": "<unk>", "special": true},
			{"id": 1, "content": "<s>", "special": true},
			{"id": 2, "content": "</s>", "special": true},
		},
		"normalizer": map[string]any{"type": "Sequence", "normalizers": []any{
			map[string]any{"type": "Prepend", "prepend": "\u2581"},
			map[string]any{"type": "Replace", "pattern": map[string]any{"String": " "}, "content": "\u2581"},
		}},
		"pre_tokenizer": nil,
		"post_processor": map[string]any{"type": "TemplateProcessing", "single": []any{
			map[string]any{"SpecialToken": map[string]any{"id": "<s>", "type_id": 0}},
			map[string]any{"Sequence": map[string]any{"id": "A", "type_id": 0}},
		}},
		"decoder": map[string]any{"type": "Sequence", "decoders": []any{
			map[string]any{"type": "Replace", "pattern": map[string]any{"String": "\u2581"}, "content": " "},
			map[string]any{"type": "ByteFallback"},
			map[string]any{"type": "Fuse"},
			map[string]any{"type": "Strip", "content": " ", "start": 1, "stop": 0},
		}},
		"model": map[string]any{"type": "BPE", "vocab": vocab, "merges": pairs, "byte_fallback": true, "unk_token": "<unk>", "fuse_unk": true},
	}
	data, err := json.Marshal(doc)
	if err != nil {
		t.Fatal(err)
	}
	return data
}

// TestSentencePieceTokenizerJSON: the tokenizer.json form of the Llama-2
// vocabulary gives the Hugging Face ids of every test case, the same ids
// as its GGUF form, and decodes back to the text.
func TestSentencePieceTokenizerJSON(t *testing.T) {
	tok, err := LoadHFBytes("llama-spm", llamaTokenizerJSON(t), nil, "")
	if err != nil {
		t.Fatalf("LoadHFBytes: %v", err)
	}
	if tok.kind != kindCharBPE {
		t.Fatalf("kind = %d, want SentencePiece-style BPE", tok.kind)
	}
	if id, add := tok.BOS(); id != 1 || !add {
		t.Errorf("BOS() = %d, %v; want 1, true (post-processor)", id, add)
	}
	cases := readVocabCases(t, "ggml-vocab-llama-spm.gguf")
	bad := 0
	for i, c := range cases {
		got := tok.Encode(nil, c.text)
		if !slices.Equal(got, c.ids) {
			bad++
			t.Errorf("case %d %q:\n got %v\nwant %v", i, c.text, got, c.ids)
			continue
		}
		if dec := tok.Decode(got); dec != c.text && c.text != "" && c.text[0] != ' ' {
			t.Errorf("case %d: Decode = %q, want %q", i, dec, c.text)
		}
	}
	t.Logf("tokenizer.json llama-spm: %d/%d exact", len(cases)-bad, len(cases))
}

// BenchmarkEncodeSentencePieceJSON encodes the benchmark prose with the
// tokenizer.json form of the Llama-2 vocabulary (merges by rank over
// characters, no pre-tokenizer: one piece per segment).
func BenchmarkEncodeSentencePieceJSON(b *testing.B) {
	tok, err := LoadHFBytes("llama-spm", llamaTokenizerJSON(b), nil, "")
	if err != nil {
		b.Fatal(err)
	}
	n := len(tok.Encode(nil, benchProse))
	dst := make([]uint32, 0, n)
	b.SetBytes(int64(len(benchProse)))
	for b.Loop() {
		dst = tok.Encode(dst[:0], benchProse)
	}
	b.ReportMetric(float64(n)*float64(b.N)/b.Elapsed().Seconds(), "tokens/s")
}
