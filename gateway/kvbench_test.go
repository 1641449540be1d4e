package gateway

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/valyala/fasthttp"

	"github.com/llmgw/llmgw/engines/tokenizer"
	"github.com/llmgw/llmgw/internal/testfix"
)

// BenchmarkKVExactAddedLatency measures, in one run, what KV-exact routing
// adds to a request against round robin: one gateway, one fixed-response
// worker, two rules (sel 0, and kvExactMode 3 with the real Qwen3
// tokenizer), chat requests of about 0.5k, 4k and 16k prompt tokens sent
// one at a time. Each request's user turn is new (a counter leads it), so
// the tokenization cache only helps with the template's fixed parts: the
// cost measured is rendering, tokenizing, hashing and the index lookup of
// a prompt the gateway has not seen. The worker publishes no KV events, so
// every KV-exact decision ends in a miss after the lookup (an empty index
// is the cheapest lookup; BENCHMARKS.md gives the index's cost when it
// holds blocks). kv-repeat sends the same prompt every time: the
// tokenization cache answers, and what remains is rendering, hashing and
// the lookup. Reported: p50 and p99 per request in µs.
func BenchmarkKVExactAddedLatency(b *testing.B) {
	answer := `{"id":"x","object":"chat.completion","created":1,"model":"m","choices":[{"index":0,"message":{"role":"assistant","content":"ok"},"finish_reason":"stop"}],"usage":{"prompt_tokens":1,"completion_tokens":1,"total_tokens":2}}`
	worker := benchServe(b, &fasthttp.Server{Handler: func(ctx *fasthttp.RequestCtx) {
		ctx.SetContentType("application/json")
		ctx.SetBodyString(answer)
	}, MaxRequestBodySize: 64 << 20})
	gw, err := New(Config{Listen: "127.0.0.1:0", Admin: "127.0.0.1:0", StateDir: b.TempDir(), Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		b.Fatal(err)
	}
	if err := gw.Start(context.Background()); err != nil {
		b.Fatal(err)
	}
	defer gw.Close()
	_, port, _ := net.SplitHostPort(worker)
	for _, y := range []string{
		fmt.Sprintf("name: rr\nmodel_name: m-rr\nsel: 0\nprobe: {disabled: true}\nendpoints:\n  - {endpointIP: 127.0.0.1, targetPort: %s}\n", port),
		fmt.Sprintf("name: kv\nmodel_name: m-kv\nsel: 8\nkvEngineType: vllm\nkvExactMode: 3\nkvTokenizer: %q\nprobe: {disabled: true}\nendpoints:\n  - {endpointIP: 127.0.0.1, targetPort: %s, kvEventsEndpoint: \"tcp://127.0.0.1:9\"}\n", testfix.Qwen3Dir(b), port),
	} {
		if _, err := gw.Apply(mustDecode(b, y), false); err != nil {
			b.Fatal(err)
		}
	}
	tok, err := tokenizer.Qwen3()
	if err != nil {
		b.Fatal(err)
	}
	words := strings.Fields("the gateway routes each request to the worker that holds its prefix so the engine skips the prefill of the shared part and answers sooner")
	for _, size := range []int{512, 4096, 16384} {
		// A user turn of about size tokens (the vocabulary's words are one
		// Qwen3 token each with their leading space).
		var sb strings.Builder
		for i := 0; len(tok.Encode(nil, sb.String())) < size; i++ {
			for j := 0; j < 64; j++ {
				sb.WriteString(" " + words[(i*64+j)%len(words)])
			}
		}
		text := sb.String()
		for _, variant := range []string{"rr", "kv", "kv-repeat"} {
			rule, repeat := strings.TrimSuffix(variant, "-repeat"), strings.HasSuffix(variant, "-repeat")
			b.Run(fmt.Sprintf("%dtok/%s", size, variant), func(b *testing.B) {
				c := &fasthttp.HostClient{Addr: gw.Addr(), MaxConns: 4, MaxResponseBodySize: 1 << 20}
				req, resp := fasthttp.AcquireRequest(), fasthttp.AcquireResponse()
				defer fasthttp.ReleaseRequest(req)
				defer fasthttp.ReleaseResponse(resp)
				var lat []time.Duration
				n := 0
				for b.Loop() {
					if !repeat { // kv-repeat sends one prompt again and again
						n++
					}
					body := fmt.Appendf(nil, `{"model":"m-%s","max_tokens":1,"messages":[{"role":"system","content":"You are a helpful assistant."},{"role":"user","content":"%d%s"}]}`, rule, n, text)
					benchRequest(req, gw.Addr(), body)
					t0 := time.Now()
					if err := c.Do(req, resp); err != nil || resp.StatusCode() != 200 {
						b.Fatalf("%v %d %s", err, resp.StatusCode(), resp.Body())
					}
					lat = append(lat, time.Since(t0))
					if rule == "kv" && !strings.HasPrefix(string(resp.Header.Peek("X-Llmgw-Route")), "kv-exact miss=not_ready") {
						b.Fatalf("route %q: the KV-exact path did not run to its lookup", resp.Header.Peek("X-Llmgw-Route"))
					}
				}
				slices.Sort(lat)
				b.ReportMetric(float64(lat[len(lat)/2].Microseconds()), "p50-µs")
				b.ReportMetric(float64(lat[len(lat)*99/100].Microseconds()), "p99-µs")
			})
		}
	}
}
