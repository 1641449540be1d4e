// Package policy holds the gateway's selection policies: given a plain view
// of one request and a rule's endpoints, a Picker chooses one available
// endpoint and says why.
//
// Policies never see fasthttp types. Availability is decided only by
// (*upstream.Endpoint).Available; load is read only from InFlight. A Picker
// never changes in-flight counts: the caller calls Acquire on the chosen
// endpoint and defers the returned release.
//
// Every Pick is allocation-free on its common path (alloc_test.go proves it)
// and safe for concurrent use. Ties always break deterministically.
package policy

import (
	"errors"
	"fmt"
	"time"

	"github.com/llmgw/llmgw/gateway/upstream"
)

// Request is what a policy sees of one request. The gateway fills it once
// per request from the parsed body and headers. Policies read it during Pick
// only: they never retain the Request or its slices after Pick returns, so
// the caller may reuse both (a pooled Request per connection avoids an
// allocation per request, since Pick is called through an interface).
//
// The zero Request is valid: no key, no conversation, no session, nothing
// excluded.
type Request struct {
	// KeyHash is the content-affinity key (model + system prompt + first
	// prefix_bytes of conversation/prompt, hashed by the gateway with
	// xxhash). Valid only when HasKey.
	KeyHash uint64
	HasKey  bool
	// ConvHash is the hash of a conversation header value, used by CHWBL
	// when HasKey is false. Valid only when HasConv.
	ConvHash uint64
	HasConv  bool
	// Session is the session-affinity value (header, cookie or query value,
	// else the body's "user"). Nil or empty means none.
	Session []byte
	// Exclude is skipped by every policy (the endpoint that just failed,
	// for the single retry). Nil excludes nothing.
	Exclude *upstream.Endpoint
}

// Reason says why an endpoint was chosen. String gives a short stable token
// for the X-Llmgw-Route header and metric labels; the tokens never change
// once published.
type Reason uint8

// Reasons, by policy.
const (
	ReasonNone           Reason = iota // zero value; never returned with an endpoint
	ReasonRoundRobin                   // "rr": sel 0
	ReasonWeighted                     // "wrr": sel 2
	ReasonLeastInFlight                // "least-inflight": sel 4
	ReasonSessionBound                 // "session-bound": sel 3, the session's live binding
	ReasonSessionNew                   // "session-new": sel 3, no live binding; bound to the least in-flight endpoint
	ReasonSessionRebound               // "session-rebound": sel 3, the bound endpoint was unavailable or excluded; rebound
	ReasonSessionNoKey                 // "session-nokey": sel 3, the request carries no session value; least in-flight
	ReasonCHWBLHome                    // "chwbl-home": sel 8/10, the key's home endpoint is available and under the bound
	ReasonCHWBLSpill                   // "chwbl-spill": sel 8/10, walked clockwise past Spill endpoints
	ReasonCHWBLNoKey                   // "chwbl-nokey": sel 8/10, no key and no conversation; least in-flight
	ReasonFallback                     // "fallback": sel 8/10, no available endpoint under the bound; least loaded taken
	numReasons
)

var reasonTokens = [numReasons]string{
	ReasonNone:           "none",
	ReasonRoundRobin:     "rr",
	ReasonWeighted:       "wrr",
	ReasonLeastInFlight:  "least-inflight",
	ReasonSessionBound:   "session-bound",
	ReasonSessionNew:     "session-new",
	ReasonSessionRebound: "session-rebound",
	ReasonSessionNoKey:   "session-nokey",
	ReasonCHWBLHome:      "chwbl-home",
	ReasonCHWBLSpill:     "chwbl-spill",
	ReasonCHWBLNoKey:     "chwbl-nokey",
	ReasonFallback:       "fallback",
}

// String returns the reason's stable token, or "unknown" for a value out of
// range. It does not allocate.
func (r Reason) String() string {
	if r < numReasons {
		return reasonTokens[r]
	}
	return "unknown"
}

// Decision is the outcome of one Pick.
type Decision struct {
	Endpoint *upstream.Endpoint // never nil when Pick returns a nil error
	Reason   Reason
	// Spill is, for CHWBL, the number of distinct endpoints passed over on
	// the ring walk before the chosen one (0 = the key's home endpoint). It is
	// 0 for every other policy.
	Spill int
}

// ErrNoEndpoint is returned by Pick when no endpoint is available (all are
// down, draining, breaker-open or excluded). The gateway maps it to 503.
var ErrNoEndpoint = errors.New("policy: no available endpoint")

// ErrUnknownSel is wrapped by New for a sel value no policy implements.
var ErrUnknownSel = errors.New("policy: unknown sel")

// ErrBadConfig is wrapped by New for an invalid Config or endpoint set.
var ErrBadConfig = errors.New("policy: invalid configuration")

// Picker chooses one available endpoint for a request.
//
// Pick is safe for concurrent use, does not allocate on its common path, and
// does not touch in-flight counts: the caller calls Acquire on the chosen
// endpoint. It returns ErrNoEndpoint when nothing is available.
type Picker interface {
	Pick(req *Request) (Decision, error)
}

// Inheritor is implemented by a Picker that keeps learned state (session
// bindings). Inherit copies that state from old, the previous Picker of the
// same rule, mapping endpoints by ID; state for IDs that no longer exist is
// dropped. Call it before publishing the new Picker. A nil or foreign old is
// ignored. Safe for concurrent use with Picks on either Picker.
type Inheritor interface {
	Inherit(old Picker)
}

