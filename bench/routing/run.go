package routing

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/llmgw/llmgw/bench/loadgen"
	"github.com/llmgw/llmgw/engines"
	"github.com/llmgw/llmgw/engines/sim"
	"github.com/llmgw/llmgw/engines/tokenizer"
	"github.com/llmgw/llmgw/gateway"
	"github.com/llmgw/llmgw/gateway/rule"
)

// Policy names a router under test.
type Policy string

// The routers compared. All but the oracles run inside an embedded llmgw;
// the oracles send straight to the chosen simulator.
const (
	RoundRobin    Policy = "rr"             // sel 0
	LeastInFlight Policy = "least-inflight" // sel 4
	CHWBL         Policy = "chwbl"          // sel 8
	KVExact       Policy = "kv-exact"       // kvExactMode 3 (CHWBL fallback)
	OraclePolicy  Policy = "oracle"         // exact cache and load model, no gateway
	// OraclePrefix is the oracle without its load rule: always the longest
	// cached prefix (ties to fewest in flight). It maximises hits on
	// workloads without a common opening block and collapses onto one
	// worker on those with one.
	OraclePrefix Policy = "oracle-prefix"
)

// Policies lists every policy in report order.
func Policies() []Policy {
	return []Policy{RoundRobin, LeastInFlight, CHWBL, KVExact, OraclePolicy, OraclePrefix}
}

// ParsePolicies parses a comma-separated policy list ("" or "all" = every
// policy); errors wrap ErrParams and list the valid names.
func ParsePolicies(s string) ([]Policy, error) {
	if s == "" || s == "all" {
		return Policies(), nil
	}
	var out []Policy
	seen := map[Policy]bool{}
	for _, f := range strings.Split(s, ",") {
		p := Policy(strings.TrimSpace(f))
		ok := false
		for _, v := range Policies() {
			ok = ok || v == p
		}
		if !ok {
			return nil, fmt.Errorf("%w: unknown policy %q; valid policies are rr, least-inflight, chwbl, kv-exact, oracle, oracle-prefix", ErrParams, p)
		}
		if !seen[p] {
			seen[p] = true
			out = append(out, p)
		}
	}
	return out, nil
}

// Config is one routing benchmark: a workload replayed against a fresh set
// of simulators (cold caches) once per policy.
type Config struct {
	Workload Workload
	Shape    Shape
	Seed     uint64
	Policies []Policy
	// Endpoints is the number of simulators (2..64).
	Endpoints int
	// Concurrency is the number of client sessions in flight (closed loop).
	Concurrency int
	// CacheBlocks bounds each simulator's prefix cache (16-token blocks).
	CacheBlocks int
	// PrefillPerToken and DecodePerToken are the simulators' latency model.
	PrefillPerToken, DecodePerToken time.Duration
	// SimConcurrency is each simulator's serving slots; 0 = unbounded.
	SimConcurrency int
	// MaxTokens is each request's generation cap.
	MaxTokens int
	// PolicyTimeout bounds each policy's run; 0 means 5 minutes.
	PolicyTimeout time.Duration
	// Logger receives the embedded gateways' logs; nil discards them.
	Logger *slog.Logger
	// Replicas is the number of gateways serving the same rule over the
	// same simulators (0 means 1), each subscribed to every simulator's KV
	// events and each counting only its own in-flight requests; the
	// client sends to them in turn (round robin). Oracle policies ignore
	// it.
	Replicas int
	// AgreementProbes, with Replicas ≥ 2, sends that many requests of the
	// workload again after the run (warm indexes), each to replica 1 and
	// replica 2 at once, and counts how often both pick the same endpoint.
	AgreementProbes int
}

// blockSize is the simulators' (vLLM default) and the rules' KV block size.
const blockSize = 16

