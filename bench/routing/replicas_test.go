package routing

import (
	"testing"
)

// TestReplicas runs the shared-prefix workload through 1, 2 and 3 gateway
// replicas over the same simulators (round-robin client; every replica
// ingests every simulator's KV events) and gates the acceptance of
// several replicas: with warm indexes, two replicas pick the same endpoint
// for at least 95% of the workload's requests. The figures are logged for
// BENCHMARKS.md ("Several gateway replicas").
func TestReplicas(t *testing.T) {
	for _, n := range []int{1, 2, 3} {
		cfg := gateConfig(SharedPrefix, KVExact)
		cfg.Replicas = n
		if n >= 2 {
			cfg.AgreementProbes = 60
		}
		rep, err := Run(t.Context(), cfg)
		if err != nil {
			t.Fatalf("%d replicas: %v", n, err)
		}
		r := rep.Result(KVExact)
		t.Logf("replicas %d: hit %.3f ttft p50 %v p99 %v rps %.0f imbalance %.2f share %v routes %v agreement %+v",
			n, r.HitRatio, r.TTFT.P50, r.TTFT.P99, r.Throughput, r.Imbalance, r.Share, r.Routes, r.Agreement)
		if n >= 2 {
			if r.Agreement == nil || r.Agreement.Pairs != cfg.AgreementProbes {
				t.Fatalf("%d replicas: agreement probe incomplete: %+v", n, r.Agreement)
			}
			if r.Agreement.BothHit < r.Agreement.Pairs*9/10 {
				t.Errorf("%d replicas: only %d of %d probe pairs were kv-exact hits on both replicas: the indexes are not warm", n, r.Agreement.BothHit, r.Agreement.Pairs)
			}
			if r.Agreement.Ratio < 0.95 {
				t.Errorf("%d replicas: two replicas agreed on %d of %d warm requests (%.3f), want ≥ 0.95", n, r.Agreement.Same, r.Agreement.Pairs, r.Agreement.Ratio)
			}
		}
	}
}
