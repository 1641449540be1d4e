package tokenizer

import (
	"bytes"
	"compress/gzip"
	"encoding/json"
	"io"
	"math/rand/v2"
	"slices"
	"strings"
	"sync"
	"testing"
)

// normCutVariants are the Qwen3 vocabulary under the normalizers and
// pre-tokenizers that cutsSpacedWords accepts, each loaded once.
var normCutVariants = sync.OnceValues(func() (map[string]*HF, error) {
	zr, err := gzip.NewReader(bytes.NewReader(qwen3TokenizerGz))
	if err != nil {
		return nil, err
	}
	raw, err := io.ReadAll(zr)
	if err != nil {
		return nil, err
	}
	split := func(pattern string) map[string]any {
		return map[string]any{"type": "Split", "pattern": map[string]any{"Regex": pattern}, "behavior": "Isolated", "invert": false}
	}
	byteLevel := func(prefix, regex bool) map[string]any {
		return map[string]any{"type": "ByteLevel", "add_prefix_space": prefix, "trim_offsets": false, "use_regex": regex}
	}
	seq := func(p ...any) map[string]any { return map[string]any{"type": "Sequence", "pretokenizers": p} }
	variants := map[string]struct{ normalizer, pre any }{
		"qwen3 as published":               {nil, nil},
		"NFKC":                             {map[string]any{"type": "NFKC"}, nil},
		"gpt2 split":                       {nil, seq(split(gpt2Pattern), byteLevel(false, false))},
		"ByteLevel regex, prefix space":    {nil, byteLevel(true, true)},
		"digits, then llama3":              {nil, seq(split(`\p{N}`), split(llama3Pattern), byteLevel(false, false))},
		"llama3, digit runs, prefix space": {nil, seq(split(llama3Pattern), split(`\p{N}+`), byteLevel(true, false))},
	}
	out := map[string]*HF{}
	for name, v := range variants {
		var f map[string]any
		if err := json.Unmarshal(raw, &f); err != nil {
			return nil, err
		}
		if v.normalizer != nil {
			f["normalizer"] = v.normalizer
		}
		if v.pre != nil {
			f["pre_tokenizer"] = v.pre
		}
		data, err := json.Marshal(f)
		if err != nil {
			return nil, err
		}
		tok, err := LoadHFBytes(name, data, qwen3Config, "")
		if err != nil {
			return nil, err
		}
		out[name] = tok
	}
	return out, nil
})

// normCutText is a random text of the pieces where cutting could go wrong:
// letters on both sides of single and double spaces, contractions, digits,
// combining marks that NFC composes (and NFKC compatibility characters),
// newlines, punctuation, CJK and added tokens.
func normCutText(rng *rand.Rand, n int) string {
	parts := []string{"a", "Ab", " ", "  ", " x", "e\u0301", "\u0301", " \u0301", "'s", "'T", "n't", "12", "3456", " 7", "\n", "\r\n", "\t", "!?", " .", "ﬁ", "①", "中文", "é", "<|im_end|>", "<think>", "\u00a0", "q"}
	var b strings.Builder
	for b.Len() < n {
		b.WriteString(parts[rng.IntN(len(parts))])
	}
	return b.String()
}

// withCut runs fn with tok cut at every spaced word (normChunk 1) or not at
// all.
func withCut(tok *HF, cut bool, fn func()) {
	saveCut, saveChunk := tok.normCut, tok.normChunk
	defer func() { tok.normCut, tok.normChunk = saveCut, saveChunk }()
	tok.normCut, tok.normChunk = cut, 1
	fn()
}

// TestNormCutMatchesWhole: encoding a segment in parts cut before spaced
// words gives the ids of encoding it whole, for every variant, and
// EncodeUntil stops at the same place with the same bound.
func TestNormCutMatchesWhole(t *testing.T) {
	variants, err := normCutVariants()
	if err != nil {
		t.Fatal(err)
	}
	for name, tok := range variants {
		t.Run(name, func(t *testing.T) {
			if !tok.normCut {
				t.Fatal("cutsSpacedWords refused a variant it should cut")
			}
			rng := rand.New(rand.NewPCG(7, uint64(len(name))))
			texts := []string{"", "ab cd", "don't stop", "e\u0301 e\u0301x y", "x \u0301y", "12 34 ab 56", "a  b   c\n d"}
			for range 200 {
				texts = append(texts, normCutText(rng, 1+rng.IntN(400)))
			}
			for _, s := range texts {
				var whole, cut []uint32
				withCut(tok, false, func() { whole = tok.Encode(nil, s) })
				withCut(tok, true, func() { cut = tok.Encode(nil, s) })
				if !slices.Equal(whole, cut) {
					t.Fatalf("%q: cut %v, whole %v", s, cut, whole)
				}
				stop := rng.IntN(len(whole) + 1)
				more := func(ids []uint32) bool { return len(ids) < stop }
				var wIDs, cIDs []uint32
				var wRest, cRest int
				var wDone, cDone bool
				withCut(tok, false, func() { wIDs, wRest, wDone = tok.EncodeUntil(nil, s, more) })
				withCut(tok, true, func() { cIDs, cRest, cDone = tok.EncodeUntil(nil, s, more) })
				if !slices.Equal(wIDs, cIDs) || wRest != cRest || wDone != cDone {
					t.Fatalf("%q stopping at %d ids: cut %v %d %v, whole %v %d %v", s, stop, cIDs, cRest, cDone, wIDs, wRest, wDone)
				}
			}
		})
	}
}

