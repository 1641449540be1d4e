package tokenizer

import (
	"fmt"
	"strings"
	"unicode"
	"unicode/utf8"

	"github.com/dlclark/regexp2/v2"
)

// splitter cuts normalized text into pre-tokens ("pieces") that BPE encodes
// independently. Implementations are safe for concurrent use.
type splitter interface {
	// split calls fn with consecutive substrings of s that together cover s
	// exactly, in order.
	split(s string, fn func(piece string))
}

// qwenPattern is the Split pre-tokenizer regex of the Qwen2, Qwen2.5 and
// Qwen3 tokenizers. It needs a negative lookahead, which Go's regexp lacks;
// qwenScanner implements exactly this pattern by hand.
const qwenPattern = `(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+`

// llama3Pattern is the Split pre-tokenizer regex of the Llama-3.x
// tokenizers (Qwen's with digit runs of up to three); llama.cpp's
// llama-vocab.cpp quotes it as the "original regex from tokenizer.json" of
// its LLAMA3 pre-tokenizer type.
const llama3Pattern = `(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+`

// gpt2Pattern is the regex the ByteLevel pre-tokenizer applies when its
// use_regex flag is set (GPT-2 and RoBERTa style tokenizers).
const gpt2Pattern = `'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+`

// Character classes of the pre-tokenizer patterns. \s is Unicode
// White_Space (what Go's unicode.IsSpace reports, and what Oniguruma, the
// regex engine of the Hugging Face tokenizers library, uses); \p{L} and \p{N}
// are the general categories.
const (
	clsOther   uint8 = iota // none of the below: punctuation, symbols, controls
	clsLetter               // \p{L}
	clsNumber               // \p{N}
	clsSpace                // \s other than \r and \n
	clsNewline              // \r or \n
)

var asciiClass = func() [utf8.RuneSelf]uint8 {
	var t [utf8.RuneSelf]uint8
	for c := 0; c < utf8.RuneSelf; c++ {
		t[c] = classOf(rune(c))
	}
	return t
}()

func classOf(r rune) uint8 {
	switch {
	case r == '\r' || r == '\n':
		return clsNewline
	case unicode.IsLetter(r):
		return clsLetter
	case unicode.IsNumber(r):
		return clsNumber
	case unicode.IsSpace(r):
		return clsSpace
	}
	return clsOther
}

// runeAt decodes the rune at s[i:] and its class. An invalid UTF-8 byte is a
// rune of width 1 in class clsOther (it decodes as U+FFFD, a symbol), which
// keeps byte-level encoding lossless for any input.
func runeAt(s string, i int) (r rune, w int, cls uint8) {
	c := s[i]
	if c < utf8.RuneSelf {
		return rune(c), 1, asciiClass[c]
	}
	r, w = utf8.DecodeRuneInString(s[i:])
	return r, w, classOf(r)
}

// qwenScanner is a hand-written matcher for qwenPattern (digits 1) and
// llama3Pattern (digits 3), which differ only in `\p{N}` versus
// `\p{N}{1,3}`. It reproduces the regex's leftmost-first alternation,
// including the backtracking of `\s*[\r\n]+` and `\s+(?!\S)`; the fuzz
// target FuzzQwenScannerMatchesRegex checks it against regexp2 running the
// patterns themselves.
type qwenScanner struct {
	digits int // most number runes in one piece
}

func (q qwenScanner) split(s string, fn func(piece string)) {
	for i := 0; i < len(s); {
		j := qwenPieceEnd(s, i, q.digits)
		fn(s[i:j])
		i = j
	}
}

