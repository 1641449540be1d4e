package gateway

import (
	"fmt"
	"strings"
	"testing"

	"github.com/llmgw/llmgw/engines"
	"github.com/llmgw/llmgw/engines/sim"
	"github.com/llmgw/llmgw/gateway/upstream"
)

// TestLlamaPersonaBackToBack runs the acceptance against the
// simulator's llama.cpp persona (close after every SSE answer while
// advertising keep-alive, 5 s idle, 100 requests per connection, 4 served
// connections, the reused-connection stall on): back-to-back streaming and
// plain requests through a llama.cpp rule, 0 errors, and the breaker
// (opening on the first charged failure) never opens; then eight n:2
// requests, whose 500s are the client's fault, leave the endpoint available.
func TestLlamaPersonaBackToBack(t *testing.T) {
	s, err := sim.Start(t.Context(), sim.Config{Engine: engines.LlamaCpp, Model: "m1", KVEvents: sim.KVEventsOff, NagleStall: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	gw := startGateway(t, "", nil)
	h, p := hostPort(t, s.Addrs().HTTP)
	mustApply(t, gw, fmt.Sprintf("name: r\nmodel_name: m1\nkvEngineType: llamacpp\nprobe: {disabled: true}\ncb: {failures: 1, origin_5xx: 1}\nendpoints:\n  - {id: w1, endpointIP: %s, targetPort: %d}\n", h, p))
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
