// Command soak drives mixed streaming and non-streaming chat completions
// through an llmgw gateway (child process) to three simulated vLLM workers
// (child processes) on loopback for a fixed duration, samples the gateway's
// goroutines, heap and open file descriptors from its /metrics, classifies
// every failure (gateway-caused 5xx, engine 5xx relayed by the gateway,
// transport errors, broken streams) and writes a Markdown report and a CSV
// of the samples.
//
//	go run ./reliability/soak -duration 30m -rps 1000 -out reliability/soak-report
//
// It stops by itself after -duration (or on SIGINT/SIGTERM) and stops every
// process it started.
package main

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log"
	"math/rand/v2"
	"net/http"
	"os"
	"os/signal"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/llmgw/llmgw/reliability/harness"
)

type options struct {
	duration   time.Duration
	rps        int
	streamFrac float64
	sample     time.Duration
	out        string
	bin        string
	errorRate  float64
	maxTokens  int
	inflight   int
	drain      time.Duration
}

func main() {
	var o options
	flag.DurationVar(&o.duration, "duration", 30*time.Minute, "how long to drive load")
	flag.IntVar(&o.rps, "rps", 1000, "requests per second (open loop)")
	flag.Float64Var(&o.streamFrac, "stream-frac", 0.3, "fraction of requests that stream")
	flag.DurationVar(&o.sample, "sample", 10*time.Second, "metrics sampling period")
	flag.StringVar(&o.out, "out", "reliability/soak-report", "report directory (report.md, samples.csv)")
	flag.StringVar(&o.bin, "bin", "", "llmgw binary (\"\" builds ./cmd/llmgw)")
	flag.Float64Var(&o.errorRate, "engine-error-rate", 0.001, "injected engine 5xx rate on the third worker (to prove the classification)")
	flag.IntVar(&o.maxTokens, "max-tokens", 16, "max_tokens of every request")
	flag.IntVar(&o.inflight, "max-inflight", 4000, "cap on concurrent requests; a tick that finds the cap reached is counted as shed")
	flag.DurationVar(&o.drain, "drain", 150*time.Second, "after the load, how long to wait for the gateway's fds and goroutines to return to their pre-load level (its idle worker connections live 4 s for the known engines, 90 s when the engine's keep-alive timeout is not known)")
	flag.Parse()
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, o); err != nil {
		log.Fatalf("soak: %v", err)
	}
}

// counters are the run's totals and the current interval's, updated by the
// request goroutines.
type counters struct {
	sent, ok, engine5xx, gateway5xx, other4xx, transport, brokenStream, shed atomic.Int64
	streams                                                                  atomic.Int64
}

type sample struct {
	at                                                 time.Duration
	goroutines, heapInuse, openFDs, rss                float64
	sent, ok, engine5xx, gateway5xx, transport, broken int64
	p50, p99                                           time.Duration
}

type latencies struct {
	mu sync.Mutex
	d  []time.Duration
}

func (l *latencies) add(d time.Duration) {
	l.mu.Lock()
	l.d = append(l.d, d)
	l.mu.Unlock()
}

// take returns the p50 and p99 of the interval and starts a new one.
func (l *latencies) take() (p50, p99 time.Duration) {
	l.mu.Lock()
	d := l.d
	l.d = make([]time.Duration, 0, len(d))
	l.mu.Unlock()
	if len(d) == 0 {
		return 0, 0
	}
	slices.Sort(d)
	return d[len(d)/2], d[min(len(d)-1, len(d)*99/100)]
}

