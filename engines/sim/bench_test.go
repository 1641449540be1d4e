package sim

import (
	"fmt"
	"net"
	"strings"
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

// BenchmarkTTFTCacheHit shows the latency model's point: with a prefill cost
// per uncached token, a prompt whose prefix is cached reaches its first
// token sooner. "cold" sends a new prompt each time, "warm" repeats one.
func BenchmarkTTFTCacheHit(b *testing.B) {
	s := startSim(b, Config{Engine: engines.VLLM, KVEvents: KVEventsOff, PrefillPerToken: 20 * time.Microsecond})
	c := &fasthttp.HostClient{Addr: s.Addrs().HTTP, MaxIdleConnDuration: 100 * time.Millisecond, Dial: func(addr string) (net.Conn, error) { return net.Dial("tcp", addr) }}
	b.Cleanup(c.CloseIdleConnections)
	long := strings.Repeat("shared system prompt with many tokens ", 40)
	for _, tc := range []struct {
		name   string
		prompt func(i int) string
	}{
		{"cold", func(i int) string { return fmt.Sprintf("%d %s", i, long) }},
		{"warm", func(int) string { return long }},
	} {
		b.Run(tc.name, func(b *testing.B) {
			var ttft time.Duration
			for i := 0; i < b.N; i++ {
				body := fmt.Sprintf(`{"prompt":%q,"max_tokens":1}`, tc.prompt(i))
				req, resp := fasthttp.AcquireRequest(), fasthttp.AcquireResponse()
				req.SetRequestURI("http://" + s.Addrs().HTTP + "/v1/completions")
				req.Header.SetMethod("POST")
				req.SetBodyString(body)
				t0 := time.Now()
				err := c.Do(req, resp)
				ttft += time.Since(t0)
				if err != nil || resp.StatusCode() != 200 {
					b.Fatalf("request: %v %d", err, resp.StatusCode())
				}
				fasthttp.ReleaseRequest(req)
				fasthttp.ReleaseResponse(resp)
			}
			b.ReportMetric(float64(ttft.Microseconds())/float64(b.N), "ttft-us")
		})
	}
}
