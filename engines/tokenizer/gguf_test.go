package tokenizer

import (
	"bytes"
	"encoding/json"
	"errors"
	"math/rand/v2"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/llmgw/llmgw/internal/testfix"
)

// vocabCase is one text of a llama.cpp vocab test file with the ids the
// Hugging Face tokenizer produced for it (add_special_tokens=False).
type vocabCase struct {
	text string
	ids  []uint32
}

// readVocabCases parses a .inp/.out pair the way llama.cpp's
// tests/test-tokenizer-0.cpp does: texts separated by
// "\n__ggml_vocab_test__\n", one line of space-separated ids per text.
func readVocabCases(t *testing.T, base string) []vocabCase {
	t.Helper()
	inp := string(testfix.Read(t, "tokenizers/gguf-vocab/"+base+".inp"))
	out := string(testfix.Read(t, "tokenizers/gguf-vocab/"+base+".out"))
	const sep = "\n__ggml_vocab_test__\n"
	var texts []string
	for pos := 0; pos < len(inp); {
		next := strings.Index(inp[pos:], sep)
		if next < 0 {
			texts = append(texts, inp[pos:])
			break
		}
		texts = append(texts, inp[pos:pos+next])
		pos += next + len(sep)
	}
	lines := strings.Split(strings.TrimSuffix(out, "\n"), "\n")
	if len(lines) != len(texts) {
		t.Fatalf("%s: %d texts, %d id lines", base, len(texts), len(lines))
	}
	cases := make([]vocabCase, len(texts))
	for i, l := range lines {
		var ids []uint32
		for _, f := range strings.Fields(l) {
			n, err := strconv.ParseUint(f, 10, 32)
			if err != nil {
				t.Fatalf("%s line %d: %v", base, i+1, err)
			}
			ids = append(ids, uint32(n))
		}
		cases[i] = vocabCase{text: texts[i], ids: ids}
	}
	return cases
}

// TestGGUFVocabs: every case of every llama.cpp vocab file encodes, from
// the GGUF metadata alone, to exactly the Hugging Face ids.
func TestGGUFVocabs(t *testing.T) {
	files, err := filepath.Glob(filepath.Join(testfix.Path(t, "tokenizers/gguf-vocab"), "*.gguf"))
	if err != nil || len(files) == 0 {
		t.Fatalf("no vocab files: %v", err)
	}
	for _, f := range files {
		base := filepath.Base(f)
		t.Run(strings.TrimSuffix(strings.TrimPrefix(base, "ggml-vocab-"), ".gguf"), func(t *testing.T) {
			tok, err := LoadGGUF(f)
			if err != nil {
				t.Fatalf("LoadGGUF: %v", err)
			}
			cases := readVocabCases(t, base)
			bad := 0
			for i, c := range cases {
				got := tok.Encode(nil, c.text)
				if !slices.Equal(got, c.ids) {
					bad++
					if bad <= 5 {
						t.Errorf("case %d %q:\n got %v\nwant %v", i, c.text, got, c.ids)
					}
				}
			}
			t.Logf("%s: %d/%d exact", base, len(cases)-bad, len(cases))
		})
	}
}

func TestReadGGUFMetaErrors(t *testing.T) {
	good := testfix.Read(t, "tokenizers/gguf-vocab/ggml-vocab-gpt-2.gguf")
	cases := []struct {
		name string
		data []byte
	}{
		{"empty", nil},
		{"bad magic", []byte("GGML\x03\x00\x00\x00")},
		{"version 1", append([]byte("GGUF"), 1, 0, 0, 0)},
		{"truncated header", good[:10]},
		{"truncated metadata", good[:4000]},
		{"huge kv count", append([]byte("GGUF\x03\x00\x00\x00"), 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x7f)},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			if _, err := readGGUFMeta(bytes.NewReader(tc.data)); err == nil {
				t.Fatal("readGGUFMeta succeeded, want an error")
			}
		})
	}
}

// TestGGUFUnsupported: a GGUF tokenizer this package does not implement is
// refused with an error naming it, wrapping ErrUnsupported.
func TestGGUFUnsupported(t *testing.T) {
	cases := []struct {
		name, key, value, want string
	}{
		{"unknown pre-tokenizer", "tokenizer.ggml.pre", "tekken", `pre-tokenizer "tekken"`},
		{"unigram model", "tokenizer.ggml.model", "t5", `model "t5"`},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			meta, err := openGGUFMeta(testfix.Path(t, "tokenizers/gguf-vocab/ggml-vocab-gpt-2.gguf"))
			if err != nil {
				t.Fatal(err)
			}
			meta[tc.key] = tc.value
			_, err = ggufTokenizer(meta)
			if !errors.Is(err, ErrUnsupported) || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("err %v; want ErrUnsupported naming %s", err, tc.want)
			}
		})
	}
}

