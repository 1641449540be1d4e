package runbook

import (
	"bytes"
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/llmgw/llmgw/internal/golden"
	"github.com/llmgw/llmgw/results"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// fakeClock advances by one second per call, so durations are stable.
func fakeClock() func() time.Time {
	t := time.Date(2026, 11, 30, 1, 0, 0, 0, time.UTC)
	return func() time.Time {
		t = t.Add(time.Second)
		return t
	}
}

func newWriter(t *testing.T, id string) (*results.Store, *results.RunWriter) {
	t.Helper()
	store, err := results.Open(t.TempDir(), results.WithClock(func() time.Time { return time.Date(2026, 11, 30, 1, 0, 0, 0, time.UTC) }))
	if err != nil {
		t.Fatal(err)
	}
	w, err := store.NewRunWithID(id, results.Tuple{Engine: "vllm", Profile: "qwen3-0.6b", Topology: "converged", Mode: "exact", Launcher: results.LauncherSim, SimulatedWorkers: true, Workers: 3})
	if err != nil {
		t.Fatal(err)
	}
	return store, w
}

// script builds a runbook whose steps return fixed outcomes and log the
// order of events.
func script(log *[]string, outcomes ...Outcome) Runbook {
	rb := Runbook{Name: "scripted"}
	for i, o := range outcomes {
		name := []string{"select tuple", "launch workers", "prove direct inference", "apply rule", "deliver"}[i]
		rb.Steps = append(rb.Steps, NewStep(name, func(_ context.Context, r *Run) Outcome {
			*log = append(*log, "run "+name)
			r.Defer("undo "+name, func(context.Context) error {
				*log = append(*log, "undo "+name)
				return nil
			})
			return o
		}))
	}
	return rb
}

func TestRunnerOrderBlockingAndCleanup(t *testing.T) {
	pass := Pass("fine").With("a.json", []byte("{}\n"))
	cases := []struct {
		name       string
		outcomes   []Outcome
		wantLog    []string
		wantStatus []results.Status
		wantCodes  []string
		verdict    results.Status
	}{
		{
			name:       "all pass",
			outcomes:   []Outcome{pass, pass, pass},
			wantLog:    []string{"run select tuple", "run launch workers", "run prove direct inference", "undo prove direct inference", "undo launch workers", "undo select tuple"},
			wantStatus: []results.Status{"PASS", "PASS", "PASS", "PASS"},
			wantCodes:  []string{"", "", "", ""},
			verdict:    results.StatusPass,
		},
		{
			name:       "fail blocks later steps, cleanup still runs LIFO",
			outcomes:   []Outcome{pass, Fail("ENGINE_NOT_READY", "worker w2 not ready"), pass},
			wantLog:    []string{"run select tuple", "run launch workers", "undo launch workers", "undo select tuple"},
			wantStatus: []results.Status{"PASS", "FAIL", "BLOCKED", "PASS"},
			wantCodes:  []string{"", "ENGINE_NOT_READY", "blocked_by_launch_workers", ""},
			verdict:    results.StatusFail,
		},
		{
			name:       "blocked tuple",
			outcomes:   []Outcome{Blocked("architecture_unsupported", "no Gemma2 on the pinned backend"), pass},
			wantLog:    []string{"run select tuple", "undo select tuple"},
			wantStatus: []results.Status{"BLOCKED", "BLOCKED", "PASS"},
			wantCodes:  []string{"architecture_unsupported", "blocked_by_select_tuple", ""},
			verdict:    results.StatusBlocked,
		},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			var log []string
			_, w := newWriter(t, "run-1")
			rep, err := (&Runner{Clock: fakeClock()}).Execute(t.Context(), script(&log, tc.outcomes...), w, nil)
			if err != nil {
				t.Fatal(err)
			}
			if strings.Join(log, "|") != strings.Join(tc.wantLog, "|") {
				t.Errorf("events = %v; want %v", log, tc.wantLog)
			}
			for i, st := range rep.Steps {
				if st.Status != tc.wantStatus[i] || st.ReasonCode != tc.wantCodes[i] {
					t.Errorf("step %d %q = %s %q; want %s %q", i, st.Name, st.Status, st.ReasonCode, tc.wantStatus[i], tc.wantCodes[i])
				}
			}
			if rep.Summary.Verdict != tc.verdict {
				t.Errorf("verdict = %s; want %s", rep.Summary.Verdict, tc.verdict)
			}
		})
	}
}

