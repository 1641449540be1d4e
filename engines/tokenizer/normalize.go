package tokenizer

import (
	"encoding/json"
	"fmt"
	"strings"

	"golang.org/x/text/unicode/norm"
)

// normStep is one normalizer of tokenizer.json that this package
// implements. Steps run in order on each text segment between added tokens,
// as in the Hugging Face library (added tokens are cut out first; see
// addedMatcher).
type normStep struct {
	op   normOp
	a, b string // prepend: a; replace: a -> b
}

type normOp uint8

const (
	normNFC normOp = iota
	normNFKC
	normPrepend // Prepend: a before a non-empty segment
	normReplace // Replace with a String pattern
)

func applyNorm(steps []normStep, s string) string {
	for _, st := range steps {
		switch st.op {
		case normNFC:
			s = norm.NFC.String(s)
		case normNFKC:
			s = norm.NFKC.String(s)
		case normPrepend:
			if s != "" {
				s = st.a + s
			}
		case normReplace:
			s = strings.ReplaceAll(s, st.a, st.b)
		}
	}
	return s
}

// parseNormalizer reads tokenizer.json's normalizer: NFC, NFKC, Prepend,
// Replace (String pattern) and Sequence of these. Anything else, including a
// Replace with a Regex pattern, is ErrUnsupported.
func parseNormalizer(raw json.RawMessage) ([]normStep, error) {
	if len(raw) == 0 || string(raw) == "null" {
		return nil, nil
	}
	var n hfComponent
	if err := json.Unmarshal(raw, &n); err != nil {
		return nil, fmt.Errorf("tokenizer: parse normalizer: %w", err)
	}
	var steps []normStep
	var walk func(n hfComponent) error
	walk = func(n hfComponent) error {
		switch n.Type {
		case "NFC":
			steps = append(steps, normStep{op: normNFC})
		case "NFKC":
			steps = append(steps, normStep{op: normNFKC})
		case "Prepend":
			steps = append(steps, normStep{op: normPrepend, a: n.Prepend})
		case "Replace":
			p, err := stringPattern(n.Pattern)
			if err != nil {
				return fmt.Errorf("normalizer Replace: %w", err)
			}
			steps = append(steps, normStep{op: normReplace, a: p, b: n.Content})
		case "Sequence":
			for _, c := range n.Normalizers {
				if err := walk(c); err != nil {
					return err
				}
			}
		default:
			return fmt.Errorf("%w: normalizer %q", ErrUnsupported, n.Type)
		}
		return nil
	}
	if err := walk(n); err != nil {
		return nil, err
	}
	return steps, nil
}

// stringPattern reads a {"String": "..."} pattern; a Regex pattern is
// ErrUnsupported where only literal patterns are implemented.
func stringPattern(raw json.RawMessage) (string, error) {
	var p struct {
		Regex  *string `json:"Regex"`
		String *string `json:"String"`
	}
	if err := json.Unmarshal(raw, &p); err != nil {
		return "", fmt.Errorf("tokenizer: parse pattern: %w", err)
	}
	if p.String == nil || *p.String == "" {
		return "", fmt.Errorf("%w: a non-literal or empty pattern", ErrUnsupported)
	}
	return *p.String, nil
}
