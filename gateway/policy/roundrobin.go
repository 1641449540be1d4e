package policy

import (
	"sync/atomic"

	"github.com/llmgw/llmgw/gateway/upstream"
)

// roundRobin is sel 0: a shared atomic counter walks the endpoints in rule
// order. An ineligible endpoint consumes its turn and the next position is
// tried, so over any run of picks the eligible endpoints get exactly equal
// shares (a skipped endpoint's turn is not handed to its neighbour, which
// would double that neighbour's share).
//
// Concurrent picks share the counter, so one pick's n turns need not cover
// all n positions: the turns in between may go to other picks, and a pick
// can meet the same ineligible endpoint n times (issue 42: with 1 of 2
// endpoints draining, 1 pick in 8 failed under contention). A pick whose n
// turns all met ineligible endpoints therefore scans every position once,
// from its last turn on, without taking more turns: it fails only if no
// endpoint was eligible when it looked.
type roundRobin struct {
	eps  []*upstream.Endpoint
	next atomic.Uint64
}

func newRoundRobin(eps []*upstream.Endpoint) *roundRobin {
	return &roundRobin{eps: eps}
}

// Pick implements Picker.
func (p *roundRobin) Pick(req *Request) (Decision, error) {
	n := len(p.eps)
	pos := 0
	for range n {
		pos = rotation(p.next.Add(1)-1, n)
		if e := p.eps[pos]; eligible(e, req.Exclude) {
			return Decision{Endpoint: e, Reason: ReasonRoundRobin}, nil
		}
	}
	for k := 1; k <= n; k++ {
		i := pos + k
		if i >= n {
			i -= n
		}
		if e := p.eps[i]; eligible(e, req.Exclude) {
			return Decision{Endpoint: e, Reason: ReasonRoundRobin}, nil
		}
	}
	return Decision{}, ErrNoEndpoint
}

var _ Picker = (*roundRobin)(nil)
