//go:build !race

package policy

import (
	"fmt"
	"testing"

	"github.com/cespare/xxhash/v2"

	"github.com/llmgw/llmgw/gateway/upstream"
)

// TestPickZeroAllocs proves the target: no allocation per pick on
// every policy's common path, including a session that is already bound and
// a CHWBL rule large enough to use the pooled visited-set.
func TestPickZeroAllocs(t *testing.T) {
	big := testEndpoints(600)
	tests := []struct {
		name string
		sel  int
		eps  []*upstream.Endpoint
		req  func(eps []*upstream.Endpoint) *Request
		// warm runs before measuring (binds the session).
		warm bool
	}{
		{"rr", 0, testEndpoints(4), func([]*upstream.Endpoint) *Request { return &Request{} }, false},
		{"rr excluding", 0, testEndpoints(4), func(eps []*upstream.Endpoint) *Request { return &Request{Exclude: eps[1]} }, false},
		{"wrr", 2, testEndpoints(0, 5, 1, 1), func([]*upstream.Endpoint) *Request { return &Request{} }, false},
		{"session bound", 3, testEndpoints(4), func([]*upstream.Endpoint) *Request { return &Request{Session: []byte("user-1234")} }, true},
		{"session bound, other endpoint excluded", 3, testEndpoints(4), func(eps []*upstream.Endpoint) *Request {
			return &Request{Session: []byte("user-1234"), Exclude: eps[3]}
		}, true},
		{"session none", 3, testEndpoints(4), func([]*upstream.Endpoint) *Request { return &Request{} }, false},
		{"least-inflight", 4, testEndpoints(4), func([]*upstream.Endpoint) *Request { return &Request{} }, false},
		{"chwbl key", 8, testEndpoints(4), func([]*upstream.Endpoint) *Request {
			return &Request{KeyHash: xxhash.Sum64String("k"), HasKey: true}
		}, false},
		{"chwbl conversation", 8, testEndpoints(4), func([]*upstream.Endpoint) *Request {
			return &Request{ConvHash: xxhash.Sum64String("c"), HasConv: true}
		}, false},
		{"chwbl nokey", 8, testEndpoints(4), func([]*upstream.Endpoint) *Request { return &Request{} }, false},
		{"chwbl 600 endpoints", 8, big, func([]*upstream.Endpoint) *Request {
			return &Request{KeyHash: xxhash.Sum64String("k"), HasKey: true}
		}, false},
		{"weighted chwbl", 10, testEndpoints(0, 8, 2), func([]*upstream.Endpoint) *Request {
			return &Request{KeyHash: xxhash.Sum64String("k"), HasKey: true}
		}, false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			p := mustNew(t, Config{Sel: tc.sel}, tc.eps)
			req := tc.req(tc.eps)
			if tc.warm {
				mustPick(t, p, req)
			}
			// Load some endpoints so spill and tie-break paths run too.
			hold(t, tc.eps[0], 2)
			var failed error
			allocs := testing.AllocsPerRun(1000, func() {
				d, err := p.Pick(req)
				if err != nil {
					failed = err
					return
				}
				d.Endpoint.Acquire()()
			})
			if failed != nil {
				t.Fatalf("Pick error: %v", failed)
			}
			if allocs != 0 {
				t.Errorf("allocs per Pick = %v; want 0", allocs)
			}
		})
	}
}

// TestReasonStringZeroAllocs: the route header token costs nothing.
func TestReasonStringZeroAllocs(t *testing.T) {
	var sink string
	if allocs := testing.AllocsPerRun(100, func() { sink = ReasonCHWBLSpill.String() }); allocs != 0 {
		t.Errorf("allocs per Reason.String = %v; want 0", allocs)
	}
	_ = fmt.Sprint(sink)
}
