package policy

import (
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/llmgw/llmgw/gateway/upstream"
)

// fakeClock is a settable clock for TTL tests; safe for concurrent use.
type fakeClock struct {
	mu  sync.Mutex
	now time.Time
}

func newFakeClock() *fakeClock { return &fakeClock{now: time.Unix(1_700_000_000, 0)} }

func (c *fakeClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

func (c *fakeClock) Advance(d time.Duration) {
	c.mu.Lock()
	c.now = c.now.Add(d)
	c.mu.Unlock()
}

func sessionReq(s string) *Request { return &Request{Session: []byte(s)} }

// TestSessionSticky: one session stays on its endpoint across picks even
// when that endpoint becomes the most loaded.
func TestSessionSticky(t *testing.T) {
	eps := testEndpoints(3)
	p := mustNew(t, Config{Sel: 3}, eps)
	first := mustPick(t, p, sessionReq("alice"))
	if first.Endpoint != eps[0] || first.Reason != ReasonSessionNew {
		t.Fatalf("first pick = %s (%v); want ep0 (session-new)", first.Endpoint.ID, first.Reason)
	}
	for i := range 50 {
		hold(t, first.Endpoint, 1) // alice's endpoint gets ever busier
		d := mustPick(t, p, sessionReq("alice"))
		if d.Endpoint != first.Endpoint || d.Reason != ReasonSessionBound {
			t.Fatalf("pick %d = %s (%v); want %s (session-bound)", i, d.Endpoint.ID, d.Reason, first.Endpoint.ID)
		}
	}
}

// TestSessionNewBindsLeastInFlight: new sessions go to the least in-flight
// endpoint; ties rotate, so sessions that start one after another on an idle
// pool spread over it instead of all binding to the first endpoint.
func TestSessionNewBindsLeastInFlight(t *testing.T) {
	tests := []struct {
		name     string
		inflight []int
		want     []string // for new sessions 0..4, in order
	}{
		{"idle: ties rotate", []int{0, 0, 0}, []string{"ep0", "ep1", "ep2", "ep0", "ep1"}},
		{"tie between ep1 and ep2 rotates", []int{4, 1, 1}, []string{"ep1", "ep1", "ep2", "ep1", "ep1"}},
		{"unique minimum", []int{2, 3, 1}, []string{"ep2", "ep2", "ep2", "ep2", "ep2"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			eps := testEndpoints(len(tc.inflight))
			for i, n := range tc.inflight {
				hold(t, eps[i], n)
			}
			p := mustNew(t, Config{Sel: 3}, eps)
			for i := range 5 { // distinct sessions, no acquire: loads stay as set
				d := mustPick(t, p, sessionReq(fmt.Sprint("s", i)))
				if d.Endpoint.ID != tc.want[i] || d.Reason != ReasonSessionNew {
					t.Errorf("new session %d = %s (%v); want %s (session-new)", i, d.Endpoint.ID, d.Reason, tc.want[i])
				}
			}
		})
	}
}

func TestSessionRebind(t *testing.T) {
	tests := []struct {
		name string
		// spoil makes the bound endpoint ep0 unusable for the next request.
		spoil      func(eps []*upstream.Endpoint, req *Request)
		wantReason Reason
	}{
		{"draining", func(eps []*upstream.Endpoint, _ *Request) { eps[0].SetDraining(true) }, ReasonSessionRebound},
		{"down", func(eps []*upstream.Endpoint, _ *Request) { eps[0].SetDown(true) }, ReasonSessionRebound},
		{"excluded for retry", func(eps []*upstream.Endpoint, req *Request) { req.Exclude = eps[0] }, ReasonSessionRebound},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			eps := testEndpoints(3)
			hold(t, eps[1], 1) // so the replacement is ep2, not just the next index
			p := mustNew(t, Config{Sel: 3}, eps)
			if d := mustPick(t, p, sessionReq("bob")); d.Endpoint != eps[0] {
				t.Fatalf("initial binding = %s; want ep0", d.Endpoint.ID)
			}
			req := sessionReq("bob")
			tc.spoil(eps, req)
			d := mustPick(t, p, req)
			if d.Endpoint != eps[2] || d.Reason != tc.wantReason {
				t.Fatalf("after spoiling ep0: %s (%v); want ep2 (%v)", d.Endpoint.ID, d.Reason, tc.wantReason)
			}
			// ep0 is usable again, but the binding moved: bob stays on ep2.
			eps[0].SetDraining(false)
			eps[0].SetDown(false)
			d = mustPick(t, p, sessionReq("bob"))
			if d.Endpoint != eps[2] || d.Reason != ReasonSessionBound {
				t.Errorf("after ep0 returns: %s (%v); want ep2 (session-bound)", d.Endpoint.ID, d.Reason)
			}
		})
	}
}

