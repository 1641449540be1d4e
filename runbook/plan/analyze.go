package plan

import (
	"fmt"
	"sort"
	"strconv"
	"strings"

	"github.com/llmgw/llmgw/engines"
)

// Status is how well a question is answered.
type Status string

const (
	Known        Status = "known"
	Unknown      Status = "unknown"
	Inconsistent Status = "inconsistent"
	// Unreachable is an event endpoint's state when every probe failed;
	// the pool-level answer is then Unknown or Inconsistent.
	Unreachable Status = "unreachable"
)

// Disagreement names an endpoint whose value differs from the answer's.
type Disagreement struct {
	Endpoint string `json:"endpoint"`
	Value    string `json:"value"`
}

// Answer is one question's answer across the pool.
type Answer struct {
	Key      string         `json:"key"`
	Question string         `json:"question"`
	Status   Status         `json:"status"`
	Value    string         `json:"value,omitempty"`
	Evidence []string       `json:"evidence,omitempty"`
	Disagree []Disagreement `json:"disagree,omitempty"`
	Note     string         `json:"note,omitempty"`
}

// Plan is the planner's result.
type Plan struct {
	Engine    engines.Kind   `json:"engine,omitempty"`
	Profile   string         `json:"profile,omitempty"`
	Topology  string         `json:"topology"` // converged, pd or unknown
	Answers   []Answer       `json:"answers"`
	Endpoints []*Observation `json:"endpoints"`
	// Consistent is false when any answer is inconsistent.
	Consistent bool     `json:"consistent"`
	Stages     []Stage  `json:"stages"`
	Blocked    []Block  `json:"blocked,omitempty"`
	Prefill    []string `json:"prefill,omitempty"`
	Decode     []string `json:"decode,omitempty"`
	Converged  []string `json:"converged,omitempty"`
	// BootstrapPort is the SGLang prefills' bootstrap port when they all
	// reported the same one.
	BootstrapPort int `json:"bootstrap_port,omitempty"`
}

// Answer returns the answer with key ("" Status when absent).
func (p *Plan) Answer(key string) Answer {
	for _, a := range p.Answers {
		if a.Key == key {
			return a
		}
	}
	return Answer{Key: key}
}

// Answer keys.
const (
	KeyEngine    = "engine"
	KeyVersion   = "version"
	KeyRoles     = "roles"
	KeyEvents    = "kv_events"
	KeyConsumer  = "event_consumer"
	KeyModels    = "models"
	KeyProfile   = "profile"
	KeyTokenizer = "tokenizer"
	KeyBlockSize = "block_size"
	KeyHashAlgo  = "hash_algo"
	KeyHashes    = "hash_parity"
	KeyContext   = "context_length"
	KeyHealth    = "health"
)

// consistencyKeys are the facts whose disagreement makes the pool
// inconsistent (exit 3).
var consistencyKeys = []string{KeyEngine, KeyVersion, KeyRoles, KeyModels, KeyProfile, KeyTokenizer, KeyBlockSize, KeyHashAlgo, KeyHashes, KeyContext}

// tally builds a pool answer from one value per endpoint ("" = the
// endpoint did not tell): known when every endpoint that told agrees,
// inconsistent otherwise, with the disagreeing endpoints named against the
// majority value (ties go to the first endpoint's).
func tally(key, question string, obs []*Observation, value func(*Observation) (string, string)) Answer {
	a := Answer{Key: key, Question: question, Status: Unknown}
	counts := map[string]int{}
	var order []string
	silent := 0
	for _, o := range obs {
		v, ev := value(o)
		if v == "" {
			silent++
			continue
		}
		if counts[v] == 0 {
			order = append(order, v)
		}
		counts[v]++
		if ev != "" {
			a.Evidence = append(a.Evidence, o.Addr+": "+ev)
		}
	}
	if len(order) == 0 {
		a.Note = "no endpoint told"
		return a
	}
	best := order[0]
	for _, v := range order[1:] {
		if counts[v] > counts[best] {
			best = v
		}
	}
	a.Value = best
	a.Status = Known
	if len(order) > 1 {
		a.Status = Inconsistent
		for _, o := range obs {
			if v, _ := value(o); v != "" && v != best {
				a.Disagree = append(a.Disagree, Disagreement{Endpoint: o.Addr, Value: v})
			}
		}
	}
	if silent > 0 {
		a.Note = fmt.Sprintf("%d of %d endpoints did not tell", silent, len(obs))
	}
	return a
}

