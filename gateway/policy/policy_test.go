package policy

import (
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/llmgw/llmgw/gateway/upstream"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// testEndpoints returns len(weights) endpoints "ep0", "ep1", ... with the
// given weights (nil: n endpoints of weight 1), Index = position.
func testEndpoints(n int, weights ...int) []*upstream.Endpoint {
	if len(weights) > 0 {
		n = len(weights)
	}
	eps := make([]*upstream.Endpoint, n)
	for i := range eps {
		w := 1
		if len(weights) > 0 {
			w = weights[i]
		}
		port := 8000 + i
		eps[i] = upstream.New(fmt.Sprintf("ep%d", i), "127.0.0.1", port, fmt.Sprintf("127.0.0.1:%d", port), w, upstream.RoleNormal, i, nil)
	}
	return eps
}

// mustNew builds a picker or fails the test.
func mustNew(t testing.TB, cfg Config, eps []*upstream.Endpoint) Picker {
	t.Helper()
	p, err := New(cfg, eps)
	if err != nil {
		t.Fatalf("New(%+v) error: %v", cfg, err)
	}
	return p
}

// mustPick picks or fails the test.
func mustPick(t testing.TB, p Picker, req *Request) Decision {
	t.Helper()
	d, err := p.Pick(req)
	if err != nil {
		t.Fatalf("Pick(%+v) error: %v", req, err)
	}
	if d.Endpoint == nil {
		t.Fatalf("Pick(%+v) returned a nil endpoint and no error", req)
	}
	return d
}

// hold acquires n requests on e and registers their release with t.Cleanup;
// the returned func releases them earlier (idempotent).
func hold(t testing.TB, e *upstream.Endpoint, n int) (release func()) {
	t.Helper()
	rels := make([]func(), n)
	for i := range rels {
		rels[i] = e.Acquire()
	}
	done := false
	release = func() {
		if done {
			return
		}
		done = true
		for _, r := range rels {
			r()
		}
	}
	t.Cleanup(release)
	return release
}

// tripped returns an endpoint whose breaker is open (unavailable).
func tripped(id string, index int) *upstream.Endpoint {
	b := upstream.NewBreaker(upstream.BreakerConfig{})
	b.Trip()
	return upstream.New(id, "127.0.0.1", 9000+index, fmt.Sprintf("127.0.0.1:%d", 9000+index), 1, upstream.RoleNormal, index, b)
}

var allSels = []int{0, 2, 3, 4, 8, 10}

func TestNewRejects(t *testing.T) {
	eps := testEndpoints(2)
	dup := testEndpoints(2)
	dup[1] = upstream.New("ep0", "127.0.0.1", 1, "127.0.0.1:1", 1, upstream.RoleNormal, 1, nil)
	misIndexed := testEndpoints(2)
	subset := []*upstream.Endpoint{testEndpoints(3)[0], testEndpoints(3)[2]} // indexes 0, 2: a pool in rule order
	if _, err := New(Config{Sel: 4}, subset); err != nil {
		t.Errorf("New over a subset in rule order: %v", err)
	}
	misIndexed[0] = upstream.New("ep0", "127.0.0.1", 1, "127.0.0.1:1", 1, upstream.RoleNormal, 5, nil)
	tests := []struct {
		name    string
		cfg     Config
		eps     []*upstream.Endpoint
		wantErr error
		wantMsg string
	}{
		{"unknown sel lists valid ones", Config{Sel: 1}, eps, ErrUnknownSel, "valid: 0 round-robin, 2 weighted-round-robin, 3 session-affinity, 4 least-inflight, 8 chwbl, 10 weighted-chwbl"},
		{"negative sel", Config{Sel: -1}, eps, ErrUnknownSel, "unknown sel -1"},
		{"load factor below 1", Config{Sel: 8, LoadFactor: 0.5}, eps, ErrBadConfig, "load factor 0.5"},
		{"load factor above 10", Config{Sel: 8, LoadFactor: 11}, eps, ErrBadConfig, "load factor 11"},
		{"replicas negative", Config{Sel: 8, Replicas: -3}, eps, ErrBadConfig, "replicas -3"},
		{"replicas too many", Config{Sel: 10, Replicas: 5000}, eps, ErrBadConfig, "replicas 5000"},
		{"negative ttl", Config{Sel: 3, SessionTTL: -time.Second}, eps, ErrBadConfig, "negative session ttl"},
		{"negative cap", Config{Sel: 3, SessionCap: -1}, eps, ErrBadConfig, "negative session cap"},
		{"nil endpoint", Config{Sel: 0}, []*upstream.Endpoint{eps[0], nil}, ErrBadConfig, "endpoint 1 is nil"},
		{"index not increasing", Config{Sel: 4}, misIndexed, ErrBadConfig, `"ep1" has index 1 at position 1, not above its predecessor's 5`},
		{"duplicate id", Config{Sel: 2}, dup, ErrBadConfig, `id "ep0" at positions 0 and 1`},
		{"ring too large", Config{Sel: 10, Replicas: 4096}, testEndpoints(0, 1000, 1), ErrBadConfig, "virtual nodes"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			p, err := New(tc.cfg, tc.eps)
			if !errors.Is(err, tc.wantErr) {
				t.Fatalf("New() = %v, %v; want error wrapping %v", p, err, tc.wantErr)
			}
			if !strings.Contains(err.Error(), tc.wantMsg) {
				t.Errorf("New() error = %q; want it to contain %q", err, tc.wantMsg)
			}
			if !strings.HasPrefix(err.Error(), "policy: ") {
				t.Errorf("New() error = %q; want the package prefix", err)
			}
		})
	}
}

