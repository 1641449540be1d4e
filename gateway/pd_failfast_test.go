package gateway

import (
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"regexp"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/llmgw/llmgw/engines"
	"github.com/llmgw/llmgw/engines/sim"
	"github.com/llmgw/llmgw/internal/wait"
)

// pdScripted is a net/http upstream for P/D legs that no engine plays
// politely: it records each request's arrival and end (cancelled by the
// client or answered) as events.
type pdScripted struct {
	addr      string
	arrived   chan struct{} // one event per request received
	cancelled chan struct{} // one event per request the client abandoned
	hits      atomic.Int32
	ids       chan string // X-Request-Id of each request
}

// newPDScripted serves handle; handle returns true when it answered and false
// when it waited for the client to go away.
func newPDScripted(t *testing.T, handle func(w http.ResponseWriter, r *http.Request) bool) *pdScripted {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	s := &pdScripted{addr: ln.Addr().String(), arrived: make(chan struct{}, 64), cancelled: make(chan struct{}, 64), ids: make(chan string, 64)}
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/health" {
			return
		}
		// Read the body as an engine does (net/http notices a closed
		// connection, and cancels r.Context(), only once it has).
		_, _ = io.Copy(io.Discard, r.Body)
		s.hits.Add(1)
		s.ids <- r.Header.Get("X-Request-Id")
		s.arrived <- struct{}{}
		if !handle(w, r) {
			s.cancelled <- struct{}{}
		}
	})}
	go func() { _ = srv.Serve(ln) }()
	t.Cleanup(func() { _ = srv.Close() })
	return s
}

// pendingUntilCancelled never answers: it returns when the client cancels
// the request (or the server closes).
func pendingUntilCancelled(w http.ResponseWriter, r *http.Request) bool {
	<-r.Context().Done()
	return false
}

func answer(status int, body string) func(w http.ResponseWriter, r *http.Request) bool {
	return func(w http.ResponseWriter, r *http.Request) bool {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(status)
		_, _ = w.Write([]byte(body))
		return true
	}
}

// dropConn closes the connection without an answer.
func dropConn(w http.ResponseWriter, r *http.Request) bool {
	c, _, err := w.(http.Hijacker).Hijack()
	if err == nil {
		c.Close()
	}
	return true
}

func waitEvent(t *testing.T, ch <-chan struct{}, what string) {
	t.Helper()
	select {
	case <-ch:
	case <-time.After(10 * time.Second):
		t.Fatalf("no %s event within 10s", what)
	}
}

func breakerOf(t *testing.T, s *Server, rule, id string) string {
	t.Helper()
	st, err := s.Rule(rule)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range st.Status.Endpoints {
		if e.ID == id {
			return e.Breaker
		}
	}
	t.Fatalf("endpoint %q missing", id)
	return ""
}