func run(parent context.Context, o options) error {
	if o.rps <= 0 || o.duration <= 0 {
		return errors.New("soak: -rps and -duration must be positive")
	}
	work, err := os.MkdirTemp("", "llmgw-soak-")
	if err != nil {
		return fmt.Errorf("soak: temp dir: %w", err)
	}
	defer os.RemoveAll(work)
	// Processes live until the deferred stops below, not until the load
	// deadline: the final metrics sample needs the gateway.
	procCtx, cancelProcs := context.WithCancel(parent)
	defer cancelProcs()
	bin := o.bin
	if bin == "" {
		root, err := harness.ModuleRoot()
		if err != nil {
			return err
		}
		log.Printf("building llmgw")
		if bin, err = harness.Build(procCtx, root, work, false); err != nil {
			return err
		}
	}
	var sims []*harness.Sim
	for i := range 3 {
		s, err := harness.StartSim(procCtx, bin, filepath.Join(work, fmt.Sprintf("sim%d.log", i)),
			"--engine", "vllm", "--kv-events", "off", "--seed", fmt.Sprint(i))
		if err != nil {
			return err
		}
		defer s.Stop()
		sims = append(sims, s)
	}
	gw, err := harness.StartGateway(procCtx, bin, filepath.Join(work, "state"), filepath.Join(work, "gateway.log"), "--log-level", "warn")
	if err != nil {
		return err
	}
	defer gw.Stop()
	var rule strings.Builder
	rule.WriteString("name: soak\nmodel_name: \"\"\nsel: 8\nchwbl: {load_factor: 1.25, replicas: 160, prefix_bytes: 2048}\n")
	rule.WriteString("probe: {path: /health, interval: 1s, timeout: 500ms, failures: 2, successes: 1}\nendpoints:\n")
	for i, s := range sims {
		port := s.Addrs.HTTP[strings.LastIndexByte(s.Addrs.HTTP, ':')+1:]
		fmt.Fprintf(&rule, "  - {id: w%d, endpointIP: 127.0.0.1, targetPort: %s}\n", i+1, port)
	}
	if err := gw.PutRule(procCtx, "soak", rule.String()); err != nil {
		return err
	}
	if o.errorRate > 0 {
		if err := sims[2].SetFaults(procCtx, map[string]any{"error_rate": o.errorRate}); err != nil {
			return err
		}
	}
	log.Printf("gateway %s, workers %s %s %s; %d rps for %v", gw.Data, sims[0].Addrs.HTTP, sims[1].Addrs.HTTP, sims[2].Addrs.HTTP, o.rps, o.duration)

	tr := &http.Transport{MaxIdleConns: 2048, MaxIdleConnsPerHost: 2048, IdleConnTimeout: 60 * time.Second}
	defer tr.CloseIdleConnections()
	client := &http.Client{Transport: tr, Timeout: 30 * time.Second}

	var c counters
	var lat latencies
	var wg sync.WaitGroup
	sem := make(chan struct{}, o.inflight)
	loadCtx, cancelLoad := context.WithTimeout(procCtx, o.duration)
	defer cancelLoad()
	start := time.Now()

	var samples []sample
	var prev sample
	takeSample := func() {
		m, err := gw.Scrape(procCtx)
		if err != nil {
			log.Printf("scrape: %v", err)
			return
		}
		p50, p99 := lat.take()
		s := sample{
			at: time.Since(start).Round(time.Second), goroutines: m.Sum("go_goroutines"),
			heapInuse: m.Sum("go_memstats_heap_inuse_bytes"), openFDs: m.Sum("process_open_fds"),
			rss:  m.Sum("process_resident_memory_bytes"),
			sent: c.sent.Load(), ok: c.ok.Load(), engine5xx: c.engine5xx.Load(), gateway5xx: c.gateway5xx.Load(),
			transport: c.transport.Load(), broken: c.brokenStream.Load(), p50: p50, p99: p99,
		}
		log.Printf("t=%v sent=%d (+%d) ok=%d gw5xx=%d eng5xx=%d transport=%d broken=%d goroutines=%.0f heap=%.1fMiB fds=%.0f p50=%v p99=%v",
			s.at, s.sent, s.sent-prev.sent, s.ok, s.gateway5xx, s.engine5xx, s.transport, s.broken, s.goroutines, s.heapInuse/(1<<20), s.openFDs, p50, p99)
		prev = s
		samples = append(samples, s)
	}
	takeSample()

	// Open-loop pacing: every 10 ms, issue the requests due so far.
	tick := time.NewTicker(10 * time.Millisecond)
	sampleTick := time.NewTicker(o.sample)
	var issued int64
	url := gw.URL() + "/v1/chat/completions"
loop:
	for {
		select {
		case <-loadCtx.Done():
			break loop
		case <-sampleTick.C:
			takeSample()
		case <-tick.C:
			due := int64(time.Since(start).Seconds() * float64(o.rps))
			for ; issued < due; issued++ {
				select {
				case sem <- struct{}{}:
				default:
					c.shed.Add(1)
					continue
				}
				stream := rand.Float64() < o.streamFrac
				prompt := rand.IntN(500)
				wg.Add(1)
				go func() {
					defer wg.Done()
					defer func() { <-sem }()
					one(procCtx, client, url, stream, prompt, o.maxTokens, &c, &lat)
				}()
			}
		}
	}
	tick.Stop()
	sampleTick.Stop()
	wg.Wait()
	tr.CloseIdleConnections()
	elapsed := time.Since(start)
	// After the load: what the gateway holds right away (its pooled
	// worker connections), then after its idle timeouts have run out.
	takeSample()
	d := drain(procCtx, gw, samples[0], o.drain)
	takeSample()
	return writeReport(o, &c, samples, elapsed, d)
}