// Validate checks every parameter before anything starts; errors wrap
// ErrParams.
func (c Config) Validate() error {
	if _, err := ParseWorkload(string(c.Workload)); err != nil {
		return err
	}
	if err := c.Shape.Validate(); err != nil {
		return err
	}
	switch {
	case len(c.Policies) == 0:
		return fmt.Errorf("%w: no policy to run", ErrParams)
	case c.Endpoints < 2 || c.Endpoints > 64:
		return fmt.Errorf("%w: endpoints must be 2..64, got %d", ErrParams, c.Endpoints)
	case c.Concurrency < 1 || c.Concurrency > 4096:
		return fmt.Errorf("%w: concurrency must be 1..4096, got %d", ErrParams, c.Concurrency)
	case c.CacheBlocks < 1:
		return fmt.Errorf("%w: cache blocks must be at least 1, got %d", ErrParams, c.CacheBlocks)
	case c.PrefillPerToken < 0 || c.DecodePerToken < 0:
		return fmt.Errorf("%w: per-token costs must not be negative", ErrParams)
	case c.PrefillPerToken > time.Second || c.DecodePerToken > time.Second:
		return fmt.Errorf("%w: per-token costs above 1s would not finish", ErrParams)
	case c.SimConcurrency < 0:
		return fmt.Errorf("%w: sim concurrency must not be negative, got %d", ErrParams, c.SimConcurrency)
	case c.MaxTokens < 1 || c.MaxTokens > 4096:
		return fmt.Errorf("%w: max tokens must be 1..4096, got %d", ErrParams, c.MaxTokens)
	case c.PolicyTimeout < 0:
		return fmt.Errorf("%w: policy timeout must not be negative", ErrParams)
	case c.Replicas < 0 || c.Replicas > 8:
		return fmt.Errorf("%w: replicas must be 0..8, got %d", ErrParams, c.Replicas)
	case c.AgreementProbes < 0 || c.AgreementProbes > 0 && c.Replicas < 2:
		return fmt.Errorf("%w: agreement probes need 2 or more replicas and must not be negative", ErrParams)
	}
	for _, p := range c.Policies {
		if _, err := ParsePolicies(string(p)); err != nil {
			return err
		}
	}
	return nil
}

// Result is one policy's measurements.
type Result struct {
	Policy Policy `json:"policy"`
	// Requests completed without error; Errors failed (status, transport
	// or stream errors); Skipped were never sent (interrupted run).
	Requests int `json:"requests"`
	Errors   int `json:"errors"`
	Skipped  int `json:"skipped"`
	// FirstError is the first failure's message, for diagnosis.
	FirstError string `json:"first_error,omitempty"`
	// PromptTokens and CachedTokens sum the engines' usage reports;
	// HitRatio = CachedTokens / PromptTokens.
	PromptTokens int64   `json:"prompt_tokens"`
	CachedTokens int64   `json:"cached_tokens"`
	HitRatio     float64 `json:"hit_ratio"`
	// TTFT is measured by the client on streaming requests: from sending
	// the request to reading the first chunk that carries generated text.
	TTFT loadgen.Summary `json:"ttft"`
	// Throughput is completed requests per second of wall time.
	Throughput float64       `json:"throughput_rps"`
	Wall       time.Duration `json:"wall_ns"`
	// MeanInFlight is each endpoint's in-flight count averaged over the
	// samples (the router's own count, sampled every millisecond or so);
	// Imbalance is the max over the mean of those averages (1 = even).
	MeanInFlight []float64 `json:"mean_in_flight"`
	Imbalance    float64   `json:"imbalance"`
	Samples      int       `json:"samples"`
	// Share is the number of requests each endpoint served.
	Share []int `json:"share"`
	// Routes counts the gateway's X-Llmgw-Route decisions with their
	// numbers stripped (e.g. "kv-exact hit", "kv-exact miss=overloaded");
	// empty for the oracle.
	Routes map[string]int `json:"routes,omitempty"`
	// Replicas is the number of gateways the requests were spread over.
	Replicas int `json:"replicas,omitempty"`
	// Agreement is the warm-index probe of two replicas (AgreementProbes).
	Agreement *Agreement `json:"agreement,omitempty"`
}