// qwenPieceEnd returns the end of the pattern's match starting at i < len(s).
// The pattern matches every character, so a match always starts at i and is
// never empty.
func qwenPieceEnd(s string, i, digits int) int {
	r, w, cls := runeAt(s, i)
	// (?i:'s|'t|'re|'ve|'m|'ll|'d)
	if r == '\'' && i+1 < len(s) {
		if n := contractionLen(s[i+1:]); n > 0 {
			return i + 1 + n
		}
	}
	// [^\r\n\p{L}\p{N}]?\p{L}+
	if cls == clsLetter {
		return letterRunEnd(s, i+w)
	}
	if cls == clsOther || cls == clsSpace {
		if i+w < len(s) {
			if _, w2, c2 := runeAt(s, i+w); c2 == clsLetter {
				return letterRunEnd(s, i+w+w2)
			}
		}
	}
	// \p{N} or \p{N}{1,3}
	if cls == clsNumber {
		j := i + w
		for k := 1; k < digits && j < len(s); k++ {
			_, w2, c2 := runeAt(s, j)
			if c2 != clsNumber {
				break
			}
			j += w2
		}
		return j
	}
	// ` ?[^\s\p{L}\p{N}]+[\r\n]*`
	start := -1
	if cls == clsOther {
		start = i
	} else if r == ' ' && i+1 < len(s) {
		if _, _, c2 := runeAt(s, i+1); c2 == clsOther {
			start = i + 1
		}
	}
	if start >= 0 {
		j := start
		for j < len(s) {
			_, w2, c2 := runeAt(s, j)
			if c2 != clsOther {
				break
			}
			j += w2
		}
		for j < len(s) && (s[j] == '\r' || s[j] == '\n') {
			j++
		}
		return j
	}
	// The rune is whitespace. Find the run, its last newline and the start
	// of its last rune.
	j, lastNL, lastStart := i, -1, i
	for j < len(s) {
		_, w2, c2 := runeAt(s, j)
		if c2 != clsSpace && c2 != clsNewline {
			break
		}
		if c2 == clsNewline {
			lastNL = j
		}
		lastStart = j
		j += w2
	}
	switch {
	case lastNL >= 0: // \s*[\r\n]+ backtracks to the run's last newline
		return lastNL + 1
	case j == len(s): // \s+(?!\S) at the end of the text
		return j
	case lastStart > i: // \s+(?!\S) gives back the last space to the next word
		return lastStart
	default: // \s+ of a single space before a non-space
		return j
	}
}

// contractionLen reports the length after the apostrophe of a
// case-insensitive 's, 't, 're, 've, 'm, 'll or 'd at the start of s, or 0.
// Case-insensitive matching uses Unicode simple case folding, under which
// U+017F (long s) is an 's'.
func contractionLen(s string) int {
	if strings.HasPrefix(s, "\u017f") {
		return len("\u017f")
	}
	if !isASCIILetter(s[0]) {
		return 0
	}
	second := func(want byte) int {
		if len(s) >= 2 && isASCIILetter(s[1]) && s[1]|0x20 == want {
			return 2
		}
		return 0
	}
	switch s[0] | 0x20 {
	case 's', 't', 'm', 'd':
		return 1
	case 'r', 'v':
		return second('e')
	case 'l':
		return second('l')
	}
	return 0
}

func isASCIILetter(c byte) bool { return (c|0x20) >= 'a' && (c|0x20) <= 'z' }

func letterRunEnd(s string, j int) int {
	for j < len(s) {
		c := s[j]
		if c < utf8.RuneSelf {
			if asciiClass[c] != clsLetter {
				return j
			}
			j++
			continue
		}
		r, w := utf8.DecodeRuneInString(s[j:])
		if !unicode.IsLetter(r) {
			return j
		}
		j += w
	}
	return j
}

// regexSplitter implements a Split pre-tokenizer with behavior "Isolated"
// for any pattern, using regexp2 (which supports lookaround). Matches and
// the gaps between them are both pieces.
type regexSplitter struct {
	re *regexp2.Regexp
}

func newRegexSplitter(pattern string) (*regexSplitter, error) {
	re, err := regexp2.Compile(pattern, regexp2.Unicode)
	if err != nil {
		return nil, fmt.Errorf("tokenizer: compile split pattern: %w", err)
	}
	return &regexSplitter{re: re}, nil
}

