package converged

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/llmgw/llmgw/results"
	"github.com/llmgw/llmgw/runbook"
	"github.com/llmgw/llmgw/runbook/launcher"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m,
		// fasthttp and zmq4 housekeeping goroutines that end on their own
		// after their pools close (the gateway's tests document each).
		goleak.IgnoreAnyFunction("github.com/valyala/fasthttp.(*HostClient).connsCleaner"),
		goleak.IgnoreAnyFunction("github.com/valyala/fasthttp.(*workerPool).Start.func2"),
		goleak.IgnoreAnyFunction("github.com/valyala/fasthttp.(*TCPDialer).tcpAddrsClean"),
		goleak.IgnoreAnyFunction("github.com/valyala/fasthttp.updateServerDate.func1"),
		goleak.IgnoreAnyFunction("github.com/go-zeromq/zmq4.(*pubMWriter).run"),
	)
}

// run executes the converged runbook on sims into a fresh store.
func run(t *testing.T, ctx context.Context, o *Options) (runbook.Report, *results.Store, string) {
	t.Helper()
	if err := o.Validate(); err != nil {
		t.Fatal(err)
	}
	out := t.TempDir()
	store, err := results.Open(out)
	if err != nil {
		t.Fatal(err)
	}
	rep, err := Execute(ctx, o, store, out, nil)
	if err != nil {
		t.Fatalf("Execute: %v", err)
	}
	return rep, store, out
}

func stepLine(rep runbook.Report) string {
	var b strings.Builder
	for _, s := range rep.Steps {
		b.WriteString(s.Name + "=" + string(s.Status) + " " + s.ReasonCode + ": " + s.Reason + "\n")
	}
	return b.String()
}

func TestPassPathOnSims(t *testing.T) {
	cases := []struct {
		name, engine, mode string
	}{
		{"vllm exact", "vllm", "exact"},
		{"vllm rr", "vllm", "rr"},
		{"vllm chwbl", "vllm", "chwbl"},
		{"sglang exact", "sglang", "exact"},
		{"sglang rr", "sglang", "rr"},
		{"trtllm exact", "trtllm", "exact"},
		{"trtllm chwbl", "trtllm", "chwbl"},
		{"llamacpp rr", "llamacpp", "rr"},
		{"llamacpp chwbl", "llamacpp", "chwbl"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			o := &Options{Engine: tc.engine, Mode: tc.mode, Launcher: &launcher.Sim{}, HealthTimeout: 10 * time.Second, ReadyTimeout: 10 * time.Second}
			rep, _, _ := run(t, t.Context(), o)
			if rep.Summary.Verdict != results.StatusPass {
				t.Fatalf("verdict = %s; want PASS\n%s", rep.Summary.Verdict, stepLine(rep))
			}
			if os.Getenv("V") != "" {
				t.Log(stepLine(rep))
			}
		})
	}
}

// TestTamperedEvidenceIsCaught: a run's evidence is content-addressed; a
// changed byte is reported by results verify.
func TestTamperedEvidenceIsCaught(t *testing.T) {
	o := &Options{Mode: "rr", Workers: 2, Launcher: &launcher.Sim{}, HealthTimeout: 10 * time.Second, ReadyTimeout: 10 * time.Second}
	rep, store, _ := run(t, t.Context(), o)
	if vr, err := store.Verify(rep.Summary.ID); err != nil || !vr.OK() {
		t.Fatalf("fresh run does not verify: %v %v", err, vr.Problems())
	}
	var target string
	for _, st := range rep.Steps {
		if st.Name == StepDeliver && len(st.Evidence) > 0 {
			target = st.Evidence[0]
		}
	}
	if target == "" {
		t.Fatal("delivery step left no evidence")
	}
	p := filepath.Join(store.RunDir(rep.Summary.ID), filepath.FromSlash(target))
	b, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(p, append(b, ' '), 0o644); err != nil {
		t.Fatal(err)
	}
	vr, err := store.Verify(rep.Summary.ID)
	if err != nil {
		t.Fatal(err)
	}
	if vr.OK() || len(vr.Changed) != 1 || vr.Changed[0] != target {
		t.Errorf("verify after tampering: changed %v; want [%s]", vr.Changed, target)
	}
}

// An unset mode is the engine's default: exact where the engine publishes
// KV events, chwbl where it publishes none (llama.cpp, for which exact is
// refused).
func TestDefaultModePerEngine(t *testing.T) {
	for _, tc := range []struct{ engine, want string }{{"vllm", DefaultMode}, {"sglang", DefaultMode}, {"trtllm", DefaultMode}, {"llamacpp", DefaultModeNoKV}} {
		t.Run(tc.engine, func(t *testing.T) {
			o := &Options{Engine: tc.engine, Launcher: &launcher.Sim{}}
			if err := o.Validate(); err != nil || o.Mode != tc.want {
				t.Errorf("mode %q, err %v; want %q", o.Mode, err, tc.want)
			}
		})
	}
}