// Agreement counts probe pairs: the same request sent at once to two
// replicas, Same of Pairs answered by the same endpoint; BothHit of them
// routed as a KV-exact hit by both replicas (agreement from the indexes,
// not only from a shared CHWBL ring, which agrees without any).
type Agreement struct {
	Pairs   int     `json:"pairs"`
	Same    int     `json:"same"`
	BothHit int     `json:"both_hit"`
	Ratio   float64 `json:"ratio"`
}

// Report is a whole routing benchmark run.
type Report struct {
	Workload  Workload `json:"workload"`
	Shape     Shape    `json:"shape"`
	Seed      uint64   `json:"seed"`
	Endpoints int      `json:"endpoints"`
	// Concurrency, CacheBlocks, the latency model and MaxTokens are as in
	// Config.
	Concurrency     int           `json:"concurrency"`
	CacheBlocks     int           `json:"cache_blocks"`
	PrefillPerToken time.Duration `json:"prefill_per_token_ns"`
	DecodePerToken  time.Duration `json:"decode_per_token_ns"`
	SimConcurrency  int           `json:"sim_concurrency"`
	MaxTokens       int           `json:"max_tokens"`
	Started         time.Time     `json:"started"`
	// Partial is set when the run was interrupted; the results hold what
	// completed.
	Partial bool     `json:"partial"`
	Results []Result `json:"results"`
}

// Result returns the result for p, or nil.
func (r *Report) Result(p Policy) *Result {
	for i := range r.Results {
		if r.Results[i].Policy == p {
			return &r.Results[i]
		}
	}
	return nil
}

// BestOracle returns the oracle result with the higher hit ratio, or nil
// when no oracle ran: the bound a real router is held to.
func (r *Report) BestOracle() *Result {
	a, b := r.Result(OraclePolicy), r.Result(OraclePrefix)
	switch {
	case a == nil:
		return b
	case b == nil || a.HitRatio >= b.HitRatio:
		return a
	}
	return b
}

// Run validates cfg, generates the workload and replays it once per policy.
// Each policy gets fresh simulators (cold caches) and, except the oracle, a
// fresh embedded gateway. When ctx ends mid-run, Run returns the partial
// report (Partial set) together with an error wrapping ctx's error.
func Run(ctx context.Context, cfg Config) (*Report, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	sessions, err := Generate(cfg.Workload, cfg.Shape, cfg.Seed)
	if err != nil {
		return nil, err
	}
	rep := &Report{Workload: cfg.Workload, Shape: cfg.Shape, Seed: cfg.Seed, Endpoints: cfg.Endpoints,
		Concurrency: cfg.Concurrency, CacheBlocks: cfg.CacheBlocks, PrefillPerToken: cfg.PrefillPerToken,
		DecodePerToken: cfg.DecodePerToken, SimConcurrency: cfg.SimConcurrency, MaxTokens: cfg.MaxTokens,
		Started: time.Now().UTC()}
	for _, p := range cfg.Policies {
		res, err := runPolicy(ctx, cfg, p, sessions)
		if res != nil {
			rep.Results = append(rep.Results, *res)
		}
		if err != nil {
			if ctx.Err() != nil {
				rep.Partial = true
				return rep, fmt.Errorf("routing: interrupted during %s: %w", p, ctx.Err())
			}
			return rep, err
		}
	}
	return rep, nil
}

// router is what a worker needs from the system under test.
type router struct {
	// target returns the URL for a request and a release func, or an error.
	target func(msgs []tokenizer.Message) (url string, endpoint int, release func(), err error)
	// inFlight samples per-endpoint in-flight counts.
	inFlight func() []int64
	// replicaURLs are the gateways' chat URLs (nil for the oracle).
	replicaURLs []string
}

