package gateway

import (
	"fmt"
	"io"
	"net"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/llmgw/llmgw/engines"
	"github.com/llmgw/llmgw/engines/sim"
	"github.com/llmgw/llmgw/gateway/kvindex"
	"github.com/llmgw/llmgw/internal/testfix"
	"github.com/llmgw/llmgw/internal/wait"
)

// countingForwarder relays TCP connections to target and counts them.
type countingForwarder struct {
	ln       net.Listener
	accepted atomic.Int64
	wg       sync.WaitGroup
}

func newCountingForwarder(t *testing.T, target string) *countingForwarder {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	f := &countingForwarder{ln: ln}
	f.wg.Add(1)
	go func() {
		defer f.wg.Done()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			f.accepted.Add(1)
			u, err := net.Dial("tcp", target)
			if err != nil {
				c.Close()
				continue
			}
			f.wg.Add(2)
			go func() { defer f.wg.Done(); _, _ = io.Copy(u, c); u.Close() }()
			go func() { defer f.wg.Done(); _, _ = io.Copy(c, u); c.Close() }()
		}
	}()
	t.Cleanup(func() { ln.Close() })
	return f
}

// TestKVExactTRTIdlePollingKeepsOneConnection: through the gateway, an
// idle TensorRT-LLM worker's event drains back off to the idle cadence and
// go on one kept-alive connection (the worker accepts no new connection
// over an idle interval of six drains); a request routed to the worker
// wakes the poller, which drains its events at once.
func TestKVExactTRTIdlePollingKeepsOneConnection(t *testing.T) {
	s, err := sim.Start(t.Context(), sim.Config{Engine: engines.TRTLLM, Model: "m", BlockSize: 32, PrefillPerToken: time.Microsecond})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	fwd := newCountingForwarder(t, s.Addrs().HTTP)
	// The rule names the forwarder as the worker.
	h, p := hostPort(t, fwd.ln.Addr().String())
	gw := startGateway(t, "", nil)
	mustApply(t, gw, kvTokenizerLine.ReplaceAllString(kvRule(t, "kv", "trtllm", 32, nil), fmt.Sprintf("kvTokenizer: %q\n", testfix.Qwen3Dir(t)))+
		fmt.Sprintf("  - {id: w1, endpointIP: %s, targetPort: %d}\n", h, p))
	rt := gw.rules["kv"]
	g := rt.kv.ingest[0]
	c := newClient(t)
	url := "http://" + gw.Addr() + "/v1/completions"
	// One request fills the inventory (no canary is needed then); from
	// the moment the poller is back at its idle bound, the worker is idle.
	wait.For(t, 10*time.Second, "admission", func() bool { _, conn, _ := rt.kv.ready(0); return conn })
	if resp, out := post(t, c, url, `{"model":"m","max_tokens":1,"prompt":"`+kvPrompt("trt warm", 6)+`"}`); resp.StatusCode != 200 {
		t.Fatalf("%d %s", resp.StatusCode, out)
	}
	wait.For(t, 10*time.Second, "the warm request's blocks", func() bool { return rt.kv.index.Blocks(0) > 0 })
	wait.For(t, 20*time.Second, "the idle bound", func() bool { return g.State().PollInterval == kvindex.DefaultPollMax })
	conns, polls := fwd.accepted.Load(), g.State().Polls
	wait.For(t, 20*time.Second, "six idle drains", func() bool { return g.State().Polls >= polls+6 })
	if st := g.State(); st.PollInterval != kvindex.DefaultPollMax {
		t.Errorf("idle poll interval %v; want the idle bound %v", st.PollInterval, kvindex.DefaultPollMax)
	}
	if n := fwd.accepted.Load(); n != conns {
		t.Errorf("the worker accepted %d new connections over %d idle drains; want none (keep-alive)", n-conns, g.State().Polls-polls)
	}
	if got := gw.metricValue(t, "llmgw_kv_event_polls_total", "kv", "w1"); got < float64(polls+6) {
		t.Errorf("llmgw_kv_event_polls_total = %v; want at least %d", got, polls+6)
	}
	// A request wakes the poller: its blocks are drained without waiting
	// out the idle interval, at the quick cadence.
	before := rt.kv.index.Blocks(0)
	resp, out := post(t, c, url, `{"model":"m","max_tokens":1,"prompt":"`+kvPrompt("trt idle", 6)+`"}`)
	if resp.StatusCode != 200 {
		t.Fatalf("%d %s", resp.StatusCode, out)
	}
	wait.For(t, 10*time.Second, "the request's blocks", func() bool { return rt.kv.index.Blocks(0) > before })
	if st := g.State(); st.PollInterval >= kvindex.DefaultPollMax {
		t.Errorf("poll interval %v right after the request's events; want the quick cadence", st.PollInterval)
	}
}
