package converged

import (
	"testing"
	"time"

	"github.com/llmgw/llmgw/results"
	"github.com/llmgw/llmgw/runbook"
	"github.com/llmgw/llmgw/runbook/launcher"
)

// BenchmarkConvergedRun measures one whole converged run on in-process
// simulators (3 workers, embedded gateway), evidence and cleanup included:
// the README's main command without process start-up.
func BenchmarkConvergedRun(b *testing.B) {
	for _, mode := range []string{"exact", "rr"} {
		b.Run(mode, func(b *testing.B) {
			out := b.TempDir()
			store, err := results.Open(out)
			if err != nil {
				b.Fatal(err)
			}
			for b.Loop() {
				o := &Options{Mode: mode, Launcher: &launcher.Sim{}, HealthTimeout: 10 * time.Second, ReadyTimeout: 10 * time.Second}
				if err := o.Validate(); err != nil {
					b.Fatal(err)
				}
				w, err := store.NewRun(o.Tuple())
				if err != nil {
					b.Fatal(err)
				}
				rep, err := ExecuteInto(b.Context(), o, w, out, runbook.Runner{})
				if err != nil || rep.Summary.Verdict != results.StatusPass {
					b.Fatalf("verdict %s, err %v", rep.Summary.Verdict, err)
				}
			}
		})
	}
}
