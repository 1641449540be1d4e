package policy

import (
	"fmt"
	"testing"

	"github.com/llmgw/llmgw/gateway/upstream"
)

// countPicks runs n picks of req on p and returns the picks per endpoint ID.
func countPicks(t *testing.T, p Picker, req *Request, n int) map[string]int {
	t.Helper()
	got := map[string]int{}
	for range n {
		got[mustPick(t, p, req).Endpoint.ID]++
	}
	return got
}

func TestRoundRobinSpread(t *testing.T) {
	tests := []struct {
		name  string
		setup func(eps []*upstream.Endpoint) (*Request, []*upstream.Endpoint)
		picks int
		want  map[string]int
	}{
		{"all available", func(eps []*upstream.Endpoint) (*Request, []*upstream.Endpoint) { return &Request{}, eps }, 300,
			map[string]int{"ep0": 100, "ep1": 100, "ep2": 100}},
		{"draining skipped", func(eps []*upstream.Endpoint) (*Request, []*upstream.Endpoint) {
			eps[1].SetDraining(true)
			return &Request{}, eps
		}, 300, map[string]int{"ep0": 150, "ep2": 150}},
		{"down skipped", func(eps []*upstream.Endpoint) (*Request, []*upstream.Endpoint) {
			eps[0].SetDown(true)
			return &Request{}, eps
		}, 300, map[string]int{"ep1": 150, "ep2": 150}},
		{"excluded skipped", func(eps []*upstream.Endpoint) (*Request, []*upstream.Endpoint) {
			return &Request{Exclude: eps[2]}, eps
		}, 300, map[string]int{"ep0": 150, "ep1": 150}},
		{"breaker open skipped", func(eps []*upstream.Endpoint) (*Request, []*upstream.Endpoint) {
			return &Request{}, []*upstream.Endpoint{eps[0], eps[1], tripped("ep2", 2)}
		}, 300, map[string]int{"ep0": 150, "ep1": 150}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			req, eps := tc.setup(testEndpoints(3))
			p := mustNew(t, Config{Sel: 0}, eps)
			got := countPicks(t, p, req, tc.picks)
			if fmt.Sprint(got) != fmt.Sprint(tc.want) {
				t.Errorf("picks per endpoint = %v; want %v", got, tc.want)
			}
		})
	}
}

func TestRoundRobinOrder(t *testing.T) {
	eps := testEndpoints(3)
	p := mustNew(t, Config{Sel: 0}, eps)
	var got []string
	for range 7 {
		d := mustPick(t, p, &Request{})
		if d.Reason != ReasonRoundRobin || d.Spill != 0 {
			t.Errorf("Pick() reason %v spill %d; want rr, 0", d.Reason, d.Spill)
		}
		got = append(got, d.Endpoint.ID)
	}
	if want := "[ep0 ep1 ep2 ep0 ep1 ep2 ep0]"; fmt.Sprint(got) != want {
		t.Errorf("sequence = %v; want %s", got, want)
	}
}
