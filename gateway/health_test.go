package gateway

import (
	"fmt"
	"net"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/valyala/fasthttp"

	"github.com/llmgw/llmgw/internal/wait"
)

// deadPort returns a loopback port with nothing listening on it.
func deadPort(t *testing.T) int {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	_, p, _ := net.SplitHostPort(ln.Addr().String())
	ln.Close()
	n, _ := strconv.Atoi(p)
	return n
}

func TestRetryOnceOnAnotherEndpoint(t *testing.T) {
	good := newBackend(t, "good", nil)
	s := startGateway(t, "", nil)
	dead := deadPort(t)
	mustApply(t, s, fmt.Sprintf(`name: r
model_name: m1
sel: 0
probe: {disabled: true}
endpoints:
  - {id: dead, endpointIP: 127.0.0.1, targetPort: %d}
  - {id: good, endpointIP: 127.0.0.1, targetPort: %d}
`, dead, good.port()))
	c := newClient(t)
	url := "http://" + s.Addr() + "/v1/chat/completions"
	for i := 0; i < 4; i++ {
		resp, body := post(t, c, url, chatBody)
		if resp.StatusCode != 200 || resp.Header.Get("X-Llmgw-Endpoint") != "good" {
			t.Fatalf("request %d: %d from %q: %s; want 200 from good (retried)", i, resp.StatusCode, resp.Header.Get("X-Llmgw-Endpoint"), body)
		}
	}

	// Both endpoints dead: one retry only, then 502 with an OpenAI error.
	mustApply(t, s, fmt.Sprintf(`name: r2
model_name: m2
probe: {disabled: true}
endpoints:
  - {id: d1, endpointIP: 127.0.0.1, targetPort: %d}
  - {id: d2, endpointIP: 127.0.0.1, targetPort: %d}
  - {id: d3, endpointIP: 127.0.0.1, targetPort: %d}
`, deadPort(t), deadPort(t), deadPort(t)))
	resp, body := post(t, c, url, `{"model":"m2","messages":[{"role":"user","content":"x"}]}`)
	if resp.StatusCode != 502 || !strings.Contains(body, `"code":"backend_unreachable"`) {
		t.Fatalf("all dead: %d %s; want 502 backend_unreachable", resp.StatusCode, body)
	}
	if got := s.metricValue(t, "llmgw_retries_total", "r2"); got != 1 {
		t.Errorf("retries for r2 = %v; want exactly 1", got)
	}
}

func TestBreakerOpensAfterConnectionFailures(t *testing.T) {
	good := newBackend(t, "good", nil)
	s := startGateway(t, "", nil)
	mustApply(t, s, fmt.Sprintf(`name: r
model_name: m1
sel: 0
probe: {disabled: true}
cb: {failures: 2, open_for: 1h}
endpoints:
  - {id: dead, endpointIP: 127.0.0.1, targetPort: %d}
  - {id: good, endpointIP: 127.0.0.1, targetPort: %d}
`, deadPort(t), good.port()))
	c := newClient(t)
	for i := 0; i < 6; i++ {
		if resp, body := post(t, c, "http://"+s.Addr()+"/v1/chat/completions", chatBody); resp.StatusCode != 200 {
			t.Fatalf("request %d: %d %s", i, resp.StatusCode, body)
		}
	}
	st, _ := s.Rule("r")
	if st.Status.Endpoints[0].Breaker != "open" || st.Status.Endpoints[0].Available {
		t.Errorf("dead endpoint status %+v; want breaker open and unavailable", st.Status.Endpoints[0])
	}
	if st.Status.Endpoints[1].Breaker != "closed" {
		t.Errorf("good endpoint breaker %q; want closed", st.Status.Endpoints[1].Breaker)
	}
}

func TestOrigin5xxRelayedAndDemotes(t *testing.T) {
	bad := newBackend(t, "bad", func(ctx *fasthttp.RequestCtx) {
		ctx.SetStatusCode(500)
		ctx.SetContentType("application/json")
		ctx.SetBodyString(`{"error":{"message":"engine exploded","type":"server_error","code":500}}`)
	})
	good := newBackend(t, "good", nil)
	s := startGateway(t, "", nil)
	mustApply(t, s, fmt.Sprintf(`name: r
model_name: m1
sel: 0
probe: {disabled: true}
cb: {origin_5xx: 3, open_for: 1h}
endpoints:
  - {id: bad, endpointIP: 127.0.0.1, targetPort: %d}
  - {id: good, endpointIP: 127.0.0.1, targetPort: %d}
`, bad.port(), good.port()))
	c := newClient(t)
	url := "http://" + s.Addr() + "/v1/chat/completions"
	var fivexx int
	for i := 0; i < 6; i++ {
		resp, body := post(t, c, url, chatBody)
		if resp.StatusCode == 500 {
			fivexx++
			if !strings.Contains(body, "engine exploded") {
				t.Errorf("5xx body not relayed as is: %s", body)
			}
		}
	}
	if fivexx != 3 {
		t.Errorf("client saw %d origin 5xx; want exactly 3 (then the endpoint is demoted)", fivexx)
	}
	before := bad.hits.Load()
	for i := 0; i < 10; i++ {
		if resp, _ := post(t, c, url, chatBody); resp.StatusCode != 200 {
			t.Fatalf("after demotion: status %d", resp.StatusCode)
		}
	}
	if bad.hits.Load() != before {
		t.Errorf("demoted endpoint still received requests")
	}
}