func analyze(o *Options, obs []*Observation) *Plan {
	p := &Plan{Endpoints: obs, Profile: o.Profile, Topology: "unknown"}
	engineQ := "Which engine runs, from its own surfaces?"
	if o.Engine != "" {
		engineQ = fmt.Sprintf("Is every endpoint the given engine %s?", o.Engine)
	}
	eng := tally(KeyEngine, engineQ, obs, func(ob *Observation) (string, string) {
		if ob.Engine == "" {
			return "", ""
		}
		return string(ob.Engine), strings.Join(ob.EngineWhy, "; ")
	})
	for _, ob := range obs {
		if ob.Engine != "" {
			continue
		}
		// An endpoint that answered as no engine (or not as the given one)
		// leaves the engine unproven for the pool; against a given engine
		// it disagrees.
		if o.Engine != "" && ob.OwnedBy != "" {
			eng.Status = Inconsistent
			eng.Disagree = append(eng.Disagree, Disagreement{Endpoint: ob.Addr, Value: "owned_by " + ob.OwnedBy + ", not " + string(o.Engine)})
		} else if eng.Status == Known {
			eng.Status = Unknown
		}
		eng.Evidence = append(eng.Evidence, ob.Addr+": "+strings.Join(ob.Problems, "; "))
	}
	if o.Engine != "" && eng.Status == Inconsistent && eng.Value == "" {
		eng.Value = string(o.Engine)
	}
	p.Answers = append(p.Answers, eng)
	if eng.Status == Known {
		p.Engine = engines.Kind(eng.Value)
	}
	p.Answers = append(p.Answers,
		tally(KeyVersion, "Which engine build (version) runs?", obs, func(ob *Observation) (string, string) {
			if ob.Version == "" {
				return "", ""
			}
			return string(ob.Engine) + " " + ob.Version, ""
		}),
		tally(KeyHealth, "Is every endpoint healthy?", obs, func(ob *Observation) (string, string) {
			if ob.Health == "" {
				return "", ""
			}
			return strconv.FormatBool(ob.Healthy), ob.Health
		}),
	)
	p.Answers = append(p.Answers, roles(p, obs))
	p.Answers = append(p.Answers, events(obs)...)
	models := tally(KeyModels, "Which model names are served?", obs, func(ob *Observation) (string, string) {
		if len(ob.Models) == 0 {
			return "", ""
		}
		return strings.Join(ob.Models, ","), "GET /v1/models"
	})
	p.Answers = append(p.Answers, models)
	if o.ProfileModel != "" {
		pa := Answer{Key: KeyProfile, Question: fmt.Sprintf("Does the pool serve profile %s's model %s?", o.Profile, o.ProfileModel), Status: Known, Value: o.ProfileModel}
		for _, ob := range obs {
			if len(ob.Models) > 0 && !contains(ob.Models, o.ProfileModel) {
				pa.Status = Inconsistent
				pa.Disagree = append(pa.Disagree, Disagreement{Endpoint: ob.Addr, Value: strings.Join(ob.Models, ",")})
			}
		}
		p.Answers = append(p.Answers, pa)
	}
	p.Answers = append(p.Answers,
		tally(KeyTokenizer, "Do the endpoints tokenize the same canary text to the same ids?", obs, func(ob *Observation) (string, string) {
			if ob.Tokenizer == "" {
				return "", ""
			}
			return ob.Tokenizer, fmt.Sprintf("%d ids, sha256 %s", ob.TokenCount, ob.Tokenizer)
		}),
		tally(KeyBlockSize, "Which KV block size (tokens per block)?", obs, blockSize),
		tally(KeyHashAlgo, "Which block-hash algorithm?", obs, func(ob *Observation) (string, string) {
			if ob.Desc.HashAlgo != "" {
				return ob.Desc.HashAlgo, ob.Desc.From["hash_algo"]
			}
			// No configuration surface said; published hashes that
			// reproduce name the algorithm as surely.
			for k, c := range ob.parity {
				if c[1] > 0 && c[0] == c[1] {
					return k.algo, fmt.Sprintf("%d published root blocks reproduce as %s", c[1], k.algo)
				}
			}
			return "", ""
		}),
		tally(KeyHashes, "Do published block hashes reproduce with the gateway's algorithm and seed?", obs, func(ob *Observation) (string, string) {
			if ob.Events.Parity == "" {
				return "", ""
			}
			v, _, _ := strings.Cut(ob.Events.Parity, ":")
			return v, ob.Events.Parity
		}),
		tally(KeyContext, "Which context length?", obs, func(ob *Observation) (string, string) {
			if ob.Desc.ContextLength == 0 {
				return "", ""
			}
			return strconv.Itoa(ob.Desc.ContextLength), ob.Desc.From["context_length"]
		}),
	)
	// An engine without KV events has no blocks to size or hash.
	noKV := true
	for _, ob := range obs {
		noKV = noKV && ob.adapter != nil && ob.kv == nil
	}
	for i := range p.Answers {
		if a := &p.Answers[i]; noKV && a.Status == Unknown && (a.Key == KeyBlockSize || a.Key == KeyHashAlgo || a.Key == KeyHashes) {
			a.Note = "not applicable: the engine publishes no KV blocks"
		}
	}
	p.Consistent = true
	for _, a := range p.Answers {
		if a.Status == Inconsistent && contains(consistencyKeys, a.Key) {
			p.Consistent = false
		}
	}
	recommend(o, p)
	return p
}

