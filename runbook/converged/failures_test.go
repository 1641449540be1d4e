package converged

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/llmgw/llmgw/engines/sim"
	"github.com/llmgw/llmgw/gateway"
	"github.com/llmgw/llmgw/gateway/rule"
	"github.com/llmgw/llmgw/results"
	"github.com/llmgw/llmgw/runbook"
	"github.com/llmgw/llmgw/runbook/gates"
	"github.com/llmgw/llmgw/runbook/launcher"
)

// countingLauncher records how often Launch was called.
type countingLauncher struct {
	runbook.Launcher
	launches atomic.Int32
}

func (c *countingLauncher) Launch(ctx context.Context, spec runbook.LaunchSpec) ([]runbook.Worker, error) {
	c.launches.Add(1)
	return c.Launcher.Launch(ctx, spec)
}

// receiptlessLauncher fronts each simulator with a proxy that answers every
// gateway-delivered completion itself: the worker "answers" but the engine
// never does the work, so its receipt log has no trace. Direct requests,
// health and control calls reach the simulator.
type receiptlessLauncher struct {
	inner   launcher.Sim
	mu      sync.Mutex
	servers []*httptest.Server
}

func (l *receiptlessLauncher) Name() string    { return results.LauncherSim }
func (l *receiptlessLauncher) Simulated() bool { return true }

func (l *receiptlessLauncher) Launch(ctx context.Context, spec runbook.LaunchSpec) ([]runbook.Worker, error) {
	ws, err := l.inner.Launch(ctx, spec)
	if err != nil {
		return nil, err
	}
	for i, w := range ws {
		target, _ := url.Parse("http://" + w.HTTP)
		proxy := httputil.NewSingleHostReverseProxy(target)
		srv := httptest.NewServer(http.HandlerFunc(func(rw http.ResponseWriter, r *http.Request) {
			if strings.HasPrefix(r.URL.Path, "/v1/") && r.Method == http.MethodPost && !strings.Contains(r.Header.Get("X-Request-Id"), "-direct-") {
				body, _ := io.ReadAll(r.Body)
				rw.Header().Set("X-Request-Id", r.Header.Get("X-Request-Id"))
				if strings.Contains(string(body), `"stream":true`) {
					rw.Header().Set("Content-Type", "text/event-stream")
					fmt.Fprint(rw, "data: {\"choices\":[{\"index\":0,\"text\":\"cached\"}]}\n\ndata: [DONE]\n\n")
					return
				}
				rw.Header().Set("Content-Type", "application/json")
				fmt.Fprint(rw, `{"id":"x","object":"text_completion","choices":[{"index":0,"text":"cached","finish_reason":"stop"}]}`)
				return
			}
			proxy.ServeHTTP(rw, r)
		}))
		l.mu.Lock()
		l.servers = append(l.servers, srv)
		l.mu.Unlock()
		ws[i].HTTP = srv.Listener.Addr().String()
	}
	return ws, nil
}

func (l *receiptlessLauncher) Stop(ctx context.Context) error {
	l.mu.Lock()
	srvs := l.servers
	l.servers = nil
	l.mu.Unlock()
	for _, s := range srvs {
		s.Close()
	}
	return l.inner.Stop(ctx)
}

