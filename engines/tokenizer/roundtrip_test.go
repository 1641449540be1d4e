package tokenizer

import (
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"unicode/utf8"

	"go.uber.org/goleak"
	"golang.org/x/text/unicode/norm"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// qwen3Regexp2 is the Qwen3 tokenizer with its pre-tokenizer run by regexp2
// on the pattern text instead of the hand-written scanner.
func qwen3Regexp2(tb testing.TB) *HF {
	tb.Helper()
	base := qwen3(tb)
	rs, err := newRegexSplitter(qwenPattern)
	if err != nil {
		tb.Fatalf("newRegexSplitter: %v", err)
	}
	c := &HF{name: base.name, model: base.model, norm: base.norm, split: rs, added: base.added, idToBytes: base.idToBytes, idKnown: base.idKnown}
	return c
}

// TestScannerMatchesRegexp2 runs the encode vectors through both
// pre-tokenizers: the scanner is used only because it is equal and faster.
func TestScannerMatchesRegexp2(t *testing.T) {
	viaRegex := qwen3Regexp2(t)
	var ev encodeVectors
	readFixture(t, "tokenizers/Qwen__Qwen3/encode_vectors.json", &ev)
	for i, tc := range ev.Cases {
		t.Run(caseName(i, tc.Text), func(t *testing.T) {
			if got := viaRegex.Encode(nil, tc.Text); !slices.Equal(got, tc.IDs) {
				t.Errorf("regexp2 Encode(%q)\n got %v\nwant %v", tc.Text, got, tc.IDs)
			}
			var a, b []string
			qwenScanner{digits: 1}.split(tc.Text, func(p string) { a = append(a, p) })
			viaRegex.split.split(tc.Text, func(p string) { b = append(b, p) })
			if !slices.Equal(a, b) {
				t.Errorf("pieces differ\nscanner %q\nregexp2 %q", a, b)
			}
		})
	}
}

func TestRoundTrip(t *testing.T) {
	tok := qwen3(t)
	long := strings.Repeat("ab", 3000) + strings.Repeat(" ", 5000) + "x"
	cases := []struct {
		name string
		text string
	}{
		{"empty", ""},
		{"prose", "The quick brown fox jumps over the lazy dog."},
		{"specials", "<|im_start|>user\nhi<|im_end|>\n<think>\n</think>"},
		{"broken special", "<|im_sta <| <|im_end| <think"},
		{"utf8", "naïve café — 日本語 🙂 Ελληνικά"},
		{"long piece", long},
		{"invalid utf8", "\xff\xfe abc \xc3"},
		{"long s contraction", "it'ſ ok"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			ids := tok.Encode(nil, tc.text)
			if got := tok.Decode(ids); got != tc.text {
				t.Errorf("Decode(Encode(%q)) = %q", tc.text, got)
			}
		})
	}
	t.Run("encode appends", func(t *testing.T) {
		dst := []uint32{7}
		got := tok.Encode(dst, "Hello")
		if !slices.Equal(got, []uint32{7, 9707}) {
			t.Errorf("Encode([7], Hello) = %v, want [7 9707]", got)
		}
	})
	t.Run("unknown ids skipped", func(t *testing.T) {
		if got := tok.Decode([]uint32{9707, 1 << 30, 1879}); got != "Hello world" {
			t.Errorf("Decode = %q, want %q", got, "Hello world")
		}
	})
}

// FuzzEncodeRoundTrip: Encode never panics, and byte-level BPE is lossless
// up to the tokenizer's own NFC normalizer: for valid UTF-8 that is already
// NFC, Decode(Encode(s)) == s. Valid non-NFC input is normalized per segment
// between special tokens (as the engine does), which need not equal NFC of
// the whole string, so only the no-panic property is checked for it; for
// invalid UTF-8 without added tokens the bytes must come back as NFC leaves
// them.
func FuzzEncodeRoundTrip(f *testing.F) {
	tok := qwen3(f)
	for _, s := range []string{"hello <|im_end|> world", "\xff\xfe  x", "e\u0301", "It's  \r\n\n 12 ab", "<|im_start|><think>"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		ids := tok.Encode(nil, s)
		got := tok.Decode(ids)
		if utf8.ValidString(s) && norm.NFC.IsNormalString(s) && got != s {
			t.Fatalf("Decode(Encode(%q)) = %q", s, got)
		}
		if !utf8.ValidString(s) && !strings.Contains(s, "<") {
			// Without added tokens there is one segment; invalid bytes pass
			// through the normalizer and byte-level BPE unchanged.
			if want := norm.NFC.String(s); got != want {
				t.Fatalf("Decode(Encode(%q)) = %q, want %q", s, got, want)
			}
		}
	})
}

