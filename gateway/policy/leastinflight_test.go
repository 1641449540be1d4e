package policy

import (
	"fmt"
	"testing"
)

func TestLeastInFlightPicksMinimum(t *testing.T) {
	tests := []struct {
		name     string
		inflight []int
		exclude  int // index, -1 none
		draining int // index, -1 none
		want     string
	}{
		{"unique minimum", []int{2, 0, 1}, -1, -1, "ep1"},
		{"minimum at the end", []int{3, 3, 3, 1}, -1, -1, "ep3"},
		{"minimum excluded", []int{2, 0, 1}, 1, -1, "ep2"},
		{"minimum draining", []int{2, 0, 1}, -1, 1, "ep2"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			eps := testEndpoints(len(tc.inflight))
			for i, n := range tc.inflight {
				hold(t, eps[i], n)
			}
			if tc.draining >= 0 {
				eps[tc.draining].SetDraining(true)
			}
			req := &Request{}
			if tc.exclude >= 0 {
				req.Exclude = eps[tc.exclude]
			}
			p := mustNew(t, Config{Sel: 4}, eps)
			// Several picks, so every rotation of the tie-break start is seen.
			for i := range 2 * len(eps) {
				d := mustPick(t, p, req)
				if d.Endpoint.ID != tc.want || d.Reason != ReasonLeastInFlight {
					t.Fatalf("pick %d = %s (%v); want %s (least-inflight)", i, d.Endpoint.ID, d.Reason, tc.want)
				}
			}
		})
	}
}

// TestLeastInFlightFollowsAcquire picks and acquires in turn: each pick must
// go to an endpoint with the fewest requests held at that moment.
func TestLeastInFlightFollowsAcquire(t *testing.T) {
	eps := testEndpoints(3)
	p := mustNew(t, Config{Sel: 4}, eps)
	hold(t, eps[0], 2)
	var got []string
	for range 6 {
		d := mustPick(t, p, &Request{})
		for _, e := range eps {
			if e.InFlight() < d.Endpoint.InFlight() {
				t.Fatalf("picked %s with %d in flight while %s has %d", d.Endpoint.ID, d.Endpoint.InFlight(), e.ID, e.InFlight())
			}
		}
		hold(t, d.Endpoint, 1)
		got = append(got, d.Endpoint.ID)
	}
	// Deterministic: the tie-break start is 0,1,2,0,1,2. Counts before each
	// pick: [2 0 0] [2 1 0] [2 1 1]→start 2 [2 1 2] [2 2 2]→start 1 [2 3 2]→start 2.
	if want := "[ep1 ep2 ep2 ep1 ep1 ep2]"; fmt.Sprint(got) != want {
		t.Errorf("sequence = %v; want %s", got, want)
	}
}

// TestLeastInFlightNoHerd: when all counts are equal (picks made before any
// Acquire lands, as under a concurrent burst), picks rotate instead of all
// going to Index 0.
func TestLeastInFlightNoHerd(t *testing.T) {
	eps := testEndpoints(4)
	got := countPicks(t, mustNew(t, Config{Sel: 4}, eps), &Request{}, 400)
	if want := map[string]int{"ep0": 100, "ep1": 100, "ep2": 100, "ep3": 100}; fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("picks per endpoint on equal load = %v; want %v", got, want)
	}
}