func TestFailureClassesLandOnTheirStep(t *testing.T) {
	cases := []struct {
		name     string
		opts     func() *Options
		wantStep string
		wantCode []string
		// wantStatus is the failing step's status (FAIL unless set).
		wantStatus  results.Status
		wantVerdict results.Status
	}{
		{
			name: "worker fails health",
			opts: func() *Options {
				return &Options{Mode: "rr", Launcher: &launcher.Sim{Faults: map[int]string{1: `{"health_fail":true}`}}, HealthTimeout: time.Second}
			},
			wantStep: StepLaunch, wantCode: []string{"ENGINE_NOT_READY"},
		},
		{
			name: "rejected rule",
			opts: func() *Options {
				return &Options{Mode: "rr", Launcher: &launcher.Sim{}, RuleHook: func(r *rule.Rule) { r.Sel = 99 }}
			},
			wantStep: StepApply, wantCode: []string{"RULE_REJECTED"},
		},
		{
			name:     "delivery without a receipt",
			opts:     func() *Options { return &Options{Mode: "rr", Launcher: &receiptlessLauncher{}} },
			wantStep: StepDeliver, wantCode: []string{"DELIVERY_NO_RECEIPT"},
		},
		{
			name: "chwbl rule that round-robins",
			opts: func() *Options {
				return &Options{Mode: "chwbl", Launcher: &launcher.Sim{}, RuleHook: func(r *rule.Rule) { r.Sel = 0 }}
			},
			wantStep: StepRouting, wantCode: []string{"ROUTING_NOT_STICKY"},
		},
		{
			name: "exact with a worker hashing another seed",
			opts: func() *Options {
				return &Options{Mode: "exact", Launcher: &launcher.Sim{HashSeed: "7"}, ReadyTimeout: 3 * time.Second}
			},
			// The hash-parity gate fails first; it is optional, so routing
			// still runs and fails too (checked below).
			wantStep: gates.StepHashParity, wantCode: []string{"HASH_PARITY_MISS"},
		},
		{
			name: "known-blocked tuple",
			opts: func() *Options {
				return &Options{Engine: "trtllm", Profile: "gemma-2-9b-it", Mode: "rr", Launcher: &countingLauncher{Launcher: &launcher.Sim{}}}
			},
			wantStep: StepSelect, wantCode: []string{"architecture_unsupported"}, wantStatus: results.StatusBlocked, wantVerdict: results.StatusBlocked,
		},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			o := tc.opts()
			if o.ReadyTimeout == 0 {
				o.ReadyTimeout = 10 * time.Second
			}
			if o.HealthTimeout == 0 {
				o.HealthTimeout = 10 * time.Second
			}
			rep, _, _ := run(t, t.Context(), o)
			wantStatus, wantVerdict := tc.wantStatus, tc.wantVerdict
			if wantStatus == "" {
				wantStatus = results.StatusFail
			}
			if wantVerdict == "" {
				wantVerdict = results.StatusFail
			}
			if rep.Summary.Verdict != wantVerdict {
				t.Errorf("verdict = %s; want %s\n%s", rep.Summary.Verdict, wantVerdict, stepLine(rep))
			}
			seen := false
			for _, st := range rep.Steps {
				switch {
				case st.Name == tc.wantStep:
					seen = true
					if st.Status != wantStatus || !slices.Contains(tc.wantCode, st.ReasonCode) {
						t.Errorf("step %q = %s %s; want %s with one of %v (%s)", st.Name, st.Status, st.ReasonCode, wantStatus, tc.wantCode, st.Reason)
					}
				case st.Name == StepCleanup:
					if st.Status != results.StatusPass {
						t.Errorf("cleanup = %s %s; want PASS", st.Status, st.Reason)
					}
				case seen && tc.wantStep == gates.StepHashParity:
					// After a parity miss the routing evidence must see no
					// KV hit and fail (it is required, so the drain after it
					// is blocked by it).
					want, code := results.StatusFail, ""
					if st.Name != StepRouting {
						want, code = results.StatusBlocked, runbook.BlockedByCode(StepRouting)
					}
					if st.Status != want || (code != "" && st.ReasonCode != code) {
						t.Errorf("step %q after a parity miss = %s %s; want %s", st.Name, st.Status, st.ReasonCode, want)
					}
				case !seen:
					if st.Status != results.StatusPass {
						t.Errorf("step %q before %q = %s; want PASS (%s)", st.Name, tc.wantStep, st.Status, st.Reason)
					}
				default:
					if st.Status != results.StatusBlocked || st.ReasonCode != runbook.BlockedByCode(tc.wantStep) {
						t.Errorf("step %q after %q = %s %s; want BLOCKED %s", st.Name, tc.wantStep, st.Status, st.ReasonCode, runbook.BlockedByCode(tc.wantStep))
					}
				}
			}
			if !seen {
				t.Errorf("step %q not recorded:\n%s", tc.wantStep, stepLine(rep))
			}
			if cl, ok := o.Launcher.(*countingLauncher); ok && cl.launches.Load() != 0 {
				t.Errorf("a BLOCKED tuple launched %d times; want nothing launched", cl.launches.Load())
			}
		})
	}
}