// TestCutsSpacedWords: the tokenizers whose parts could differ from the
// whole are never cut.
func TestCutsSpacedWords(t *testing.T) {
	qwen := qwenScanner{digits: 1}
	nfc := []normStep{{op: normNFC}}
	for _, c := range []struct {
		name    string
		steps   []normStep
		split   splitter
		blRegex splitter
		want    bool
	}{
		{"NFC, Qwen split", nfc, qwen, nil, true},
		{"NFC, ByteLevel regex only", nfc, nil, gpt2Scanner{}, true},
		{"no normalizer: nothing to save", nil, qwen, nil, false},
		{"Replace may match across the cut", []normStep{{op: normNFC}, {op: normReplace, a: "b c", b: "x"}}, qwen, nil, false},
		{"Prepend applies to each part", []normStep{{op: normPrepend, a: "_"}}, qwen, nil, false},
		{"no pre-tokenizer regex: one piece", nfc, nil, nil, false},
		{"digits alone keep letters together", nfc, seqSplitter{numberSplitter{}}, nil, false},
		{"a literal Split", nfc, seqSplitter{literalSplitter{pat: " "}, qwen}, nil, false},
		{"a regex not analysed", nfc, &regexSplitter{}, nil, false},
	} {
		t.Run(c.name, func(t *testing.T) {
			if got := cutsSpacedWords(c.steps, c.split, c.blRegex); got != c.want {
				t.Fatalf("cutsSpacedWords = %v, want %v", got, c.want)
			}
		})
	}
}

func TestSpacedWordCut(t *testing.T) {
	for _, c := range []struct {
		s    string
		min  int
		want int
	}{
		{"ab cd", 1, 2},
		{"ab cd ef", 3, 5},
		{"a  b", 1, 4},
		{"1 2", 1, 3},
		{"ab c", 3, 4},
		{" ab", 1, 3},
		{"ab ", 1, 3},
		{"x y", 0, 1},
	} {
		if got := spacedWordCut(c.s, c.min); got != c.want {
			t.Errorf("spacedWordCut(%q, %d) = %d, want %d", c.s, c.min, got, c.want)
		}
	}
}

// FuzzNormCutMatchesWhole is TestNormCutMatchesWhole on any text, for the
// published Qwen3 tokenizer and the GPT-2 split.
func FuzzNormCutMatchesWhole(f *testing.F) {
	variants, err := normCutVariants()
	if err != nil {
		f.Fatal(err)
	}
	for _, s := range []string{"ab cd", "e\u0301 x y", "don't  go 12 ab\n cd", "<|im_end|>ab cd"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		for _, name := range []string{"qwen3 as published", "gpt2 split"} {
			tok := variants[name]
			var whole, cut []uint32
			withCut(tok, false, func() { whole = tok.Encode(nil, s) })
			withCut(tok, true, func() { cut = tok.Encode(nil, s) })
			if !slices.Equal(whole, cut) {
				t.Fatalf("%s, %q: cut %v, whole %v", name, s, cut, whole)
			}
		}
	})
}

// TestAddedMatcherFindsEveryStart: the segments each gives are those of a
// byte-by-byte scan, whether the added tokens start with one byte
// (IndexByte), several ASCII bytes (IndexAny) or a byte outside ASCII.
func TestAddedMatcherFindsEveryStart(t *testing.T) {
	type seg struct {
		s     string
		id    uint32
		added bool
	}
	// reference is each as a loop over every byte.
	reference := func(m *addedMatcher, text string) []seg {
		var out []seg
		start := 0
		for i := 0; i < len(text); i++ {
			for _, a := range m.byByte[text[i]] {
				if !strings.HasPrefix(text[i:], a.Content) {
					continue
				}
				segEnd, next := i, i+len(a.Content)
				if a.Lstrip {
					for segEnd > start && isSpace(text[segEnd-1]) {
						segEnd--
					}
				}
				if a.Rstrip {
					for next < len(text) && isSpace(text[next]) {
						next++
					}
				}
				if segEnd > start {
					out = append(out, seg{text[start:segEnd], 0, false})
				}
				out = append(out, seg{a.Content, a.ID, true})
				start, i = next, next-1
				break
			}
		}
		if start < len(text) {
			out = append(out, seg{text[start:], 0, false})
		}
		return out
	}
	for _, c := range []struct {
		name string
		toks []hfAddedToken
	}{
		{"one first byte", []hfAddedToken{{ID: 1, Content: "<a>"}, {ID: 2, Content: "<ab>", Rstrip: true}}},
		{"ASCII first bytes", []hfAddedToken{{ID: 1, Content: "<a>", Lstrip: true}, {ID: 2, Content: "[b]"}, {ID: 3, Content: "c"}}},
		{"a first byte outside ASCII", []hfAddedToken{{ID: 1, Content: "<a>"}, {ID: 2, Content: "é!"}}},
	} {
		t.Run(c.name, func(t *testing.T) {
			m := newAddedMatcher(c.toks)
			rng := rand.New(rand.NewPCG(3, uint64(len(c.name))))
			parts := []string{"<a>", "<ab>", "<", "[b]", "[", "c", "é!", "é", " ", "\n", "x", "<a", "b]"}
			for range 500 {
				var b strings.Builder
				for range rng.IntN(20) {
					b.WriteString(parts[rng.IntN(len(parts))])
				}
				text := b.String()
				var got []seg
				m.each(text, func(s string, id uint32, added bool) { got = append(got, seg{s, id, added}) })
				if want := reference(&m, text); !slices.Equal(got, want) && !(len(got) == 1 && got[0].s == "" && len(want) == 0) {
					t.Fatalf("%q: each gives %+v, a byte-by-byte scan %+v", text, got, want)
				}
			}
		})
	}
}
