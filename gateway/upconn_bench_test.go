package gateway

import (
	"log/slog"
	"testing"

	"github.com/valyala/fasthttp"
)

// BenchmarkUpstreamConnection is the cost of each way a request gets its
// upstream connection, through the whole gateway: a live pooled connection
// (vLLM policy; the reuse check included), a pooled connection the worker
// closed while idle (found dead before the write, redialed on the same
// endpoint), and a kept connection under the llama.cpp policy (at most
// keptConns per endpoint, TCP_QUICKACK before each answer is read). The
// worker closes its idle connections between timed requests in "redial".
func BenchmarkUpstreamConnection(b *testing.B) {
	for _, tc := range []struct {
		name, engine string
		expire       bool
	}{
		{name: "pooled", engine: "vllm"},
		{name: "redial", engine: "vllm", expire: true},
		{name: "kept-quickack", engine: "llamacpp"},
	} {
		b.Run(tc.name, func(b *testing.B) {
			up := newScripted(b, uvicornLike)
			s, err := New(Config{Listen: "127.0.0.1:0", Admin: "127.0.0.1:0", StateDir: b.TempDir(), Logger: slog.New(slog.DiscardHandler)})
			if err != nil {
				b.Fatal(err)
			}
			if err := s.Start(b.Context()); err != nil {
				b.Fatal(err)
			}
			defer s.Close()
			if _, err := s.Apply(mustDecode(b, scriptedRule("r", "m1", "kvEngineType: "+tc.engine, up)), false); err != nil {
				b.Fatal(err)
			}
			c := &fasthttp.HostClient{Addr: s.Addr()}
			defer c.CloseIdleConnections()
			req, resp := fasthttp.AcquireRequest(), fasthttp.AcquireResponse()
			defer fasthttp.ReleaseRequest(req)
			defer fasthttp.ReleaseResponse(resp)
			req.SetRequestURI("http://" + s.Addr() + "/v1/chat/completions")
			req.Header.SetMethod(fasthttp.MethodPost)
			req.SetBodyString(chatBody)
			do := func() {
				if err := c.Do(req, resp); err != nil || resp.StatusCode() != 200 {
					b.Fatalf("request: %v status %d", err, resp.StatusCode())
				}
			}
			do() // the first connection
			b.ResetTimer()
			for range b.N {
				if tc.expire {
					b.StopTimer()
					up.expireIdle()
					b.StartTimer()
				}
				do()
			}
			b.StopTimer()
			if r := s.metricValue(b, "llmgw_upstream_redials_total", "r"); tc.expire && r < float64(b.N) {
				b.Fatalf("%v redials for %d requests on expired connections", r, b.N)
			}
		})
	}
}
