// Package overhead measures what a proxy adds to an LLM request: the same
// load is sent to a simulated engine directly, through an embedded llmgw,
// and through nginx and HAProxy when they are installed, in one run, so
// the figures compare side by side. llmgw is measured as its own process
// (`llmgw serve`), as nginx and HAProxy are; embedded in the benchmark's
// process only on request (target llmgw-embedded), since there it shares
// the load generator's runtime and a process boundary's cost is hidden.
// Load is open-loop (a fixed request rate; latency counted from each
// request's actual send, and the generator's lag behind the schedule
// reported beside it, with sends the target could not take dropped and
// counted) or closed-loop (a fixed number of clients, each sending its next
// request when the last one ends). A streaming mode measures when each SSE
// chunk arrives. Every target that is a process of its own is charged its
// CPU time (from /proc) and resident memory.
//
// Everything runs on loopback and stops by itself: every target gets a
// bounded number of requests and a bounded time.
package overhead

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/llmgw/llmgw/bench/loadgen"
	"github.com/llmgw/llmgw/engines"
	_ "github.com/llmgw/llmgw/engines/all"
	"github.com/llmgw/llmgw/engines/sim"
	"github.com/llmgw/llmgw/gateway"
	"github.com/llmgw/llmgw/gateway/rule"
)

// ErrParams classifies invalid parameters; Run returns it before any load
// is sent. Test with errors.Is.
var ErrParams = errors.New("overhead: invalid parameters")

// ErrUnreachable classifies a target that did not answer the probe request
// sent before the load; test with errors.Is.
var ErrUnreachable = errors.New("overhead: target unreachable")

// Mode is the load shape.
type Mode string

// The load shapes.
const (
	OpenLoop   Mode = "open"   // fixed requests per second
	ClosedLoop Mode = "closed" // fixed concurrency
)

// Target names.
const (
	Direct = "direct"
	// LLMGW is llmgw as its own process (`llmgw serve`), measured as the
	// reference proxies are; needs Config.GatewayBinary.
	LLMGW = "llmgw"
	// LLMGWEmbedded is llmgw embedded in the benchmark's process, sharing
	// the load generator's Go runtime and CPUs; only on request.
	LLMGWEmbedded = "llmgw-embedded"
	Nginx         = "nginx"
	// NginxNoKeepAlive is nginx opening a new upstream connection per
	// request (no upstream keepalive pool), its default.
	NginxNoKeepAlive = "nginx-nokeepalive"
	HAProxy          = "haproxy"
)

// AllTargets lists every target in report order.
func AllTargets() []string {
	return []string{Direct, LLMGW, LLMGWEmbedded, Nginx, NginxNoKeepAlive, HAProxy}
}

// Backends.
const (
	// BackendSim is the built-in simulator (Config.Engine's persona), in
	// the benchmark's process.
	BackendSim = "sim"
	// BackendFixed is nginx as its own process answering every request
	// with the same FixedAnswerBytes-byte chat completion: the cheapest
	// backend, so a proxy's own cost is not diluted by the engine's.
	BackendFixed = "fixed"
)

// FixedAnswerBytes is the fixed backend's answer size.
const FixedAnswerBytes = 1024

