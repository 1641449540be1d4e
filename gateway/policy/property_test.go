package policy

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/cespare/xxhash/v2"

	"github.com/llmgw/llmgw/gateway/upstream"
)

// TestPickNeverFailsWhileOneStaysEligible is the picker's availability
// property, for every registered policy: while at least one endpoint stays
// eligible for the whole run, no concurrent Pick returns an error, and none
// returns an endpoint that is ineligible for the whole run (the excluded one,
// one held down, one behind an open breaker). The other endpoints flip
// between eligible and not while the picks run. Run it with -race.
//
// Issue 42 found round robin failing this with 1 of 2 endpoints draining:
// concurrent picks took the turns in between one pick's turns, so a pick
// could land on the draining endpoint every time.
func TestPickNeverFailsWhileOneStaysEligible(t *testing.T) {
	const (
		workers = 4
		picks   = 2000
	)
	type flipKind int
	const (
		flipNone flipKind = iota
		flipDraining
		flipDown
	)
	tests := []struct {
		name    string
		weights []int
		stable  int   // position that stays eligible throughout
		off     []int // positions ineligible throughout (draining)
		tripped []int // positions whose breaker is open throughout
		exclude int   // position every request excludes; -1 none
		flip    flipKind
	}{
		{"one of two draining", []int{1, 1}, 1, []int{0}, nil, -1, flipNone},
		{"others flip draining", []int{1, 3, 1, 2}, 2, nil, nil, -1, flipDraining},
		{"others flip down, one excluded, one tripped", []int{2, 1, 1, 1, 1}, 0, nil, []int{4}, 3, flipDown},
		{"last stable, others flip draining", []int{1, 1, 1}, 2, nil, nil, -1, flipDraining},
	}
	for _, sel := range Sels() {
		name, _ := SelName(sel)
		for _, tc := range tests {
			t.Run(name+"/"+tc.name, func(t *testing.T) {
				eps := make([]*upstream.Endpoint, len(tc.weights))
				never := map[*upstream.Endpoint]bool{}
				for i, w := range tc.weights {
					port := 8000 + i
					var b *upstream.Breaker
					for _, j := range tc.tripped {
						if j == i {
							b = upstream.NewBreaker(upstream.BreakerConfig{})
							b.Trip()
						}
					}
					eps[i] = upstream.New(fmt.Sprintf("ep%d", i), "127.0.0.1", port, fmt.Sprintf("127.0.0.1:%d", port), w, upstream.RoleNormal, i, b)
					if b != nil {
						never[eps[i]] = true
					}
				}
				for _, i := range tc.off {
					eps[i].SetDraining(true)
					never[eps[i]] = true
				}
				var exclude *upstream.Endpoint
				if tc.exclude >= 0 {
					exclude = eps[tc.exclude]
					never[exclude] = true
				}
				var flippers []*upstream.Endpoint
				for i, e := range eps {
					if i != tc.stable && !never[e] && tc.flip != flipNone {
						flippers = append(flippers, e)
					}
				}
				p := mustNew(t, Config{Sel: sel, SessionCap: 64}, eps)

				ctx, cancel := context.WithCancel(context.Background())
				var flipWG sync.WaitGroup
				for k, e := range flippers {
					flipWG.Add(1)
					go func() {
						defer flipWG.Done()
						for i := k; ctx.Err() == nil; i++ {
							switch tc.flip {
							case flipDraining:
								e.SetDraining(i%2 == 0)
							case flipDown:
								e.SetDown(i%2 == 0)
							}
						}
					}()
				}

				var failed, wrong atomic.Int64
				var first atomic.Value // the first failure, as a string
				var wg sync.WaitGroup
				for w := range workers {
					wg.Add(1)
					go func() {
						defer wg.Done()
						req := &Request{Exclude: exclude}
						for i := range picks {
							req.KeyHash, req.HasKey = xxhash.Sum64String(fmt.Sprint("k", i%29)), i%3 != 0
							req.ConvHash, req.HasConv = uint64(i%11), i%5 == 0
							req.Session = fmt.Appendf(req.Session[:0], "s-%d-%d", w, i%17)
							if i%4 == 0 {
								req.Session = req.Session[:0]
							}
							d, err := p.Pick(req)
							switch {
							case err != nil || d.Endpoint == nil:
								if failed.Add(1) == 1 {
									first.Store(fmt.Sprintf("worker %d pick %d: %+v, %v", w, i, d, err))
								}
								continue
							case never[d.Endpoint]:
								if wrong.Add(1) == 1 {
									first.Store(fmt.Sprintf("worker %d pick %d chose %s, ineligible throughout", w, i, d.Endpoint.ID))
								}
								continue
							}
							// Hold it briefly so in-flight counts move (the
							// least-loaded and bounded-load paths read them).
							release := d.Endpoint.Acquire()
							if i%2 == 0 {
								release()
							} else {
								defer release()
							}
						}
					}()
				}
				wg.Wait()
				cancel()
				flipWG.Wait()
				if f, x := failed.Load(), wrong.Load(); f != 0 || x != 0 {
					t.Errorf("%d of %d picks failed and %d chose an endpoint ineligible throughout, while %s stayed eligible; first: %v",
						f, workers*picks, x, eps[tc.stable].ID, first.Load())
				}
			})
		}
	}
}
