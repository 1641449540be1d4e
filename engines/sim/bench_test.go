package sim

import (
	"net"
	"testing"
	"time"

	"github.com/valyala/fasthttp"

	"github.com/llmgw/llmgw/engines"
)

// BenchmarkTinyCompletions measures the throughput of one sim serving tiny
// non-streaming completions with the latency model at zero, client and
// server in the same process. Run with GOMAXPROCS=1 to measure one core:
//
//	GOMAXPROCS=1 go test ./engines/sim -run '^$' -bench TinyCompletions
func BenchmarkTinyCompletions(b *testing.B) {
	for _, k := range []engines.Kind{engines.VLLM, engines.SGLang, engines.TRTLLM, engines.LlamaCpp} {
		b.Run(string(k), func(b *testing.B) {
			s := startSim(b, Config{Engine: k, KVEvents: KVEventsOff})
			// A plain dialer: fasthttp's default one starts a process-wide
			// cache goroutine that never stops.
			c := &fasthttp.HostClient{Addr: s.Addrs().HTTP, MaxConns: 256, MaxIdleConnDuration: time.Second,
				Dial: func(addr string) (net.Conn, error) { return net.Dial("tcp", addr) }}
			b.Cleanup(c.CloseIdleConnections)
			body := []byte(`{"model":"Qwen/Qwen3-0.6B","prompt":"hi","max_tokens":1}`)
			b.SetParallelism(32)
			b.ReportAllocs()
			start := time.Now()
			b.RunParallel(func(pb *testing.PB) {
				req, resp := fasthttp.AcquireRequest(), fasthttp.AcquireResponse()
				defer fasthttp.ReleaseRequest(req)
				defer fasthttp.ReleaseResponse(resp)
				req.SetRequestURI("http://" + s.Addrs().HTTP + "/v1/completions")
				req.Header.SetMethod("POST")
				req.Header.SetContentType("application/json")
				req.SetBody(body)
				for pb.Next() {
					if err := c.Do(req, resp); err != nil {
						b.Error(err)
						return
					}
					if resp.StatusCode() != 200 {
						b.Errorf("status %d: %s", resp.StatusCode(), resp.Body())
						return
					}
				}
			})
			b.ReportMetric(float64(b.N)/time.Since(start).Seconds(), "req/s")
		})
	}
}