func contains(s []string, v string) bool {
	for _, x := range s {
		if x == v {
			return true
		}
	}
	return false
}

// blockSize is what the endpoint runs: its published events' block size
// when it published any (what runs beats what is configured), else its
// configuration surface.
func blockSize(ob *Observation) (string, string) {
	if len(ob.blockSizes) > 0 {
		var sizes []int
		for s := range ob.blockSizes {
			sizes = append(sizes, s)
		}
		sort.Ints(sizes)
		var parts []string
		for _, s := range sizes {
			parts = append(parts, strconv.Itoa(s))
		}
		ev := "published BlockStored block_size"
		if ob.Desc.BlockSize != 0 && (len(sizes) != 1 || sizes[0] != ob.Desc.BlockSize) {
			ev += fmt.Sprintf(" (the configuration surface says %d)", ob.Desc.BlockSize)
		}
		return strings.Join(parts, "+"), ev
	}
	if ob.Desc.BlockSize == 0 {
		return "", ""
	}
	return strconv.Itoa(ob.Desc.BlockSize), ob.Desc.From["block_size"]
}

// roles classifies each endpoint and the pool's topology.
func roles(p *Plan, obs []*Observation) Answer {
	a := Answer{Key: KeyRoles, Question: "Single pool, or separate prefill/decode workers?"}
	var unsaid []string
	for _, ob := range obs {
		r := ob.Desc.Role
		switch {
		case r == engines.RoleUnknown && ob.DeclaredRole != engines.RoleUnknown:
			// The engine says nothing; the operator's word is taken, and
			// marked as such.
			r = ob.DeclaredRole
			ob.Desc.Role = r
			ob.Desc.Said("role", "declared with --endpoints (the engine reports no role)")
		case r != engines.RoleUnknown && ob.DeclaredRole != engines.RoleUnknown && r != ob.DeclaredRole:
			a.Disagree = append(a.Disagree, Disagreement{Endpoint: ob.Addr, Value: fmt.Sprintf("reports %s, declared %s", r, ob.DeclaredRole)})
		}
		switch {
		case r.PrefillSide():
			p.Prefill = append(p.Prefill, ob.Addr)
		case r.DecodeSide():
			p.Decode = append(p.Decode, ob.Addr)
		default:
			p.Converged = append(p.Converged, ob.Addr)
			if r == engines.RoleUnknown {
				unsaid = append(unsaid, ob.Addr)
			}
		}
		if r != engines.RoleUnknown {
			a.Evidence = append(a.Evidence, fmt.Sprintf("%s: %s (%s)", ob.Addr, r, ob.Desc.From["role"]))
		}
	}
	if len(a.Disagree) > 0 {
		a.Status, a.Value = Inconsistent, "declared roles contradict the engines"
		p.Prefill, p.Decode, p.Converged = nil, nil, nil
		return a
	}
	split := len(p.Prefill) + len(p.Decode)
	switch {
	case split > 0 && len(p.Converged) > 0:
		a.Status, a.Value = Inconsistent, "mixed"
		for _, c := range p.Converged {
			a.Disagree = append(a.Disagree, Disagreement{Endpoint: c, Value: "converged (or unsaid) among P/D workers"})
		}
	case split > 0 && (len(p.Prefill) == 0 || len(p.Decode) == 0):
		a.Status, a.Value = Inconsistent, "incomplete P/D"
		a.Note = fmt.Sprintf("%d prefill and %d decode workers: a P/D pool needs both", len(p.Prefill), len(p.Decode))
	case split > 0:
		a.Status, a.Value = Known, fmt.Sprintf("pd: %d prefill, %d decode", len(p.Prefill), len(p.Decode))
		p.Topology = "pd"
		ports := map[int]bool{}
		for _, ob := range obs {
			if ob.Desc.Role.PrefillSide() && ob.Desc.BootstrapPort > 0 {
				ports[ob.Desc.BootstrapPort] = true
				p.BootstrapPort = ob.Desc.BootstrapPort
			}
		}
		if len(ports) > 1 {
			p.BootstrapPort = 0 // per-endpoint bootstrapPort in the rule
		}
	case len(unsaid) == len(obs):
		a.Status, a.Value = Unknown, "converged (assumed)"
		a.Note = "no endpoint reports a role on a read-only surface (vLLM never does) and none was declared (--endpoints host:port=prefill); the pool is planned as converged"
		p.Topology = "converged"
	default:
		a.Status, a.Value = Known, "converged"
		p.Topology = "converged"
		if len(unsaid) > 0 {
			a.Note = fmt.Sprintf("%d endpoints did not say; taken as converged", len(unsaid))
		}
	}
	return a
}

