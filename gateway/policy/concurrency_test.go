package policy

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"

	"github.com/cespare/xxhash/v2"
)

// TestConcurrentPickAcquireRelease runs many goroutines that pick, acquire,
// sometimes retry with the first endpoint excluded, and release, while
// another goroutine drains and undrains an endpoint. Run it with -race.
// Afterwards every in-flight count is back to 0.
func TestConcurrentPickAcquireRelease(t *testing.T) {
	const (
		workers = 8
		picks   = 1500
	)
	for _, sel := range allSels {
		name, _ := SelName(sel)
		t.Run(name, func(t *testing.T) {
			eps := testEndpoints(0, 3, 1, 2, 1)
			p := mustNew(t, Config{Sel: sel, SessionCap: 64}, eps)

			ctx, cancel := context.WithCancel(context.Background())
			var toggler sync.WaitGroup
			toggler.Add(1)
			go func() {
				defer toggler.Done()
				for i := 0; ctx.Err() == nil; i++ {
					eps[1].SetDraining(i%2 == 0)
				}
				eps[1].SetDraining(false)
			}()

			// Each worker reports at most one error and stops, so the buffered
			// channel can never block a worker.
			errs := make(chan error, workers)
			var wg sync.WaitGroup
			for w := range workers {
				wg.Add(1)
				go func() {
					defer wg.Done()
					for i := range picks {
						req := &Request{
							KeyHash: xxhash.Sum64String(fmt.Sprint("k", i%37)), HasKey: i%3 != 0,
							ConvHash: uint64(i % 11), HasConv: i%5 == 0,
							Session: fmt.Appendf(nil, "s-%d-%d", w, i%101),
						}
						d, err := p.Pick(req)
						if err != nil {
							errs <- fmt.Errorf("worker %d pick %d: %w", w, i, err)
							return
						}
						release := d.Endpoint.Acquire()
						if i%7 == 0 { // a retry: the first endpoint failed before any byte
							req.Exclude = d.Endpoint
							d2, err := p.Pick(req)
							if err != nil && !errors.Is(err, ErrNoEndpoint) {
								release()
								errs <- fmt.Errorf("worker %d retry %d: %w", w, i, err)
								return
							}
							if err == nil {
								d2.Endpoint.Acquire()()
								if d2.Endpoint == d.Endpoint {
									release()
									errs <- fmt.Errorf("worker %d retry %d: excluded %s picked again", w, i, d.Endpoint.ID)
									return
								}
							}
						}
						release()
					}
				}()
			}
			wg.Wait()
			cancel()
			toggler.Wait()
			close(errs)
			for err := range errs {
				t.Error(err)
			}
			for _, e := range eps {
				if n := e.InFlight(); n != 0 {
					t.Errorf("%s in flight after all releases = %d; want 0", e.ID, n)
				}
			}
			if s, ok := p.(*session); ok {
				if n := s.Bindings(); n > 64 {
					t.Errorf("Bindings() = %d; want ≤ 64", n)
				}
			}
		})
	}
}
