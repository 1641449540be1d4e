package policy

import (
	"fmt"
	"math"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"

	"github.com/cespare/xxhash/v2"

	"github.com/llmgw/llmgw/gateway/upstream"
)

// chwbl is sel 8 (consistent hashing with bounded loads) and, with weighted
// set, sel 10 (weighted CHWBL).
//
// Ring. Each endpoint owns virtual nodes at xxhash64("<ID>#<j>") for j in
// 0..vnodes-1: Replicas nodes each for sel 8, Replicas × weight/g for sel 10
// (g = gcd of all weights, so 8:2 and 4:1 build the same ring). Nodes are
// sorted by hash (then position, so a hash collision still orders
// deterministically). A key's home is the first node with hash ≥ key,
// wrapping to the first node.
//
// Key. Request.KeyHash when HasKey, else ConvHash when HasConv; with neither
// the request is not affine and goes to the least in-flight endpoint
// (rotating tie-break, as sel 4).
//
// Bounded load, on live in-flight counts. Let T be the sum of in-flight
// counts over the eligible endpoints (available and not excluded), N their
// number, W the sum of their weights, c the load factor. Endpoint i may take
// the request only if
//
//	in_i + 1 ≤ ceil(c × (T + 1) × w_i / W)
//
// which for sel 8 (every w = 1, W = N) is in_i + 1 ≤ ceil(c × (T + 1) / N).
// The +1s count the request being placed. Worked example, sel 8, c = 1.25,
// four eligible endpoints with in-flight 3, 1, 0, 0: T = 4, the bound is
// ceil(1.25 × 5 / 4) = ceil(1.5625) = 2; an endpoint holding 3 fails
// (3+1 = 4 > 2), one holding 1 passes (1+1 = 2 ≤ 2). With c ≥ 1 some
// eligible endpoint always passes when counts are stable (the least loaded
// holds at most floor(T/N) and floor(T/N)+1 ≤ ceil((T+1)/N)).
//
// Unlike the reference gateway the bound applies to every key, prefix-hash
// keys included: a hot prompt prefix spills instead of herding its whole
// burst onto one worker.
//
// Walk. From the home node clockwise, the first eligible endpoint under the
// bound takes the request; Decision.Spill counts the distinct endpoints
// passed over. If none passes (counts moved during the walk), the least
// loaded eligible endpoint is taken: lowest (in_i+1)/w_i, ties to the lowest
// Index, Reason fallback. The walk is deterministic for given counts, and a
// key returns home as soon as its home is back under the bound.
type chwbl struct {
	eps      []*upstream.Endpoint
	weighted bool
	// lfPPM is the load factor in millionths, so the bound is computed in
	// exact integer arithmetic (no float rounding at bound edges).
	lfPPM int64
	// hashes and owners are the ring, sorted by hash: owners[k] is the
	// position of the endpoint owning node k.
	hashes []uint64
	owners []int32
	// seenPool holds visited-sets for rules with more endpoints than the
	// on-stack set covers.
	seenPool sync.Pool
	// next rotates the tie-break start for keyless requests.
	next atomic.Uint64
}

// lfScale is the fixed-point scale of lfPPM.
const lfScale = 1_000_000

// smallSeen is the visited-set size (in 64-bit words) kept on the stack.
const smallSeen = 8 // 512 endpoints

func newCHWBL(cfg Config, eps []*upstream.Endpoint, weighted bool) (*chwbl, error) {
	p := &chwbl{
		eps:      eps,
		weighted: weighted,
		lfPPM:    int64(math.Round(cfg.LoadFactor * lfScale)),
	}
	words := (len(eps) + 63) / 64
	p.seenPool.New = func() any { s := make([]uint64, words); return &s }

	counts := make([]int, len(eps))
	g := int64(0)
	for _, e := range eps {
		g = gcd(g, weightOf(e))
	}
	total := 0
	for i, e := range eps {
		c := cfg.Replicas
		if weighted {
			c = cfg.Replicas * int(weightOf(e)/g)
		}
		if total += c; total > maxRingNodes {
			return nil, fmt.Errorf("%w: ring would exceed %d virtual nodes; lower replicas or weights", ErrBadConfig, maxRingNodes)
		}
		counts[i] = c
	}

	type node struct {
		hash  uint64
		owner int32
	}
	nodes := make([]node, 0, total)
	var buf []byte
	for i, e := range eps {
		for j := range counts[i] {
			buf = append(buf[:0], e.ID...)
			buf = append(buf, '#')
			buf = strconv.AppendInt(buf, int64(j), 10)
			nodes = append(nodes, node{xxhash.Sum64(buf), int32(i)})
		}
	}
	slices.SortFunc(nodes, func(a, b node) int {
		switch {
		case a.hash < b.hash:
			return -1
		case a.hash > b.hash:
			return 1
		}
		return int(a.owner - b.owner)
	})
	p.hashes = make([]uint64, len(nodes))
	p.owners = make([]int32, len(nodes))
	for k, nd := range nodes {
		p.hashes[k], p.owners[k] = nd.hash, nd.owner
	}
	return p, nil
}

