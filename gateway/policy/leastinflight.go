package policy

import (
	"sync/atomic"

	"github.com/llmgw/llmgw/gateway/upstream"
)

// leastInFlight is sel 4: the eligible endpoint with the fewest in-flight
// requests. Ties go to the first endpoint met from a start position that
// rotates with every pick (an atomic counter), so a burst of concurrent picks
// that all see equal counts spreads instead of herding onto Index 0. For a
// given sequence of picks the result is deterministic; the first pick on an
// idle set starts at Index 0.
type leastInFlight struct {
	eps  []*upstream.Endpoint
	next atomic.Uint64
}

func newLeastInFlight(eps []*upstream.Endpoint) *leastInFlight {
	return &leastInFlight{eps: eps}
}

// Pick implements Picker.
func (p *leastInFlight) Pick(req *Request) (Decision, error) {
	if len(p.eps) == 0 {
		return Decision{}, ErrNoEndpoint
	}
	i, ok := leastLoaded(p.eps, req.Exclude, rotation(p.next.Add(1)-1, len(p.eps)), false)
	if !ok {
		return Decision{}, ErrNoEndpoint
	}
	return Decision{Endpoint: p.eps[i], Reason: ReasonLeastInFlight}, nil
}

var _ Picker = (*leastInFlight)(nil)
