package gateway

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/valyala/fasthttp"

	"github.com/llmgw/llmgw/engines"
	"github.com/llmgw/llmgw/engines/sim"
	"github.com/llmgw/llmgw/engines/trtllm"
	"github.com/llmgw/llmgw/internal/wait"
)

func startSimT(t *testing.T, cfg sim.Config) *sim.Sim {
	t.Helper()
	if cfg.KVEvents == "" {
		cfg.KVEvents = sim.KVEventsOff
	}
	if cfg.Model == "" {
		cfg.Model = "m"
	}
	if cfg.PrefillPerToken == 0 {
		cfg.PrefillPerToken = time.Microsecond
	}
	s, err := sim.Start(context.Background(), cfg)
	if err != nil {
		t.Fatalf("sim.Start: %v", err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

func hostPort(t *testing.T, addr string) (string, int) {
	h, p, err := net.SplitHostPort(addr)
	if err != nil {
		t.Fatal(err)
	}
	n, _ := strconv.Atoi(p)
	return h, n
}

// pdRule builds a P/D rule over prefill and decode sims.
func pdRule(t *testing.T, name, model, engine string, prefill, decode []*sim.Sim, extra string) string {
	var sb strings.Builder
	fmt.Fprintf(&sb, "name: %s\nmodel_name: %s\nkvEngineType: %s\npd_disagg_mode: true\nprobe: {disabled: true}\n%s\nendpoints:\n", name, model, engine, extra)
	for i, s := range prefill {
		h, p := hostPort(t, s.Addrs().HTTP)
		line := fmt.Sprintf("  - {id: p%d, endpointIP: %s, targetPort: %d, ep_role: 1", i+1, h, p)
		if engines.MustFor(engines.Kind(engine)).PD().BootstrapPort() != 0 {
			_, bp := hostPort(t, s.Addrs().Bootstrap)
			line += fmt.Sprintf(", bootstrapPort: %d", bp)
		}
		sb.WriteString(line + "}\n")
	}
	for i, s := range decode {
		h, p := hostPort(t, s.Addrs().HTTP)
		fmt.Fprintf(&sb, "  - {id: d%d, endpointIP: %s, targetPort: %d, ep_role: 2}\n", i+1, h, p)
	}
	return sb.String()
}

func TestPDHandOffPerEngine(t *testing.T) {
	for _, engine := range []engines.Kind{engines.VLLM, engines.SGLang, engines.TRTLLM} {
		for _, stream := range []bool{false, true} {
			name := fmt.Sprintf("%s stream=%v", engine, stream)
			t.Run(name, func(t *testing.T) {
				p := startSimT(t, sim.Config{Engine: engine, Role: sim.RolePrefill})
				d := startSimT(t, sim.Config{Engine: engine, Role: sim.RoleDecode})
				s := startGateway(t, "", nil)
				mustApply(t, s, pdRule(t, "pd", "m", string(engine), []*sim.Sim{p}, []*sim.Sim{d}, ""))
				c := newClient(t)
				body := fmt.Sprintf(`{"model":"m","stream":%v,"max_tokens":8,"messages":[{"role":"user","content":"%s"}]}`, stream, strings.Repeat("tell me about disaggregation ", 8))
				resp, out := post(t, c, "http://"+s.Addr()+"/v1/chat/completions", body, "X-Request-Id", "pd-req-1")
				if resp.StatusCode != 200 {
					t.Fatalf("status %d: %s", resp.StatusCode, out)
				}
				if stream != strings.HasPrefix(out, "data: ") {
					t.Errorf("stream=%v but body starts %q", stream, out[:min(len(out), 40)])
				}
				if stream && !strings.HasSuffix(out, "data: [DONE]\n\n") {
					t.Errorf("stream does not end with [DONE]: %q", out[max(0, len(out)-60):])
				}
				if resp.Header.Get("X-Llmgw-Endpoint") != "d1" {
					t.Errorf("answer from %q; want the decode d1", resp.Header.Get("X-Llmgw-Endpoint"))
				}
				pr, dr := p.Receipts(), d.Receipts()
				if len(pr) != 1 || len(dr) != 1 {
					t.Fatalf("receipts: prefill %d, decode %d; want 1 each", len(pr), len(dr))
				}
				if pr[0].RequestID != "pd-req-1" || dr[0].RequestID != "pd-req-1" {
					t.Errorf("request ids: prefill %q decode %q; want both pd-req-1", pr[0].RequestID, dr[0].RequestID)
				}
				proto := engines.MustFor(engine).PD()
				if pr[0].Stream && proto.Shape() != engines.PDConcurrent {
					// The concurrent shape's legs carry the same body; the
					// others' prefill legs are always non-streaming.
					t.Errorf("the prefill leg streamed")
				}
				if dr[0].RemotePrefillTokens == 0 {
					t.Errorf("decode did not receive the prefill's KV")
				}
				if proto.Shape() == engines.PDConcurrent {
					if pr[0].Bootstrap == nil || dr[0].Bootstrap == nil || *pr[0].Bootstrap != *dr[0].Bootstrap {
						t.Errorf("bootstrap triples differ: %+v vs %+v", pr[0].Bootstrap, dr[0].Bootstrap)
					}
				} else {
					pl, perr := proto.ParseHandOff(pr[0].HandOff)
					dl, derr := proto.ParseHandOff(dr[0].HandOff)
					if perr != nil || derr != nil || pl.Role != engines.PDLegPrefill || dl.Role != engines.PDLegDecode {
						t.Errorf("hand-off roles: prefill %v (%v) from %s, decode %v (%v) from %s", pl.Role, perr, pr[0].HandOff, dl.Role, derr, dr[0].HandOff)
					}
					var in, want map[string]any
					json.Unmarshal(dr[0].HandOff, &in)
					json.Unmarshal(proto.CarryParams(pr[0].HandOffOut), &want)
					if len(want) == 0 || fmt.Sprint(in) != fmt.Sprint(want) {
						t.Errorf("decode hand-off %v; want the prefill's answered one carried: %v", in, want)
					}
				}
				if engine == engines.VLLM && pr[0].MaxTokens != 1 {
					t.Errorf("prefill max_tokens = %d; want 1", pr[0].MaxTokens)
				}
			})
		}
	}
}

func TestPDVLLMAddsMaxTokensWhenAbsent(t *testing.T) {
	p := startSimT(t, sim.Config{Engine: engines.VLLM, Role: sim.RolePrefill})
	d := startSimT(t, sim.Config{Engine: engines.VLLM, Role: sim.RoleDecode})
	s := startGateway(t, "", nil)
	mustApply(t, s, pdRule(t, "pd", "m", "vllm", []*sim.Sim{p}, []*sim.Sim{d}, ""))
	c := newClient(t)
	resp, out := post(t, c, "http://"+s.Addr()+"/v1/completions", `{"model":"m","prompt":"`+strings.Repeat("x ", 100)+`","stream":true,"stream_options":{"include_usage":true}}`)
	if resp.StatusCode != 200 {
		t.Fatalf("%d %s", resp.StatusCode, out)
	}
	if r := p.Receipts(); len(r) != 1 || r[0].MaxTokens != 1 || r[0].Stream {
		t.Errorf("prefill receipt %+v; want max_tokens 1 and no stream", r)
	}
}

func TestPDLegFailures(t *testing.T) {
	type tc struct {
		name       string
		engine     engines.Kind
		setup      func(t *testing.T, p, d *sim.Sim) (prefillAddr, decodeAddr string)
		wantStatus int
		wantCode   string
	}
	faults := func(t *testing.T, s *sim.Sim, patch string) {
		c := newClient(t)
		resp, body := post(t, c, "http://"+s.Addrs().HTTP+"/_sim/faults", patch)
		if resp.StatusCode != 200 {
			t.Fatalf("faults: %d %s", resp.StatusCode, body)
		}
	}
	dead := func(t *testing.T) string { return fmt.Sprintf("127.0.0.1:%d", deadPort(t)) }
	cases := []tc{
		{"vllm prefill 5xx recomputes", engines.VLLM, func(t *testing.T, p, d *sim.Sim) (string, string) {
			faults(t, p, `{"error_rate":1}`)
			return p.Addrs().HTTP, d.Addrs().HTTP
		}, 200, ""},
		{"vllm prefill unreachable", engines.VLLM, func(t *testing.T, p, d *sim.Sim) (string, string) { return dead(t), d.Addrs().HTTP }, 502, "pd_prefill_failed"},
		{"vllm decode unreachable", engines.VLLM, func(t *testing.T, p, d *sim.Sim) (string, string) { return p.Addrs().HTTP, dead(t) }, 502, "pd_decode_backend_died"},
		{"sglang prefill 5xx", engines.SGLang, func(t *testing.T, p, d *sim.Sim) (string, string) {
			faults(t, p, `{"error_rate":1}`)
			return p.Addrs().HTTP, d.Addrs().HTTP
		}, 502, "pd_prefill_failed"},
		{"sglang prefill unreachable", engines.SGLang, func(t *testing.T, p, d *sim.Sim) (string, string) { return dead(t), d.Addrs().HTTP }, 502, "pd_prefill_failed"},
		{"sglang decode unreachable", engines.SGLang, func(t *testing.T, p, d *sim.Sim) (string, string) { return p.Addrs().HTTP, dead(t) }, 502, ""},
		{"trtllm context 5xx recomputes", engines.TRTLLM, func(t *testing.T, p, d *sim.Sim) (string, string) {
			faults(t, p, `{"error_rate":1}`)
			return p.Addrs().HTTP, d.Addrs().HTTP
		}, 200, ""},
		{"trtllm generation unreachable", engines.TRTLLM, func(t *testing.T, p, d *sim.Sim) (string, string) { return p.Addrs().HTTP, dead(t) }, 502, "pd_decode_backend_died"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			p := startSimT(t, sim.Config{Engine: tc.engine, Role: sim.RolePrefill, RendezvousTimeout: 2 * time.Second})
			d := startSimT(t, sim.Config{Engine: tc.engine, Role: sim.RoleDecode, RendezvousTimeout: 2 * time.Second})
			pa, da := tc.setup(t, p, d)
			ph, pp := hostPort(t, pa)
			dh, dp := hostPort(t, da)
			boot := ""
			if engines.MustFor(tc.engine).PD().BootstrapPort() != 0 {
				_, bp := hostPort(t, p.Addrs().Bootstrap)
				boot = fmt.Sprintf(", bootstrapPort: %d", bp)
			}
			y := fmt.Sprintf("name: pd\nmodel_name: m\nkvEngineType: %s\npd_disagg_mode: true\nprobe: {disabled: true}\ntimeouts: {prefill: 5s, first_byte: 5s}\nendpoints:\n  - {id: p1, endpointIP: %s, targetPort: %d, ep_role: 1%s}\n  - {id: d1, endpointIP: %s, targetPort: %d, ep_role: 2}\n", tc.engine, ph, pp, boot, dh, dp)
			s := startGateway(t, "", nil)
			mustApply(t, s, y)
			// A failing leg must not hang the request: the client gives
			// up after 10 s, twice the rule's timeouts.
			c := newClient(t)
			c.Timeout = 10 * time.Second
			resp, out := post(t, c, "http://"+s.Addr()+"/v1/chat/completions", `{"model":"m","max_tokens":4,"messages":[{"role":"user","content":"hello there"}]}`)
			if resp.StatusCode != tc.wantStatus {
				t.Fatalf("status %d (%s); want %d", resp.StatusCode, out, tc.wantStatus)
			}
			if tc.wantCode != "" {
				var e apiError
				if json.Unmarshal([]byte(out), &e); e.Error.Code != tc.wantCode {
					t.Errorf("code %q (%s); want %q", e.Error.Code, out, tc.wantCode)
				}
			}
			rt := s.rules["pd"]
			wait.For(t, 5*time.Second, "legs to be released", func() bool { return rt.inFlight() == 0 })
		})
	}
}

func TestPDBreakerOpensOnBadPrefillTrafficContinues(t *testing.T) {
	bad := startSimT(t, sim.Config{Engine: engines.VLLM, Role: sim.RolePrefill})
	good := startSimT(t, sim.Config{Engine: engines.VLLM, Role: sim.RolePrefill})
	d1 := startSimT(t, sim.Config{Engine: engines.VLLM, Role: sim.RoleDecode})
	d2 := startSimT(t, sim.Config{Engine: engines.VLLM, Role: sim.RoleDecode})
	c := newClient(t)
	if resp, b := post(t, c, "http://"+bad.Addrs().HTTP+"/_sim/faults", `{"error_rate":1}`); resp.StatusCode != 200 {
		t.Fatal(b)
	}
	s := startGateway(t, "", nil)
	mustApply(t, s, pdRule(t, "pd", "m", "vllm", []*sim.Sim{bad, good}, []*sim.Sim{d1, d2}, "cb: {open_for: 1h}"))
	for i := 0; i < 12; i++ {
		resp, out := post(t, c, "http://"+s.Addr()+"/v1/completions", fmt.Sprintf(`{"model":"m","prompt":"request %d","max_tokens":2}`, i))
		if resp.StatusCode != 200 {
			t.Fatalf("request %d: %d %s", i, resp.StatusCode, out)
		}
	}
	st, _ := s.Rule("pd")
	if st.Status.Endpoints[0].Breaker != "open" {
		t.Errorf("bad prefill breaker %q; want open", st.Status.Endpoints[0].Breaker)
	}
	badN, goodN := len(bad.Receipts()), len(good.Receipts())
	if badN != 3 || goodN != 9 {
		t.Errorf("prefill receipts bad=%d good=%d; want 3 (then demoted) and 9", badN, goodN)
	}
	// Both decodes served (least in-flight with rotation).
	if len(d1.Receipts()) == 0 || len(d2.Receipts()) == 0 {
		t.Errorf("decode spread %d/%d; want both used", len(d1.Receipts()), len(d2.Receipts()))
	}
	if !st.Status.Ready {
		t.Errorf("rule not ready with one good prefill and two decodes")
	}
}

func TestPDTRTEarlyExit(t *testing.T) {
	// A context server whose single token ended the answer (EOS): the
	// gateway relays it and never calls the generation server.
	ctxSrv := newBackend(t, "ctx", func(ctx *fasthttp.RequestCtx) {
		ctx.SetContentType("application/json")
		ctx.SetBodyString(fmt.Sprintf(`{"id":"chatcmpl-1","object":"chat.completion","choices":[{"index":0,"message":{"role":"assistant","content":"Hi"},"finish_reason":"stop",%q:%s}]}`,
			trtllm.Field, trtllm.AnswerParams(trtllm.ContextAnswer{FirstGenTokens: []uint32{9}, CtxRequestID: 1, Opaque: []byte("{}")})))
	})
	d := startSimT(t, sim.Config{Engine: engines.TRTLLM, Role: sim.RoleDecode})
	s := startGateway(t, "", nil)
	dh, dp := hostPort(t, d.Addrs().HTTP)
	mustApply(t, s, fmt.Sprintf("name: pd\nmodel_name: m\nkvEngineType: trtllm\npd_disagg_mode: true\nprobe: {disabled: true}\nendpoints:\n  - {id: c1, endpointIP: 127.0.0.1, targetPort: %d, ep_role: 1}\n  - {id: g1, endpointIP: %s, targetPort: %d, ep_role: 2}\n", ctxSrv.port(), dh, dp))
	c := newClient(t)
	for _, stream := range []bool{true, false} {
		resp, out := post(t, c, "http://"+s.Addr()+"/v1/chat/completions", fmt.Sprintf(`{"model":"m","stream":%v,"messages":[{"role":"user","content":"hi"}]}`, stream))
		if resp.StatusCode != 200 || !strings.Contains(resp.Header.Get("X-Llmgw-Route"), "early-exit") {
			t.Fatalf("stream=%v: %d route %q %s", stream, resp.StatusCode, resp.Header.Get("X-Llmgw-Route"), out)
		}
		if strings.Contains(out, trtllm.Field) {
			t.Errorf("early exit leaked the hand-off: %s", out)
		}
		if stream && (!strings.HasPrefix(out, "data: {") || !strings.HasSuffix(out, "\n\ndata: [DONE]\n\n") || strings.Count(out, "data: ") != 2) {
			t.Errorf("early exit SSE = %q; want one event then [DONE]", out)
		}
		if !stream && !strings.HasPrefix(out, `{"id":"chatcmpl-1"`) {
			t.Errorf("early exit JSON = %q", out)
		}
	}
	if n := len(d.Receipts()); n != 0 {
		t.Errorf("generation server got %d requests after early exits; want 0", n)
	}
}

func TestPDTimeoutsAndLifecycle(t *testing.T) {
	faults := func(t *testing.T, s *sim.Sim, patch string) {
		c := newClient(t)
		if resp, body := post(t, c, "http://"+s.Addrs().HTTP+"/_sim/faults", patch); resp.StatusCode != 200 {
			t.Fatalf("faults: %d %s", resp.StatusCode, body)
		}
	}
	body := `{"model":"m","max_tokens":6,"stream":true,"messages":[{"role":"user","content":"hello"}]}`

	t.Run("prefill timeout is 504 pd_prefill_timeout", func(t *testing.T) {
		p := startSimT(t, sim.Config{Engine: engines.VLLM, Role: sim.RolePrefill})
		d := startSimT(t, sim.Config{Engine: engines.VLLM, Role: sim.RoleDecode})
		faults(t, p, `{"added_latency_ms":3000}`)
		s := startGateway(t, "", nil)
		mustApply(t, s, pdRule(t, "pd", "m", "vllm", []*sim.Sim{p}, []*sim.Sim{d}, "timeouts: {prefill: 200ms}"))
		resp, out := post(t, newClient(t), "http://"+s.Addr()+"/v1/chat/completions", body)
		if resp.StatusCode != 504 || !strings.Contains(out, `"pd_prefill_timeout"`) {
			t.Errorf("%d %s; want 504 pd_prefill_timeout", resp.StatusCode, out)
		}
		if len(d.Receipts()) != 0 {
			t.Errorf("the decode leg ran after a prefill timeout")
		}
	})
	t.Run("decode first byte timeout is 504 pd_decode_timeout", func(t *testing.T) {
		p := startSimT(t, sim.Config{Engine: engines.VLLM, Role: sim.RolePrefill})
		d := startSimT(t, sim.Config{Engine: engines.VLLM, Role: sim.RoleDecode})
		faults(t, d, `{"added_latency_ms":3000}`)
		s := startGateway(t, "", nil)
		mustApply(t, s, pdRule(t, "pd", "m", "vllm", []*sim.Sim{p}, []*sim.Sim{d}, "timeouts: {first_byte: 200ms}"))
		resp, out := post(t, newClient(t), "http://"+s.Addr()+"/v1/chat/completions", body)
		if resp.StatusCode != 504 || !strings.Contains(out, `"pd_decode_timeout"`) {
			t.Errorf("%d %s; want 504 pd_decode_timeout", resp.StatusCode, out)
		}
	})
	t.Run("decode stall mid-stream ends with pd_decode_stream_timeout", func(t *testing.T) {
		p := startSimT(t, sim.Config{Engine: engines.VLLM, Role: sim.RolePrefill})
		d := startSimT(t, sim.Config{Engine: engines.VLLM, Role: sim.RoleDecode, DecodePerToken: 400 * time.Millisecond})
		s := startGateway(t, "", nil)
		mustApply(t, s, pdRule(t, "pd", "m", "vllm", []*sim.Sim{p}, []*sim.Sim{d}, "timeouts: {idle: 100ms}"))
		resp, out := post(t, newClient(t), "http://"+s.Addr()+"/v1/chat/completions", body)
		if resp.StatusCode != 200 || !strings.Contains(out, `"pd_decode_stream_timeout"`) || !strings.HasSuffix(out, "data: [DONE]\n\n") {
			t.Errorf("%d %q; want a stream ending in a pd_decode_stream_timeout error event and [DONE]", resp.StatusCode, out)
		}
	})
	t.Run("pools spread, drain and readiness", func(t *testing.T) {
		p1 := startSimT(t, sim.Config{Engine: engines.VLLM, Role: sim.RolePrefill})
		p2 := startSimT(t, sim.Config{Engine: engines.VLLM, Role: sim.RolePrefill})
		d1 := startSimT(t, sim.Config{Engine: engines.VLLM, Role: sim.RoleDecode})
		d2 := startSimT(t, sim.Config{Engine: engines.VLLM, Role: sim.RoleDecode})
		s := startGateway(t, "", nil)
		mustApply(t, s, pdRule(t, "pd", "m", "vllm", []*sim.Sim{p1, p2}, []*sim.Sim{d1, d2}, ""))
		c := newClient(t)
		url := "http://" + s.Addr() + "/v1/completions"
		for i := 0; i < 8; i++ {
			if resp, out := post(t, c, url, `{"model":"m","prompt":"x","max_tokens":2}`); resp.StatusCode != 200 {
				t.Fatalf("%d %s", resp.StatusCode, out)
			}
		}
		for name, n := range map[string]int{"p1": len(p1.Receipts()), "p2": len(p2.Receipts()), "d1": len(d1.Receipts()), "d2": len(d2.Receipts())} {
			if n != 4 {
				t.Errorf("%s served %d of 8; want an even 4 (least in-flight with rotation)", name, n)
			}
		}
		// Draining a prefill: new requests use the other one.
		if err := s.SetDraining("pd", "p1", true); err != nil {
			t.Fatal(err)
		}
		before := len(p1.Receipts())
		for i := 0; i < 4; i++ {
			post(t, c, url, `{"model":"m","prompt":"x","max_tokens":2}`)
		}
		if len(p1.Receipts()) != before {
			t.Errorf("a drained prefill got new requests")
		}
		// No decode available: not ready, and 503 pd_pool_unavailable.
		s.SetDraining("pd", "d1", true)
		s.SetDraining("pd", "d2", true)
		if st, _ := s.Rule("pd"); st.Status.Ready {
			t.Errorf("rule ready with no decode available")
		}
		resp, out := post(t, c, url, `{"model":"m","prompt":"x","max_tokens":2}`)
		if resp.StatusCode != 503 || !strings.Contains(out, "pd_pool_unavailable") {
			t.Errorf("%d %s; want 503 pd_pool_unavailable", resp.StatusCode, out)
		}
	})
	t.Run("a body too large to rewrite is refused before any leg", func(t *testing.T) {
		p := startSimT(t, sim.Config{Engine: engines.VLLM, Role: sim.RolePrefill})
		d := startSimT(t, sim.Config{Engine: engines.VLLM, Role: sim.RoleDecode})
		s := startGateway(t, "", nil)
		mustApply(t, s, pdRule(t, "pd", "m", "vllm", []*sim.Sim{p}, []*sim.Sim{d}, ""))
		big := `{"model":"m","prompt":"` + strings.Repeat("z", pdMaxRewriteBytes) + `"}`
		resp, out := post(t, newClient(t), "http://"+s.Addr()+"/v1/completions", big)
		if resp.StatusCode != 413 || !strings.Contains(out, "pd_body_too_large") {
			t.Errorf("%d %.200s; want 413 pd_body_too_large", resp.StatusCode, out)
		}
		if len(p.Receipts())+len(d.Receipts()) != 0 {
			t.Errorf("a leg was sent")
		}
	})
}

func TestPDSGLangPrefillRejectionAndRetry(t *testing.T) {
	t.Run("prefill 4xx is relayed verbatim and the decode aborted", func(t *testing.T) {
		rejecting := newBackend(t, "prefill", func(ctx *fasthttp.RequestCtx) {
			ctx.SetStatusCode(400)
			ctx.SetContentType("application/json")
			ctx.SetBodyString(`{"object":"error","message":"prompt too long for prefill","type":"BadRequestError","param":null,"code":400}`)
		})
		// The decode waits for a rendezvous that never comes, as an
		// engine's decode does, until the gateway gives it up.
		d := newPDScripted(t, pendingUntilCancelled)
		dh, dp := hostPort(t, d.addr)
		s := startGateway(t, "", nil)
		mustApply(t, s, fmt.Sprintf("name: pd\nmodel_name: m\nkvEngineType: sglang\npd_disagg_mode: true\nprobe: {disabled: true}\nendpoints:\n  - {id: p1, endpointIP: 127.0.0.1, targetPort: %d, ep_role: 1}\n  - {id: d1, endpointIP: %s, targetPort: %d, ep_role: 2}\n", rejecting.port(), dh, dp))
		resp, out := post(t, newClient(t), "http://"+s.Addr()+"/v1/chat/completions", `{"model":"m","messages":[{"role":"user","content":"x"}]}`)
		if resp.StatusCode != 400 || !strings.Contains(out, "prompt too long for prefill") {
			t.Errorf("%d %s; want the prefill's 400 verbatim", resp.StatusCode, out)
		}
		// The decode leg is aborted: both legs are released, and a
		// decode that was already sent has its connection closed by the
		// gateway (waitEvent's deadline only detects a decode left
		// waiting). The prefill's 400 may come back before the decode leg
		// is written at all; then there is nothing to close.
		wait.For(t, 5*time.Second, "legs released", func() bool { return s.rules["pd"].inFlight() == 0 })
		select {
		case <-d.arrived:
			waitEvent(t, d.cancelled, "decode leg cancelled")
		default:
		}
	})
	t.Run("a dead prefill is retried once with a fresh pair and room", func(t *testing.T) {
		good := startSimT(t, sim.Config{Engine: engines.SGLang, Role: sim.RolePrefill})
		d := startSimT(t, sim.Config{Engine: engines.SGLang, Role: sim.RoleDecode})
		gh, gp := hostPort(t, good.Addrs().HTTP)
		_, gbp := hostPort(t, good.Addrs().Bootstrap)
		dh, dp := hostPort(t, d.Addrs().HTTP)
		s := startGateway(t, "", nil)
		// The dead prefill is first: least in-flight with rotation starts
		// at position 0.
		mustApply(t, s, fmt.Sprintf("name: pd\nmodel_name: m\nkvEngineType: sglang\npd_disagg_mode: true\nprobe: {disabled: true}\nendpoints:\n  - {id: dead, endpointIP: 127.0.0.1, targetPort: %d, ep_role: 1}\n  - {id: p1, endpointIP: %s, targetPort: %d, ep_role: 1, bootstrapPort: %d}\n  - {id: d1, endpointIP: %s, targetPort: %d, ep_role: 2}\n", deadPort(t), gh, gp, gbp, dh, dp))
		resp, out := post(t, newClient(t), "http://"+s.Addr()+"/v1/chat/completions", `{"model":"m","max_tokens":3,"messages":[{"role":"user","content":"x"}]}`)
		if resp.StatusCode != 200 || !strings.Contains(resp.Header.Get("X-Llmgw-Route"), "prefill=p1") {
			t.Fatalf("%d route %q %s; want 200 through p1 after one retry", resp.StatusCode, resp.Header.Get("X-Llmgw-Route"), out)
		}
		// The first attempt's decode leg may have reached the decode
		// worker before it was aborted; the one that served must carry the
		// surviving prefill's room.
		pr, dr := good.Receipts(), d.Receipts()
		served := 0
		for _, r := range dr {
			if r.Status == 200 && r.Bootstrap != nil && len(pr) == 1 && *r.Bootstrap == *pr[0].Bootstrap {
				served++
			}
		}
		if len(pr) != 1 || served != 1 {
			t.Errorf("retry pair receipts: prefill %d, decodes %+v; want one decode served in the prefill's room", len(pr), dr)
		}
		if got := s.metricValue(t, "llmgw_retries_total", "pd"); got != 1 {
			t.Errorf("retries = %v; want 1", got)
		}
	})
}

// TestPDVLLMNixlPortKeepsTheNixlHandOff: nixl_port means what it means in
// the reference gateway, the NIXL side-channel port named in the legs'
// X-Request-Id; the pair keeps the NIXL hand-off (the prefill is asked for
// do_remote_decode and its kv_transfer_params reach the decode, which pulls
// the KV). It used to switch the pair to P2P-NCCL silently: no hand-off,
// and the decode recomputed. p2p_nccl_port is that connector's field.
func TestPDVLLMNixlPortKeepsTheNixlHandOff(t *testing.T) {
	cases := []struct {
		name, field string
		wantNixl    bool // the NIXL hand-off is carried
	}{
		{"nixl_port", "nixl_port", true},
		{"p2p_nccl_port", "p2p_nccl_port", false},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			p := startSimT(t, sim.Config{Engine: engines.VLLM, Role: sim.RolePrefill})
			d := startSimT(t, sim.Config{Engine: engines.VLLM, Role: sim.RoleDecode})
			ph, pp := hostPort(t, p.Addrs().HTTP)
			dh, dp := hostPort(t, d.Addrs().HTTP)
			s := startGateway(t, "", nil)
			mustApply(t, s, fmt.Sprintf("name: pd\nmodel_name: m\nkvEngineType: vllm\npd_disagg_mode: true\nprobe: {disabled: true}\nendpoints:\n"+
				"  - {id: p1, endpointIP: %s, targetPort: %d, ep_role: 1, %s: 9001}\n  - {id: d1, endpointIP: %s, targetPort: %d, ep_role: 2, %s: 9002}\n", ph, pp, tc.field, dh, dp, tc.field))
			body := fmt.Sprintf(`{"model":"m","max_tokens":4,"messages":[{"role":"user","content":"%s"}]}`, strings.Repeat("tell me about disaggregation ", 8))
			resp, out := post(t, newClient(t), "http://"+s.Addr()+"/v1/chat/completions", body, "X-Request-Id", "client-1")
			if resp.StatusCode != 200 {
				t.Fatalf("status %d: %s", resp.StatusCode, out)
			}
			pr, dr := p.Receipts(), d.Receipts()
			if len(pr) != 1 || len(dr) != 1 {
				t.Fatalf("receipts: prefill %d, decode %d; want 1 each", len(pr), len(dr))
			}
			// Both legs name the pair's ports, as the reference gateway does.
			m := p2pID.FindStringSubmatch(pr[0].RequestID)
			if m == nil || m[1] != "9001" || m[2] != "9002" || dr[0].RequestID != pr[0].RequestID {
				t.Errorf("leg ids %q, %q; want one id naming ports 9001 and 9002", pr[0].RequestID, dr[0].RequestID)
			}
			proto := engines.MustFor(engines.VLLM).PD()
			pl, _ := proto.ParseHandOff(pr[0].HandOff)
			route := resp.Header.Get("X-Llmgw-Route")
			if !tc.wantNixl {
				if pl.Role != engines.PDLegNone || len(dr[0].HandOff) != 0 {
					t.Errorf("P2P-NCCL legs carry hand-off fields: prefill %s, decode %s", pr[0].HandOff, dr[0].HandOff)
				}
				if !strings.HasSuffix(route, " kv-out-of-band") || s.metricValue(t, "llmgw_pd_handoff_params_total", "pd", "out_of_band") != 1 {
					t.Errorf("route %q: the out-of-band hand-off is not said (route, llmgw_pd_handoff_params_total)", route)
				}
				return
			}
			if pl.Role != engines.PDLegPrefill {
				t.Errorf("prefill hand-off %s: not asked for do_remote_decode", pr[0].HandOff)
			}
			if dl, err := proto.ParseHandOff(dr[0].HandOff); err != nil || dl.Role != engines.PDLegDecode || dr[0].RemotePrefillTokens == 0 {
				t.Errorf("decode hand-off %s (%v), %d remote tokens: the decode did not pull the prefill's KV", dr[0].HandOff, err, dr[0].RemotePrefillTokens)
			}
			if strings.Contains(route, "recompute") {
				t.Errorf("route %q: the decode recomputed", route)
			}
		})
	}
}
