package overhead

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/valyala/fasthttp"

	"github.com/llmgw/llmgw/bench/loadgen"
)

// requestBody is the chat completion every request sends: one user message
// of PromptBytes bytes.
func requestBody(cfg Config) []byte {
	type msg struct {
		Role    string `json:"role"`
		Content string `json:"content"`
	}
	body := struct {
		Model     string `json:"model"`
		Messages  []msg  `json:"messages"`
		MaxTokens int    `json:"max_tokens"`
		Stream    bool   `json:"stream,omitempty"`
	}{Model: cfg.Model, MaxTokens: cfg.MaxTokens, Stream: cfg.Stream,
		Messages: []msg{{Role: "user", Content: strings.Repeat("y", cfg.PromptBytes)}}}
	b, _ := json.Marshal(body) // cannot fail: plain strings and ints
	return b
}

// probeTimeout bounds the single request sent to each target before load.
const probeTimeout = 5 * time.Second

// probe sends one request to addr and checks it succeeds (and, streaming,
// that the stream parses to its end).
func probe(ctx context.Context, addr string, body []byte, stream bool) error {
	c := newClient(addr, 1, stream)
	defer c.CloseIdleConnections()
	pctx, cancel := context.WithTimeout(ctx, probeTimeout)
	defer cancel()
	done := make(chan error, 1)
	go func() {
		_, _, _, err := do(c, addr, body, stream, time.Now(), nil)
		done <- err
	}()
	select {
	case err := <-done:
		return err
	case <-pctx.Done():
		// The client's own timeout (below probeTimeout) ends do soon.
		<-done
		return fmt.Errorf("no answer within %v: %w", probeTimeout, pctx.Err())
	}
}

func newClient(addr string, conns int, stream bool) *fasthttp.HostClient {
	return &fasthttp.HostClient{
		Addr: addr, MaxConns: conns, StreamResponseBody: stream,
		ReadTimeout: probeTimeout - 100*time.Millisecond, WriteTimeout: probeTimeout - 100*time.Millisecond,
		MaxIdleConnDuration: time.Second,
	}
}

// do sends one request. It returns the latency from sent (to the last
// byte), the body size, the number of SSE data events, and an error for a
// transport failure, a non-200 status or a malformed stream. In streaming
// mode each event's arrival (from sent) is appended through chunk.
func do(c *fasthttp.HostClient, addr string, body []byte, stream bool, sent time.Time, chunk func(time.Duration)) (time.Duration, int, int, error) {
	req, resp := fasthttp.AcquireRequest(), fasthttp.AcquireResponse()
	defer fasthttp.ReleaseRequest(req)
	defer fasthttp.ReleaseResponse(resp)
	req.SetRequestURI("http://" + addr + "/v1/chat/completions")
	req.Header.SetMethod(fasthttp.MethodPost)
	req.Header.SetContentType("application/json")
	req.SetBodyRaw(body)
	if err := c.Do(req, resp); err != nil {
		return 0, 0, 0, fmt.Errorf("overhead: send: %w", err)
	}
	if !stream {
		if resp.StatusCode() != fasthttp.StatusOK {
			return 0, 0, 0, fmt.Errorf("overhead: status %d: %.200s", resp.StatusCode(), resp.Body())
		}
		return time.Since(sent), len(resp.Body()), 0, nil
	}
	defer resp.CloseBodyStream()
	if resp.StatusCode() != fasthttp.StatusOK {
		b, _ := io.ReadAll(io.LimitReader(resp.BodyStream(), 200))
		return 0, 0, 0, fmt.Errorf("overhead: status %d: %s", resp.StatusCode(), b)
	}
	r := loadgen.NewSSEReader(resp.BodyStream())
	n, size, done := 0, 0, false
	for {
		data, err := r.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return 0, 0, 0, err
		}
		if chunk != nil {
			chunk(time.Since(sent))
		}
		n++
		size += len(data)
		c, err := loadgen.ParseChunk(data)
		if err != nil {
			return 0, 0, 0, err
		}
		done = done || c.Done
	}
	if !done {
		return 0, 0, 0, fmt.Errorf("%w: stream ended without [DONE]", loadgen.ErrStream)
	}
	return time.Since(sent), size, n, nil
}

// workerStats is one load worker's private record, merged after the run.
type workerStats struct {
	lat, chunks, lag []time.Duration
	ok, errs         int
	bytes            int64
	firstErr         error
}

func (w *workerStats) record(c *fasthttp.HostClient, addr string, body []byte, stream, measure bool, sent time.Time) {
	var onChunk func(time.Duration)
	if stream && measure {
		onChunk = func(d time.Duration) { w.chunks = append(w.chunks, d) }
	}
	lat, size, _, err := do(c, addr, body, stream, sent, onChunk)
	if !measure {
		return
	}
	if err != nil {
		w.errs++
		if w.firstErr == nil {
			w.firstErr = err
		}
		return
	}
	w.ok++
	w.bytes += int64(size)
	w.lat = append(w.lat, lat)
}