// Config is one overhead benchmark.
type Config struct {
	Mode Mode
	// RPS is the open-loop request rate (1..100000).
	RPS int
	// Concurrency is the closed-loop client count and the open-loop cap on
	// outstanding requests (1..4096).
	Concurrency int
	// Duration bounds each target's measured load (10ms..10m).
	Duration time.Duration
	// Slice, when > 0, interleaves the targets: each measures for Slice in
	// turn until it has its Duration (or MaxRequests). 0 runs each target's
	// whole load at once, one after the other.
	Slice time.Duration
	// MaxRequests bounds each target's measured requests (1..10000000).
	MaxRequests int
	// Warmup requests are sent to each target first and not measured.
	Warmup int
	// Stream sends streaming requests and records each SSE chunk's arrival.
	Stream bool
	// PromptBytes sizes the request's user message.
	PromptBytes int
	// MaxTokens caps the completion (the simulator answers 8..32 tokens).
	MaxTokens int
	// DecodePerToken is the simulator's per-token delay; in streaming mode
	// it spaces the chunks. 0 answers at once.
	DecodePerToken time.Duration
	// Upstream, when set, is the host:port of an existing OpenAI-compatible
	// server to use instead of the built-in simulator. It must be loopback.
	Upstream string
	// Model is the model name sent ("m" for the built-in simulator).
	Model string
	// Engine is the built-in simulator's persona and the llmgw rule's
	// kvEngineType, so llmgw treats upstream connections as that engine
	// needs; "" is vLLM.
	Engine engines.Kind
	// NagleStall turns on the llama.cpp persona's reused-connection stall
	// (sim.Config.NagleStall); only with Engine llamacpp.
	NagleStall bool
	// Targets to measure, from AllTargets; Direct is always measured
	// first, as the baseline. Nginx and HAProxy are skipped with a note
	// when not installed.
	Targets []string
	// GatewayBinary is the llmgw executable the LLMGW target runs; ""
	// skips that target with a note.
	GatewayBinary string
	// Backend is BackendSim ("" too) or BackendFixed; ignored when Upstream
	// is set.
	Backend string
	// Pin places the processes on CPUs; the report says where each ran.
	Pin Placement
	// KeepCPUsAwake runs a SCHED_IDLE spinner on each CPU this process may
	// use, for the whole run, so that no CPU halts between requests
	// (keepAwake says why).
	KeepCPUsAwake bool
	// Logger receives the embedded gateway's logs; nil discards them.
	Logger *slog.Logger
	// Progress, when set, is called (from Run's goroutine) as each
	// target's warm-up starts; the CLI prints it, tests synchronise on it.
	Progress func(target string)
}

// Validate checks every parameter; errors wrap ErrParams.
func (c Config) Validate() error {
	switch {
	case c.Mode != OpenLoop && c.Mode != ClosedLoop:
		return fmt.Errorf("%w: mode %q: want open or closed", ErrParams, c.Mode)
	case c.Mode == OpenLoop && (c.RPS < 1 || c.RPS > 100_000):
		return fmt.Errorf("%w: rps must be 1..100000, got %d", ErrParams, c.RPS)
	case c.Concurrency < 1 || c.Concurrency > 4096:
		return fmt.Errorf("%w: concurrency must be 1..4096, got %d", ErrParams, c.Concurrency)
	case c.Duration < 10*time.Millisecond || c.Duration > 10*time.Minute:
		return fmt.Errorf("%w: duration must be 10ms..10m, got %v", ErrParams, c.Duration)
	case c.MaxRequests < 1 || c.MaxRequests > 10_000_000:
		return fmt.Errorf("%w: max requests must be 1..10000000, got %d", ErrParams, c.MaxRequests)
	case c.Slice < 0:
		return fmt.Errorf("%w: slice must not be negative, got %v", ErrParams, c.Slice)
	case c.Warmup < 0:
		return fmt.Errorf("%w: warmup must not be negative, got %d", ErrParams, c.Warmup)
	case c.PromptBytes < 1 || c.PromptBytes > 1<<20:
		return fmt.Errorf("%w: prompt bytes must be 1..1048576, got %d", ErrParams, c.PromptBytes)
	case c.MaxTokens < 1 || c.MaxTokens > 4096:
		return fmt.Errorf("%w: max tokens must be 1..4096, got %d", ErrParams, c.MaxTokens)
	case c.DecodePerToken < 0 || c.DecodePerToken > time.Second:
		return fmt.Errorf("%w: decode per token must be 0..1s, got %v", ErrParams, c.DecodePerToken)
	case len(c.Targets) == 0:
		return fmt.Errorf("%w: no target", ErrParams)
	case c.Backend != "" && c.Backend != BackendSim && c.Backend != BackendFixed:
		return fmt.Errorf("%w: backend %q: want sim or fixed", ErrParams, c.Backend)
	case c.Backend == BackendFixed && (c.Stream || c.Engine != "" || c.DecodePerToken > 0):
		return fmt.Errorf("%w: the fixed backend answers one non-streaming completion; stream, engine and decode per token need the simulator", ErrParams)
	case !validCPUList(c.Pin.Targets) || !validCPUList(c.Pin.Load):
		return fmt.Errorf("%w: CPU lists %q / %q: want taskset lists such as 0 or 0-1,3", ErrParams, c.Pin.Targets, c.Pin.Load)
	}
	for _, t := range c.Targets {
		if !slicesContains(AllTargets(), t) {
			return fmt.Errorf("%w: unknown target %q; valid targets are %s", ErrParams, t, strings.Join(AllTargets(), ", "))
		}
	}
	if c.Engine != "" {
		if _, err := engines.ParseKind(string(c.Engine)); err != nil {
			return fmt.Errorf("%w: engine: %w", ErrParams, err)
		}
	}
	if c.NagleStall && c.Engine != engines.LlamaCpp {
		return fmt.Errorf("%w: the nagle stall is a llama.cpp persona option; set engine llamacpp", ErrParams)
	}
	if c.Upstream != "" {
		host, port, err := net.SplitHostPort(c.Upstream)
		if err != nil {
			return fmt.Errorf("%w: upstream %q: %w", ErrParams, c.Upstream, err)
		}
		if p, err := strconv.Atoi(port); err != nil || p < 1 || p > 65535 {
			return fmt.Errorf("%w: upstream %q: port must be 1..65535", ErrParams, c.Upstream)
		}
		if ip := net.ParseIP(host); host != "localhost" && (ip == nil || !ip.IsLoopback()) {
			return fmt.Errorf("%w: upstream %q: the benchmark runs on loopback only", ErrParams, c.Upstream)
		}
	}
	return nil
}

