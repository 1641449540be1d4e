package policy

import (
	"fmt"
	"math"
	"sort"
	"testing"
	"time"

	"github.com/cespare/xxhash/v2"

	"github.com/llmgw/llmgw/gateway/upstream"
)

// refRing is an independent, naive model of the documented ring: virtual
// node j of endpoint e sits at xxhash64("<ID>#<j>"). walk returns the
// distinct endpoint positions met clockwise from key's home node.
type refRing struct {
	nodes []refNode
}

type refNode struct {
	hash uint64
	pos  int
}

func newRefRing(eps []*upstream.Endpoint, vnodes func(e *upstream.Endpoint) int) refRing {
	var r refRing
	for i, e := range eps {
		for j := 0; j < vnodes(e); j++ {
			r.nodes = append(r.nodes, refNode{xxhash.Sum64String(fmt.Sprintf("%s#%d", e.ID, j)), i})
		}
	}
	sort.Slice(r.nodes, func(a, b int) bool {
		if r.nodes[a].hash != r.nodes[b].hash {
			return r.nodes[a].hash < r.nodes[b].hash
		}
		return r.nodes[a].pos < r.nodes[b].pos
	})
	return r
}

func (r refRing) walk(key uint64) []int {
	start := sort.Search(len(r.nodes), func(i int) bool { return r.nodes[i].hash >= key })
	var order []int
	seen := map[int]bool{}
	for k := range r.nodes {
		n := r.nodes[(start+k)%len(r.nodes)]
		if !seen[n.pos] {
			seen[n.pos] = true
			order = append(order, n.pos)
		}
	}
	return order
}

func keyReq(i int) *Request {
	return &Request{KeyHash: xxhash.Sum64String(fmt.Sprint("prompt-", i)), HasKey: true}
}

// TestCHWBLHomeMatchesReferenceRing: on idle endpoints every key goes to the
// first endpoint of the documented ring, for several replica counts; if
// Replicas were ignored, the counts other than the default would disagree.
func TestCHWBLHomeMatchesReferenceRing(t *testing.T) {
	tests := []struct {
		name     string
		sel      int
		replicas int
		weights  []int
		vnodes   func(e *upstream.Endpoint) int
	}{
		{"sel8 replicas 1", 8, 1, []int{1, 1, 1, 1}, func(*upstream.Endpoint) int { return 1 }},
		{"sel8 replicas 7", 8, 7, []int{1, 1, 1, 1}, func(*upstream.Endpoint) int { return 7 }},
		{"sel8 default 160", 8, 0, []int{1, 1, 1, 1}, func(*upstream.Endpoint) int { return 160 }},
		{"sel8 ignores weights", 8, 5, []int{8, 2}, func(*upstream.Endpoint) int { return 5 }},
		{"sel10 8:2 reduces to 4:1", 10, 3, []int{8, 2}, func(e *upstream.Endpoint) int { return 3 * e.Weight / 2 }},
		{"sel10 3:1:1", 10, 4, []int{3, 1, 1}, func(e *upstream.Endpoint) int { return 4 * e.Weight }},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			eps := testEndpoints(0, tc.weights...)
			p := mustNew(t, Config{Sel: tc.sel, Replicas: tc.replicas}, eps)
			ref := newRefRing(eps, tc.vnodes)
			for i := range 500 {
				req := keyReq(i)
				want := eps[ref.walk(req.KeyHash)[0]]
				d := mustPick(t, p, req)
				if d.Endpoint != want || d.Reason != ReasonCHWBLHome || d.Spill != 0 {
					t.Fatalf("key %d: Pick = %s (%v, spill %d); want %s (chwbl-home, spill 0)", i, d.Endpoint.ID, d.Reason, d.Spill, want.ID)
				}
			}
		})
	}
}

// TestCHWBLReplicasChangeHomes: the ring really depends on Replicas.
func TestCHWBLReplicasChangeHomes(t *testing.T) {
	eps := testEndpoints(4)
	a := mustNew(t, Config{Sel: 8, Replicas: 1}, eps)
	b := mustNew(t, Config{Sel: 8, Replicas: 160}, eps)
	moved := 0
	for i := range 1000 {
		if mustPick(t, a, keyReq(i)).Endpoint != mustPick(t, b, keyReq(i)).Endpoint {
			moved++
		}
	}
	if moved == 0 {
		t.Errorf("homes of 1000 keys identical with 1 and 160 replicas; want them to differ")
	}
}

