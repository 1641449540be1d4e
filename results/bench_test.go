package results

import (
	"bytes"
	"fmt"
	"io"
	"testing"
)

// baselineRows is the shape of the reference baseline: 5 profiles x 3
// engines x {rr, exact}, 4 of them BLOCKED.
func baselineRows() []RunSummary {
	var rows []RunSummary
	for _, p := range []string{"exaone-3.5-7.8b-instruct", "gemma-2-9b-it", "llama-3.1-8b-instruct", "qwen2.5-7b-instruct", "qwen3-0.6b"} {
		for _, e := range []string{"vllm", "sglang", "trtllm"} {
			for _, m := range []string{"rr", "exact"} {
				tu := Tuple{Engine: e, Profile: p, Topology: "converged", Mode: m, Launcher: LauncherSim, SimulatedWorkers: true, Workers: 3}
				r := RunSummary{ID: fmt.Sprintf("%s-%s-%s", e, p, m), CaseID: tu.CaseID(), Tuple: tu, Verdict: StatusPass,
					Lanes: Lanes{DirectWorker: StatusPass, GatewayDelivery: StatusPass, RoutingEvidence: StatusPass}.norm()}
				if e == "trtllm" && (p == "gemma-2-9b-it" || p == "exaone-3.5-7.8b-instruct") {
					r.Verdict, r.ReasonCode, r.Lanes = StatusBlocked, "architecture_unsupported", Lanes{}.norm()
				}
				rows = append(rows, r)
			}
		}
	}
	return rows
}

func BenchmarkRender30(b *testing.B) {
	rows := baselineRows()
	for _, f := range Formats {
		b.Run(string(f), func(b *testing.B) {
			for b.Loop() {
				if err := Render(io.Discard, f, rows); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// BenchmarkRunLifecycle writes a run with 10 evidence files of 4 KiB,
// finishes it (run.json, SHA256SUMS, history append, all fsynced) and
// verifies it.
func BenchmarkRunLifecycle(b *testing.B) {
	s, err := Open(b.TempDir())
	if err != nil {
		b.Fatal(err)
	}
	data := bytes.Repeat([]byte("x"), 4096)
	i := 0
	for b.Loop() {
		i++
		id := fmt.Sprintf("run-%d", i)
		w, err := s.NewRunWithID(id, simTuple)
		if err != nil {
			b.Fatal(err)
		}
		for j := range 10 {
			p, err := w.AddEvidence(fmt.Sprintf("e%d.json", j), data)
			if err != nil {
				b.Fatal(err)
			}
			if err := w.RecordStep(Step{Name: fmt.Sprintf("s%d", j), Status: StatusPass, Evidence: []string{p}}); err != nil {
				b.Fatal(err)
			}
		}
		if _, err := w.Finish(); err != nil {
			b.Fatal(err)
		}
		rep, err := s.Verify(id)
		if err != nil || !rep.OK() {
			b.Fatalf("Verify(%s) = %+v, %v", id, rep, err)
		}
	}
}

func TestBaselineTally(t *testing.T) {
	c := Tally(baselineRows())
	if c.Total != 30 || c.Pass != 26 || c.Blocked != 4 || c.Overall() != StatusBlocked {
		t.Errorf("Tally(baseline) = %+v, overall %s; want 30 total, 26 PASS, 4 BLOCKED, overall BLOCKED", c, c.Overall())
	}
}