// samples accumulates one target's raw measurements over its slices.
type samples struct {
	lat, chunks, lag []time.Duration
	cpu              time.Duration
	rss              int64
	usageErr         string
	ok, errs         int
	dropped          int
	bytes            int64
	wall             time.Duration
	firstErr         string
	warmed           bool
	client           *fasthttp.HostClient
	// turns is each slice's share of ok and wall, in round order.
	turns []turn
}

// result summarises the samples.
func (s *samples) result() TargetResult {
	res := TargetResult{Wall: s.wall, Dropped: s.dropped, Requests: s.ok, Errors: s.errs, FirstError: s.firstErr}
	res.Latency = loadgen.Summarize(s.lat)
	res.Chunks = loadgen.Summarize(s.chunks)
	res.Lag = loadgen.Summarize(s.lag)
	res.RSS = s.rss
	if s.ok > 0 && s.cpu > 0 {
		res.CPUPer100k = s.cpu.Seconds() * 100_000 / float64(s.ok)
	}
	if s.ok > 0 {
		res.ResponseBytes = int(s.bytes / int64(s.ok))
	}
	if s.wall > 0 {
		res.Throughput = float64(s.ok) / s.wall.Seconds()
	}
	if len(s.turns) > 1 {
		for _, t := range s.turns {
			rps := 0.0
			if t.wall > 0 {
				rps = float64(t.ok) / t.wall.Seconds()
			}
			res.SliceRPS = append(res.SliceRPS, rps)
		}
	}
	return res
}

// load runs one slice of load (at most d, and at most budget requests)
// against addr, adding to acc; the first slice starts with the warm-up. It
// stops early when ctx ends.
func load(ctx context.Context, cfg Config, addr string, body []byte, acc *samples, d time.Duration, budget int) {
	if acc.client == nil {
		acc.client = newClient(addr, cfg.Concurrency, cfg.Stream)
		acc.client.ReadTimeout, acc.client.WriteTimeout = 30*time.Second, 30*time.Second
	}
	c := acc.client
	if !acc.warmed {
		// Warm-up: open the connections and let every layer reach its
		// steady state (pools, buffers) before anything is measured.
		acc.warmed = true
		var warm workerStats
		for i := 0; i < cfg.Warmup && ctx.Err() == nil; i++ {
			warm.record(c, addr, body, cfg.Stream, false, time.Now())
		}
	}

	stats := make([]*workerStats, cfg.Concurrency)
	for i := range stats {
		stats[i] = &workerStats{}
	}
	var dropped atomic.Int64
	runCtx, cancel := context.WithTimeout(ctx, d)
	defer cancel()
	start := time.Now()
	var wg sync.WaitGroup
	if cfg.Mode == ClosedLoop {
		var issued atomic.Int64
		for _, st := range stats {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for runCtx.Err() == nil && issued.Add(1) <= int64(budget) {
					st.record(c, addr, body, cfg.Stream, true, time.Now())
				}
			}()
		}
	} else {
		// Open loop: the scheduler hands each request's due time to a free
		// worker; when all are busy and the queue is full the send is
		// dropped and counted, never delayed (a delay would hide the
		// target's queueing from the latency figures).
		due := make(chan time.Time, cfg.Concurrency)
		for _, st := range stats {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for t := range due {
					if runCtx.Err() != nil {
						continue
					}
					// Latency counts from the actual send; how late
					// the send left is the generator's lag, recorded
					// beside it (a late send is not the target's).
					sent := time.Now()
					st.lag = append(st.lag, sent.Sub(t))
					st.record(c, addr, body, cfg.Stream, true, sent)
				}
			}()
		}
		interval := time.Second / time.Duration(cfg.RPS)
		sent := 0
	schedule:
		for sent < budget {
			next := start.Add(time.Duration(sent) * interval)
			if wait := time.Until(next); wait > 0 {
				t := time.NewTimer(wait)
				select {
				case <-runCtx.Done():
					t.Stop()
					break schedule
				case <-t.C:
				}
			} else if runCtx.Err() != nil {
				break
			}
			select {
			case due <- next:
			default:
				dropped.Add(1)
			}
			sent++
		}
		close(due)
	}
	wg.Wait()
	acc.wall += time.Since(start)
	if cfg.releaseBetweenSlices() {
		// An engine that serves only a few connections at once holds one
		// for each idle keep-alive connection: the next target's turn must
		// not wait behind this one's.
		c.CloseIdleConnections()
	}
	acc.dropped += int(dropped.Load())
	for _, st := range stats {
		acc.lat = append(acc.lat, st.lat...)
		acc.chunks = append(acc.chunks, st.chunks...)
		acc.lag = append(acc.lag, st.lag...)
		acc.ok += st.ok
		acc.errs += st.errs
		acc.bytes += st.bytes
		if st.firstErr != nil && acc.firstErr == "" {
			acc.firstErr = st.firstErr.Error()
		}
	}
}