// TestCHWBLSticky: the same key lands on the same endpoint pick after pick
// while that endpoint stays under the bound, other endpoints being loaded.
func TestCHWBLSticky(t *testing.T) {
	for _, sel := range []int{8, 10} {
		t.Run(fmt.Sprint("sel", sel), func(t *testing.T) {
			eps := testEndpoints(4)
			p := mustNew(t, Config{Sel: sel}, eps)
			for k := range 20 {
				req := keyReq(k)
				home := mustPick(t, p, req).Endpoint
				for _, e := range eps {
					if e != home {
						hold(t, e, 3)
					}
				}
				for i := range 30 {
					// home holds 0, others 3: T=9, bound ceil(1.25×10/4)=4 ≥ 1.
					if d := mustPick(t, p, req); d.Endpoint != home || d.Reason != ReasonCHWBLHome {
						t.Fatalf("key %d pick %d = %s (%v); want %s (chwbl-home)", k, i, d.Endpoint.ID, d.Reason, home.ID)
					}
				}
				for _, e := range eps {
					for e.InFlight() > 0 {
						e.Release()
					}
				}
			}
		})
	}
}

// TestCHWBLKeyPrecedence: KeyHash wins over ConvHash; ConvHash is the key
// without KeyHash; neither falls back to least in-flight.
func TestCHWBLKeyPrecedence(t *testing.T) {
	eps := testEndpoints(4)
	ref := newRefRing(eps, func(*upstream.Endpoint) int { return DefaultReplicas })
	p := mustNew(t, Config{Sel: 8}, eps)
	key := xxhash.Sum64String("system prompt")
	// The first conversation id whose home differs from the key's, so the
	// cases below can tell which hash was used.
	var conv uint64
	for i := 0; conv == 0 || ref.walk(conv)[0] == ref.walk(key)[0]; i++ {
		conv = xxhash.Sum64String(fmt.Sprint("conversation-", i))
	}
	tests := []struct {
		name       string
		req        *Request
		want       *upstream.Endpoint
		wantReason Reason
	}{
		{"key only", &Request{KeyHash: key, HasKey: true}, eps[ref.walk(key)[0]], ReasonCHWBLHome},
		{"key beats conversation", &Request{KeyHash: key, HasKey: true, ConvHash: conv, HasConv: true}, eps[ref.walk(key)[0]], ReasonCHWBLHome},
		{"conversation only", &Request{ConvHash: conv, HasConv: true}, eps[ref.walk(conv)[0]], ReasonCHWBLHome},
		{"hash fields ignored without flags", &Request{KeyHash: key, ConvHash: conv}, nil, ReasonCHWBLNoKey},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			d := mustPick(t, p, tc.req)
			if (tc.want != nil && d.Endpoint != tc.want) || d.Reason != tc.wantReason {
				t.Errorf("Pick = %s (%v); want %v (%v)", d.Endpoint.ID, d.Reason, tc.want, tc.wantReason)
			}
		})
	}
}

// TestCHWBLNoKeyLeastInFlight: keyless requests go to the least in-flight
// endpoint and rotate on ties.
func TestCHWBLNoKeyLeastInFlight(t *testing.T) {
	eps := testEndpoints(3)
	p := mustNew(t, Config{Sel: 8}, eps)
	got := countPicks(t, p, &Request{}, 300)
	if want := map[string]int{"ep0": 100, "ep1": 100, "ep2": 100}; fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("keyless picks on idle endpoints = %v; want %v", got, want)
	}
	hold(t, eps[0], 1)
	hold(t, eps[2], 1)
	if d := mustPick(t, p, &Request{}); d.Endpoint != eps[1] || d.Reason != ReasonCHWBLNoKey {
		t.Errorf("keyless pick = %s (%v); want ep1 (chwbl-nokey)", d.Endpoint.ID, d.Reason)
	}
}

