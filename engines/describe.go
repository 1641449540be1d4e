package engines

// This file is what an engine says about itself on its read-only surfaces,
// and what the deployment guide recommends for it. The planner (llmgw plan)
// asks a Describer and a Guide through the adapter; it never switches on an
// engine's name. Each engine package implements both in its probe.go.

// Role is what an endpoint does in a deployment.
type Role string

const (
	RoleUnknown    Role = ""
	RoleConverged  Role = "converged"  // prefill and decode in one worker
	RolePrefill    Role = "prefill"    // vLLM / SGLang disaggregated prefill
	RoleDecode     Role = "decode"     // vLLM / SGLang disaggregated decode
	RoleContext    Role = "context"    // TensorRT-LLM context server
	RoleGeneration Role = "generation" // TensorRT-LLM generation server
)

// PrefillSide reports whether r takes the first leg of a P/D request
// (ep_role 1): prefill or context.
func (r Role) PrefillSide() bool { return r == RolePrefill || r == RoleContext }

// DecodeSide reports whether r takes the second leg (ep_role 2): decode or
// generation.
func (r Role) DecodeSide() bool { return r == RoleDecode || r == RoleGeneration }

// Description is what one endpoint said about itself. A zero field is "not
// said"; From names the surface each said field came from, keyed by the
// field's JSON name ("block_size": "GET /get_server_info page_size").
type Description struct {
	Role          Role   `json:"role,omitempty"`
	BlockSize     int    `json:"block_size,omitempty"`
	HashAlgo      string `json:"hash_algo,omitempty"`
	ContextLength int    `json:"context_length,omitempty"`
	// BootstrapPort is an SGLang prefill's bootstrap server port.
	BootstrapPort int `json:"bootstrap_port,omitempty"`
	// Events and Replay are the KV event endpoints the engine reports
	// (tcp://host:port as configured; a wildcard host is the endpoint's).
	Events string `json:"events,omitempty"`
	Replay string `json:"replay,omitempty"`
	// EventsOff: the engine reports that it publishes no KV events.
	EventsOff bool `json:"events_off,omitempty"`
	// Slots is llama.cpp's parallel slot count.
	Slots int               `json:"slots,omitempty"`
	From  map[string]string `json:"from,omitempty"`
}

// Said records that field came from where.
func (d *Description) Said(field, where string) {
	if d.From == nil {
		d.From = map[string]string{}
	}
	d.From[field] = where
}

// Describer reads an engine's self-description from its read-only
// surfaces. Every path it names is fetched with GET only: nothing a
// Describer asks for changes the engine's state.
type Describer interface {
	// OwnedBy is the "owned_by" this engine puts in its /v1/models entries
	// (the planner's first fingerprint).
	OwnedBy() string
	// DescribePaths are the GET paths whose answers Describe reads, in the
	// order they are asked.
	DescribePaths() []string
	// Describe folds the 200 answer of GET path into d. An answer that does
	// not have this engine's shape is an error (a fingerprint mismatch).
	Describe(path string, body []byte, d *Description) error
	// TokenizeBody is the POST body asking the Surfaces().Tokenize surface
	// for text's token ids without special tokens; nil when the engine has
	// no tokenize surface.
	TokenizeBody(model, text string) []byte
	// ParseTokens reads the tokenize answer.
	ParseTokens(body []byte) ([]uint32, error)
	// EventsProbe is how the planner may test a destructive event endpoint
	// without draining it: a method and path whose answer proves the
	// endpoint exists while leaving the queue alone, with WantStatus the
	// answer that proves it. Method "" means it cannot be told without
	// draining. Engines whose events are not destructive return "".
	EventsProbe() (method, path string, wantStatus int)
}

// Guide is the deployment guide's starting configuration for an engine
// ("Choose an Inference Engine"): which capability comes first and what may
// follow, with the guide's reason for each.
type Guide struct {
	// FirstSel is the selection policy of stage 1 (health-checked
	// fullproxy): 0 round robin or 8 CHWBL.
	FirstSel int
	FirstWhy string
	// AffinityWhy, when FirstSel is round robin, is why CHWBL may follow as
	// its own stage; "" when it is not offered.
	AffinityWhy string
	// KVExactWhy is why single-pool KV-exact (kvExactMode 3) may follow the
	// parity gate; "" when the engine cannot do it, with NoKVExactWhy the
	// guide's reason.
	KVExactWhy   string
	NoKVExactWhy string
	// PDWhy is why P/D may be staged for a role-split pool; "" when the
	// engine has none, with NoPDWhy the guide's reason.
	PDWhy   string
	NoPDWhy string
}

// Guided is implemented by adapters that carry the guide's starting
// configuration.
type Guided interface {
	Guide() Guide
}