// events answers whether KV events are reachable and who may consume them.
func events(obs []*Observation) []Answer {
	reach := Answer{Key: KeyEvents, Question: "Does the engine expose KV cache events the gateway can consume?"}
	consumer := Answer{Key: KeyConsumer, Question: "Can this gateway be the only consumer of a destructive event endpoint?"}
	var ok, bad, none, unknown []string
	destructive := false
	for _, ob := range obs {
		e := ob.Events
		if e.How != "" {
			reach.Evidence = append(reach.Evidence, ob.Addr+": "+e.How)
		}
		if ob.kv != nil && ob.kv.Destructive {
			destructive = true
		}
		switch {
		case e.Transport == "none" || e.Transport == "off":
			none = append(none, ob.Addr)
		case e.Reachable == Known:
			ok = append(ok, ob.Addr)
		case e.Reachable == Unreachable:
			bad = append(bad, ob.Addr)
		default:
			unknown = append(unknown, ob.Addr)
		}
	}
	switch {
	case len(ok) == len(obs):
		reach.Status, reach.Value = Known, "reachable"
	case len(none) == len(obs):
		reach.Status, reach.Value = Known, "none"
	case len(ok) > 0 && len(ok)+len(none) == len(obs):
		// In a vLLM P/D pool the decode workers run without events.
		reach.Status, reach.Value = Known, fmt.Sprintf("reachable on %d of %d endpoints (the others publish none)", len(ok), len(obs))
	default:
		reach.Status = Unknown
		reach.Value = fmt.Sprintf("reachable on %d of %d endpoints", len(ok), len(obs))
		for _, b := range bad {
			reach.Disagree = append(reach.Disagree, Disagreement{Endpoint: b, Value: "unreachable"})
		}
		for _, u := range unknown {
			reach.Disagree = append(reach.Disagree, Disagreement{Endpoint: u, Value: "unknown"})
		}
	}
	if destructive {
		consumer.Status, consumer.Value = Unknown, "cannot be told"
		consumer.Note = "the endpoint exposes no consumer count and an empty drain looks the same to every reader; make this gateway its sole consumer (stop every other poller) before a KV-exact stage"
	} else {
		consumer.Status, consumer.Value = Known, "not destructive"
		consumer.Note = "ZeroMQ PUB delivers every batch to every subscriber; reading takes nothing away"
		if len(none) == len(obs) {
			consumer.Value, consumer.Note = "no events", ""
		}
	}
	return []Answer{reach, consumer}
}
