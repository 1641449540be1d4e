package pd

import (
	"context"
	"net"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/llmgw/llmgw/engines"
	"github.com/llmgw/llmgw/engines/sim"
	"github.com/llmgw/llmgw/results"
	"github.com/llmgw/llmgw/runbook/labkit"
)

// TestPDAttachReceiptlessSims: the P/D runbook PASSes against simulators
// that keep no receipts, for the three P/D engines, on engine-native
// evidence: the direct step drives each pair in the engine's own shape,
// delivery and routing name the engine counters that proved them. SGLang's
// per-prefill bootstrap ports are given as an attach operator would
// (BootstrapPorts), since a silent simulator does not report them.
func TestPDAttachReceiptlessSims(t *testing.T) {
	cases := []struct {
		name, engine string
		wantSource   string
	}{
		{"vllm", "vllm", "engine_metrics vllm:request_success_total"},
		{"sglang", "sglang", "engine_metrics sglang:prompt_tokens_total"},
		{"trtllm", "trtllm", "engine_metrics trtllm_request_success_total"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			kind, err := engines.ParseKind(tc.engine)
			if err != nil {
				t.Fatal(err)
			}
			att := &Attach{Simulator: true}
			for _, role := range []string{RolePrefill, RolePrefill, RoleDecode} {
				s, err := sim.Start(context.WithoutCancel(t.Context()), sim.Config{Engine: kind, Role: role, Silent: true, KVEvents: sim.KVEventsOff})
				if err != nil {
					t.Fatal(err)
				}
				t.Cleanup(func() {
					if err := s.Close(); err != nil {
						t.Errorf("close sim: %v", err)
					}
				})
				a := s.Addrs()
				if role == RoleDecode {
					att.Decode = append(att.Decode, a.HTTP)
					continue
				}
				att.Prefill = append(att.Prefill, a.HTTP)
				if a.Bootstrap != "" {
					_, p, err := net.SplitHostPort(a.Bootstrap)
					if err != nil {
						t.Fatal(err)
					}
					n, _ := strconv.Atoi(p)
					att.BootstrapPorts = append(att.BootstrapPorts, n)
				}
			}
			o := &Options{Engine: tc.engine, Prefill: 2, Decode: 1, Launcher: att, HealthTimeout: 10 * time.Second, ReadyTimeout: 10 * time.Second}
			rep, _ := run(t, t.Context(), o)
			if rep.Summary.Verdict != results.StatusPass {
				t.Fatalf("verdict = %s; want PASS\n%s", rep.Summary.Verdict, stepLines(rep))
			}
			src := rep.Summary.LaneSources
			if src["direct"] != labkit.SourceAnswer {
				t.Errorf("direct lane source = %q; want %s", src["direct"], labkit.SourceAnswer)
			}
			for _, lane := range []string{"delivery", "routing"} {
				if src[lane] != tc.wantSource {
					t.Errorf("%s lane source = %q; want %s", lane, src[lane], tc.wantSource)
				}
			}
			if st := step(rep, StepHandOff); st.Status != results.StatusSkipped || !strings.Contains(st.Reason, "no receipt log") {
				t.Errorf("hand-off step = %s %q; want SKIPPED saying why", st.Status, st.Reason)
			}
			if os.Getenv("V") != "" {
				t.Log(stepLines(rep), src)
			}
		})
	}
}
