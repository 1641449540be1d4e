//go:build faults

package reliability

import (
	"bytes"
	"context"
	"fmt"
	"net/http"
	"sync"
	"testing"
	"time"

	"github.com/llmgw/llmgw/internal/wait"
	"github.com/llmgw/llmgw/reliability/harness"
)

// TestWorkerKilledMidStream: the worker serving a stream dies after a few
// chunks. The client must see the stream end with an OpenAI error event and
// [DONE] — never a hang, never a silent truncation.
func TestWorkerKilledMidStream(t *testing.T) {
	cases := []struct {
		name  string
		fault func(t *testing.T, s *harness.Sim)
		// arm runs before the stream opens (for faults the sim applies itself).
		arm func(t *testing.T, s *harness.Sim)
	}{
		{name: "process killed with SIGKILL", fault: func(_ *testing.T, s *harness.Sim) { s.Kill() }},
		{name: "engine drops the connection after 3 chunks", arm: func(t *testing.T, s *harness.Sim) {
			if err := s.SetFaults(t.Context(), map[string]any{"crash_after_chunks": 3}); err != nil {
				t.Fatal(err)
			}
		}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			// 20 ms a token, 300 tokens: the stream would run 6 s.
			s := startSim(t, "w1", "--kv-events", "off", "--decode-us-per-token", "20000")
			g := startGW(t, "")
			putRule(t, g, "r", ruleFor(t, "r", "timeouts: {idle: 3s}", s))
			if tc.arm != nil {
				tc.arm(t, s)
			}
			// The client's own deadline turns a hang into a failure.
			ctx, cancel := context.WithTimeout(t.Context(), 15*time.Second)
			defer cancel()
			c := newClient(t, 0)
			st := openStream(t, ctx, c, g.URL(), chatBody("tell me a long story", 300, true))
			chunks := 0
			for chunks < 3 {
				d, ok := st.next()
				if !ok {
					t.Fatalf("stream ended after %d chunks before the fault", chunks)
				}
				if bytes.HasPrefix(d, []byte(`{"error"`)) {
					break
				}
				chunks++
			}
			if tc.fault != nil {
				tc.fault(t, s)
			}
			var errEvent []byte
			done := false
			for {
				d, ok := st.next()
				if !ok {
					break
				}
				switch {
				case bytes.Equal(d, []byte("[DONE]")):
					done = true
				case bytes.HasPrefix(d, []byte(`{"error"`)):
					errEvent = d
				}
			}
			if err := st.sc.Err(); err != nil {
				t.Fatalf("stream read failed (hang or reset) instead of ending cleanly: %v", err)
			}
			if errEvent == nil || !done {
				t.Fatalf("stream end: error event %q, [DONE] %v; want an error event then [DONE]", errEvent, done)
			}
			t.Logf("client saw %d chunks, then %s, then [DONE]", chunks, errEvent)
			if got := metric(t, g, "llmgw_stream_errors_total"); got < 1 {
				t.Errorf("llmgw_stream_errors_total = %v; want >= 1", got)
			}
		})
	}
}

// load drives n sequential client loops through the gateway until ctx ends
// and returns every result.
func load(ctx context.Context, c *http.Client, base string, n int) (collect func() []result, startedSince func(time.Time) int) {
	var mu sync.Mutex
	var all []result
	var wg sync.WaitGroup
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for k := 0; ctx.Err() == nil; k++ {
				r := chat(ctx, c, base, chatBody(fmt.Sprintf("loop %d request %d", i, k), 4, false))
				if ctx.Err() != nil && r.err != nil {
					return // cut by the end of the load, not a gateway failure
				}
				mu.Lock()
				all = append(all, r)
				mu.Unlock()
			}
		}()
	}
	collect = func() []result {
		wg.Wait()
		return all
	}
	// startedSince counts the requests completed so far that started at
	// or after at.
	startedSince = func(at time.Time) int {
		mu.Lock()
		defer mu.Unlock()
		n := 0
		for _, r := range all {
			if !r.start.Before(at) {
				n++
			}
		}
		return n
	}
	return collect, startedSince
}

// probeRule is round robin over the sims with a 100 ms probe that needs 2
// failures: a dead worker is marked down within about 300 ms. Connection
// failures under load also open the endpoint's breaker; it stays open for
// open_for (default 30 s, shortened here) after the worker is back.
const probeRule = "sel: 0\nprobe: {path: /health, interval: 100ms, timeout: 100ms, failures: 2, successes: 1}\ncb: {open_for: 1s}"

// verdictLimit bounds the wait for a probe verdict; it only detects a
// verdict that never comes (probeRule's detection window is about 300 ms;
// how long it took is logged, not asserted).
const verdictLimit = 10 * time.Second

// afterMark is how many requests started after the mark-down must have
// completed before the load stops: the verdict's effect is judged on them.
const afterMark = 20

type downCase struct {
	name string
	down func(t *testing.T, s *harness.Sim)
	// back restores the worker; it returns the sim now serving as w2.
	back func(t *testing.T, s *harness.Sim) *harness.Sim
}

var downCases = []downCase{
	{
		name: "process killed",
		down: func(_ *testing.T, s *harness.Sim) { s.Kill() },
		back: func(t *testing.T, s *harness.Sim) *harness.Sim {
			return startSim(t, "w2-again", "--kv-events", "off", "--listen", s.Addrs.HTTP)
		},
	},
	{
		name: "health check failing",
		down: func(t *testing.T, s *harness.Sim) {
			if err := s.SetFaults(t.Context(), map[string]any{"health_fail": true}); err != nil {
				t.Fatal(err)
			}
		},
		back: func(t *testing.T, s *harness.Sim) *harness.Sim {
			if err := s.SetFaults(t.Context(), map[string]any{"health_fail": false}); err != nil {
				t.Fatal(err)
			}
			return s
		},
	},
}