func runPolicy(ctx context.Context, cfg Config, p Policy, sessions []Session) (*Result, error) {
	timeout := cfg.PolicyTimeout
	if timeout == 0 {
		timeout = 5 * time.Minute
	}
	pctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	sims, err := startSims(pctx, cfg, p == KVExact)
	defer func() {
		for _, s := range sims {
			_ = s.Close()
		}
	}()
	if err != nil {
		return nil, err
	}
	rt, closeRouter, err := newRouter(pctx, cfg, p, sims)
	if err != nil {
		return nil, err
	}
	defer closeRouter()
	res, err := drive(pctx, cfg, p, rt, sessions)
	if err != nil || cfg.AgreementProbes == 0 || len(rt.replicaURLs) < 2 {
		return res, err
	}
	res.Agreement, err = probeAgreement(pctx, cfg, rt.replicaURLs[:2], sessions)
	return res, err
}

func startSims(ctx context.Context, cfg Config, events bool) ([]*sim.Sim, error) {
	var sims []*sim.Sim
	for i := 0; i < cfg.Endpoints; i++ {
		sc := sim.Config{Engine: engines.VLLM, Model: "m", KVEvents: sim.KVEventsOff, CacheBlocks: cfg.CacheBlocks,
			PrefillPerToken: cfg.PrefillPerToken, DecodePerToken: cfg.DecodePerToken,
			MaxConcurrency: cfg.SimConcurrency, Seed: int64(cfg.Seed) + int64(i), BlockSize: blockSize}
		if events {
			sc.KVEvents = "tcp://127.0.0.1:0"
		}
		s, err := sim.Start(ctx, sc)
		if err != nil {
			return sims, fmt.Errorf("routing: start simulator %d: %w", i+1, err)
		}
		sims = append(sims, s)
	}
	return sims, nil
}

// ruleYAML returns the rule for a gateway policy over sims, endpoints named
// w1..wN in sims order.
func ruleYAML(p Policy, sims []*sim.Sim) (string, error) {
	var b strings.Builder
	switch p {
	case RoundRobin:
		b.WriteString("sel: 0\n")
	case LeastInFlight:
		b.WriteString("sel: 4\n")
	case CHWBL:
		b.WriteString("sel: 8\n")
	case KVExact:
		// The sims tokenize with their default, the embedded Qwen3
		// tokenizer; the gateway reads the same files.
		tok, err := tokenizer.ExportQwen3(filepath.Join(os.TempDir(), "llmgw-tokenizers"))
		if err != nil {
			return "", err
		}
		fmt.Fprintf(&b, "sel: 8\nkvEngineType: vllm\nkvExactMode: 3\nkvTokenizer: %q\nkvBlockSize: %d\n", tok, blockSize)
	default:
		return "", fmt.Errorf("%w: policy %q has no gateway rule", ErrParams, p)
	}
	b.WriteString("name: bench\nmodel_name: m\nprobe: {disabled: true}\nendpoints:\n")
	for i, s := range sims {
		host, port, err := splitHostPort(s.Addrs().HTTP)
		if err != nil {
			return "", err
		}
		fmt.Fprintf(&b, "  - {id: w%d, endpointIP: %s, targetPort: %d", i+1, host, port)
		if p == KVExact {
			fmt.Fprintf(&b, ", kvEventsEndpoint: %q, kvReplayEndpoint: %q", s.Addrs().Events, s.Addrs().Replay)
		}
		b.WriteString("}\n")
	}
	return b.String(), nil
}

func splitHostPort(hp string) (string, int, error) {
	i := strings.LastIndexByte(hp, ':')
	if i < 0 {
		return "", 0, fmt.Errorf("routing: address %q has no port", hp)
	}
	port, err := strconv.Atoi(hp[i+1:])
	if err != nil {
		return "", 0, fmt.Errorf("routing: address %q: %w", hp, err)
	}
	return hp[:i], port, nil
}