// TestPDDecodeFailureFailsFast: a decode leg that fails is answered with
// the decode's own status and body, for every P/D shape; a concurrent
// (SGLang) prefill, which can only wait for a decode that never joins, is
// cancelled before the client's answer is complete, and only the decode's
// breaker is charged. On the old code the client waited for the prefill's
// timeout and got 502 pd_prefill_failed naming the prefill.
func TestPDDecodeFailureFailsFast(t *testing.T) {
	const errBody = `{"object":"error","message":"decode says no","type":"BadRequestError","param":null,"code":400}`
	const srvBody = `{"object":"error","message":"decode crashed","type":"InternalServerError","param":null,"code":500}`
	// A prefill answer whose hand-off the decode may recompute: both
	// sequential shapes then send the decode the client's body.
	const prefillOK = `{"id":"x","object":"text_completion","choices":[{"index":0,"text":"a","finish_reason":"length"}]}`
	cases := []struct {
		name        string
		engine      engines.Kind
		decode      func(w http.ResponseWriter, r *http.Request) bool
		wantStatus  int
		wantBody    string // verbatim, when set
		wantCode    string // OpenAI error code, when set
		decodeOpens bool   // the decode's breaker is charged (opens at 1)
	}{
		{"sglang decode 500", engines.SGLang, answer(500, srvBody), 500, srvBody, "", true},
		{"sglang decode 400 verbatim", engines.SGLang, answer(400, errBody), 400, errBody, "", false},
		{"sglang decode drops", engines.SGLang, dropConn, 502, "", "pd_decode_backend_died", true},
		{"vllm decode 500", engines.VLLM, answer(500, srvBody), 500, srvBody, "", true},
		{"vllm decode 400 verbatim", engines.VLLM, answer(400, errBody), 400, errBody, "", false},
		{"vllm decode drops", engines.VLLM, dropConn, 502, "", "pd_decode_backend_died", true},
		{"trtllm generation 500", engines.TRTLLM, answer(500, srvBody), 500, srvBody, "", true},
		{"trtllm generation 400 verbatim", engines.TRTLLM, answer(400, errBody), 400, errBody, "", false},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			concurrent := engines.MustFor(tc.engine).PD().Shape() == engines.PDConcurrent
			prefill := pendingUntilCancelled
			if !concurrent {
				prefill = answer(200, prefillOK)
			}
			p := newPDScripted(t, prefill)
			decode := tc.decode
			if concurrent {
				// The decode fails only once the prefill is pending.
				decode = func(w http.ResponseWriter, r *http.Request) bool {
					waitEvent(t, p.arrived, "prefill arrived")
					return tc.decode(w, r)
				}
			}
			d := newPDScripted(t, decode)
			ph, pp := hostPort(t, p.addr)
			dh, dp := hostPort(t, d.addr)
			s := startGateway(t, "", nil)
			mustApply(t, s, fmt.Sprintf("name: pd\nmodel_name: m\nkvEngineType: %s\npd_disagg_mode: true\nprobe: {disabled: true}\n"+
				"cb: {failures: 1, origin_5xx: 1, open_for: 1h}\ntimeouts: {prefill: 1h, first_byte: 1h}\nendpoints:\n"+
				"  - {id: p1, endpointIP: %s, targetPort: %d, ep_role: 1}\n  - {id: d1, endpointIP: %s, targetPort: %d, ep_role: 2}\n",
				tc.engine, ph, pp, dh, dp))
			resp, out := post(t, newClient(t), "http://"+s.Addr()+"/v1/completions", `{"model":"m","prompt":"hello","max_tokens":4}`)
			if concurrent {
				// The answer came while the prefill was still pending: it
				// never answers on its own. Its cancellation follows.
				waitEvent(t, p.cancelled, "prefill cancelled")
			}
			if resp.StatusCode != tc.wantStatus {
				t.Fatalf("status %d (%s); want the decode's %d", resp.StatusCode, out, tc.wantStatus)
			}
			if tc.wantBody != "" && out != tc.wantBody {
				t.Errorf("body %q; want the decode's body verbatim %q", out, tc.wantBody)
			}
			if tc.wantCode != "" {
				var e apiError
				if json.Unmarshal([]byte(out), &e); e.Error.Code != tc.wantCode {
					t.Errorf("code %q (%s); want %q", e.Error.Code, out, tc.wantCode)
				}
			}
			if got := resp.Header.Get("X-Llmgw-Endpoint"); tc.wantBody != "" && got != "d1" {
				t.Errorf("X-Llmgw-Endpoint %q; want the decode d1", got)
			}
			if got := breakerOf(t, s, "pd", "p1"); got != "closed" {
				t.Errorf("prefill breaker %q; want closed (the prefill did nothing wrong)", got)
			}
			want := "closed"
			if tc.decodeOpens {
				want = "open"
			}
			if got := breakerOf(t, s, "pd", "d1"); got != want {
				t.Errorf("decode breaker %q; want %s", got, want)
			}
			wait.For(t, 5*time.Second, "legs released", func() bool { return s.rules["pd"].inFlight() == 0 })
		})
	}
}