func TestBuiltinsUnique(t *testing.T) {
	sels := map[int]bool{}
	names := map[string]bool{}
	for _, b := range builtins {
		if sels[b.sel] || names[b.name] {
			t.Errorf("builtin sel %d name %q registered twice", b.sel, b.name)
		}
		sels[b.sel], names[b.name] = true, true
	}
	if got, want := fmt.Sprint(Sels()), fmt.Sprint(allSels); got != want {
		t.Errorf("Sels() = %s; want %s", got, want)
	}
	for _, tc := range []struct {
		sel    int
		want   string
		wantOK bool
	}{{0, "round-robin", true}, {8, "chwbl", true}, {10, "weighted-chwbl", true}, {9, "", false}} {
		t.Run(fmt.Sprint(tc.sel), func(t *testing.T) {
			if got, ok := SelName(tc.sel); got != tc.want || ok != tc.wantOK {
				t.Errorf("SelName(%d) = %q, %v; want %q, %v", tc.sel, got, ok, tc.want, tc.wantOK)
			}
		})
	}
}

func TestReasonString(t *testing.T) {
	tests := []struct {
		reason Reason
		want   string
	}{
		{ReasonRoundRobin, "rr"},
		{ReasonWeighted, "wrr"},
		{ReasonLeastInFlight, "least-inflight"},
		{ReasonSessionBound, "session-bound"},
		{ReasonSessionNew, "session-new"},
		{ReasonSessionRebound, "session-rebound"},
		{ReasonSessionNoKey, "session-nokey"},
		{ReasonCHWBLHome, "chwbl-home"},
		{ReasonCHWBLSpill, "chwbl-spill"},
		{ReasonCHWBLNoKey, "chwbl-nokey"},
		{ReasonFallback, "fallback"},
		{Reason(200), "unknown"},
	}
	for _, tc := range tests {
		t.Run(tc.want, func(t *testing.T) {
			if got := tc.reason.String(); got != tc.want {
				t.Errorf("Reason(%d).String() = %q; want %q", tc.reason, got, tc.want)
			}
		})
	}
}

// TestNoEndpoint checks every policy reports ErrNoEndpoint, not a nil
// endpoint, when nothing is eligible.
func TestNoEndpoint(t *testing.T) {
	key := &Request{KeyHash: 42, HasKey: true, Session: []byte("s")}
	tests := []struct {
		name string
		eps  func() []*upstream.Endpoint
		req  func(eps []*upstream.Endpoint) *Request
	}{
		{"empty rule", func() []*upstream.Endpoint { return nil }, func([]*upstream.Endpoint) *Request { return key }},
		{"all draining", func() []*upstream.Endpoint {
			eps := testEndpoints(3)
			for _, e := range eps {
				e.SetDraining(true)
			}
			return eps
		}, func([]*upstream.Endpoint) *Request { return key }},
		{"down, breaker open and excluded", func() []*upstream.Endpoint {
			eps := testEndpoints(2)
			eps[0].SetDown(true)
			return append(eps, tripped("ep2", 2))
		}, func(eps []*upstream.Endpoint) *Request {
			return &Request{KeyHash: 42, HasKey: true, Session: []byte("s"), Exclude: eps[1]}
		}},
	}
	for _, tc := range tests {
		for _, sel := range allSels {
			t.Run(fmt.Sprintf("%s/sel%d", tc.name, sel), func(t *testing.T) {
				eps := tc.eps()
				p := mustNew(t, Config{Sel: sel}, eps)
				keyed := tc.req(eps)
				// The keyed request and a keyless one (each policy's other path).
				for _, req := range []*Request{keyed, {Exclude: keyed.Exclude}} {
					d, err := p.Pick(req)
					if !errors.Is(err, ErrNoEndpoint) || d.Endpoint != nil {
						t.Errorf("Pick(%+v) = %+v, %v; want no endpoint, ErrNoEndpoint", req, d, err)
					}
				}
			})
		}
	}
}
