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
	for range n {
		e := p.eps[rotation(p.next.Add(1)-1, n)]
		if eligible(e, req.Exclude) {
			return Decision{Endpoint: e, Reason: ReasonRoundRobin}, nil
		}
	}
	return Decision{}, ErrNoEndpoint
}

var _ Picker = (*roundRobin)(nil)