// worldDown starts three workers behind a round-robin rule, runs load, takes
// w2 down and returns the gateway, the sims, the results of the load up to
// one second after w2 was marked down, and when that happened.
func worldDown(t *testing.T, tc downCase) (g *harness.Gateway, sims []*harness.Sim, rs []result, faultAt, markedAt time.Time) {
	t.Helper()
	for i := range 3 {
		sims = append(sims, startSim(t, fmt.Sprintf("w%d", i+1), "--kv-events", "off"))
	}
	g = startGW(t, "")
	putRule(t, g, "r", ruleFor(t, "r", probeRule, sims...))
	wait.For(t, 5*time.Second, "all three endpoints healthy", func() bool {
		return metric(t, g, "llmgw_endpoint_healthy", "rule", "r") == 3
	})
	c := newClient(t, 10*time.Second)
	ctx, stop := context.WithCancel(t.Context())
	defer stop()
	collect, startedSince := load(ctx, c, g.URL(), 4)
	// Let every worker take traffic before the fault.
	wait.For(t, 5*time.Second, "w2 to serve some requests", func() bool {
		rs, err := sims[1].Receipts(t.Context())
		return err == nil && len(rs) >= 5
	})
	faultAt = time.Now()
	tc.down(t, sims[1])
	took := wait.For(t, verdictLimit, "w2 marked down", func() bool {
		return metric(t, g, "llmgw_endpoint_healthy", "rule", "r", "endpoint", "w2") == 0
	})
	markedAt = time.Now()
	t.Logf("w2 marked down %v after the fault", took.Round(time.Millisecond))
	// The active probe gave the verdict, once: no flapping.
	if n := metric(t, g, "llmgw_probe_transitions_total", "rule", "r", "endpoint", "w2", "to", "down"); n != 1 {
		t.Errorf("w2: %v probe transitions to down; want 1", n)
	}
	// Keep the load on until enough requests started after the detection
	// have completed.
	wait.For(t, verdictLimit, fmt.Sprintf("%d requests after the mark-down", afterMark), func() bool {
		return startedSince(markedAt) >= afterMark
	})
	stop()
	return g, sims, collect(), faultAt, markedAt
}

// TestWorkerDownTrafficShifts: a worker dies (or fails its health check)
// under load. Its active probe marks it down (one verdict), its traffic
// shifts to the others, and no request started after the detection fails.
func TestWorkerDownTrafficShifts(t *testing.T) {
	for _, tc := range downCases {
		t.Run(tc.name, func(t *testing.T) {
			_, _, rs, faultAt, markedAt := worldDown(t, tc)
			var inWindow, inWindowFailed, after, afterFailed, afterOnW2 int
			for _, r := range rs {
				switch {
				case r.start.Before(faultAt):
				case r.start.Before(markedAt):
					inWindow++
					if r.failed() {
						inWindowFailed++
						t.Logf("failed during the detection window: status %d err %v body %.200s", r.status, r.err, r.body)
					}
				default:
					after++
					if r.failed() {
						afterFailed++
						t.Errorf("failed after detection: status %d err %v body %.200s", r.status, r.err, r.body)
					}
					if r.endpoint == "w2" {
						afterOnW2++
					}
				}
			}
			t.Logf("requests: %d during the detection window (%d failed), %d after it (%d failed, %d on w2)", inWindow, inWindowFailed, after, afterFailed, afterOnW2)
			if after < 10 {
				t.Fatalf("only %d requests after detection; the load did not run", after)
			}
			if afterOnW2 != 0 {
				t.Errorf("%d requests went to w2 after it was marked down; want 0", afterOnW2)
			}
		})
	}
}

// TestWorkerBackReadmitted: the worker comes back (restarted on its port, or
// its health check recovers); it is marked up and takes traffic again.
func TestWorkerBackReadmitted(t *testing.T) {
	for _, tc := range downCases {
		t.Run(tc.name, func(t *testing.T) {
			g, sims, _, _, _ := worldDown(t, tc)
			w2 := tc.back(t, sims[1])
			took := wait.For(t, verdictLimit, "w2 marked up with its breaker closed", func() bool {
				return metric(t, g, "llmgw_endpoint_available", "rule", "r", "endpoint", "w2") == 1
			})
			t.Logf("w2 readmitted %v after it came back", took.Round(time.Millisecond))
			before, err := w2.Receipts(t.Context())
			if err != nil {
				t.Fatal(err)
			}
			c := newClient(t, 10*time.Second)
			onW2 := 0
			for i := range 12 {
				r := chat(t.Context(), c, g.URL(), chatBody(fmt.Sprintf("after recovery %d", i), 4, false))
				if r.failed() {
					t.Fatalf("request %d after recovery: status %d err %v %s", i, r.status, r.err, r.body)
				}
				if r.endpoint == "w2" {
					onW2++
				}
			}
			after, err := w2.Receipts(t.Context())
			if err != nil {
				t.Fatal(err)
			}
			if onW2 == 0 || len(after)-len(before) != onW2 {
				t.Errorf("round robin over 3 after recovery: %d of 12 routed to w2, w2 receipts grew by %d; want > 0 and equal", onW2, len(after)-len(before))
			}
		})
	}
}