// releaseBetweenSlices: the engine serves a bounded number of connections
// (engines.ConnPolicy.ServingConns, llama.cpp), so the load client closes
// its idle connections at the end of each target's turn.
func (c Config) releaseBetweenSlices() bool {
	if c.Engine == "" {
		return false
	}
	a, err := engines.For(c.Engine)
	return err == nil && a.Conn().ServingConns > 0
}

func slicesContains(list []string, s string) bool {
	for _, v := range list {
		if v == s {
			return true
		}
	}
	return false
}

// TargetResult is one target's measurements.
type TargetResult struct {
	Target string `json:"target"`
	// Skipped explains why the target was not measured (e.g. not
	// installed); the other fields are zero.
	Skipped string `json:"skipped,omitempty"`
	// Requests completed with status 200; Errors did not.
	Requests   int    `json:"requests"`
	Errors     int    `json:"errors"`
	FirstError string `json:"first_error,omitempty"`
	// Dropped counts open-loop sends skipped because Concurrency requests
	// were already outstanding (the target could not keep up).
	Dropped int           `json:"dropped"`
	Wall    time.Duration `json:"wall_ns"`
	// Throughput is completed requests per second.
	Throughput float64 `json:"throughput_rps"`
	// SliceRPS is the throughput of each of the target's slices, in
	// round order (only when the run had more than one round).
	SliceRPS []float64 `json:"slice_rps,omitempty"`
	// Latency is per request: from the send (the moment the request is
	// handed to the client, in both modes) to the last byte of the
	// response.
	Latency loadgen.Summary `json:"latency"`
	// Chunks is, in streaming mode, the arrival time of every SSE data
	// event counted from the request's send, over all requests.
	Chunks loadgen.Summary `json:"chunks"`
	// ResponseBytes is the mean response body size.
	ResponseBytes int `json:"response_bytes"`
	// Lag is, in open loop, how late each send left against its schedule
	// (the generator's own delay: a figure above the target's latency
	// means the generator, not the target, limited the run).
	Lag loadgen.Summary `json:"lag,omitzero"`
	// CPUs is the CPU list the target's process may run on ("" for the
	// embedded gateway and the in-process simulator: see Report.LoadCPUs).
	CPUs string `json:"cpus,omitempty"`
	// CPUPer100k is the target's own processes' CPU seconds (user +
	// system, all threads and workers) per 100,000 completed requests
	// over its measured slices; 0 when it is not a process of its own
	// (embedded gateway, in-process simulator). For direct it is the
	// backend's.
	CPUPer100k float64 `json:"cpu_s_per_100k,omitempty"`
	// RSS is the largest resident memory of the target's processes seen
	// at the end of a slice, bytes.
	RSS int64 `json:"rss_bytes,omitempty"`
	// AddedP50, AddedP99 (and AddedChunkP50 in streaming mode) are this
	// target's quantile minus the direct target's, from the same run.
	AddedP50      time.Duration `json:"added_p50_ns"`
	AddedP99      time.Duration `json:"added_p99_ns"`
	AddedChunkP50 time.Duration `json:"added_chunk_p50_ns"`
}