func TestRunnerPanicAndFailingCleanup(t *testing.T) {
	_, w := newWriter(t, "run-2")
	calls := 0
	rb := Runbook{Steps: []Step{
		NewStep("boom", func(_ context.Context, r *Run) Outcome {
			r.Defer("bad cleanup", func(context.Context) error { calls++; return errors.New("container still running") })
			panic("step bug")
		}),
	}}
	rep, err := (&Runner{Clock: fakeClock()}).Execute(t.Context(), rb, w, nil)
	if err != nil {
		t.Fatal(err)
	}
	if got := rep.Steps[0]; got.Status != results.StatusFail || got.ReasonCode != "STEP_PANIC" {
		t.Errorf("panicking step = %s %s; want FAIL STEP_PANIC", got.Status, got.ReasonCode)
	}
	if got := rep.Steps[1]; got.Status != results.StatusFail || got.ReasonCode != "CLEANUP_FAILED" || !strings.Contains(got.Reason, "bad cleanup") {
		t.Errorf("cleanup = %s %s %q; want FAIL CLEANUP_FAILED naming the cleanup", got.Status, got.ReasonCode, got.Reason)
	}
	if calls != 1 {
		t.Errorf("cleanup ran %d times; want 1", calls)
	}
}

func TestRunnerCancelledContext(t *testing.T) {
	_, w := newWriter(t, "run-3")
	ctx, cancel := context.WithCancel(t.Context())
	var cleanupCtxErr error = errors.New("not called")
	rb := Runbook{Steps: []Step{
		NewStep("launch workers", func(ctx context.Context, r *Run) Outcome {
			r.Defer("stop workers", func(c context.Context) error { cleanupCtxErr = c.Err(); return nil })
			cancel() // Ctrl-C while the step runs
			<-ctx.Done()
			return Fail("INTERRUPTED", "interrupted")
		}),
		NewStep("deliver", func(context.Context, *Run) Outcome { t.Error("ran after cancellation"); return Pass("") }),
	}}
	rep, err := (&Runner{Clock: fakeClock()}).Execute(ctx, rb, w, nil)
	if err != nil {
		t.Fatal(err)
	}
	if !rep.Interrupted {
		t.Error("not marked interrupted")
	}
	if got := rep.Steps[1].Status; got != results.StatusNotRun {
		t.Errorf("step after cancel = %s; want NOT_RUN", got)
	}
	if cleanupCtxErr != nil {
		t.Errorf("cleanup context err = %v; want a live context", cleanupCtxErr)
	}
}

// TestProgressGolden renders the live progress (plain and TTY) and the
// final summary of a scripted run.
func TestProgressGolden(t *testing.T) {
	for _, tty := range []bool{false, true} {
		name := "progress-plain.golden"
		if tty {
			name = "progress-tty.golden"
		}
		t.Run(name, func(t *testing.T) {
			var log []string
			store, w := newWriter(t, "20261130T010000Z-vllm-qwen3-0.6b-exact-abc123")
			var buf bytes.Buffer
			rb := script(&log, Pass("vllm 0.31.0 × qwen3-0.6b").With("tuple.json", []byte("{}\n")),
				Pass("3 workers healthy").For(LaneDirectWorker),
				Fail("DIRECT_NO_RECEIPT", "worker w2 answered but its receipt log has no receipt").For(LaneDirectWorker),
				Pass("unreached"))
			rep, err := (&Runner{Clock: fakeClock(), Progress: NewProgress(&buf, tty, 0)}).Execute(t.Context(), rb, w, nil)
			if err != nil {
				t.Fatal(err)
			}
			run, err := store.Get(rep.Summary.ID)
			if err != nil {
				t.Fatal(err)
			}
			buf.WriteString("\n")
			if err := results.WriteRunDetail(&buf, run, tty, 0); err != nil {
				t.Fatal(err)
			}
			golden.File(t, name, buf.Bytes())
		})
	}
}