func newRouter(ctx context.Context, cfg Config, p Policy, sims []*sim.Sim) (*router, func(), error) {
	if p == OraclePolicy || p == OraclePrefix {
		slots := cfg.SimConcurrency
		if p == OraclePrefix {
			slots = 0
		}
		o, err := NewOracle(len(sims), blockSize, cfg.CacheBlocks, slots)
		if err != nil {
			return nil, nil, err
		}
		return &router{
			target: func(msgs []tokenizer.Message) (string, int, func(), error) {
				d, err := o.Pick(msgs)
				if err != nil {
					return "", 0, nil, err
				}
				return "http://" + sims[d.Endpoint].Addrs().HTTP + "/v1/chat/completions", d.Endpoint, func() { o.Done(d.Endpoint) }, nil
			},
			inFlight: o.InFlight,
		}, func() {}, nil
	}
	yaml, err := ruleYAML(p, sims)
	if err != nil {
		return nil, nil, err
	}
	r, err := rule.Decode([]byte(yaml))
	if err != nil {
		return nil, nil, fmt.Errorf("routing: %s rule: %w", p, err)
	}
	log := cfg.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	replicas := max(cfg.Replicas, 1)
	var gws []*gateway.Server
	var dirs []string
	closeAll := func() {
		for _, gw := range gws {
			_ = gw.Close()
		}
		for _, d := range dirs {
			os.RemoveAll(d)
		}
	}
	var urls []string
	for range replicas {
		dir, err := os.MkdirTemp("", "llmgw-bench-")
		if err != nil {
			closeAll()
			return nil, nil, fmt.Errorf("routing: state dir: %w", err)
		}
		dirs = append(dirs, dir)
		gw, err := gateway.New(gateway.Config{Listen: "127.0.0.1:0", Admin: "127.0.0.1:0", StateDir: dir, Logger: log})
		if err != nil {
			closeAll()
			return nil, nil, fmt.Errorf("routing: gateway: %w", err)
		}
		if err := gw.Start(ctx); err != nil {
			closeAll()
			return nil, nil, fmt.Errorf("routing: gateway start: %w", err)
		}
		gws = append(gws, gw)
		if _, err := gw.Apply(r.Clone(), true); err != nil {
			closeAll()
			return nil, nil, fmt.Errorf("routing: apply %s rule: %w", p, err)
		}
		if p == KVExact {
			if err := waitEventsConnected(ctx, gw); err != nil {
				closeAll()
				return nil, nil, err
			}
		}
		urls = append(urls, "http://"+gw.Addr()+"/v1/chat/completions")
	}
	n := len(sims)
	var next atomic.Uint64
	return &router{
		target: func([]tokenizer.Message) (string, int, func(), error) {
			return urls[(next.Add(1)-1)%uint64(len(urls))], -1, func() {}, nil
		},
		// The sum over replicas: what each engine really has in flight.
		inFlight: func() []int64 {
			out := make([]int64, n)
			for _, gw := range gws {
				st, err := gw.Rule("bench")
				if err != nil {
					continue
				}
				for _, e := range st.Status.Endpoints {
					if i := endpointIndex(e.ID); i >= 0 && i < n {
						out[i] += e.InFlight
					}
				}
			}
			return out
		},
		replicaURLs: urls,
	}, closeAll, nil
}

// probeAgreement sends requests of the workload (the first request of
// each session, up to cfg.AgreementProbes, after the run has warmed every
// index) to two replicas at the same moment, one pair at a time, and counts
// how often both answer from the same endpoint.
func probeAgreement(ctx context.Context, cfg Config, urls []string, sessions []Session) (*Agreement, error) {
	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 4, DisableCompression: true}}
	defer client.CloseIdleConnections()
	a := &Agreement{}
	for _, s := range sessions {
		if a.Pairs == cfg.AgreementProbes || len(s) == 0 {
			break
		}
		var out [2]outcome
		var wg sync.WaitGroup
		for i, u := range urls {
			wg.Add(1)
			go func() {
				defer wg.Done()
				rt := &router{target: func([]tokenizer.Message) (string, int, func(), error) { return u, -1, func() {}, nil }}
				out[i] = send(ctx, client, rt, cfg.MaxTokens, s[0])
			}()
		}
		wg.Wait()
		for _, o := range out {
			if o.err != nil {
				return a, fmt.Errorf("routing: agreement probe: %w", o.err)
			}
		}
		a.Pairs++
		if out[0].endpoint == out[1].endpoint {
			a.Same++
		}
		if out[0].route == "kv-exact hit" && out[1].route == "kv-exact hit" {
			a.BothHit++
		}
	}
	if a.Pairs > 0 {
		a.Ratio = float64(a.Same) / float64(a.Pairs)
	}
	return a, nil
}