// Report is one overhead run.
type Report struct {
	Mode           Mode          `json:"mode"`
	RPS            int           `json:"rps,omitempty"`
	Concurrency    int           `json:"concurrency"`
	Duration       time.Duration `json:"duration_ns"`
	Slice          time.Duration `json:"slice_ns"`
	MaxRequests    int           `json:"max_requests"`
	Stream         bool          `json:"stream"`
	PromptBytes    int           `json:"prompt_bytes"`
	DecodePerToken time.Duration `json:"decode_per_token_ns"`
	Upstream       string        `json:"upstream"`
	Engine         string        `json:"engine,omitempty"`
	NagleStall     bool          `json:"nagle_stall,omitempty"`
	Backend        string        `json:"backend"`
	// LoadCPUs is the CPU list of the benchmark's own process (load
	// generator, embedded gateway, in-process simulator).
	LoadCPUs string    `json:"load_cpus"`
	Pin      Placement `json:"pin"`
	// ProxyWorkers is each proxy process's worker count (ProxyWorkers).
	ProxyWorkers int `json:"proxy_workers"`
	// AwakeCPUs lists the CPUs kept from halting by a SCHED_IDLE spinner
	// (Config.KeepCPUsAwake); empty when none was.
	AwakeCPUs []int          `json:"awake_cpus,omitempty"`
	Started   time.Time      `json:"started"`
	Partial   bool           `json:"partial"`
	Results   []TargetResult `json:"results"`
	// Paired compares each llmgw target with every other target round by
	// round (when the run had at least two rounds; see PairedRatio).
	Paired []PairedRatio `json:"paired,omitempty"`
	// AddedByRound compares each target's latency with direct's round by
	// round (when direct was measured in at least two rounds; see
	// AddedByRound).
	AddedByRound []AddedByRound `json:"added_by_round,omitempty"`
}

// Result returns target's result, or nil.
func (r *Report) Result(target string) *TargetResult {
	for i := range r.Results {
		if r.Results[i].Target == target {
			return &r.Results[i]
		}
	}
	return nil
}