// TestCHWBLBoundFormula pins the bound: in_i + 1 ≤ ceil(c × (T+1) × w_i / W).
func TestCHWBLBoundFormula(t *testing.T) {
	tests := []struct {
		name     string
		sel      int
		lf       float64
		weights  []int
		inflight []int
		probe    int  // endpoint whose admission is checked
		want     bool // under the bound
	}{
		// The worked example of the chwbl type comment: bound 2.
		{"worked example: 3 in flight fails", 8, 1.25, []int{1, 1, 1, 1}, []int{3, 1, 0, 0}, 0, false},
		{"worked example: 1 in flight passes", 8, 1.25, []int{1, 1, 1, 1}, []int{3, 1, 0, 0}, 1, true},
		{"idle: first request passes", 8, 1.25, []int{1, 1, 1, 1}, []int{0, 0, 0, 0}, 0, true},
		{"second concurrent request spills at 1.25", 8, 1.25, []int{1, 1, 1, 1}, []int{1, 0, 0, 0}, 0, false},
		// T=2: ceil(3×3/4)=3 admits 2+1; ceil(1.25×3/4)=1 does not.
		{"load factor 3 admits", 8, 3, []int{1, 1, 1, 1}, []int{2, 0, 0, 0}, 0, true},
		{"load factor 1.25 refuses", 8, 1.25, []int{1, 1, 1, 1}, []int{2, 0, 0, 0}, 0, false},
		// Exact edge: ceil(1.1 × 10 / 11) = 1 exactly; floats would give 2.
		{"exact integer edge", 8, 1.1, []int{1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1}, []int{1, 1, 1, 1, 1, 1, 1, 1, 1, 0, 0}, 10, true},
		{"exact integer edge refuses 1", 8, 1.1, []int{1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1}, []int{1, 1, 1, 1, 1, 1, 1, 1, 1, 0, 0}, 0, false},
		// Weighted: 3:1, T=4, c=1.25: heavy bound ceil(1.25×5×3/4)=5, light ceil(1.25×5/4)=2.
		{"weighted heavy admits 4", 10, 1.25, []int{3, 1}, []int{4, 0}, 0, true},
		{"weighted light refuses 2", 10, 1.25, []int{3, 1}, []int{2, 2}, 1, false},
		{"weighted light admits 1", 10, 1.25, []int{3, 1}, []int{3, 1}, 1, true},
		// Same counts under sel 8 ignore weights: bound ceil(1.25×5/2)=4 < 5.
		{"sel8 ignores weights", 8, 1.25, []int{3, 1}, []int{4, 0}, 0, false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			eps := testEndpoints(0, tc.weights...)
			var total, wsum int64
			for i, n := range tc.inflight {
				hold(t, eps[i], n)
				total += int64(n)
				if tc.sel == 10 {
					wsum += int64(tc.weights[i])
				} else {
					wsum++
				}
			}
			p := mustNew(t, Config{Sel: tc.sel, LoadFactor: tc.lf}, eps).(*chwbl)
			if got := p.underBound(eps[tc.probe], total, wsum); got != tc.want {
				t.Errorf("underBound(ep%d) with in-flight %v = %v; want %v", tc.probe, tc.inflight, got, tc.want)
			}
		})
	}
}