func gcd(a, b int64) int64 {
	for b != 0 {
		a, b = b, a%b
	}
	return a
}

// home returns the ring position of key's home node: the first node with
// hash ≥ key, wrapping to 0. The ring is non-empty.
func (p *chwbl) home(key uint64) int {
	lo, hi := 0, len(p.hashes)
	for lo < hi {
		mid := int(uint(lo+hi) >> 1)
		if p.hashes[mid] < key {
			lo = mid + 1
		} else {
			hi = mid
		}
	}
	if lo == len(p.hashes) {
		return 0
	}
	return lo
}

// underBound reports whether e may take one more request given the eligible
// totals (see the type comment for the formula).
func (p *chwbl) underBound(e *upstream.Endpoint, total, weightSum int64) bool {
	w := int64(1)
	if p.weighted {
		w = weightOf(e)
	}
	num := p.lfPPM * (total + 1) * w
	den := lfScale * weightSum
	limit := (num + den - 1) / den // ceil(num/den); all terms positive
	return inFlight(e)+1 <= limit
}

// Pick implements Picker.
func (p *chwbl) Pick(req *Request) (Decision, error) {
	n := len(p.eps)
	if n == 0 {
		return Decision{}, ErrNoEndpoint
	}
	var key uint64
	switch {
	case req.HasKey:
		key = req.KeyHash
	case req.HasConv:
		key = req.ConvHash
	default:
		i, ok := leastLoaded(p.eps, req.Exclude, rotation(p.next.Add(1)-1, n), p.weighted)
		if !ok {
			return Decision{}, ErrNoEndpoint
		}
		return Decision{Endpoint: p.eps[i], Reason: ReasonCHWBLNoKey}, nil
	}

	var total, weightSum int64
	for _, e := range p.eps {
		if !eligible(e, req.Exclude) {
			continue
		}
		total += inFlight(e)
		if p.weighted {
			weightSum += weightOf(e)
		} else {
			weightSum++
		}
	}
	if weightSum == 0 {
		return Decision{}, ErrNoEndpoint
	}

	// Visited set: on the stack for up to 512 endpoints, pooled beyond.
	var small [smallSeen]uint64
	seen := small[:]
	if n > 64*smallSeen {
		sp := p.seenPool.Get().(*[]uint64)
		defer p.seenPool.Put(sp)
		seen = *sp
		clear(seen)
	}

	ringLen := len(p.hashes)
	k := p.home(key)
	passed := 0
	for step := 0; step < ringLen && passed < n; step++ {
		i := p.owners[k]
		if k++; k == ringLen {
			k = 0
		}
		word, bit := i>>6, uint64(1)<<(i&63)
		if seen[word]&bit != 0 {
			continue
		}
		seen[word] |= bit
		e := p.eps[i]
		if eligible(e, req.Exclude) && p.underBound(e, total, weightSum) {
			r := ReasonCHWBLHome
			if passed > 0 {
				r = ReasonCHWBLSpill
			}
			return Decision{Endpoint: e, Reason: r, Spill: passed}, nil
		}
		passed++
	}
	i, ok := leastLoaded(p.eps, req.Exclude, 0, p.weighted)
	if !ok {
		return Decision{}, ErrNoEndpoint
	}
	return Decision{Endpoint: p.eps[i], Reason: ReasonFallback, Spill: passed}, nil
}

var _ Picker = (*chwbl)(nil)