// waitEventsConnected waits until every endpoint's KV event stream is
// connected, so the KV-exact run starts with the event plane up (as a
// deployment would after warm-up) rather than measuring connection setup.
func waitEventsConnected(ctx context.Context, gw *gateway.Server) error {
	deadline := time.Now().Add(15 * time.Second)
	tick := time.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
	for {
		st, err := gw.Rule("bench")
		if err != nil {
			return fmt.Errorf("routing: kv-exact status: %w", err)
		}
		all := true
		for _, e := range st.Status.Endpoints {
			all = all && e.KV != nil && e.KV.EventsConnected
		}
		if all {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("routing: kv-exact event streams not connected after 15s: %+v", st.Status.Endpoints)
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("routing: waiting for kv events: %w", ctx.Err())
		case <-tick.C:
		}
	}
}

// endpointIndex maps "wK" to K-1, anything else to -1.
func endpointIndex(id string) int {
	n, err := strconv.Atoi(strings.TrimPrefix(id, "w"))
	if err != nil || !strings.HasPrefix(id, "w") || n < 1 {
		return -1
	}
	return n - 1
}

// outcome is one request's measurements.
type outcome struct {
	endpoint       int
	route          string
	ttft           time.Duration
	prompt, cached int
	err            error
}

func drive(ctx context.Context, cfg Config, p Policy, rt *router, sessions []Session) (*Result, error) {
	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: cfg.Concurrency * 2, DisableCompression: true}}
	defer client.CloseIdleConnections()

	res := &Result{Policy: p, Replicas: len(rt.replicaURLs), MeanInFlight: make([]float64, cfg.Endpoints), Share: make([]int, cfg.Endpoints)}
	sums := make([]float64, cfg.Endpoints)
	sampleCtx, stopSampling := context.WithCancel(ctx)
	var samplerDone sync.WaitGroup
	samplerDone.Add(1)
	go func() {
		defer samplerDone.Done()
		tick := time.NewTicker(time.Millisecond)
		defer tick.Stop()
		for {
			select {
			case <-sampleCtx.Done():
				return
			case <-tick.C:
				for i, v := range rt.inFlight() {
					sums[i] += float64(v)
				}
				res.Samples++
			}
		}
	}()

	work := make(chan Session)
	outcomes := make(chan outcome, cfg.Concurrency)
	var workers sync.WaitGroup
	start := time.Now()
	for range cfg.Concurrency {
		workers.Add(1)
		go func() {
			defer workers.Done()
			for s := range work {
				for _, req := range s {
					o := send(ctx, client, rt, cfg.MaxTokens, req)
					outcomes <- o
					if o.err != nil && ctx.Err() != nil {
						break
					}
				}
			}
		}()
	}
	var ttfts []time.Duration
	collected := make(chan struct{})
	go func() {
		defer close(collected)
		for o := range outcomes {
			if o.err != nil {
				res.Errors++
				if res.FirstError == "" {
					res.FirstError = o.err.Error()
				}
				continue
			}
			res.Requests++
			res.PromptTokens += int64(o.prompt)
			res.CachedTokens += int64(o.cached)
			ttfts = append(ttfts, o.ttft)
			if o.route != "" {
				if res.Routes == nil {
					res.Routes = map[string]int{}
				}
				res.Routes[o.route]++
			}
			if o.endpoint >= 0 && o.endpoint < len(res.Share) {
				res.Share[o.endpoint]++
			}
		}
	}()
	sent := 0