func TestSessionTTL(t *testing.T) {
	const ttl = 10 * time.Minute
	tests := []struct {
		name       string
		advance    []time.Duration // clock steps, each followed by a pick
		wantID     string          // endpoint of the last pick
		wantReason Reason
	}{
		{"used before expiry", []time.Duration{ttl - time.Second}, "ep0", ReasonSessionBound},
		{"refreshed by use", []time.Duration{ttl - time.Second, ttl - time.Second, ttl - time.Second}, "ep0", ReasonSessionBound},
		{"expired", []time.Duration{ttl}, "ep1", ReasonSessionNew},
		{"expired after refreshes", []time.Duration{ttl / 2, ttl / 2, ttl + time.Nanosecond}, "ep1", ReasonSessionNew},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			clock := newFakeClock()
			eps := testEndpoints(2)
			p := mustNew(t, Config{Sel: 3, SessionTTL: ttl, Now: clock.Now}, eps)
			if d := mustPick(t, p, sessionReq("carol")); d.Endpoint != eps[0] {
				t.Fatalf("initial binding = %s; want ep0", d.Endpoint.ID)
			}
			hold(t, eps[0], 1) // a rebinding would now choose ep1
			var d Decision
			for _, step := range tc.advance {
				clock.Advance(step)
				d = mustPick(t, p, sessionReq("carol"))
			}
			if d.Endpoint.ID != tc.wantID || d.Reason != tc.wantReason {
				t.Errorf("last pick = %s (%v); want %s (%v)", d.Endpoint.ID, d.Reason, tc.wantID, tc.wantReason)
			}
		})
	}
}

func TestSessionNoKey(t *testing.T) {
	eps := testEndpoints(3)
	hold(t, eps[0], 2)
	hold(t, eps[2], 1)
	p := mustNew(t, Config{Sel: 3}, eps)
	for _, req := range []*Request{{}, {Session: []byte{}}} {
		d := mustPick(t, p, req)
		if d.Endpoint != eps[1] || d.Reason != ReasonSessionNoKey {
			t.Errorf("Pick(no session) = %s (%v); want ep1 (session-nokey)", d.Endpoint.ID, d.Reason)
		}
	}
	if n := p.(BindingCounter).Bindings(); n != 0 {
		t.Errorf("Bindings() after keyless picks = %d; want 0", n)
	}
}

// TestSessionTableBounded: a flood of distinct sessions never grows the
// table past SessionCap, and the most recent sessions keep their bindings.
func TestSessionTableBounded(t *testing.T) {
	tests := []struct {
		name string
		cap  int
	}{
		{"cap 1", 1},
		{"cap 10 (uneven shards)", 10},
		{"cap 64", 64},
		{"cap 1000", 1000},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			eps := testEndpoints(3)
			p := mustNew(t, Config{Sel: 3, SessionCap: tc.cap}, eps).(*session)
			const flood = 20_000
			for i := range flood {
				mustPick(t, p, sessionReq(fmt.Sprint("flood-", i)))
				if n := p.Bindings(); i%997 == 0 && n > tc.cap {
					t.Fatalf("after %d sessions Bindings() = %d; want ≤ %d", i+1, n, tc.cap)
				}
			}
			if n := p.Bindings(); n > tc.cap || n < tc.cap/2 {
				t.Errorf("Bindings() = %d; want ≤ %d and at least half full", n, tc.cap)
			}
			// The last session used is the most recent in its shard.
			last := fmt.Sprint("flood-", flood-1)
			if d := mustPick(t, p, sessionReq(last)); d.Reason != ReasonSessionBound {
				t.Errorf("most recent session %s reason = %v; want session-bound", last, d.Reason)
			}
		})
	}
}

