package upstream

import (
	"sync"
	"sync/atomic"
	"time"
)

// BreakerState is a circuit breaker's state.
type BreakerState int32

const (
	Closed   BreakerState = 0 // traffic flows; failures are counted
	Open     BreakerState = 1 // no traffic until the open period ends
	HalfOpen BreakerState = 2 // a few trial requests decide between Closed and Open
)

func (s BreakerState) String() string {
	switch s {
	case Closed:
		return "closed"
	case Open:
		return "open"
	case HalfOpen:
		return "half_open"
	}
	return "unknown"
}

// BreakerConfig sets a breaker's thresholds. Zero values take the defaults
// noted on each field.
type BreakerConfig struct {
	// Failures is the number of consecutive connection failures or timeouts
	// that open the breaker. Default 5.
	Failures int
	// OpenFor is how long the breaker stays open before admitting trials.
	// Default 30s.
	OpenFor time.Duration
	// HalfOpenTrials is how many requests may be in flight while half-open.
	// Default 3.
	HalfOpenTrials int
	// Origin5xx is the number of origin responses with status ≥ 500 since
	// the last response below 400 that open the breaker (origin-5xx
	// demotion): 4xx answers in between neither count nor reset it, as the
	// reference gateway's streak. Default 3; a negative value disables
	// demotion.
	Origin5xx int
	// OnChange, when set, is called after every state change with the old
	// and new state. It runs on the goroutine that recorded the outcome, with
	// no lock held; it must be cheap and must not block.
	OnChange func(from, to BreakerState)
	// Now is the clock; nil means time.Now.
	Now func() time.Time
}

// Breaker is a per-endpoint circuit breaker with origin-5xx demotion.
//
// Connection-level failures (refused, reset before any byte, timeouts) and
// origin 5xx answers are counted separately: a worker that accepts TCP but
// answers 500 never trips a connect-failure counter, so the 5xx streak is
// what demotes it. A response below 400 resets both streaks; a 4xx resets
// neither (it is the client's fault). Safe for concurrent use; Allow is
// lock-free.
type Breaker struct {
	cfg BreakerConfig
	now nowFunc

	state     atomic.Int32
	openUntil atomic.Int64 // unix nanos; meaningful while Open
	trials    atomic.Int32 // requests admitted since entering HalfOpen

	mu        sync.Mutex
	connFails int
	originErr int
}

// NewBreaker returns a closed breaker.
func NewBreaker(cfg BreakerConfig) *Breaker {
	if cfg.Failures <= 0 {
		cfg.Failures = 5
	}
	if cfg.OpenFor <= 0 {
		cfg.OpenFor = 30 * time.Second
	}
	if cfg.HalfOpenTrials <= 0 {
		cfg.HalfOpenTrials = 3
	}
	if cfg.Origin5xx == 0 {
		cfg.Origin5xx = 3
	}
	now := time.Now
	if cfg.Now != nil {
		now = cfg.Now
	}
	return &Breaker{cfg: cfg, now: now}
}

// State returns the current state, moving Open to HalfOpen when the open
// period has ended.
func (b *Breaker) State() BreakerState {
	s := BreakerState(b.state.Load())
	if s == Open && b.now().UnixNano() >= b.openUntil.Load() {
		b.transition(Open, HalfOpen)
		return BreakerState(b.state.Load())
	}
	return s
}

// Allow reports whether a new request may be sent. It does not reserve a
// trial slot; Endpoint.Acquire does.
func (b *Breaker) Allow() bool {
	switch b.State() {
	case Closed:
		return true
	case HalfOpen:
		return int(b.trials.Load()) < b.cfg.HalfOpenTrials
	default:
		return false
	}
}

func (b *Breaker) noteTrial() {
	if BreakerState(b.state.Load()) == HalfOpen {
		b.trials.Add(1)
	}
}

// RecordSuccess records a response with status < 400 (or a 4xx with
// clientError): the worker is serving. It closes a half-open breaker.
func (b *Breaker) RecordSuccess() {
	b.mu.Lock()
	b.connFails, b.originErr = 0, 0
	b.mu.Unlock()
	if BreakerState(b.state.Load()) == HalfOpen {
		b.transition(HalfOpen, Closed)
	}
}

// RecordClientError records a 4xx origin answer: the worker is alive (the
// connect streak resets) but the answer says nothing about its health.
func (b *Breaker) RecordClientError() {
	b.mu.Lock()
	b.connFails = 0
	b.mu.Unlock()
	if BreakerState(b.state.Load()) == HalfOpen {
		b.transition(HalfOpen, Closed)
	}
}

// RecordConnFailure records a connection failure or timeout before any
// response byte. It reports whether the breaker opened.
func (b *Breaker) RecordConnFailure() bool {
	b.mu.Lock()
	b.connFails++
	trip := b.connFails >= b.cfg.Failures
	b.mu.Unlock()
	return b.failed(trip)
}

// RecordOrigin5xx records an origin response with status ≥ 500. It reports
// whether the breaker opened (demotion). The response itself is still
// relayed to the client by the caller.
func (b *Breaker) RecordOrigin5xx() bool {
	b.mu.Lock()
	b.connFails = 0 // the worker answered: the connection is fine
	b.originErr++
	trip := b.cfg.Origin5xx > 0 && b.originErr >= b.cfg.Origin5xx
	b.mu.Unlock()
	return b.failed(trip)
}

func (b *Breaker) failed(trip bool) bool {
	switch BreakerState(b.state.Load()) {
	case HalfOpen:
		return b.open(HalfOpen) // a failed trial reopens at once
	case Closed:
		if trip {
			return b.open(Closed)
		}
	}
	return false
}

func (b *Breaker) open(from BreakerState) bool {
	b.openUntil.Store(b.now().Add(b.cfg.OpenFor).UnixNano())
	if !b.transition(from, Open) {
		return false
	}
	b.mu.Lock()
	b.connFails, b.originErr = 0, 0
	b.mu.Unlock()
	return true
}

// Trip opens the breaker now, whatever its state (operator action or tests).
func (b *Breaker) Trip() {
	for {
		s := BreakerState(b.state.Load())
		if s == Open || b.open(s) {
			return
		}
	}
}

func (b *Breaker) transition(from, to BreakerState) bool {
	if !b.state.CompareAndSwap(int32(from), int32(to)) {
		return false
	}
	if to == HalfOpen {
		b.trials.Store(0)
	}
	if b.cfg.OnChange != nil {
		b.cfg.OnChange(from, to)
	}
	return true
}

func (b *Breaker) copyFrom(old *Breaker) {
	b.openUntil.Store(old.openUntil.Load())
	b.state.Store(old.state.Load())
	b.trials.Store(old.trials.Load())
}