// BindingCounter is implemented by a Picker with a session binding table
// (sel 3), for status pages and metrics. Bindings counts the entries held,
// expired ones not yet swept included; it is safe for concurrent use and
// takes each shard lock briefly, so call it per scrape, not per request.
type BindingCounter interface {
	Bindings() int
}

// Config selects and tunes a policy. Zero fields take the defaults noted.
type Config struct {
	// Sel is the rule's policy number: 0 rr, 2 weighted rr, 3 session
	// affinity, 4 least in-flight, 8 CHWBL, 10 weighted CHWBL.
	Sel int
	// LoadFactor is CHWBL's bound c (sel 8, 10); see boundOK. Default 1.25;
	// range 1..10. Resolved to 1/1e6 precision.
	LoadFactor float64
	// Replicas is the number of ring virtual nodes per endpoint (sel 8) or
	// per unit of gcd-reduced weight (sel 10). Default 160; range 1..4096.
	Replicas int
	// SessionTTL is how long an unused session binding lives (sel 3); every
	// use refreshes it. Default 1h.
	SessionTTL time.Duration
	// SessionCap bounds the session binding table (sel 3); when full, the
	// least recently used binding is evicted. Default 100000.
	SessionCap int
	// Now is the clock for session TTLs; nil means time.Now.
	Now func() time.Time
}

// Defaults and limits of Config.
const (
	DefaultLoadFactor = 1.25
	DefaultReplicas   = 160
	DefaultSessionTTL = time.Hour
	DefaultSessionCap = 100_000

	maxLoadFactor = 10
	maxReplicas   = 4096
	// maxRingNodes bounds a CHWBL ring's memory (16 MiB of hashes and
	// indices at 12 bytes per node is well below it).
	maxRingNodes = 1 << 20
)

// resolved returns cfg with defaults filled, or an error naming the first
// invalid field.
func (cfg Config) resolved() (Config, error) {
	if cfg.LoadFactor == 0 {
		cfg.LoadFactor = DefaultLoadFactor
	}
	if !(cfg.LoadFactor >= 1 && cfg.LoadFactor <= maxLoadFactor) { // also rejects NaN
		return cfg, fmt.Errorf("%w: load factor %v out of range 1..%d", ErrBadConfig, cfg.LoadFactor, maxLoadFactor)
	}
	if cfg.Replicas == 0 {
		cfg.Replicas = DefaultReplicas
	}
	if cfg.Replicas < 1 || cfg.Replicas > maxReplicas {
		return cfg, fmt.Errorf("%w: replicas %d out of range 1..%d", ErrBadConfig, cfg.Replicas, maxReplicas)
	}
	if cfg.SessionTTL == 0 {
		cfg.SessionTTL = DefaultSessionTTL
	}
	if cfg.SessionTTL < 0 {
		return cfg, fmt.Errorf("%w: negative session ttl %v", ErrBadConfig, cfg.SessionTTL)
	}
	if cfg.SessionCap == 0 {
		cfg.SessionCap = DefaultSessionCap
	}
	if cfg.SessionCap < 0 {
		return cfg, fmt.Errorf("%w: negative session cap %d", ErrBadConfig, cfg.SessionCap)
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	return cfg, nil
}

// checkEndpoints enforces the contract New relies on: no nil entries, Index
// strictly increasing along the slice (tie-breaks go by position, so position
// order must be Index order; a subset of a rule's endpoints in rule order,
// such as a P/D rule's prefill pool, qualifies), unique IDs (session bindings
// and the ring are keyed by ID).
func checkEndpoints(eps []*upstream.Endpoint) error {
	seen := make(map[string]int, len(eps))
	for i, e := range eps {
		if e == nil {
			return fmt.Errorf("%w: endpoint %d is nil", ErrBadConfig, i)
		}
		if i > 0 && e.Index <= eps[i-1].Index {
			return fmt.Errorf("%w: endpoint %q has index %d at position %d, not above its predecessor's %d", ErrBadConfig, e.ID, e.Index, i, eps[i-1].Index)
		}
		if j, dup := seen[e.ID]; dup {
			return fmt.Errorf("%w: endpoint id %q at positions %d and %d", ErrBadConfig, e.ID, j, i)
		}
		seen[e.ID] = i
	}
	return nil
}

// New builds the policy for cfg.Sel over eps, the rule's endpoints (or a
// subset of them) in rule order. The endpoint set is immutable for
// the returned Picker: a rule update builds a new Picker (and carries learned
// state over with Inheritor). An empty eps is allowed; every Pick then
// returns ErrNoEndpoint. New keeps eps (not a copy): do not modify the slice
// afterwards.
func New(cfg Config, eps []*upstream.Endpoint) (Picker, error) {
	b, ok := lookupBuiltin(cfg.Sel)
	if !ok {
		return nil, fmt.Errorf("%w %d (valid: %s)", ErrUnknownSel, cfg.Sel, validSels())
	}
	cfg, err := cfg.resolved()
	if err != nil {
		return nil, fmt.Errorf("policy: sel %d (%s): %w", cfg.Sel, b.name, err)
	}
	if err := checkEndpoints(eps); err != nil {
		return nil, fmt.Errorf("policy: sel %d (%s): %w", cfg.Sel, b.name, err)
	}
	p, err := b.build(cfg, eps)
	if err != nil {
		return nil, fmt.Errorf("policy: sel %d (%s): %w", cfg.Sel, b.name, err)
	}
	return p, nil
}