// TestSessionExpiredSwept: expired bindings leave the table as traffic
// continues, without a background goroutine.
func TestSessionExpiredSwept(t *testing.T) {
	clock := newFakeClock()
	p := mustNew(t, Config{Sel: 3, SessionTTL: time.Minute, Now: clock.Now}, testEndpoints(2)).(*session)
	for i := range 500 {
		mustPick(t, p, sessionReq(fmt.Sprint("old-", i)))
	}
	if n := p.Bindings(); n != 500 {
		t.Fatalf("Bindings() = %d; want 500", n)
	}
	clock.Advance(time.Minute)
	const fresh = 1000
	for i := range fresh {
		mustPick(t, p, sessionReq(fmt.Sprint("new-", i)))
	}
	if n := p.Bindings(); n != fresh {
		t.Errorf("Bindings() after expiry and %d fresh sessions = %d; want %d (all expired swept)", fresh, n, fresh)
	}
}

func TestSessionInherit(t *testing.T) {
	clock := newFakeClock()
	cfg := Config{Sel: 3, SessionTTL: time.Hour, Now: clock.Now}
	oldEps := testEndpoints(3)
	old := mustNew(t, cfg, oldEps)
	// Bind dave to ep2 and erin to ep1 by loading the others.
	hold(t, oldEps[0], 2)
	hold(t, oldEps[1], 1)
	if d := mustPick(t, old, sessionReq("dave")); d.Endpoint.ID != "ep2" {
		t.Fatalf("dave bound to %s; want ep2", d.Endpoint.ID)
	}
	hold(t, oldEps[2], 5)
	if d := mustPick(t, old, sessionReq("erin")); d.Endpoint.ID != "ep1" {
		t.Fatalf("erin bound to %s; want ep1", d.Endpoint.ID)
	}
	if d := mustPick(t, old, sessionReq("gina")); d.Endpoint.ID != "ep1" {
		t.Fatalf("gina bound to %s; want ep1", d.Endpoint.ID)
	}
	// Move gina to ep0 by making ep1 unavailable, so her binding survives
	// the update; then let a minute pass and refresh dave only.
	oldEps[1].SetDraining(true)
	if d := mustPick(t, old, sessionReq("gina")); d.Endpoint.ID != "ep0" {
		t.Fatalf("gina rebound to %s; want ep0", d.Endpoint.ID)
	}
	clock.Advance(time.Minute)
	mustPick(t, old, sessionReq("dave"))

	// The new rule drops ep1 and reorders: ep2 first, then a new ep9, then ep0.
	newEps := []*upstream.Endpoint{
		upstream.New("ep2", "127.0.0.1", 8002, "127.0.0.1:8002", 1, upstream.RoleNormal, 0, nil),
		upstream.New("ep9", "127.0.0.1", 8009, "127.0.0.1:8009", 1, upstream.RoleNormal, 1, nil),
		upstream.New("ep0", "127.0.0.1", 8000, "127.0.0.1:8000", 1, upstream.RoleNormal, 2, nil),
	}
	hold(t, newEps[0], 3) // dave's endpoint is busy: only the binding can send him there
	np := mustNew(t, cfg, newEps)
	inh, ok := np.(Inheritor)
	if !ok {
		t.Fatalf("session picker does not implement Inheritor")
	}
	inh.Inherit(old)
	inh.Inherit(mustNew(t, Config{Sel: 0}, oldEps)) // foreign pickers are ignored
	inh.Inherit(nil)

	tests := []struct {
		session    string
		wantID     string
		wantReason Reason
	}{
		{"dave", "ep2", ReasonSessionBound}, // carried over by ID to a new position
		{"erin", "ep9", ReasonSessionNew},   // ep1 is not in the new rule: binding dropped
	}
	for _, tc := range tests {
		t.Run(tc.session, func(t *testing.T) {
			d := mustPick(t, np, sessionReq(tc.session))
			if d.Endpoint.ID != tc.wantID || d.Reason != tc.wantReason {
				t.Errorf("Pick(%s) = %s (%v); want %s (%v)", tc.session, d.Endpoint.ID, d.Reason, tc.wantID, tc.wantReason)
			}
		})
	}
	// Expiry is carried over, not restarted: gina was last used an hour
	// before now, so she has expired although the new picker learned her
	// binding only 59 minutes ago. dave was used a minute later: still live.
	clock.Advance(time.Hour - time.Minute)
	if d := mustPick(t, np, sessionReq("gina")); d.Reason != ReasonSessionNew {
		t.Errorf("gina after her TTL: %s (%v); want session-new", d.Endpoint.ID, d.Reason)
	}
	if d := mustPick(t, np, sessionReq("dave")); d.Endpoint.ID != "ep2" || d.Reason != ReasonSessionBound {
		t.Errorf("dave within his TTL: %s (%v); want ep2 (session-bound)", d.Endpoint.ID, d.Reason)
	}
}
