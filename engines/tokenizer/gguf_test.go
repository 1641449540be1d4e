package tokenizer

import (
	"bytes"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"

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
