package policy

import (
	"strconv"
	"strings"

	"github.com/llmgw/llmgw/gateway/upstream"
)

// builtin is one selection policy known to New.
type builtin struct {
	sel   int
	name  string
	build func(Config, []*upstream.Endpoint) (Picker, error)
}

// builtins lists every policy, in sel order. It is the only registration
// point; TestBuiltinsUnique rejects a duplicate sel or name.
var builtins = [...]builtin{
	{0, "round-robin", func(_ Config, eps []*upstream.Endpoint) (Picker, error) { return newRoundRobin(eps), nil }},
	{2, "weighted-round-robin", func(_ Config, eps []*upstream.Endpoint) (Picker, error) { return newWeightedRR(eps), nil }},
	{3, "session-affinity", func(cfg Config, eps []*upstream.Endpoint) (Picker, error) { return newSession(cfg, eps), nil }},
	{4, "least-inflight", func(_ Config, eps []*upstream.Endpoint) (Picker, error) { return newLeastInFlight(eps), nil }},
	{8, "chwbl", func(cfg Config, eps []*upstream.Endpoint) (Picker, error) { return newCHWBL(cfg, eps, false) }},
	{10, "weighted-chwbl", func(cfg Config, eps []*upstream.Endpoint) (Picker, error) { return newCHWBL(cfg, eps, true) }},
}

func lookupBuiltin(sel int) (builtin, bool) {
	for _, b := range builtins {
		if b.sel == sel {
			return b, true
		}
	}
	return builtin{}, false
}

// SelName returns the policy name for sel ("round-robin", "chwbl", ...),
// and false for a sel no policy implements.
func SelName(sel int) (string, bool) {
	b, ok := lookupBuiltin(sel)
	return b.name, ok
}

// Sels returns the valid sel values in ascending order, for validation
// messages and documentation. The caller owns the returned slice.
func Sels() []int {
	out := make([]int, len(builtins))
	for i, b := range builtins {
		out[i] = b.sel
	}
	return out
}

// validSels formats the valid sel values for error messages:
// "0 round-robin, 2 weighted-round-robin, ...".
func validSels() string {
	var sb strings.Builder
	for i, b := range builtins {
		if i > 0 {
			sb.WriteString(", ")
		}
		sb.WriteString(strconv.Itoa(b.sel))
		sb.WriteByte(' ')
		sb.WriteString(b.name)
	}
	return sb.String()
}
