package policy

import (
	"sync"

	"github.com/llmgw/llmgw/gateway/upstream"
)

// weightedRR is sel 2: nginx's smooth weighted round robin. On every pick
// each eligible endpoint's current score grows by its weight, the highest
// score wins (lowest Index on ties) and the winner's score drops by the sum
// of the eligible weights. Weights 5:1:1 give a,a,b,a,c,a,a: exact shares
// over every cycle of Σweight picks, without bursts. Ineligible endpoints
// keep their score untouched until they return.
type weightedRR struct {
	eps []*upstream.Endpoint

	mu      sync.Mutex
	current []int64 // guarded by mu; one score per endpoint position
}

func newWeightedRR(eps []*upstream.Endpoint) *weightedRR {
	return &weightedRR{eps: eps, current: make([]int64, len(eps))}
}

// Pick implements Picker.
func (p *weightedRR) Pick(req *Request) (Decision, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	best := -1
	var total int64
	for i, e := range p.eps {
		if !eligible(e, req.Exclude) {
			continue
		}
		w := weightOf(e)
		p.current[i] += w
		total += w
		if best < 0 || p.current[i] > p.current[best] {
			best = i
		}
	}
	if best < 0 {
		return Decision{}, ErrNoEndpoint
	}
	p.current[best] -= total
	return Decision{Endpoint: p.eps[best], Reason: ReasonWeighted}, nil
}

var _ Picker = (*weightedRR)(nil)