func (rs *regexSplitter) split(s string, fn func(piece string)) {
	if s == "" {
		return
	}
	// regexp2 reports rune offsets; map them to byte offsets. An invalid
	// UTF-8 byte is one rune, as in regexp2's own conversion.
	offs := make([]int, 0, len(s)+1)
	for i := 0; i < len(s); {
		offs = append(offs, i)
		_, w := utf8.DecodeRuneInString(s[i:])
		i += w
	}
	offs = append(offs, len(s))
	pos := 0
	m, err := rs.re.FindStringMatch(s)
	for err == nil && m != nil {
		start, end := offs[m.RuneIndex], offs[m.RuneIndex+m.RuneLength]
		if start > pos {
			fn(s[pos:start])
		}
		if end > start {
			fn(s[start:end])
		}
		pos = end
		m, err = rs.re.FindNextMatch(m)
	}
	// A matching error (only a timeout, which is not set) leaves the rest
	// as one piece rather than dropping text.
	if pos < len(s) {
		fn(s[pos:])
	}
}

// gpt2NoTailPattern is gpt2Pattern without its final `|\s+`, as llama.cpp
// writes the GPT-2 split (llama-vocab.cpp); the two split every text the
// same way (a lone whitespace rune that `\s+(?!\S)` rejects is a piece of
// its own either way), so one scanner serves both.
const gpt2NoTailPattern = `'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)`

// gpt2Scanner is a hand-written matcher for gpt2Pattern (and
// gpt2NoTailPattern): case-sensitive contractions, then an optional space
// before a run of letters, of numbers or of other symbols, then whitespace
// runs that leave their last rune to the next piece. The fuzz target
// FuzzQwenScannerMatchesRegex checks it against regexp2 running both patterns.
type gpt2Scanner struct{}

func (gpt2Scanner) split(s string, fn func(piece string)) {
	for i := 0; i < len(s); {
		j := gpt2PieceEnd(s, i)
		fn(s[i:j])
		i = j
	}
}

// classRunEnd returns the end of the run of runes of class cls from j.
func classRunEnd(s string, j int, cls uint8) int {
	if cls == clsLetter {
		return letterRunEnd(s, j)
	}
	for j < len(s) {
		_, w, c := runeAt(s, j)
		if c != cls {
			break
		}
		j += w
	}
	return j
}

func gpt2PieceEnd(s string, i int) int {
	_, w, cls := runeAt(s, i)
	// 's|'t|'re|'ve|'m|'ll|'d (case-sensitive)
	if s[i] == '\'' && i+1 < len(s) {
		switch s[i+1] {
		case 's', 't', 'm', 'd':
			return i + 2
		case 'r', 'v':
			if i+2 < len(s) && s[i+2] == 'e' {
				return i + 3
			}
		case 'l':
			if i+2 < len(s) && s[i+2] == 'l' {
				return i + 3
			}
		}
	}
	// ` ?\p{L}+`, ` ?\p{N}+`, ` ?[^\s\p{L}\p{N}]+`
	switch cls {
	case clsLetter, clsNumber, clsOther:
		return classRunEnd(s, i+w, cls)
	}
	if s[i] == ' ' && i+1 < len(s) {
		if _, w2, c2 := runeAt(s, i+1); c2 == clsLetter || c2 == clsNumber || c2 == clsOther {
			return classRunEnd(s, i+1+w2, c2)
		}
	}
	// Whitespace: `\s+(?!\S)` takes the run, or all of it but its last rune
	// when a non-space follows; a lone rune before a non-space is `\s+`.
	j, lastStart := i, i
	for j < len(s) {
		_, w2, c2 := runeAt(s, j)
		if c2 != clsSpace && c2 != clsNewline {
			break
		}
		lastStart = j
		j += w2
	}
	if j == len(s) || lastStart == i {
		return j
	}
	return lastStart
}

// numberSplitter is the Isolated split on `\p{N}` (each number rune a piece
// of its own; run false) or `\p{N}+` (runs of them; run true), the text
// between them pieces too. The digit splits of StarCoder, EXAONE and
// DeepSeek vocabularies come first in their sequences, so this is on every
// token's path.
type numberSplitter struct{ run bool }

func (n numberSplitter) split(s string, fn func(piece string)) {
	gap := 0
	for i := 0; i < len(s); {
		_, w, cls := runeAt(s, i)
		if cls != clsNumber {
			i += w
			continue
		}
		if gap < i {
			fn(s[gap:i])
		}
		j := i + w
		if n.run {
			j = classRunEnd(s, j, clsNumber)
		}
		fn(s[i:j])
		i, gap = j, j
	}
	if gap < len(s) {
		fn(s[gap:])
	}
}
