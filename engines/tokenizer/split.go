package tokenizer

import (
	"encoding/json"
	"fmt"
	"strings"
)

// seqSplitter applies splitters in order, each to every piece of the one
// before: a Sequence of Split pre-tokenizers in tokenizer.json, and the
// list of regexes llama.cpp applies for a GGUF pre-tokenizer type (each
// regex splits the fragments the previous one produced).
type seqSplitter []splitter

func (q seqSplitter) split(s string, fn func(piece string)) {
	q.splitFrom(0, s, fn)
}

func (q seqSplitter) splitFrom(i int, s string, fn func(piece string)) {
	if i == len(q) {
		fn(s)
		return
	}
	q[i].split(s, func(p string) { q.splitFrom(i+1, p, fn) })
}

// literalSplitter is a Split pre-tokenizer with a String pattern.
// MergedWithPrevious joins each match to the text before it; Isolated
// makes matches pieces of their own.
type literalSplitter struct {
	pat        string
	mergedPrev bool
}

func (l literalSplitter) split(s string, fn func(piece string)) {
	for s != "" {
		i := strings.Index(s, l.pat)
		if i < 0 {
			fn(s)
			return
		}
		end := i + len(l.pat)
		if l.mergedPrev {
			fn(s[:end])
		} else {
			if i > 0 {
				fn(s[:i])
			}
			fn(s[i:end])
		}
		s = s[end:]
	}
}

// newSplit builds the splitter of one Split pre-tokenizer.
func newSplit(c hfComponent) (splitter, error) {
	if c.Invert {
		return nil, fmt.Errorf("%w: inverted Split", ErrUnsupported)
	}
	var p struct {
		Regex  *string `json:"Regex"`
		String *string `json:"String"`
	}
	if err := json.Unmarshal(c.Pattern, &p); err != nil {
		return nil, fmt.Errorf("tokenizer: parse Split pattern: %w", err)
	}
	switch {
	case p.String != nil && *p.String != "":
		switch c.Behavior {
		case "Isolated":
			return literalSplitter{pat: *p.String}, nil
		case "MergedWithPrevious":
			return literalSplitter{pat: *p.String, mergedPrev: true}, nil
		}
		return nil, fmt.Errorf("%w: Split behavior %q", ErrUnsupported, c.Behavior)
	case p.Regex != nil && *p.Regex != "":
		if c.Behavior != "Isolated" {
			return nil, fmt.Errorf("%w: Split behavior %q with a regex", ErrUnsupported, c.Behavior)
		}
		return regexSplit(*p.Regex)
	}
	return nil, fmt.Errorf("%w: Split with an empty pattern", ErrUnsupported)
}

// regexSplit returns the fastest exact splitter for an Isolated regex
// split: the hand-written scanners for the Qwen2/Qwen3, Llama-3 and GPT-2
// patterns, regexp2 otherwise.
func regexSplit(pattern string) (splitter, error) {
	switch pattern {
	case qwenPattern:
		return qwenScanner{digits: 1}, nil
	case llama3Pattern:
		return qwenScanner{digits: 3}, nil
	case gpt2Pattern, gpt2NoTailPattern:
		return gpt2Scanner{}, nil
	case `\p{N}`:
		return numberSplitter{}, nil
	case `\p{N}+`:
		return numberSplitter{run: true}, nil
	}
	return newRegexSplitter(pattern)
}