// TestPDDecisionsAndSel: both legs' choices are in /v1/decisions, and the
// prefill pick follows the rule's sel (weighted round robin here: 3:1),
// not a hard-coded least in-flight (which spread 4:4).
func TestPDDecisionsAndSel(t *testing.T) {
	p1 := startSimT(t, sim.Config{Engine: engines.VLLM, Role: sim.RolePrefill})
	p2 := startSimT(t, sim.Config{Engine: engines.VLLM, Role: sim.RolePrefill})
	d := startSimT(t, sim.Config{Engine: engines.VLLM, Role: sim.RoleDecode})
	h1, port1 := hostPort(t, p1.Addrs().HTTP)
	h2, port2 := hostPort(t, p2.Addrs().HTTP)
	dh, dp := hostPort(t, d.Addrs().HTTP)
	s := startGateway(t, "", nil)
	mustApply(t, s, fmt.Sprintf("name: pd\nmodel_name: m\nkvEngineType: vllm\npd_disagg_mode: true\nsel: 2\nprobe: {disabled: true}\nendpoints:\n"+
		"  - {id: p1, endpointIP: %s, targetPort: %d, ep_role: 1, weight: 3}\n  - {id: p2, endpointIP: %s, targetPort: %d, ep_role: 1}\n"+
		"  - {id: d1, endpointIP: %s, targetPort: %d, ep_role: 2}\n", h1, port1, h2, port2, dh, dp))
	c := newClient(t)
	for i := 0; i < 8; i++ {
		if resp, out := post(t, c, "http://"+s.Addr()+"/v1/completions", `{"model":"m","prompt":"x","max_tokens":2}`, "X-Request-Id", fmt.Sprintf("r%d", i)); resp.StatusCode != 200 {
			t.Fatalf("%d %s", resp.StatusCode, out)
		}
	}
	if n1, n2 := len(p1.Receipts()), len(p2.Receipts()); n1 != 6 || n2 != 2 {
		t.Errorf("prefills served %d and %d of 8; want 6 and 2 (sel 2, weights 3:1)", n1, n2)
	}
	legs := map[string]map[string]string{} // request id → leg → endpoint
	for _, dec := range s.decisions.list("pd", time.Time{}) {
		if legs[dec.RequestID] == nil {
			legs[dec.RequestID] = map[string]string{}
		}
		legs[dec.RequestID][dec.Leg] = dec.Endpoint
		if dec.Leg == "prefill" && !strings.Contains(dec.Reason, "wrr") {
			t.Errorf("prefill decision reason %q; want the sel 2 policy (wrr)", dec.Reason)
		}
	}
	for i := 0; i < 8; i++ {
		l := legs[fmt.Sprintf("r%d", i)]
		if l["prefill"] == "" || l["decode"] != "d1" {
			t.Errorf("request r%d decisions %v; want a prefill and the decode d1", i, l)
		}
	}
}

// p2pID is vLLM's P2P-NCCL request id (examples/online_serving/
// disaggregated_serving_p2p_nccl_xpyd/disagg_proxy_p2p_nccl_xpyd.py).
var p2pID = regexp.MustCompile(`^___prefill_addr_127\.0\.0\.1:(\d+)___decode_addr_127\.0\.0\.1:(\d+)_[0-9a-f]{32}$`)

// TestPDVLLMP2PNCCLRequestID: with p2p_nccl_port set, both legs carry one
// P2P-NCCL request id naming the prefill's and the decode's KV ports;
// without it, the client's id.
func TestPDVLLMP2PNCCLRequestID(t *testing.T) {
	const prefillOK = `{"id":"x","object":"text_completion","choices":[{"index":0,"text":"a","finish_reason":"length"}]}`
	for _, withPorts := range []bool{true, false} {
		t.Run(fmt.Sprintf("p2p_nccl_port=%v", withPorts), func(t *testing.T) {
			p := newPDScripted(t, answer(200, prefillOK))
			d := newPDScripted(t, answer(200, prefillOK))
			ph, pp := hostPort(t, p.addr)
			dh, dp := hostPort(t, d.addr)
			extraP, extraD := "", ""
			if withPorts {
				extraP, extraD = ", p2p_nccl_port: 9001", ", p2p_nccl_port: 9002"
			}
			s := startGateway(t, "", nil)
			mustApply(t, s, fmt.Sprintf("name: pd\nmodel_name: m\nkvEngineType: vllm\npd_disagg_mode: true\nprobe: {disabled: true}\nendpoints:\n"+
				"  - {id: p1, endpointIP: %s, targetPort: %d, ep_role: 1%s}\n  - {id: d1, endpointIP: %s, targetPort: %d, ep_role: 2%s}\n", ph, pp, extraP, dh, dp, extraD))
			resp, out := post(t, newClient(t), "http://"+s.Addr()+"/v1/completions", `{"model":"m","prompt":"x","max_tokens":2}`, "X-Request-Id", "client-1")
			if resp.StatusCode != 200 {
				t.Fatalf("%d %s", resp.StatusCode, out)
			}
			pid, did := <-p.ids, <-d.ids
			if !withPorts {
				if pid != "client-1" || did != "client-1" {
					t.Errorf("leg ids %q, %q; want the client's", pid, did)
				}
				return
			}
			m := p2pID.FindStringSubmatch(pid)
			if m == nil || m[1] != "9001" || m[2] != "9002" || did != pid {
				t.Errorf("leg ids %q, %q; want one P2P-NCCL id with KV ports 9001 and 9002", pid, did)
			}
			if got := resp.Header.Get("X-Request-Id"); got != "client-1" {
				t.Errorf("client sees X-Request-Id %q; want its own", got)
			}
		})
	}
}