// FuzzReadGGUFMeta: arbitrary bytes give metadata or an error, never a
// panic or an unbounded allocation.
func FuzzReadGGUFMeta(f *testing.F) {
	f.Add(testfix.Read(f, "tokenizers/gguf-vocab/ggml-vocab-gpt-2.gguf")[:2048])
	f.Add([]byte("GGUF\x03\x00\x00\x00"))
	f.Fuzz(func(t *testing.T, b []byte) {
		meta, err := readGGUFMeta(bytes.NewReader(b))
		if err == nil {
			_, _ = ggufTokenizer(meta)
		}
	})
}

// BenchmarkEncodeGGUF encodes the benchmark prose with each llama.cpp
// vocabulary loaded from GGUF (one core: go test -bench -cpu 1).
func BenchmarkEncodeGGUF(b *testing.B) {
	files, err := filepath.Glob(filepath.Join(testfix.Path(b, "tokenizers/gguf-vocab"), "*.gguf"))
	if err != nil || len(files) == 0 {
		b.Fatalf("no vocab files: %v", err)
	}
	for _, f := range files {
		b.Run(strings.TrimSuffix(strings.TrimPrefix(filepath.Base(f), "ggml-vocab-"), ".gguf"), func(b *testing.B) {
			tok, err := LoadGGUF(f)
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
		})
	}
}

// TestQwenVocabVectors: llama.cpp's Qwen2 and DeepSeek-R1-Distill-Qwen test
// texts (their .gguf files are not in the snapshot, only the Hugging Face
// ids) encode exactly with the Qwen3 tokenizer.json, which has the same
// vocabulary and merges.
func TestQwenVocabVectors(t *testing.T) {
	tok := qwen3(t)
	for _, base := range []string{"ggml-vocab-qwen2.gguf", "ggml-vocab-deepseek-r1-qwen.gguf"} {
		t.Run(base, func(t *testing.T) {
			cases := readVocabCases(t, base)
			bad := 0
			for i, c := range cases {
				if got := tok.Encode(nil, c.text); !slices.Equal(got, c.ids) {
					bad++
					t.Errorf("case %d %q:\n got %v\nwant %v", i, c.text, got, c.ids)
				}
			}
			t.Logf("%s from tokenizer.json: %d/%d exact", base, len(cases)-bad, len(cases))
		})
	}
}

// TestSPMMatchesLlamaCpp: the SentencePiece vocabularies' encoding (BPE
// over spmMerges) equals a literal transcription of llama.cpp's
// llm_tokenizer_spm_session (refSPMWord below: a queue of adjacent pairs
// whose concatenation is a piece, highest score first, leftmost among
// equal scores, non-pieces written as bytes) on random texts of letters,
// spaces, accents, CJK, emoji and characters outside the vocabulary.
func TestSPMMatchesLlamaCpp(t *testing.T) {
	for _, vocab := range []string{"llama-spm", "phi-3"} {
		t.Run(vocab, func(t *testing.T) {
			tok, err := LoadGGUF(testfix.Path(t, "tokenizers/gguf-vocab/ggml-vocab-"+vocab+".gguf"))
			if err != nil {
				t.Fatal(err)
			}
			alpha := []string{"a", "e", "t", "h", "n", "s", "r", "i", "o", " ", " ", "é", "中", "🦙", "x", "q", "\u0301", "ing", "the", "\n", "1"}
			rng := rand.New(rand.NewPCG(5, 6))
			for iter := 0; iter < 3000; iter++ {
				var b strings.Builder
				for i, n := 0, 1+rng.IntN(80); i < n; i++ {
					b.WriteString(alpha[rng.IntN(len(alpha))])
				}
				text := b.String()
				got := tok.Encode(nil, text)
				want := refSPMWord(tok, nil, strings.ReplaceAll(" "+text, " ", "\u2581"))
				if !slices.Equal(got, want) {
					t.Fatalf("text %q\n got %v\nwant %v (llama.cpp's algorithm)", text, got, want)
				}
			}
		})
	}
}

