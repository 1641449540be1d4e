package overhead

import (
	"math"
	"strings"
	"testing"
	"time"
)

// seq is 1, 2, …, n in a scrambled order (medianCI sorts).
func seq(n int) []float64 {
	v := make([]float64, n)
	for i := range v {
		v[i] = float64((i*7)%n + 1)
	}
	return v
}

// The interval's ranks are the textbook ones for the median's
// distribution-free 95% interval (binomial order statistics): n=6 the
// extremes (coverage 96.9%), n=10 the 2nd and 9th, n=20 the 6th and 15th,
// n=100 the 40th and 61st, n=10,000 the 4,902nd and 5,099th (the normal
// approximation: 5,000 ∓ 1.96·50); below 6 there is none.
func TestMedianCI(t *testing.T) {
	cases := []struct {
		name        string
		v           []float64
		med, lo, hi float64
		ok          bool
	}{
		{"empty", nil, 0, 0, 0, false},
		{"one", []float64{3}, 3, 0, 0, false},
		{"five: no 95% interval", seq(5), 3, 0, 0, false},
		{"six", seq(6), 3.5, 1, 6, true},
		{"ten", seq(10), 5.5, 2, 9, true},
		{"twenty", seq(20), 10.5, 6, 15, true},
		{"a hundred", seq(100), 50.5, 40, 61, true},
		{"ten thousand (no underflow)", seq(10000), 5000.5, 4902, 5099, true},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			med, lo, hi, ok := medianCI(tc.v)
			if med != tc.med || lo != tc.lo || hi != tc.hi || ok != tc.ok {
				t.Fatalf("medianCI = %v [%v, %v] %v; want %v [%v, %v] %v", med, lo, hi, ok, tc.med, tc.lo, tc.hi, tc.ok)
			}
		})
	}
}

// The interval covers the median at least 95% of the time, whatever the
// distribution: checked by simulation on a skewed one.
func TestMedianCICoverage(t *testing.T) {
	const trials = 4000
	x := uint64(1)
	next := func() float64 { // xorshift, deterministic
		x ^= x << 13
		x ^= x >> 7
		x ^= x << 17
		return float64(x>>11) / (1 << 53)
	}
	trueMedian := math.Ln2 // of the exponential distribution with rate 1
	for _, n := range []int{6, 9, 25} {
		covered := 0
		for range trials {
			v := make([]float64, n)
			for i := range v {
				v[i] = -math.Log(1 - next())
			}
			if _, lo, hi, ok := medianCI(v); ok && lo <= trueMedian && trueMedian <= hi {
				covered++
			}
		}
		if c := float64(covered) / trials; c < 0.94 {
			t.Errorf("n=%d: the interval covered the true median in %.1f%% of %d trials; want at least 95%% (less sampling error)", n, 100*c, trials)
		}
	}
}

// Rounds pair by index; a round in which either target ran less than the
// minimum (the run's last, cut short) or the reference completed nothing
// is left out.
func TestPairTurns(t *testing.T) {
	s := time.Second
	a := []turn{{ok: 100, wall: s}, {ok: 300, wall: 2 * s}, {ok: 50, wall: s / 10}, {ok: 90, wall: s}, {ok: 10, wall: s}}
	b := []turn{{ok: 50, wall: s}, {ok: 100, wall: s}, {ok: 100, wall: s}, {ok: 0, wall: s}, {ok: 20, wall: s}}
	got := pairTurns(a, b, s/2)
	want := []float64{2, 1.5, 0.5}
	if len(got) != len(want) {
		t.Fatalf("pairTurns = %v; want %v", got, want)
	}
	for i := range want {
		if math.Abs(got[i]-want[i]) > 1e-12 {
			t.Fatalf("pairTurns = %v; want %v", got, want)
		}
	}
	// Only llmgw targets are compared, with every measured other one.
	turns := [][]turn{a, a, b, b}
	ps := pairedRatios([]string{Direct, LLMGW, Nginx, HAProxy}, turns, []bool{false, false, false, true}, s)
	if len(ps) != 2 || ps[0].A != LLMGW || ps[0].B != Direct || ps[1].B != Nginx || ps[0].Turns != 4 || ps[1].Turns != 3 {
		t.Fatalf("pairedRatios = %+v; want llmgw/direct over 4 rounds and llmgw/nginx over 3", ps)
	}
	if ps[1].Median != 1.5 || ps[1].Low != 0 {
		t.Fatalf("llmgw/nginx = %+v; want median 1.5 and no interval (3 rounds)", ps[1])
	}
	// Both llmgw targets: compared once, not also the other way round.
	ps = pairedRatios([]string{Direct, LLMGW, LLMGWEmbedded}, [][]turn{b, a, b}, []bool{false, false, false}, s)
	var names []string
	for _, p := range ps {
		names = append(names, p.A+"/"+p.B)
	}
	if got, want := strings.Join(names, " "), "llmgw/direct llmgw/llmgw-embedded llmgw-embedded/direct"; got != want {
		t.Fatalf("pairs %q; want %q", got, want)
	}
}

// TestAddedByRound: each target's quantiles less direct's in the same
// round, over the rounds where both ran half a slice and completed enough
// requests for a p99; one round's pause moves the median little.
func TestAddedByRound(t *testing.T) {
	s, us := time.Second, time.Microsecond
	direct := make([]turn, 8)
	gw := make([]turn, 8)
	for i := range direct {
		direct[i] = turn{ok: 10000, wall: s, p50: 80 * us, p99: 600 * us}
		gw[i] = turn{ok: 10000, wall: s, p50: time.Duration(150+i) * us, p99: time.Duration(900+10*i) * us}
	}
	gw[3].p99 = 9 * time.Millisecond // one slice with a pause
	gw[5].wall = s / 4               // cut short: not compared
	direct[6].ok = 50                // too few for a p99: not compared
	short := []turn{{ok: 10000, wall: s, p50: 90 * us, p99: 700 * us}}
	got := addedByRound([]string{Nginx, Direct, LLMGW, HAProxy}, [][]turn{short, direct, gw, gw}, []bool{false, false, false, true}, s)
	if len(got) != 1 || got[0].Target != LLMGW || got[0].Turns != 6 {
		t.Fatalf("addedByRound = %+v; want llmgw over 6 rounds (nginx has one round, haproxy was skipped)", got)
	}
	// p99 differences over rounds 0,1,2,3,4,7: 300, 310, 320, 8400, 340, 370 µs.
	if want := 330 * us; got[0].P99.Median != want {
		t.Errorf("p99 median %v; want %v", got[0].P99.Median, want)
	}
	if got[0].P99.Low != 300*us || got[0].P99.High != 8400*us {
		t.Errorf("p99 interval [%v, %v]; want the extremes of 6 rounds", got[0].P99.Low, got[0].P99.High)
	}
	if want := 72500 * time.Nanosecond; got[0].P50.Median != want {
		t.Errorf("p50 median %v; want %v", got[0].P50.Median, want)
	}
	if addedByRound([]string{LLMGW, Nginx}, [][]turn{gw, gw}, []bool{false, false}, s) != nil {
		t.Error("compared without a direct target")
	}
}
