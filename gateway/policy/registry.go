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
	reads Inputs
	build func(Config, []*upstream.Endpoint) (Picker, error)
}

// Inputs says which parts of a Request a policy reads, so that the gateway
// computes only those (Exclude is always read).
type Inputs struct {
	Key     bool // KeyHash, HasKey
	Conv    bool // ConvHash, HasConv
	Session bool // Session
}

// InputsOf is what the policy for sel reads of a Request (zero for a sel
// no policy implements).
func InputsOf(sel int) Inputs {
	b, _ := lookupBuiltin(sel)
	return b.reads
}

// builtins lists every policy, in sel order. It is the only registration
// point; TestBuiltinsUnique rejects a duplicate sel or name.
var builtins = [...]builtin{
	{0, "round-robin", Inputs{}, func(_ Config, eps []*upstream.Endpoint) (Picker, error) { return newRoundRobin(eps), nil }},
	{2, "weighted-round-robin", Inputs{}, func(_ Config, eps []*upstream.Endpoint) (Picker, error) { return newWeightedRR(eps), nil }},
	{3, "session-affinity", Inputs{Session: true}, func(cfg Config, eps []*upstream.Endpoint) (Picker, error) { return newSession(cfg, eps), nil }},
	{4, "least-inflight", Inputs{}, func(_ Config, eps []*upstream.Endpoint) (Picker, error) { return newLeastInFlight(eps), nil }},
	{8, "chwbl", Inputs{Key: true, Conv: true}, func(cfg Config, eps []*upstream.Endpoint) (Picker, error) { return newCHWBL(cfg, eps, false) }},
	{10, "weighted-chwbl", Inputs{Key: true, Conv: true}, func(cfg Config, eps []*upstream.Endpoint) (Picker, error) { return newCHWBL(cfg, eps, true) }},
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