// TestInterruptRunsCleanupAndKeepsPartialRows cancels the run's context as
// Ctrl-C would, right before the delivery step.
func TestInterruptRunsCleanupAndKeepsPartialRows(t *testing.T) {
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	var addrs []string
	sl := &launcher.Sim{AfterStart: func(_ int, s *sim.Sim) { addrs = append(addrs, s.Addrs().HTTP) }}
	o := &Options{Mode: "exact", Launcher: sl, HealthTimeout: 10 * time.Second, ReadyTimeout: 10 * time.Second,
		StepHook: func(step string) {
			if step == StepDeliver {
				cancel()
			}
		}}
	rep, store, out := run(t, ctx, o)
	if !rep.Interrupted {
		t.Errorf("report not marked interrupted")
	}
	got := map[string]results.Status{}
	for _, st := range rep.Steps {
		got[st.Name] = st.Status
	}
	want := map[string]results.Status{
		StepSelect: results.StatusPass, StepLaunch: results.StatusPass, StepDirect: results.StatusPass,
		StepApply: results.StatusPass, StepReadBack: results.StatusPass, StepDeliver: results.StatusFail,
		StepRouting: results.StatusNotRun, StepDrain: results.StatusNotRun, StepCleanup: results.StatusPass,
	}
	for name, w := range want {
		if got[name] != w {
			t.Errorf("step %q = %s; want %s", name, got[name], w)
		}
	}
	// The partial row is kept and verifiable.
	rows, err := store.List()
	if err != nil || len(rows) != 1 {
		t.Fatalf("history rows = %d (%v); want 1", len(rows), err)
	}
	if vr, err := store.Verify(rows[0].ID); err != nil || !vr.OK() {
		t.Errorf("verify partial run: %v %v", err, vr.Problems())
	}
	// Cleanup ran: every worker stopped, nothing left in the ledger.
	for _, a := range addrs {
		if c, err := net.DialTimeout("tcp", a, time.Second); err == nil {
			c.Close()
			t.Errorf("worker %s still listening after an interrupted run", a)
		}
	}
	if ls, err := runbook.Ledgers(out); err != nil || len(ls) != 0 {
		t.Errorf("ledgers left after cleanup: %d (%v)", len(ls), err)
	}
}

// TestAttachLeavesWorkersRunning attaches to simulators started here: the
// run passes and the workers are not stopped.
func TestAttachLeavesWorkersRunning(t *testing.T) {
	var eps []string
	for i := 0; i < 2; i++ {
		s, err := sim.Start(t.Context(), sim.Config{Engine: "vllm", KVEvents: "tcp://127.0.0.1:0"})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { s.Close() })
		eps = append(eps, s.Addrs().HTTP)
	}
	for _, mode := range []string{"rr", "exact"} {
		t.Run(mode, func(t *testing.T) {
			o := &Options{Mode: mode, Workers: 2, Launcher: &launcher.Attach{Endpoints: eps, Simulator: true}, HealthTimeout: 5 * time.Second, ReadyTimeout: 10 * time.Second}
			rep, _, _ := run(t, t.Context(), o)
			if rep.Summary.Verdict != results.StatusPass {
				t.Fatalf("verdict = %s; want PASS\n%s", rep.Summary.Verdict, stepLine(rep))
			}
			for _, a := range eps {
				resp, err := http.Get("http://" + a + "/health")
				if err != nil {
					t.Fatalf("attached worker %s stopped by the run: %v", a, err)
				}
				resp.Body.Close()
			}
		})
	}
}

// TestExternalGatewayThroughItsAdminAPI runs against a gateway this test
// starts (as --gateway URL would name one): the run passes through the
// admin API, deletes only its own rule, and leaves the other rule alone.
func TestExternalGatewayThroughItsAdminAPI(t *testing.T) {
	gw, err := gateway.New(gateway.Config{Listen: "127.0.0.1:0", Admin: "127.0.0.1:0", StateDir: t.TempDir(), Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	if err := gw.Start(t.Context()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { gw.Close() })
	other, err := rule.Decode([]byte("name: keep-me\nmodel_name: other\nprobe: {disabled: true}\nendpoints:\n  - {endpointIP: 127.0.0.1, targetPort: 9}\n"))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := gw.Apply(other, true); err != nil {
		t.Fatal(err)
	}
	o := &Options{Mode: "chwbl", Launcher: &launcher.Sim{}, GatewayAdmin: "http://" + gw.AdminAddr(), HealthTimeout: 10 * time.Second, ReadyTimeout: 10 * time.Second}
	rep, _, _ := run(t, t.Context(), o)
	if rep.Summary.Verdict != results.StatusPass {
		t.Fatalf("verdict = %s; want PASS\n%s", rep.Summary.Verdict, stepLine(rep))
	}
	names := []string{}
	for _, st := range gw.Rules() {
		names = append(names, st.Rule.Name)
	}
	if strings.Join(names, ",") != "keep-me" {
		t.Errorf("rules after the run = %v; want only keep-me", names)
	}
}