feed:
	for _, s := range sessions {
		select {
		case work <- s:
			sent += len(s)
		case <-ctx.Done():
			break feed
		}
	}
	close(work)
	workers.Wait()
	res.Wall = time.Since(start)
	stopSampling()
	samplerDone.Wait()
	close(outcomes)
	<-collected

	total := 0
	for _, s := range sessions {
		total += len(s)
	}
	res.Skipped = total - res.Requests - res.Errors
	if res.PromptTokens > 0 {
		res.HitRatio = float64(res.CachedTokens) / float64(res.PromptTokens)
	}
	res.TTFT = loadgen.Summarize(ttfts)
	if res.Wall > 0 {
		res.Throughput = float64(res.Requests) / res.Wall.Seconds()
	}
	var mean, peak float64
	for i, s := range sums {
		if res.Samples > 0 {
			res.MeanInFlight[i] = s / float64(res.Samples)
		}
		mean += res.MeanInFlight[i]
		peak = max(peak, res.MeanInFlight[i])
	}
	mean /= float64(len(sums))
	if mean > 0 {
		res.Imbalance = peak / mean
	}
	if err := ctx.Err(); err != nil {
		return res, fmt.Errorf("routing: %s: %w", p, err)
	}
	if res.Errors > 0 {
		return res, fmt.Errorf("routing: %s: %d of %d requests failed, first: %s", p, res.Errors, total, res.FirstError)
	}
	return res, nil
}

// chatBody is the request body of one streamed chat completion.
type chatBody struct {
	Model         string          `json:"model"`
	Messages      []wireMessage   `json:"messages"`
	MaxTokens     int             `json:"max_tokens"`
	Stream        bool            `json:"stream"`
	StreamOptions map[string]bool `json:"stream_options"`
}

type wireMessage struct {
	Role    string `json:"role"`
	Content string `json:"content"`
}

func send(ctx context.Context, client *http.Client, rt *router, maxTokens int, req Request) outcome {
	url, ep, release, err := rt.target(req.Messages)
	if err != nil {
		return outcome{err: err}
	}
	defer release()
	body := chatBody{Model: "m", MaxTokens: maxTokens, Stream: true, StreamOptions: map[string]bool{"include_usage": true}}
	for _, m := range req.Messages {
		body.Messages = append(body.Messages, wireMessage(m))
	}
	raw, err := json.Marshal(body)
	if err != nil {
		return outcome{err: fmt.Errorf("routing: encode request: %w", err)}
	}
	hreq, err := http.NewRequestWithContext(ctx, http.MethodPost, url, bytes.NewReader(raw))
	if err != nil {
		return outcome{err: fmt.Errorf("routing: request: %w", err)}
	}
	hreq.Header.Set("Content-Type", "application/json")
	t0 := time.Now()
	resp, err := client.Do(hreq)
	if err != nil {
		return outcome{err: fmt.Errorf("routing: send: %w", err)}
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		b, _ := io.ReadAll(io.LimitReader(resp.Body, 512))
		return outcome{err: fmt.Errorf("routing: status %d: %s", resp.StatusCode, bytes.TrimSpace(b))}
	}
	o := outcome{endpoint: ep}
	if ep < 0 {
		o.endpoint = endpointIndex(resp.Header.Get("X-Llmgw-Endpoint"))
		o.route = routeClass(resp.Header.Get("X-Llmgw-Route"))
	}
	r := loadgen.NewSSEReader(resp.Body)
	usage := false
	for {
		data, err := r.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return outcome{err: err}
		}
		c, err := loadgen.ParseChunk(data)
		if err != nil {
			return outcome{err: err}
		}
		if c.Content != "" && o.ttft == 0 {
			o.ttft = time.Since(t0)
		}
		if c.HasUsage {
			usage, o.prompt, o.cached = true, c.PromptTokens, c.CachedTokens
		}
	}
	if !usage || o.ttft == 0 {
		return outcome{err: fmt.Errorf("routing: stream ended without text or usage (usage %v)", usage)}
	}
	return o
}

// routeClass strips the per-request numbers from an X-Llmgw-Route value
// ("kv-exact hit=12/40" becomes "kv-exact hit") so decisions can be counted
// by kind; it keeps at most 64 bytes of a header it does not control.
func routeClass(v string) string {
	if len(v) > 64 {
		v = v[:64]
	}
	if i := strings.IndexByte(v, '='); i >= 0 && strings.HasSuffix(v[:i], "hit") {
		return v[:i]
	}
	return v
}
