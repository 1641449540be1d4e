package policy

import (
	"fmt"
	"strings"
	"testing"
)

func TestWeightedSequence(t *testing.T) {
	tests := []struct {
		name     string
		weights  []int
		draining int // index, -1 none
		want     string
	}{
		// nginx's documented smooth sequence for {a:5, b:1, c:1}, twice.
		{"nginx 5:1:1", []int{5, 1, 1}, -1, "ep0 ep0 ep1 ep0 ep2 ep0 ep0 ep0 ep0 ep1 ep0 ep2 ep0 ep0"},
		{"2:1", []int{2, 1}, -1, "ep0 ep1 ep0 ep0 ep1 ep0"},
		{"equal weights rotate", []int{1, 1, 1}, -1, "ep0 ep1 ep2 ep0 ep1 ep2"},
		{"5:1:1 with ep0 draining", []int{5, 1, 1}, 0, "ep1 ep2 ep1 ep2"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			eps := testEndpoints(0, tc.weights...)
			if tc.draining >= 0 {
				eps[tc.draining].SetDraining(true)
			}
			p := mustNew(t, Config{Sel: 2}, eps)
			want := strings.Fields(tc.want)
			got := make([]string, len(want))
			for i := range got {
				d := mustPick(t, p, &Request{})
				if d.Reason != ReasonWeighted {
					t.Errorf("pick %d reason = %v; want wrr", i, d.Reason)
				}
				got[i] = d.Endpoint.ID
			}
			if fmt.Sprint(got) != fmt.Sprint(want) {
				t.Errorf("sequence = %v; want %v", got, want)
			}
		})
	}
}

func TestWeightedShare(t *testing.T) {
	tests := []struct {
		name    string
		weights []int
		exclude int // index, -1 none
		picks   int
		want    map[string]int
	}{
		{"8:2", []int{8, 2}, -1, 1000, map[string]int{"ep0": 800, "ep1": 200}},
		{"5:1:1", []int{5, 1, 1}, -1, 700, map[string]int{"ep0": 500, "ep1": 100, "ep2": 100}},
		{"3:2:1 excluding the heaviest", []int{3, 2, 1}, 0, 300, map[string]int{"ep1": 200, "ep2": 100}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			eps := testEndpoints(0, tc.weights...)
			req := &Request{}
			if tc.exclude >= 0 {
				req.Exclude = eps[tc.exclude]
			}
			got := countPicks(t, mustNew(t, Config{Sel: 2}, eps), req, tc.picks)
			if fmt.Sprint(got) != fmt.Sprint(tc.want) {
				t.Errorf("picks per endpoint = %v; want %v", got, tc.want)
			}
		})
	}
}