// FuzzQwenScannerMatchesRegex checks the hand-written scanners (Qwen,
// Llama-3, GPT-2) against regexp2 running their patterns, on valid UTF-8 (the library's input is
// always valid UTF-8; invalid bytes have no reference behaviour).
func FuzzQwenScannerMatchesRegex(f *testing.F) {
	res := make([]*regexSplitter, len(scannerPatterns))
	for i, sc := range scannerPatterns {
		var err error
		if res[i], err = newRegexSplitter(sc.pattern); err != nil {
			f.Fatal(err)
		}
	}
	for _, s := range []string{"It'S a  test\r\n\n  x", "  ", "a\u00a0\u00a0b", "'ll'LL'Re", "x ...\n\n", "١٢ abc", "\t\tfoo"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		if !utf8.ValidString(s) {
			return
		}
		for i, sc := range scannerPatterns {
			var a, b []string
			sc.scanner.split(s, func(p string) { a = append(a, p) })
			res[i].split(s, func(p string) { b = append(b, p) })
			if !slices.Equal(a, b) {
				t.Fatalf("%s: split(%q)\nscanner %q\nregexp2 %q", sc.name, s, a, b)
			}
		}
	})
}

// FuzzParseHF: a malformed tokenizer.json is refused with an error, never a
// panic. Seeds are small valid and broken documents.
func FuzzParseHF(f *testing.F) {
	for _, s := range []string{
		`{"model":{"type":"BPE","vocab":{"a":0},"merges":[]},"pre_tokenizer":{"type":"ByteLevel"}}`,
		`{"model":{"type":"BPE","vocab":{},"merges":["a b"]},"pre_tokenizer":{"type":"Sequence","pretokenizers":[{"type":"Split","pattern":{"Regex":"\\s+"},"behavior":"Isolated"},{"type":"ByteLevel","use_regex":false}]}}`,
		`{"added_tokens":[{"id":5,"content":""}],"normalizer":{"type":"Sequence","normalizers":[{"type":"NFC"}]}}`,
		`{"model":{"vocab":{"a":4294967295}}}`,
		`[]`, `null`, `{`,
	} {
		f.Add([]byte(s))
	}
	if data, err := os.ReadFile(filepath.Join("testdata", "chatml_qwen25_rules.jinja")); err == nil {
		f.Add(data)
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		tok, err := parseHF(data)
		if err == nil {
			// A document that loads must encode and decode without panics.
			tok.Decode(tok.Encode(nil, "abc <x> 12"))
		}
	})
}

// TestScannerMatchesRegexp2Random compares the scanner with regexp2 on
// pseudo-random strings over the characters where the pattern is subtle:
// whitespace kinds (NBSP, U+2028, NEL, \v, \f), CR/LF, apostrophes and
// contraction letters (with the long s), digits, punctuation, combining
// marks and non-Latin letters. The seed is fixed, so a failure reproduces.
func TestScannerMatchesRegexp2Random(t *testing.T) {
	alpha := []rune{'a', 'B', ' ', ' ', '\n', '\r', '\t', '\'', 's', 'L', 'e', 'l', 'r', 'v', 'd', 'm', 't', '1', '2', '3', '4', '.', '!', '\u00a0', 'é', '中', '\u2028', '\u0301', '🙂', '\v', '\f', 0x85, 0x17F, '٣'}
	for _, sc := range scannerPatterns {
		t.Run(sc.name, func(t *testing.T) {
			rs, err := newRegexSplitter(sc.pattern)
			if err != nil {
				t.Fatal(err)
			}
			rng := rand.New(rand.NewPCG(1, 2))
			for iter := 0; iter < 20000; iter++ {
				r := make([]rune, rng.IntN(40))
				for i := range r {
					r[i] = alpha[rng.IntN(len(alpha))]
				}
				s := string(r)
				var a, b []string
				sc.scanner.split(s, func(p string) { a = append(a, p) })
				rs.split(s, func(p string) { b = append(b, p) })
				if !slices.Equal(a, b) {
					t.Fatalf("split(%q)\nscanner %q\nregexp2 %q", s, a, b)
				}
			}
		})
	}
}

// scannerPatterns pairs each hand-written scanner with the pattern(s) it
// implements.
var scannerPatterns = []struct {
	name    string
	scanner splitter
	pattern string
}{
	{"qwen", qwenScanner{digits: 1}, qwenPattern},
	{"llama3", qwenScanner{digits: 3}, llama3Pattern},
	{"gpt2", gpt2Scanner{}, gpt2Pattern},
	{"gpt2 llama.cpp", gpt2Scanner{}, gpt2NoTailPattern},
	{"digit", numberSplitter{}, `\p{N}`},
	{"digits", numberSplitter{run: true}, `\p{N}+`},
}