// Run starts the upstream (unless cfg.Upstream names one), the embedded
// gateway and the installed reference proxies, probes every target with
// one request, and only then loads each target in turn. Every process and
// listener it starts is stopped before it returns. When ctx ends mid-run
// it returns the partial report (Partial set) and an error wrapping ctx's
// error.
func Run(ctx context.Context, cfg Config) (*Report, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if cfg.Model == "" {
		cfg.Model = "m"
	}
	if cfg.Backend == "" {
		cfg.Backend = BackendSim
	}
	var awake []int
	if cfg.KeepCPUsAwake {
		// Before pinSelf: the spinners cover every CPU, not only the
		// load generator's.
		cpus, stop, err := keepAwake(ctx)
		if err != nil {
			return nil, err
		}
		defer stop()
		awake = cpus
	}
	if cfg.Pin.Load != "" {
		if err := pinSelf(cfg.Pin.Load); err != nil {
			return nil, err
		}
	}
	rep := &Report{Mode: cfg.Mode, Concurrency: cfg.Concurrency, Duration: cfg.Duration, Slice: cfg.Slice, MaxRequests: cfg.MaxRequests,
		Stream: cfg.Stream, PromptBytes: cfg.PromptBytes, DecodePerToken: cfg.DecodePerToken, Upstream: cfg.Upstream,
		Engine: string(cfg.Engine), NagleStall: cfg.NagleStall, Backend: cfg.Backend, LoadCPUs: cpusAllowed(os.Getpid()), Pin: cfg.Pin, ProxyWorkers: ProxyWorkers,
		AwakeCPUs: awake, Started: time.Now().UTC()}
	if cfg.Mode == OpenLoop {
		rep.RPS = cfg.RPS
	}
	type target struct {
		name, addr, skipped string
		pgid                int // process group charged for CPU and RSS; 0: none of its own
	}
	upstream := cfg.Upstream
	direct := target{name: Direct}
	switch {
	case upstream != "":
		rep.Backend = "external"
	case cfg.Backend == BackendFixed:
		p, err := startFixedBackend(ctx, cfg.Pin)
		if err != nil {
			return nil, err
		}
		defer p.stop()
		upstream, direct.pgid = p.addr, p.cmd.Process.Pid
		rep.Upstream = fmt.Sprintf("fixed %d-byte answer (nginx) %s", FixedAnswerBytes, upstream)
	default:
		engine := cfg.Engine
		if engine == "" {
			engine = engines.VLLM
		}
		s, err := sim.Start(ctx, sim.Config{Engine: engine, Model: cfg.Model, KVEvents: sim.KVEventsOff, DecodePerToken: cfg.DecodePerToken, NagleStall: cfg.NagleStall})
		if err != nil {
			return nil, fmt.Errorf("overhead: start simulator: %w", err)
		}
		defer s.Close()
		upstream = s.Addrs().HTTP
		rep.Upstream = "sim " + upstream
	}
	direct.addr = upstream
	body := requestBody(cfg)
	if err := probe(ctx, upstream, body, cfg.Stream); err != nil {
		return nil, fmt.Errorf("%w: upstream %s: %w", ErrUnreachable, upstream, err)
	}
	targets := []target{direct}
	for _, name := range cfg.Targets {
		switch name {
		case LLMGWEmbedded:
			addr, stop, err := startGateway(ctx, upstream, cfg.Engine, cfg.Logger)
			if err != nil {
				return nil, err
			}
			defer stop()
			targets = append(targets, target{name: name, addr: addr})
		case LLMGW:
			if cfg.GatewayBinary == "" {
				targets = append(targets, target{name: name, skipped: "no llmgw binary given"})
				continue
			}
			p, err := startLLMGWProcess(ctx, cfg.GatewayBinary, upstream, cfg.Engine, cfg.Pin)
			if err != nil {
				return nil, err
			}
			defer p.stop()
			targets = append(targets, target{name: name, addr: p.addr, pgid: p.cmd.Process.Pid})
		case Nginx, NginxNoKeepAlive, HAProxy:
			p, err := startProxy(ctx, name, upstream, cfg.Pin)
			if errors.Is(err, ErrNotInstalled) {
				targets = append(targets, target{name: name, skipped: "not installed (make bench-deps)"})
				continue
			}
			if err != nil {
				return nil, err
			}
			defer p.stop()
			targets = append(targets, target{name: name, addr: p.addr, pgid: p.cmd.Process.Pid})
		}
	}
	for _, t := range targets {
		if t.skipped != "" {
			continue
		}
		if err := probe(ctx, t.addr, body, cfg.Stream); err != nil {
			return nil, fmt.Errorf("%w: %s at %s: %w", ErrUnreachable, t.name, t.addr, err)
		}
	}
	// Targets take turns in slices of cfg.Slice (the whole Duration when
	// 0), so a change in the machine's background load during the run
	// falls on every target alike rather than on whichever ran then.
	slice := cfg.Slice
	if slice <= 0 || slice > cfg.Duration {
		slice = cfg.Duration
	}
	accs := make([]*samples, len(targets))
	for i := range accs {
		accs[i] = &samples{}
	}
	defer func() {
		for _, a := range accs {
			if a.client != nil {
				a.client.CloseIdleConnections()
			}
		}
	}()
	for round := 0; ctx.Err() == nil; round++ {
		progressed := false
		for i, t := range targets {
			a := accs[i]
			if t.skipped != "" || a.wall >= cfg.Duration || a.ok+a.errs >= cfg.MaxRequests || ctx.Err() != nil {
				continue
			}
			if round == 0 && cfg.Progress != nil {
				cfg.Progress(t.name)
			}
			d := min(slice, cfg.Duration-a.wall)
			var before groupUsage
			if t.pgid != 0 {
				before, _ = readGroupUsage(t.pgid)
			}
			ok0, wall0, lat0 := a.ok, a.wall, len(a.lat)
			load(ctx, cfg, t.addr, body, a, d, cfg.MaxRequests-a.ok-a.errs)
			// The slice's own quantiles (Summarize sorts the slice's
			// part of a.lat in place, which the run's summary does not
			// mind).
			q := loadgen.Summarize(a.lat[lat0:])
			a.turns = append(a.turns, turn{ok: a.ok - ok0, wall: a.wall - wall0, p50: q.P50, p99: q.P99})
			if t.pgid != 0 {
				// Read after the slice's last answer: the CPU its
				// requests cost, nothing from the other targets' turns.
				if after, err := readGroupUsage(t.pgid); err == nil {
					a.cpu += after.cpu - before.cpu
					a.rss = max(a.rss, after.rss)
				} else if a.usageErr == "" {
					a.usageErr = err.Error()
				}
			}
			progressed = true
		}
		if !progressed {
			break
		}
	}
	if ctx.Err() != nil {
		rep.Partial = true
	}
	for i, t := range targets {
		if t.skipped != "" {
			rep.Results = append(rep.Results, TargetResult{Target: t.name, Skipped: t.skipped})
			continue
		}
		res := accs[i].result()
		res.Target = t.name
		if t.pgid != 0 {
			res.CPUs = cpusAllowed(t.pgid)
		}
		rep.Results = append(rep.Results, res)
	}
	names, turns, skipped := make([]string, len(targets)), make([][]turn, len(targets)), make([]bool, len(targets))
	for i, t := range targets {
		names[i], turns[i], skipped[i] = t.name, accs[i].turns, t.skipped != ""
	}
	rep.Paired = pairedRatios(names, turns, skipped, slice)
	rep.AddedByRound = addedByRound(names, turns, skipped, slice)
	if d := rep.Result(Direct); d != nil {
		for i := range rep.Results {
			r := &rep.Results[i]
			if r.Skipped != "" || r.Requests == 0 {
				continue
			}
			r.AddedP50, r.AddedP99 = r.Latency.P50-d.Latency.P50, r.Latency.P99-d.Latency.P99
			if cfg.Stream {
				r.AddedChunkP50 = r.Chunks.P50 - d.Chunks.P50
			}
		}
	}
	if rep.Partial {
		return rep, fmt.Errorf("overhead: interrupted: %w", ctx.Err())
	}
	return rep, nil
}