func TestBreakerHalfOpenHeals(t *testing.T) {
	var failing atomic.Bool
	failing.Store(true)
	b := newBackend(t, "flappy", func(ctx *fasthttp.RequestCtx) {
		if failing.Load() {
			ctx.SetStatusCode(503)
			return
		}
		ctx.SetBodyString(`{"ok":true}`)
	})
	s := startGateway(t, "", nil)
	mustApply(t, s, ruleYAML("r", "m1", "probe: {disabled: true}\ncb: {origin_5xx: 2, open_for: 100ms}", b))
	c := newClient(t)
	url := "http://" + s.Addr() + "/v1/chat/completions"
	post(t, c, url, chatBody)
	post(t, c, url, chatBody)
	if resp, _ := post(t, c, url, chatBody); resp.StatusCode != 503 {
		t.Fatalf("open breaker, only endpoint: status %d; want 503 from the gateway", resp.StatusCode)
	}
	failing.Store(false)
	wait.For(t, 5*time.Second, "half-open trial to succeed", func() bool {
		resp, _ := post(t, c, url, chatBody)
		return resp.StatusCode == 200
	})
	st, _ := s.Rule("r")
	if st.Status.Endpoints[0].Breaker != "closed" {
		t.Errorf("breaker %q after a good trial; want closed", st.Status.Endpoints[0].Breaker)
	}
}

func TestProbeMarksDownAndUp(t *testing.T) {
	a := newBackend(t, "a", nil)
	b := newBackend(t, "b", nil)
	s := startGateway(t, "", nil)
	mustApply(t, s, ruleYAML("r", "m1", "sel: 0", a, b))
	rt := s.rules["r"]
	a.health.Store(503)
	wait.For(t, 5*time.Second, "w1 to be marked down", func() bool { return rt.eps[0].Down() })
	c := newClient(t)
	before := a.hits.Load()
	for i := 0; i < 8; i++ {
		if resp, _ := post(t, c, "http://"+s.Addr()+"/v1/chat/completions", chatBody); resp.StatusCode != 200 {
			t.Fatalf("status %d with one endpoint down", resp.StatusCode)
		}
	}
	if a.hits.Load() != before {
		t.Errorf("a down endpoint received traffic")
	}
	a.health.Store(0)
	wait.For(t, 5*time.Second, "w1 to be readmitted", func() bool { return !rt.eps[0].Down() })
	if got := s.metricValue(t, "llmgw_probe_transitions_total", "r", "w1", "down"); got != 1 {
		t.Errorf("probe down transitions = %v; want 1", got)
	}
}

func TestDrainEndpoint(t *testing.T) {
	hold := make(chan struct{})
	started := make(chan struct{}, 8)
	slow := newBackend(t, "slow", func(ctx *fasthttp.RequestCtx) {
		started <- struct{}{}
		<-hold
		ctx.SetBodyString(`{"slow":true}`)
	})
	other := newBackend(t, "other", nil)
	s := startGateway(t, "", nil)
	mustApply(t, s, ruleYAML("r", "m1", "sel: 0\nprobe: {disabled: true}", slow, other))
	c := newClient(t)
	url := "http://" + s.Addr() + "/v1/chat/completions"
	done := make(chan int, 1)
	go func() {
		resp, _ := post(t, c, url, chatBody)
		done <- resp.StatusCode
	}()
	<-started
	if err := s.SetDraining("r", "w1", true); err != nil {
		t.Fatal(err)
	}
	st, _ := s.Rule("r")
	if !st.Status.Endpoints[0].Draining || st.Status.Endpoints[0].InFlight != 1 {
		t.Errorf("drained endpoint status %+v; want draining with 1 in flight", st.Status.Endpoints[0])
	}
	for i := 0; i < 6; i++ {
		resp, _ := post(t, c, url, chatBody)
		if resp.Header.Get("X-Llmgw-Endpoint") != "w2" {
			t.Fatalf("new request went to %q while w1 drains", resp.Header.Get("X-Llmgw-Endpoint"))
		}
	}
	close(hold)
	if code := <-done; code != 200 {
		t.Errorf("in-flight request on the drained endpoint ended %d; want 200", code)
	}
	st, _ = s.Rule("r")
	if st.Status.Endpoints[0].InFlight != 0 {
		t.Errorf("in-flight after drain = %d", st.Status.Endpoints[0].InFlight)
	}
	if err := s.SetDraining("r", "nope", true); err == nil {
		t.Error("draining an unknown endpoint succeeded")
	}
}
