package overhead

import (
	"math"
	"slices"
	"time"
)

// turn is one target's share of one round: the requests it completed in
// its slice, the slice's measured length, and the latency quantiles of
// the slice's requests.
type turn struct {
	ok       int
	wall     time.Duration
	p50, p99 time.Duration
}

// PairedRatio compares two targets round by round. Targets take turns in
// slices, so two turns of the same round ran under nearly the same machine
// state; the ratio of their throughputs in each round is one sample, and
// their median with a confidence interval says what the totals' ratio
// alone cannot: whether the difference is larger than the run's own
// variation. Only rounds in which both targets ran at least half a slice
// count.
type PairedRatio struct {
	A string `json:"a"`
	B string `json:"b"`
	// Turns is the number of rounds compared.
	Turns int `json:"turns"`
	// Median is the median of A's throughput over B's, round by round.
	Median float64 `json:"median"`
	// Low and High bound the median with at least 95% confidence, whatever
	// the distribution of the ratios (order statistics of the rounds);
	// both are 0 when there are fewer than 6 rounds, too few for such a
	// bound.
	Low  float64 `json:"low,omitempty"`
	High float64 `json:"high,omitempty"`
}

// minTurnsForCI is the fewest samples for which a distribution-free 95%
// interval for the median exists: with 5, even the smallest and largest
// value cover it only with probability 1 - 2/32 = 93.75%.
const minTurnsForCI = 6

// pairTurns is the ratio of a's throughput over b's in every round where
// both ran at least minWall (turn i of each is round i).
func pairTurns(a, b []turn, minWall time.Duration) []float64 {
	var r []float64
	for i := 0; i < len(a) && i < len(b); i++ {
		x, y := a[i], b[i]
		if x.wall < minWall || y.wall < minWall || y.ok == 0 {
			continue
		}
		r = append(r, (float64(x.ok)/x.wall.Seconds())/(float64(y.ok)/y.wall.Seconds()))
	}
	return r
}

// medianCI is the median of v and a distribution-free confidence interval
// for it of at least 95% coverage: the k-th smallest and the k-th largest
// value, k the largest rank with P(Binomial(n, 1/2) < k) <= 2.5%. ok is
// false when n < minTurnsForCI (lo and hi are then 0). v is sorted in
// place.
func medianCI(v []float64) (med, lo, hi float64, ok bool) {
	n := len(v)
	if n == 0 {
		return 0, 0, 0, false
	}
	slices.Sort(v)
	if n%2 == 1 {
		med = v[n/2]
	} else {
		med = (v[n/2-1] + v[n/2]) / 2
	}
	if n < minTurnsForCI {
		return med, 0, 0, false
	}
	// cdf accumulates P(X <= j) for X ~ Binomial(n, 1/2), in logs so
	// that 2^-n does not underflow for long runs.
	k, cdf := 0, 0.0
	lg := func(x int) float64 { v, _ := math.Lgamma(float64(x) + 1); return v }
	for j := 0; j < n/2; j++ {
		cdf += math.Exp(lg(n) - lg(j) - lg(n-j) - float64(n)*math.Ln2)
		if cdf > 0.025 {
			break
		}
		k = j + 1
	}
	return med, v[k-1], v[n-k], true
}

// pairedRatios compares each llmgw target with every other measured
// target, round by round (the two llmgw targets with each other once, not
// also inverted).
func pairedRatios(names []string, turns [][]turn, skipped []bool, slice time.Duration) []PairedRatio {
	isGW := func(n string) bool { return n == LLMGW || n == LLMGWEmbedded }
	var out []PairedRatio
	for i, a := range names {
		if !isGW(a) || skipped[i] {
			continue
		}
		for j, b := range names {
			if j == i || skipped[j] || (isGW(b) && j < i) {
				continue
			}
			r := pairTurns(turns[i], turns[j], slice/2)
			if len(r) < 2 {
				continue
			}
			p := PairedRatio{A: a, B: b, Turns: len(r)}
			p.Median, p.Low, p.High, _ = medianCI(r)
			out = append(out, p)
		}
	}
	return out
}

// AddedByRound is a target's latency over direct's, round by round: in
// every round where both ran at least half a slice and completed at least
// minTurnSamples requests, the target's p50 (and p99) less direct's in the
// same round; the median of those differences with its interval. A pause
// of the machine that lands in one slice moves a whole run's p99, but
// only one round's difference.
type AddedByRound struct {
	Target string `json:"target"`
	// Turns is the number of rounds compared.
	Turns int      `json:"turns"`
	P50   MedianCI `json:"p50"`
	P99   MedianCI `json:"p99"`
}

// MedianCI is a median with a distribution-free interval of at least 95%
// coverage; Low and High are 0 below minTurnsForCI samples.
type MedianCI struct {
	Median time.Duration `json:"median_ns"`
	Low    time.Duration `json:"low_ns,omitempty"`
	High   time.Duration `json:"high_ns,omitempty"`
}

// minTurnSamples is the fewest requests a turn needs for its p99 to be a
// quantile rather than its maximum (nearest rank: 99 of 100).
const minTurnSamples = 100

// addedByRound compares every measured target but direct with direct,
// round by round (nothing when direct was not measured).
func addedByRound(names []string, turns [][]turn, skipped []bool, slice time.Duration) []AddedByRound {
	d := slices.Index(names, Direct)
	if d < 0 || skipped[d] {
		return nil
	}
	var out []AddedByRound
	for i, name := range names {
		if i == d || skipped[i] {
			continue
		}
		var p50, p99 []float64
		for r := 0; r < len(turns[i]) && r < len(turns[d]); r++ {
			x, y := turns[i][r], turns[d][r]
			if x.wall < slice/2 || y.wall < slice/2 || x.ok < minTurnSamples || y.ok < minTurnSamples {
				continue
			}
			p50 = append(p50, float64(x.p50-y.p50))
			p99 = append(p99, float64(x.p99-y.p99))
		}
		if len(p50) < 2 {
			continue
		}
		a := AddedByRound{Target: name, Turns: len(p50)}
		a.P50 = durationCI(p50)
		a.P99 = durationCI(p99)
		out = append(out, a)
	}
	return out
}

func durationCI(v []float64) MedianCI {
	med, lo, hi, _ := medianCI(v)
	return MedianCI{Median: time.Duration(med), Low: time.Duration(lo), High: time.Duration(hi)}
}