// startGateway runs an embedded llmgw with one round-robin rule over
// upstream (probes off, so the request path is all that is measured).
func startGateway(ctx context.Context, upstream string, engine engines.Kind, log *slog.Logger) (string, func(), error) {
	host, port, err := net.SplitHostPort(upstream)
	if err != nil {
		return "", nil, fmt.Errorf("overhead: upstream %q: %w", upstream, err)
	}
	if host == "localhost" {
		host = "127.0.0.1"
	}
	r, err := rule.Decode([]byte(benchRule(host, port, engine)))
	if err != nil {
		return "", nil, fmt.Errorf("overhead: gateway rule: %w", err)
	}
	dir, err := os.MkdirTemp("", "llmgw-bench-gw-")
	if err != nil {
		return "", nil, fmt.Errorf("overhead: gateway state dir: %w", err)
	}
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	gw, err := gateway.New(gateway.Config{Listen: "127.0.0.1:0", Admin: "127.0.0.1:0", StateDir: dir, Logger: log})
	if err != nil {
		os.RemoveAll(dir)
		return "", nil, fmt.Errorf("overhead: gateway: %w", err)
	}
	stop := func() { _ = gw.Close(); os.RemoveAll(dir) }
	if err := gw.Start(ctx); err != nil {
		os.RemoveAll(dir)
		return "", nil, fmt.Errorf("overhead: gateway start: %w", err)
	}
	if _, err := gw.Apply(r, true); err != nil {
		stop()
		return "", nil, fmt.Errorf("overhead: gateway rule: %w", err)
	}
	return gw.Addr(), stop, nil
}

// benchRule is the llmgw targets' rule: one round-robin endpoint, probes
// off, and the engine named so that llmgw handles its connections as that
// engine needs.
func benchRule(host, port string, engine engines.Kind) string {
	e := ""
	if engine != "" {
		e = "kvEngineType: " + string(engine) + "\n"
	}
	return fmt.Sprintf("name: bench\nmodel_name: \"\"\nsel: 0\nprobe: {disabled: true}\n%sendpoints:\n  - {id: w1, endpointIP: %s, targetPort: %s}\n", e, host, port)
}
