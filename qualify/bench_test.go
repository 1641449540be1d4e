package qualify

import (
	"testing"
	"time"

	"github.com/llmgw/llmgw/results"
)

// BenchmarkBaselineMatrix runs the reference baseline on simulated workers:
// 5 profiles × 3 engines × {rr, exact}, converged = 30 cases, and checks it
// reproduces 26 PASS and 4 BLOCKED. It reports the wall time of one matrix
// (s/matrix). Run it with:
//
//	go test ./qualify -run '^$' -bench BaselineMatrix -benchtime 1x
func BenchmarkBaselineMatrix(b *testing.B) {
	for b.Loop() {
		o := &Options{Engines: []string{"all"}, Modes: []string{"rr", "exact"}, Topologies: []string{"converged"},
			HealthTimeout: 30 * time.Second, ReadyTimeout: 20 * time.Second}
		cases, err := Plan(o)
		if err != nil {
			b.Fatal(err)
		}
		out := b.TempDir()
		store, err := results.Open(out)
		if err != nil {
			b.Fatal(err)
		}
		start := time.Now()
		rep, err := Run(b.Context(), o, cases, store, out)
		if err != nil {
			b.Fatal(err)
		}
		b.ReportMetric(time.Since(start).Seconds(), "s/matrix")
		if c := rep.Counts(); c.Total != 30 || c.Pass != 26 || c.Blocked != 4 {
			b.Fatalf("baseline: %s; want 30 runs: 26 PASS, 4 BLOCKED\n%s", c, rowLines(rep.Rows))
		}
	}
}
