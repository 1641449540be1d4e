package policy

import (
	"fmt"
	"testing"

	"github.com/cespare/xxhash/v2"
)

// BenchmarkPick measures one pick plus its acquire/release on 8 endpoints,
// from parallel goroutines, for every policy.
func BenchmarkPick(b *testing.B) {
	for _, sel := range allSels {
		name, _ := SelName(sel)
		b.Run(name, func(b *testing.B) {
			eps := testEndpoints(0, 1, 2, 3, 1, 2, 3, 1, 2)
			p := mustNew(b, Config{Sel: sel}, eps)
			b.ReportAllocs()
			b.RunParallel(func(pb *testing.PB) {
				// Per goroutine: a small set of keys and sessions, bound on
				// first use, so the session case measures the bound path.
				reqs := make([]Request, 64)
				for i := range reqs {
					reqs[i] = Request{
						KeyHash: xxhash.Sum64String(fmt.Sprint("prompt-", i)), HasKey: true,
						Session: fmt.Appendf(nil, "session-%d", i),
					}
				}
				i := 0
				for pb.Next() {
					d, err := p.Pick(&reqs[i&63])
					if err != nil {
						b.Error(err)
						return
					}
					d.Endpoint.Acquire()()
					i++
				}
			})
		})
	}
}