// TestCHWBLBoundedSpill holds requests on a key's home until it is over the
// bound: the key spills to the next endpoint clockwise (deterministically,
// by the reference ring), and returns home when the hold is released.
func TestCHWBLBoundedSpill(t *testing.T) {
	tests := []struct {
		name        string
		sel         int
		lf          float64
		weights     []int
		holdHome    int // requests held on the home endpoint
		holdNext    int // requests held on the first spill endpoint
		drainNext   bool
		excludeHome bool // the retry after the home failed
		wantSpill   int  // 0: stays home
	}{
		{"under the bound stays home", 8, 1.25, []int{1, 1, 1, 1}, 0, 0, false, false, 0},
		{"one held spills at 1.25", 8, 1.25, []int{1, 1, 1, 1}, 1, 0, false, false, 1},
		{"two held stay home at 3", 8, 3, []int{1, 1, 1, 1}, 2, 0, false, false, 0},
		{"three held spill at 3", 8, 3, []int{1, 1, 1, 1}, 3, 0, false, false, 1},
		{"next over the bound too spills twice", 8, 1.25, []int{1, 1, 1, 1}, 3, 3, false, false, 2},
		{"next draining spills twice", 8, 1.25, []int{1, 1, 1, 1}, 1, 0, true, false, 2},
		{"home excluded spills once", 8, 1.25, []int{1, 1, 1, 1}, 0, 0, false, true, 1},
		{"home excluded and next draining", 10, 1.25, []int{1, 1, 1, 1}, 0, 0, true, true, 2},
		{"weighted equal weights spill", 10, 1.25, []int{2, 2, 2, 2}, 1, 0, false, false, 1},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			eps := testEndpoints(0, tc.weights...)
			p := mustNew(t, Config{Sel: tc.sel, LoadFactor: tc.lf}, eps)
			ref := newRefRing(eps, func(e *upstream.Endpoint) int {
				if tc.sel == 10 {
					return DefaultReplicas * e.Weight / tc.weights[0] // equal weights reduce to 1
				}
				return DefaultReplicas
			})
			for k := range 10 {
				req := keyReq(k)
				order := ref.walk(req.KeyHash)
				home, next := eps[order[0]], eps[order[1]]
				releaseHome := hold(t, home, tc.holdHome)
				releaseNext := hold(t, next, tc.holdNext)
				next.SetDraining(tc.drainNext)
				retry := *req
				if tc.excludeHome {
					retry.Exclude = home
				}

				want := eps[order[tc.wantSpill]]
				wantReason := ReasonCHWBLSpill
				if tc.wantSpill == 0 {
					wantReason = ReasonCHWBLHome
				}
				for i := range 3 { // deterministic: the same answer each time
					d := mustPick(t, p, &retry)
					if d.Endpoint != want || d.Reason != wantReason || d.Spill != tc.wantSpill {
						t.Fatalf("key %d pick %d = %s (%v, spill %d); want %s (%v, spill %d); ring order %v",
							k, i, d.Endpoint.ID, d.Reason, d.Spill, want.ID, wantReason, tc.wantSpill, order)
					}
				}
				releaseHome()
				releaseNext()
				next.SetDraining(false)
				if d := mustPick(t, p, req); d.Endpoint != home || d.Reason != ReasonCHWBLHome {
					t.Fatalf("key %d after release = %s (%v); want home %s", k, d.Endpoint.ID, d.Reason, home.ID)
				}
			}
		})
	}
}

// TestCHWBLHotPrefixSpreads: a burst of identical prompts, each held, does
// not herd onto one endpoint (the reference gateway pinned prefix keys to
// one worker regardless of load); the home still takes the largest share.
func TestCHWBLHotPrefixSpreads(t *testing.T) {
	tests := []struct {
		name    string
		lf      float64
		burst   int
		wantMax int // ceil(lf × burst / 4): the home's bound at the last pick
	}{
		{"lf 1.25", 1.25, 20, 7},
		{"lf 2", 2, 20, 10},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			eps := testEndpoints(4)
			p := mustNew(t, Config{Sel: 8, LoadFactor: tc.lf}, eps)
			req := keyReq(0)
			home := mustPick(t, p, req).Endpoint
			for range tc.burst {
				hold(t, mustPick(t, p, req).Endpoint, 1)
			}
			used := 0
			for _, e := range eps {
				if e.InFlight() > 0 {
					used++
				}
				if e.InFlight() > home.InFlight() {
					t.Errorf("%s holds %d > home %s's %d", e.ID, e.InFlight(), home.ID, home.InFlight())
				}
			}
			if used < 2 || home.InFlight() > int64(tc.wantMax) {
				t.Errorf("burst of %d: %d endpoints used, home holds %d; want ≥ 2 used and home ≤ %d", tc.burst, used, home.InFlight(), tc.wantMax)
			}
		})
	}
}