// TestBPEHeapMatchesScan checks the heap-based merge used for long pieces
// against the array scan on the Qwen3 merges, for pieces of every length
// class: repetitive runs (many equal-rank pairs), words and whitespace.
func TestBPEHeapMatchesScan(t *testing.T) {
	m := &qwen3(t).model
	rng := rand.New(rand.NewPCG(3, 4))
	cases := []struct {
		name  string
		alpha string
	}{
		{"letters", "abcdefghijklmnopqrstuvwxyz"},
		{"repetitive", "ab"},
		{"single letter", "a"},
		{"spaces", " "},
		{"mixed bytes", "ab \n\t.é中\xff"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			for iter := 0; iter < 200; iter++ {
				b := make([]byte, 2+rng.IntN(300))
				for i := range b {
					b[i] = tc.alpha[rng.IntN(len(tc.alpha))]
				}
				piece := string(b)
				ids := make([]uint32, len(piece))
				for i := range ids {
					ids[i] = m.byteID[piece[i]]
				}
				scan := m.mergeScan(slices.Clone(ids))
				heap := m.mergeHeap(nil, ids)
				if !slices.Equal(scan, heap) {
					t.Fatalf("piece %q\nscan %v\nheap %v", piece, scan, heap)
				}
			}
		})
	}
}

// TestConcurrentUse encodes, decodes and renders from several goroutines at
// once; run with -race it checks the concurrency-safety contract.
func TestConcurrentUse(t *testing.T) {
	tok := qwen3(t)
	r, err := tok.ChatRenderer()
	if err != nil {
		t.Fatal(err)
	}
	msgs := []Message{{Role: "system", Content: "Be brief."}, {Role: "user", Content: "It's 2+2?"}}
	wantText, err := r.Render(msgs, true)
	if err != nil {
		t.Fatal(err)
	}
	wantIDs := tok.Encode(nil, wantText)
	const workers = 4
	errs := make(chan string, workers)
	var wg sync.WaitGroup
	for w := 0; w < workers; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; i < 50; i++ {
				text, err := r.Render(msgs, true)
				if err != nil || text != wantText {
					errs <- fmt.Sprintf("Render = %q, %v", text, err)
					return
				}
				if ids := tok.Encode(nil, text); !slices.Equal(ids, wantIDs) || tok.Decode(ids) != text {
					errs <- fmt.Sprintf("Encode = %v, want %v", ids, wantIDs)
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for e := range errs {
		t.Error(e)
	}
}

// TestScannerEdgeCases pins the scanner's pieces on the pattern's subtle
// alternatives and checks each against regexp2.
func TestScannerEdgeCases(t *testing.T) {
	rs, err := newRegexSplitter(qwenPattern)
	if err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		name string
		text string
		want []string
	}{
		{"contractions any case", "I'M he'Ll we'rE they'VE it'S", []string{"I", "'M", " he", "'Ll", " we", "'rE", " they", "'VE", " it", "'S"}},
		{"long s folds to s", "it'ſ", []string{"it", "'ſ"}},
		{"not a contraction", "'x 'r 'l", []string{"'x", " '", "r", " '", "l"}},
		{"apostrophe at end", "a'", []string{"a", "'"}},
		{"spaces give one back", "a   b", []string{"a", "  ", " b"}},
		{"trailing spaces kept whole", "a   ", []string{"a", "   "}},
		{"newline run ends at last newline", "a \n \n  b", []string{"a", " \n \n", " ", " b"}},
		{"punctuation takes newlines", "x!?\r\n\ny", []string{"x", "!?\r\n\n", "y"}},
		{"space before punctuation", "a ..b", []string{"a", " ..", "b"}},
		{"digits one by one", "x2024", []string{"x", "2", "0", "2", "4"}},
		{"tab leads a word", "\tfoo", []string{"\tfoo"}},
		{"newline does not lead a word", "\nfoo", []string{"\n", "foo"}},
		{"nbsp is whitespace", "a\u00a0\u00a0b", []string{"a", "\u00a0", "\u00a0b"}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			var got, viaRegex []string
			qwenScanner{digits: 1}.split(tc.text, func(p string) { got = append(got, p) })
			rs.split(tc.text, func(p string) { viaRegex = append(viaRegex, p) })
			if !slices.Equal(got, tc.want) {
				t.Errorf("scanner split(%q) = %q, want %q", tc.text, got, tc.want)
			}
			if !slices.Equal(viaRegex, tc.want) {
				t.Errorf("regexp2 split(%q) = %q, want %q", tc.text, viaRegex, tc.want)
			}
		})
	}
}
