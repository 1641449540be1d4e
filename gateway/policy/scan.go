package policy

import "github.com/llmgw/llmgw/gateway/upstream"

// eligible reports whether e may take this request: available and not the
// excluded endpoint.
func eligible(e, exclude *upstream.Endpoint) bool {
	return e != exclude && e.Available()
}

// inFlight is e's in-flight count, never negative (a negative count would
// only come from a caller releasing twice; it must not skew comparisons).
func inFlight(e *upstream.Endpoint) int64 {
	if n := e.InFlight(); n > 0 {
		return n
	}
	return 0
}

// leastLoaded returns the position of the eligible endpoint with the lowest
// (in-flight+1)/weight, scanning from position start and wrapping, so ties go
// to the first one met from start: start 0 gives "lowest Index wins".
// weighted false treats every weight as 1 (plain least in-flight). ok is
// false when no endpoint is eligible.
func leastLoaded(eps []*upstream.Endpoint, exclude *upstream.Endpoint, start int, weighted bool) (best int, ok bool) {
	n := len(eps)
	best = -1
	var bestLoad, bestWeight int64 = 0, 1
	for k := range n {
		i := start + k
		if i >= n {
			i -= n
		}
		e := eps[i]
		if !eligible(e, exclude) {
			continue
		}
		load, w := inFlight(e)+1, int64(1)
		if weighted {
			w = weightOf(e)
		}
		// load/w < bestLoad/bestWeight, cross-multiplied to stay in integers.
		if best < 0 || load*bestWeight < bestLoad*w {
			best, bestLoad, bestWeight = i, load, w
		}
	}
	return best, best >= 0
}

// rotation returns counter mod n for a rotating scan start; n must be > 0.
func rotation(counter uint64, n int) int {
	return int(counter % uint64(n))
}

// weightOf is e's weight, at least 1 (upstream.New enforces it; a literal
// Endpoint might not).
func weightOf(e *upstream.Endpoint) int64 {
	if e.Weight > 1 {
		return int64(e.Weight)
	}
	return 1
}
