// Package engines names the inference engines llmgw knows and defines the
// Adapter interface and registry their packages implement. One subpackage
// per engine (vllm, sglang, trtllm, llamacpp) is the only home of that
// engine's contract; engines/all registers them; engines/sim simulates them.
// README.md lists what an adapter provides and the conformance suite it
// passes.
package engines

import (
	"fmt"
	"strings"
)

// Kind names an inference engine. The zero value is not a valid kind; parse
// user input with ParseKind.
type Kind string

const (
	VLLM     Kind = "vllm"
	SGLang   Kind = "sglang"
	TRTLLM   Kind = "trtllm"
	LlamaCpp Kind = "llamacpp"
)

// Kinds lists every engine kind in a stable order (for help text and errors).
func Kinds() []Kind { return []Kind{VLLM, SGLang, TRTLLM, LlamaCpp} }

// ParseKind returns the kind named s, or an error listing the valid names.
func ParseKind(s string) (Kind, error) {
	for _, k := range Kinds() {
		if string(k) == s {
			return k, nil
		}
	}
	names := make([]string, 0, 4)
	for _, k := range Kinds() {
		names = append(names, string(k))
	}
	return "", fmt.Errorf("unknown engine %q: valid engines are %s", s, strings.Join(names, ", "))
}
