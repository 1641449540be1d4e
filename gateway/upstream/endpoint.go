// Package upstream holds the data plane's view of one worker: its address,
// weight and role, live in-flight count, health verdict, drain flag and
// circuit breaker. Availability is decided in exactly one place,
// Endpoint.Available, which every selection policy asks.
package upstream

import (
	"sync/atomic"
	"time"
)

// Role is an endpoint's part in prefill/decode disaggregation.
type Role uint8

const (
	RoleNormal  Role = 0 // serves whole requests
	RolePrefill Role = 1 // P/D prefill (TensorRT-LLM: context)
	RoleDecode  Role = 2 // P/D decode (TensorRT-LLM: generation)
)

// Endpoint is one worker of a rule.
//
// The identity fields (ID, Host, Port, Addr, Weight, Role, Index) are set at
// construction and never change; an edited rule builds new Endpoints (state
// is carried over by the owner with CopyStateFrom). All methods are safe for
// concurrent use and allocation-free.
type Endpoint struct {
	ID     string // unique within the rule; used in headers, metrics and the REST API
	Host   string // IP or DNS name
	Port   int
	Addr   string // "host:port" (IPv6 hosts in brackets)
	Weight int    // ≥ 1; used by weighted policies only
	Role   Role
	// Index is the endpoint's position in its rule. Policies break ties by
	// the lowest Index, so decisions are deterministic.
	Index int

	inflight atomic.Int64
	down     atomic.Bool // active probe verdict: true after N consecutive probe failures
	draining atomic.Bool
	breaker  *Breaker // nil: no breaker (cb_enable false)
	// onActivity, when set, is called by every Acquire and Release (a
	// TensorRT-LLM endpoint's event poller is woken: a request sent or
	// answered is events coming).
	onActivity atomic.Pointer[func()]

	release func() // e.Release bound once, so Acquire returns it without allocating
}

// New returns an endpoint that is up, not draining, with no in-flight
// requests. breaker may be nil (no circuit breaking).
func New(id, host string, port int, addr string, weight int, role Role, index int, breaker *Breaker) *Endpoint {
	if weight < 1 {
		weight = 1
	}
	e := &Endpoint{ID: id, Host: host, Port: port, Addr: addr, Weight: weight, Role: role, Index: index, breaker: breaker}
	e.release = e.Release
	return e
}

// Available reports whether the endpoint may receive a new request: its
// health probe has not marked it down, it is not draining, and its breaker
// (if any) admits traffic. It is the only availability predicate; policies
// must not re-implement any part of it.
func (e *Endpoint) Available() bool {
	if e.down.Load() || e.draining.Load() {
		return false
	}
	return e.breaker == nil || e.breaker.Allow()
}

// Acquire counts one request in flight on e and returns the function that
// ends it. The caller must call the returned function exactly once, when the
// response has been fully relayed or abandoned. It does not allocate.
func (e *Endpoint) Acquire() (release func()) {
	e.inflight.Add(1)
	if e.breaker != nil {
		e.breaker.noteTrial()
	}
	if f := e.onActivity.Load(); f != nil {
		(*f)()
	}
	return e.release
}

// OnActivity makes every later Acquire and Release call f (nil: none). f
// must be cheap and must not block; it runs on the request's goroutine.
func (e *Endpoint) OnActivity(f func()) {
	if f == nil {
		e.onActivity.Store(nil)
		return
	}
	e.onActivity.Store(&f)
}

// Release ends one request counted by Acquire. Prefer calling the function
// Acquire returned.
func (e *Endpoint) Release() {
	e.inflight.Add(-1)
	if f := e.onActivity.Load(); f != nil {
		(*f)()
	}
}

// InFlight is the number of requests currently counted on e.
func (e *Endpoint) InFlight() int64 { return e.inflight.Load() }

// Down reports the active probe verdict.
func (e *Endpoint) Down() bool { return e.down.Load() }

// SetDown records the active probe verdict; it reports whether it changed.
func (e *Endpoint) SetDown(down bool) (changed bool) { return e.down.Swap(down) != down }

// Draining reports whether e takes no new requests.
func (e *Endpoint) Draining() bool { return e.draining.Load() }

// SetDraining stops (true) or resumes (false) new requests to e. In-flight
// requests are not affected.
func (e *Endpoint) SetDraining(d bool) { e.draining.Store(d) }

// Breaker returns e's circuit breaker, or nil when breaking is disabled.
func (e *Endpoint) Breaker() *Breaker { return e.breaker }

// CopyStateFrom carries the operator- and probe-driven state of old (drain
// flag, probe verdict, breaker state) into e, for a rule update that rebuilds
// its endpoints. In-flight counts are not copied: requests started on old
// release old.
func (e *Endpoint) CopyStateFrom(old *Endpoint) {
	e.draining.Store(old.draining.Load())
	e.down.Store(old.down.Load())
	if e.breaker != nil && old.breaker != nil {
		e.breaker.copyFrom(old.breaker)
	}
}

// nowFunc is the clock; tests of this package replace it through Breaker's
// constructor, never globally.
type nowFunc func() time.Time