// refSPMWord is llama.cpp's SentencePiece merge as written there, with the
// vocabulary's scores (reference for TestSPMMatchesLlamaCpp).
func refSPMWord(t *HF, dst []uint32, text string) []uint32 {
	n := utf8.RuneCountInString(text)
	if n == 0 {
		return dst
	}
	start, end := make([]int32, n), make([]int32, n)
	next, prev := make([]int32, n), make([]int32, n)
	k := 0
	for i := 0; i < len(text); k++ {
		_, w := utf8.DecodeRuneInString(text[i:])
		start[k], end[k], prev[k], next[k] = int32(i), int32(i+w), int32(k-1), int32(k+1)
		i += w
	}
	next[n-1] = -1
	var h spmHeap
	add := func(l, r int32) {
		if l < 0 || r < 0 {
			return
		}
		id, ok := t.pieceID[text[start[l]:end[r]]]
		if !ok {
			return
		}
		h.push(spmBigram{score: t.scores[id], left: l, right: r, size: end[r] - start[l]})
	}
	for i := int32(1); i < int32(n); i++ {
		add(i-1, i)
	}
	for len(h) > 0 {
		b := h.pop()
		l, r := b.left, b.right
		if end[l] == start[l] || end[r] == start[r] || end[r]-start[l] != b.size || next[l] != r {
			continue
		}
		end[l] = end[r]
		start[r] = end[r]
		next[l] = next[r]
		if next[r] >= 0 {
			prev[next[r]] = l
		}
		add(prev[l], l)
		add(l, next[l])
	}
	for i := int32(0); i >= 0; i = next[i] {
		sym := text[start[i]:end[i]]
		if id, ok := t.pieceID[sym]; ok {
			dst = append(dst, id)
			continue
		}
		for j := 0; j < len(sym); j++ {
			dst = append(dst, t.byteTok[sym[j]])
		}
	}
	return dst
}

// spmBigram is a merge candidate: higher score first, then leftmost.
type spmBigram struct {
	score       float32
	left, right int32
	size        int32
}

func (a spmBigram) before(b spmBigram) bool {
	return a.score > b.score || (a.score == b.score && a.left < b.left)
}

type spmHeap []spmBigram

func (h *spmHeap) push(v spmBigram) {
	*h = append(*h, v)
	s := *h
	for i := len(s) - 1; i > 0; {
		p := (i - 1) / 2
		if !s[i].before(s[p]) {
			break
		}
		s[p], s[i] = s[i], s[p]
		i = p
	}
}

func (h *spmHeap) pop() spmBigram {
	s := *h
	top := s[0]
	last := len(s) - 1
	s[0] = s[last]
	s = s[:last]
	for i := 0; ; {
		l, small := 2*i+1, i
		if l < len(s) && s[l].before(s[small]) {
			small = l
		}
		if r := l + 1; r < len(s) && s[r].before(s[small]) {
			small = r
		}
		if small == i {
			break
		}
		s[i], s[small] = s[small], s[i]
		i = small
	}
	*h = s
	return top
}

// TestLlamaServerTokenize: the ids a real llama-server answered on
// POST /tokenize (recorded in testdata; the served model's vocabulary is
// the llama-spm one, token for token) reproduce from the GGUF vocabulary,
// without and with the BOS that add_special adds. This is the engine
// itself, not the Hugging Face tokenizer: special-token text is parsed, a
// space is prefixed after each special token.
func TestLlamaServerTokenize(t *testing.T) {
	var fx struct {
		Cases []struct {
			Text       string   `json:"text"`
			IDs        []uint32 `json:"ids"`
			IDsSpecial []uint32 `json:"ids_add_special"`
		} `json:"cases"`
	}
	if err := json.Unmarshal(testfix.Read(t, "tokenizers/llamacpp-tokenize-llama-spm.json"), &fx); err != nil {
		t.Fatal(err)
	}
	tok, err := LoadGGUF(testfix.Path(t, "tokenizers/gguf-vocab/ggml-vocab-llama-spm.gguf"))
	if err != nil {
		t.Fatal(err)
	}
	bos, add := tok.BOS()
	if !add || bos != 1 {
		t.Fatalf("BOS() = %d, %v; want 1, true", bos, add)
	}
	bad := 0
	for i, c := range fx.Cases {
		got := tok.Encode(nil, c.Text)
		withBOS := tok.Encode([]uint32{bos}, c.Text)
		if !slices.Equal(got, c.IDs) || !slices.Equal(withBOS, c.IDsSpecial) {
			bad++
			t.Errorf("case %d %q:\n got %v / %v\nwant %v / %v (llama-server)", i, c.Text, got, withBOS, c.IDs, c.IDsSpecial)
		}
	}
	t.Logf("llama-server /tokenize: %d/%d exact", len(fx.Cases)-bad, len(fx.Cases))
}