// TestPDLegPoolIdleBelowEngineKeepAlive: the legs' pool drops an idle
// connection before the engine does (uvicorn closes after 5 s), so that no
// leg is written to a connection the engine is closing.
func TestPDLegPoolIdleBelowEngineKeepAlive(t *testing.T) {
	for _, k := range []engines.Kind{engines.VLLM, engines.SGLang, engines.TRTLLM} {
		t.Run(string(k), func(t *testing.T) {
			p := newPDScripted(t, answer(200, `{}`))
			d := newPDScripted(t, answer(200, `{}`))
			ph, pp := hostPort(t, p.addr)
			dh, dp := hostPort(t, d.addr)
			s := startGateway(t, "", nil)
			mustApply(t, s, fmt.Sprintf("name: pd\nmodel_name: m\nkvEngineType: %s\npd_disagg_mode: true\nprobe: {disabled: true}\nendpoints:\n"+
				"  - {id: p1, endpointIP: %s, targetPort: %d, ep_role: 1}\n  - {id: d1, endpointIP: %s, targetPort: %d, ep_role: 2}\n", k, ph, pp, dh, dp))
			engineIdle := engines.MustFor(k).Conn().IdleTimeout
			got := s.rules["pd"].pd.transport.IdleConnTimeout
			if engineIdle == 0 || got <= 0 || got >= engineIdle {
				t.Errorf("leg pool idle timeout %v; want below the engine's %v", got, engineIdle)
			}
		})
	}
}

// TestPDLegHeaders: both legs get the client's end-to-end headers and none
// of its connection-scoped ones (the fixed list and those its Connection
// header names), as a plain rule's worker does.
func TestPDLegHeaders(t *testing.T) {
	const prefillOK = `{"id":"x","object":"text_completion","choices":[{"index":0,"text":"a","finish_reason":"length"}]}`
	seen := make(chan http.Header, 4)
	record := func(w http.ResponseWriter, r *http.Request) bool {
		seen <- r.Header.Clone()
		return answer(200, prefillOK)(w, r)
	}
	p, d := newPDScripted(t, record), newPDScripted(t, record)
	ph, pp := hostPort(t, p.addr)
	dh, dp := hostPort(t, d.addr)
	s := startGateway(t, "", nil)
	mustApply(t, s, fmt.Sprintf("name: pd\nmodel_name: m\nkvEngineType: vllm\npd_disagg_mode: true\nprobe: {disabled: true}\nendpoints:\n"+
		"  - {id: p1, endpointIP: %s, targetPort: %d, ep_role: 1}\n  - {id: d1, endpointIP: %s, targetPort: %d, ep_role: 2}\n", ph, pp, dh, dp))
	head := "POST /v1/completions HTTP/1.1\r\nHost: gw\r\nContent-Type: application/json\r\nConnection: keep-alive, X-Secret\r\nX-Secret: s3cret\r\n" +
		"Proxy-Authenticate: Basic\r\nProxy-Authorization: Basic eA==\r\nKeep-Alive: timeout=5\r\nUpgrade: h2c\r\nX-Kept: yes\r\nAuthorization: Bearer k\r\n"
	resp, data, err := rawRequest(t, s.Addr(), head, `{"model":"m","prompt":"x","max_tokens":2}`)
	if err != nil || resp.StatusCode != 200 {
		t.Fatalf("status %v err %v body %s", resp, err, data)
	}
	for _, leg := range []string{"prefill", "decode"} {
		var h http.Header
		select {
		case h = <-seen:
		case <-time.After(10 * time.Second):
			t.Fatalf("the %s leg never arrived", leg)
		}
		for _, name := range []string{"X-Secret", "Proxy-Authenticate", "Proxy-Authorization", "Keep-Alive", "Upgrade"} {
			if v := h.Get(name); v != "" {
				t.Errorf("a leg got %s %q; it is connection-scoped", name, v)
			}
		}
		if h.Get("X-Kept") != "yes" || h.Get("Authorization") != "Bearer k" {
			t.Errorf("a leg lost an end-to-end header: %v", h)
		}
	}
}