// TestCHWBLSpread: distinct keys spread over endpoints per their share of
// the ring. With R virtual nodes per endpoint an endpoint's arc share has a
// relative standard deviation of about 1/sqrt(R); sampling K keys adds
// sqrt((1-p)/(K p)). The tolerance is 4 of each, computed for the fixed set.
func TestCHWBLSpread(t *testing.T) {
	tests := []struct {
		name     string
		sel      int
		replicas int
		weights  []int
	}{
		{"sel8 4 endpoints", 8, 160, []int{1, 1, 1, 1}},
		{"sel8 6 endpoints", 8, 160, []int{1, 1, 1, 1, 1, 1}},
		{"sel10 8:2", 10, 160, []int{8, 2}},
		{"sel10 5:1:1", 10, 160, []int{5, 1, 1}},
		{"sel10 3:2:1 fewer replicas", 10, 64, []int{3, 2, 1}},
	}
	const keys = 6000
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			eps := testEndpoints(0, tc.weights...)
			p := mustNew(t, Config{Sel: tc.sel, Replicas: tc.replicas}, eps)
			got := make([]int, len(eps))
			for i := range keys {
				got[mustPick(t, p, keyReq(i)).Endpoint.Index]++
			}
			wsum := 0
			for _, w := range tc.weights {
				wsum += w
			}
			for i, e := range eps {
				share := 1 / float64(len(eps))
				vnodes := float64(tc.replicas)
				if tc.sel == 10 {
					share = float64(e.Weight) / float64(wsum)
					vnodes = float64(tc.replicas * e.Weight) // weights here have gcd 1
				}
				tol := 4 * (1/math.Sqrt(vnodes) + math.Sqrt((1-share)/(keys*share)))
				want := share * keys
				if diff := math.Abs(float64(got[i])-want) / want; diff > tol {
					t.Errorf("%s got %d of %d keys; want %.0f ± %.0f%% (off by %.1f%%)", e.ID, got[i], keys, want, 100*tol, 100*diff)
				}
			}
			t.Logf("keys per endpoint: %v", got)
		})
	}
}

// TestCHWBLFallback covers the walk finding no endpoint under the bound,
// which only happens when counts move during a pick: with stable counts and
// c ≥ 1 the least loaded endpoint is always under the bound. The move is
// simulated deterministically through ep0's breaker clock, which the walk
// consults when it visits ep0 (ep0's breaker is open, so Available asks the
// clock): the second call lands 10 requests on ep1, as concurrent picks
// would, after the totals were taken.
func TestCHWBLFallback(t *testing.T) {
	var calls int
	var ep1 *upstream.Endpoint
	var releases []func()
	clock := func() time.Time {
		calls++
		if calls == 2 {
			for range 10 {
				releases = append(releases, ep1.Acquire())
			}
		}
		return time.Unix(1_700_000_000, 0)
	}
	brk := upstream.NewBreaker(upstream.BreakerConfig{Now: clock})
	brk.Trip()
	calls = 0
	eps := []*upstream.Endpoint{
		upstream.New("ep0", "127.0.0.1", 8000, "127.0.0.1:8000", 1, upstream.RoleNormal, 0, brk),
		upstream.New("ep1", "127.0.0.1", 8001, "127.0.0.1:8001", 1, upstream.RoleNormal, 1, nil),
	}
	ep1 = eps[1]
	t.Cleanup(func() {
		for _, r := range releases {
			r()
		}
	})
	ref := newRefRing(eps, func(*upstream.Endpoint) int { return DefaultReplicas })
	var req *Request
	for i := 0; req == nil; i++ { // a key whose home is ep0, so the walk visits ep0 first
		if r := keyReq(i); ref.walk(r.KeyHash)[0] == 0 {
			req = r
		}
	}
	p := mustNew(t, Config{Sel: 8}, eps)
	d := mustPick(t, p, req)
	// Totals saw ep1 idle (bound ceil(1.25×1/1) = 2); by its visit it holds
	// 10, so nothing passes and the least loaded available endpoint, ep1, is
	// taken.
	if d.Endpoint != ep1 || d.Reason != ReasonFallback || d.Spill != 2 {
		t.Errorf("Pick = %s (%v, spill %d); want ep1 (fallback, spill 2)", d.Endpoint.ID, d.Reason, d.Spill)
	}
	if calls < 2 {
		t.Errorf("breaker clock called %d times; the scenario needs the walk to visit ep0", calls)
	}
}