// drainResult says whether the gateway's open fds and goroutines came back
// to their pre-load level (plus slack) after the load, and how long it took.
type drainResult struct {
	back bool
	took time.Duration
}

// drain polls the gateway every 5 s for up to limit until its open fds and
// goroutines are back within 10 of base.
func drain(ctx context.Context, gw *harness.Gateway, base sample, limit time.Duration) drainResult {
	start := time.Now()
	for {
		m, err := gw.Scrape(ctx)
		if err == nil && m.Sum("process_open_fds") <= base.openFDs+10 && m.Sum("go_goroutines") <= base.goroutines+10 {
			return drainResult{back: true, took: time.Since(start)}
		}
		if time.Since(start) >= limit {
			return drainResult{took: time.Since(start)}
		}
		select {
		case <-ctx.Done():
			return drainResult{took: time.Since(start)}
		case <-time.After(5 * time.Second):
		}
	}
}

// one sends one request and classifies the outcome. A 5xx answer carrying
// X-Llmgw-Endpoint was relayed from a worker (an engine error); one without
// it was produced by the gateway itself.
func one(ctx context.Context, client *http.Client, url string, stream bool, prompt, maxTokens int, c *counters, lat *latencies) {
	c.sent.Add(1)
	body := fmt.Sprintf(`{"model":"Qwen/Qwen3-0.6B","max_tokens":%d,"stream":%t,"messages":[{"role":"system","content":"You are a careful assistant for soak test tenant %d."},{"role":"user","content":"question %d: summarise the reliability plan"}]}`,
		maxTokens, stream, prompt%7, prompt)
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, strings.NewReader(body))
	if err != nil {
		c.transport.Add(1)
		return
	}
	req.Header.Set("Content-Type", "application/json")
	t0 := time.Now()
	resp, err := client.Do(req)
	if err != nil {
		if ctx.Err() == nil {
			c.transport.Add(1)
		}
		return
	}
	defer resp.Body.Close()
	relayed := resp.Header.Get("X-Llmgw-Endpoint") != ""
	switch {
	case resp.StatusCode >= 500 && relayed:
		c.engine5xx.Add(1)
		_, _ = io.Copy(io.Discard, resp.Body)
		return
	case resp.StatusCode >= 500:
		c.gateway5xx.Add(1)
		_, _ = io.Copy(io.Discard, resp.Body)
		return
	case resp.StatusCode >= 400:
		c.other4xx.Add(1)
		_, _ = io.Copy(io.Discard, resp.Body)
		return
	}
	if !stream {
		b, err := io.ReadAll(resp.Body)
		if err != nil || !bytes.Contains(b, []byte(`"choices"`)) {
			c.transport.Add(1)
			return
		}
		c.ok.Add(1)
		lat.add(time.Since(t0))
		return
	}
	c.streams.Add(1)
	sc := bufio.NewScanner(resp.Body)
	done, errEvent := false, false
	for sc.Scan() {
		line := sc.Bytes()
		if bytes.Equal(line, []byte("data: [DONE]")) {
			done = true
		} else if bytes.HasPrefix(line, []byte(`data: {"error"`)) {
			errEvent = true
		}
	}
	if sc.Err() != nil || !done || errEvent {
		c.brokenStream.Add(1)
		return
	}
	c.ok.Add(1)
	lat.add(time.Since(t0))
}
