package kvindex

import (
	"context"
	"net"
	"net/http"
	"sync/atomic"
	"testing"
	"time"

	"github.com/llmgw/llmgw/engines"
	"github.com/llmgw/llmgw/engines/sim"
)

// TestTRTIdlePollingBacksOffAndReusesItsConnection drives the TensorRT-LLM
// poller against the simulator with the default cadence, one step at a
// time: the poller's waits are recorded instead of slept (no timing), the
// drains are real. While the worker is idle the wait grows to
// DefaultPollMax, bounding the idle cost at two drains a second (it was
// about 46 at the reference's 20 ms bound), and every drain goes on the one
// kept-alive connection. A Kick (the gateway sent the worker a request)
// polls at once, and the cadence restarts at DefaultPollMin.
func TestTRTIdlePollingBacksOffAndReusesItsConnection(t *testing.T) {
	const bs = 32
	s := startSim(t, sim.Config{Engine: engines.TRTLLM, BlockSize: bs})
	base := "http://" + s.Addrs().HTTP
	var dials atomic.Int64
	tr := &http.Transport{DialContext: func(ctx context.Context, network, addr string) (net.Conn, error) {
		dials.Add(1)
		var d net.Dialer
		return d.DialContext(ctx, network, addr)
	}}
	t.Cleanup(tr.CloseIdleConnections)
	g, err := NewIngester(IngestConfig{Engine: engines.TRTLLM, HTTPBase: base, BlockSize: bs, HTTPClient: &http.Client{Transport: tr, Timeout: waitLimit}}, New(1, 1000))
	if err != nil {
		t.Fatal(err)
	}
	// Each wait is handed to the test, which lets the poller go on.
	waits := make(chan time.Duration)
	resume := make(chan struct{})
	g.sleep = func(ctx context.Context, d time.Duration, kick <-chan struct{}) (bool, bool) {
		select {
		case waits <- d:
		case <-ctx.Done():
			return false, false
		}
		select {
		case <-resume:
		case <-ctx.Done():
			return false, false
		}
		select {
		case <-kick:
			return true, true
		default:
			return true, false
		}
	}
	runIngester(t, g)
	next := func() time.Duration {
		t.Helper()
		select {
		case d := <-waits:
			return d
		case <-time.After(waitLimit):
			t.Fatal("the poller did not poll")
			return 0
		}
	}

	// Idle: the "created" event comes with the first drain, then nothing.
	// The poller is left waiting in its last recorded wait.
	var idle []time.Duration
	for i := 0; i < 30; i++ {
		if i > 0 {
			resume <- struct{}{}
		}
		idle = append(idle, next())
	}
	var atMax int
	var idleTime time.Duration
	for i, d := range idle {
		if d > DefaultPollMax || (i > 0 && d < idle[i-1]) {
			t.Errorf("idle wait %d is %v after %v: want a growing wait bounded by %v", i, d, idle[i-1], DefaultPollMax)
		}
		if d == DefaultPollMax {
			atMax++
			idleTime += d
		}
	}
	if atMax < 10 {
		t.Fatalf("waits %v: the idle cadence did not settle at %v", idle, DefaultPollMax)
	}
	if rate := float64(atMax) / idleTime.Seconds(); rate > 2 {
		t.Errorf("idle drains: %.0f a second; want at most 2", rate)
	}
	polls := g.State().Polls
	if n := dials.Load(); n != 1 {
		t.Errorf("%d drains (and the server_info check) took %d connections; want one kept alive", polls, n)
	}

	// A request to the worker, then a Kick: the poller drains at once and
	// returns to its quick cadence.
	c := httpClient(t)
	postJSON(t, c, base+"/v1/completions", map[string]any{"model": "Qwen/Qwen3-0.6B", "prompt": seqTokens(1, 3*bs), "max_tokens": 1}, nil)
	g.Kick()
	resume <- struct{}{}
	if d := next(); d != DefaultPollMin {
		t.Errorf("wait after a kick and a drain with events: %v; want %v", d, DefaultPollMin)
	}
	if st := g.State(); st.Polls != polls+1 || st.Events < 2 {
		t.Errorf("after the kick: %d polls (was %d), %d events; want one more poll that drained the request's events", st.Polls, polls, st.Events)
	}
	if n := dials.Load(); n != 1 {
		t.Errorf("%d connections; want the one kept alive", n)
	}
	resume <- struct{}{}
}
