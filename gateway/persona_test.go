package gateway

import (
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/llmgw/llmgw/engines"
	"github.com/llmgw/llmgw/engines/sim"
	"github.com/llmgw/llmgw/gateway/upstream"
	"github.com/llmgw/llmgw/internal/wait"
)

// llamaPersonaRule starts the llama.cpp persona with the Nagle stall on and
// a gateway with rule "r" (llama.cpp, probes off, extra settings) in front
// of it.
func llamaPersonaRule(t *testing.T, extra string, tune ...func(*sim.Config)) *Server {
	t.Helper()
	cfg := sim.Config{Engine: engines.LlamaCpp, Model: "m1", KVEvents: sim.KVEventsOff, NagleStall: true}
	for _, f := range tune {
		f(&cfg)
	}
	s, err := sim.Start(t.Context(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	gw := startGateway(t, "", nil)
	h, p := hostPort(t, s.Addrs().HTTP)
	mustApply(t, gw, fmt.Sprintf("name: r\nmodel_name: m1\nkvEngineType: llamacpp\nprobe: {disabled: true}\n%s\nendpoints:\n  - {id: w1, endpointIP: %s, targetPort: %d}\n", extra, h, p))
	return gw
}

// TestLlamaPersonaBackToBack runs the acceptance against the
// simulator's llama.cpp persona (close after every SSE answer while
// advertising keep-alive, 5 s idle, 100 requests per connection, 4 served
// connections, the reused-connection stall on): back-to-back streaming and
// plain requests through a llama.cpp rule, 0 errors, and the breaker
// (opening on the first charged failure) never opens; then eight n:2
// requests, whose 500s are the client's fault, leave the endpoint available.
func TestLlamaPersonaBackToBack(t *testing.T) {
	gw := llamaPersonaRule(t, "cb: {failures: 1, origin_5xx: 1}")
	ep := gw.rules["r"].eps[0]
	c := newClient(t)
	url := "http://" + gw.Addr() + "/v1/chat/completions"
	for i := range 120 {
		body, what := streamChat, "stream"
		if i%2 == 1 {
			body, what = chatBody, "plain"
		}
		resp, out := post(t, c, url, body)
		if resp.StatusCode != 200 || strings.Contains(out, `"error"`) {
			t.Fatalf("%s request %d: status %d body %q", what, i, resp.StatusCode, out)
		}
		if st := ep.Breaker().State(); st != upstream.Closed {
			t.Fatalf("%s request %d: breaker %s", what, i, st)
		}
	}
	if n := gw.metricValue(t, "llmgw_upstream_failures_total", "r"); n != 0 {
		t.Errorf("%v upstream failures", n)
	}
	// Eight n:2 requests: the persona answers llama-server's 500; each is
	// relayed and none demotes the endpoint (origin_5xx: 1 would open the
	// breaker on the first counted one).
	for i := range 8 {
		resp, out := post(t, c, url, `{"model":"m1","n":2,"messages":[{"role":"user","content":"hi"}]}`)
		if resp.StatusCode != 500 || !strings.Contains(out, "Only one completion choice is allowed") {
			t.Fatalf("n:2 request %d: status %d body %q; want the engine's 500", i, resp.StatusCode, out)
		}
	}
	if st := ep.Breaker().State(); st != upstream.Closed {
		t.Fatalf("breaker %s after n:2 answers", st)
	}
	if resp, out := post(t, c, url, chatBody); resp.StatusCode != 200 {
		t.Fatalf("after the n:2 answers: status %d body %q", resp.StatusCode, out)
	}
}

// TestLlamaPersonaKeptConns: in front of the llama.cpp persona with the
// Nagle stall on (Nagle's algorithm on, head and body written apart, as
// llama-server), the gateway keeps its connection, and its answers on the
// reused connection do not wait for the kernel's delayed-ACK timer (every
// reused answer of a client that delays its ACKs takes at least 40 ms,
// engines/llamacpp TestNagleStall). With more concurrent requests than it
// keeps connections for, the rest go on one-shot connections and the
// gateway never holds more than keptConns of the server's few threads.
func TestLlamaPersonaKeptConns(t *testing.T) {
	gw := llamaPersonaRule(t, "")
	rt := gw.rules["r"]
	kept := keptConns(rt.conn)
	if kept < 1 || kept >= rt.conn.ServingConns {
		t.Fatalf("keptConns = %d for %d serving connections", kept, rt.conn.ServingConns)
	}
	c := newClient(t)
	url := "http://" + gw.Addr() + "/v1/chat/completions"

	t.Run("sequential", func(t *testing.T) {
		const n = 11
		took := make([]time.Duration, n)
		for i := range n {
			start := time.Now()
			if resp, out := post(t, c, url, chatBody); resp.StatusCode != 200 {
				t.Fatalf("request %d: %d %q", i, resp.StatusCode, out)
			}
			took[i] = time.Since(start)
		}
		if got := gw.keptUpstream(t, rt, 0); got != 1 {
			t.Fatalf("%d kept connections after sequential requests, want the one reused", got)
		}
		slices.Sort(took)
		// A floor the stall cannot undercut, not a speed target: with
		// delayed ACKs every reused answer (10 of the 11) would take
		// 40 ms or more.
		if med := took[n/2]; med >= 30*time.Millisecond {
			t.Fatalf("median %v over %d requests on a kept connection: the answers waited for the delayed-ACK timer (all: %v)", med, n, took)
		}
	})

	t.Run("concurrent", func(t *testing.T) {
		const clients, each = 8, 10
		var wg sync.WaitGroup
		var maxKept atomic.Int64
		errs := make(chan error, clients*each)
		for range clients {
			wg.Go(func() {
				for range each {
					resp, out, err := postErr(c, url, chatBody)
					if err != nil {
						errs <- err
						return
					}
					if resp.StatusCode != 200 {
						errs <- fmt.Errorf("status %d body %q", resp.StatusCode, out)
						return
					}
					n := int64(gw.keptUpstream(t, rt, 0))
					for m := maxKept.Load(); n > m && !maxKept.CompareAndSwap(m, n); m = maxKept.Load() {
					}
				}
			})
		}
		wg.Wait()
		close(errs)
		for err := range errs {
			t.Error(err)
		}
		if m := maxKept.Load(); m > int64(kept) {
			t.Errorf("up to %d kept connections, want at most %d", m, kept)
		}
		if n := openConnsTo(t, rt.eps[0].Addr) - gw.keptUpstream(t, rt, 0); n != 0 {
			t.Errorf("%d one-shot connections left open after the answers", n)
		}
	})
}

// TestLlamaPersonaOneShotOverflow: with every kept connection busy
// (streams in flight), a request goes on a one-shot connection at once,
// answers, and is counted.
func TestLlamaPersonaOneShotOverflow(t *testing.T) {
	gw := llamaPersonaRule(t, "", func(c *sim.Config) { c.DecodePerToken = 5 * time.Millisecond })
	rt := gw.rules["r"]
	kept := keptConns(rt.conn)
	c := newClient(t)
	url := "http://" + gw.Addr() + "/v1/chat/completions"
	before := gw.metricValue(t, "llmgw_upstream_oneshot_requests_total", "r")
	const long = `{"model":"m1","stream":true,"max_tokens":400,"messages":[{"role":"user","content":"hi"}]}`
	errs := make(chan error, kept)
	for range kept {
		go func() {
			resp, out, err := postErr(c, url, long)
			if err == nil && resp.StatusCode != 200 {
				err = fmt.Errorf("stream: status %d body %q", resp.StatusCode, out)
			}
			errs <- err
		}()
	}
	wait.For(t, 10*time.Second, "every kept connection carrying a stream", func() bool {
		return rt.eps[0].InFlight() == int64(kept) && gw.keptUpstream(t, rt, 0) == kept
	})
	if resp, out := post(t, c, url, chatBody); resp.StatusCode != 200 {
		t.Fatalf("request beside the streams: %d %q", resp.StatusCode, out)
	}
	if got := gw.metricValue(t, "llmgw_upstream_oneshot_requests_total", "r") - before; got != 1 {
		t.Errorf("one-shot requests counted %v, want 1", got)
	}
	for range kept {
		if err := <-errs; err != nil {
			t.Error(err)
		}
	}
}
