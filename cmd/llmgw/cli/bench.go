package cli

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/llmgw/llmgw/bench/overhead"
	"github.com/llmgw/llmgw/bench/routing"
	"github.com/llmgw/llmgw/engines"
)

func newBenchCmd(io *IOStreams) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "bench",
		Short: "Measure gateway overhead and routing quality, side by side",
		Long: `Measure the two numbers a cache-aware gateway is chosen for, reproducibly,
on this machine, with simulated engines on loopback:

  llmgw bench overhead   what llmgw adds per request (and per streamed chunk),
                         next to the engine reached directly, nginx and HAProxy
  llmgw bench routing    what cache-aware routing saves: prefix-cache hit ratio,
                         TTFT, throughput and balance per routing policy

Both runs are bounded and stop by themselves; Ctrl-C prints the partial
results.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return usageErrorf("bench needs a subcommand: overhead or routing")
		},
	}
	cmd.AddCommand(newBenchOverheadCmd(io, nil), newBenchRoutingCmd(io, nil))
	return cmd
}

// BenchOverheadOptions are the inputs of `llmgw bench overhead`.
type BenchOverheadOptions struct {
	IO             *IOStreams
	Mode           string
	RPS            int
	Concurrency    int
	Duration       time.Duration
	Slice          time.Duration
	Requests       int
	Warmup         int
	Stream         bool
	PromptBytes    int
	MaxTokens      int
	DecodePerToken time.Duration
	Upstream       string
	Model          string
	Targets        string
	Engine         string
	NagleStall     bool
	Backend        string
	PinTargets     string
	PinLoad        string
	KeepCPUsAwake  bool
	Format         string // -o: table (the Markdown report), json or yaml
	JSONFile       string
}

func newBenchOverheadCmd(io *IOStreams, runF func(context.Context, *BenchOverheadOptions) error) *cobra.Command {
	opts := &BenchOverheadOptions{IO: io}
	cmd := &cobra.Command{
		Use:   "overhead",
		Short: "Latency and throughput added by llmgw, nginx and HAProxy over a direct engine",
		Long: `Send the same chat completions to a backend directly, through llmgw as
its own process (this binary's serve, one round-robin rule, probes off, run
as nginx and HAProxy run), and through nginx and HAProxy (when installed:
make bench-deps), in one run; every proxy process runs the same number of
workers (nginx worker_processes, HAProxy nbthread, llmgw --procs: 2), and report requests/s, p50/p90/p99 latency,
the latency each proxy adds over the direct baseline, and each target
process's CPU seconds per 100k requests, resident memory and CPU placement.
Target llmgw-embedded (only when named) runs the gateway inside the
benchmark's own process, sharing the load generator's runtime.

--backend sim (default) is the built-in simulator, inside the benchmark's
process; --backend fixed is nginx as its own process answering a fixed
1 KiB completion (the cheapest backend, so a proxy's cost is not diluted).
--pin-targets and --pin-load place the target processes (and the fixed
backend) and the benchmark's process on CPUs, as taskset lists.
--keep-cpus-awake runs a lowest-priority (SCHED_IDLE) spinner on each CPU
the benchmark may use, for the whole run, so that no CPU halts between
requests: on a VM whose idle vCPUs halt, each wake-up costs tens of
microseconds, which at low concurrency sets the latency and favours
whichever proxy sends the peer a packet early (a connect's SYN wakes the
engine's CPU ahead of the request).

--mode open sends --rps requests per second whatever happens (latency counts
from each request's actual send, and the generator's lag behind its
schedule is reported beside it; sends are dropped and counted when
--concurrency requests are already outstanding); --mode closed keeps
--concurrency clients busy. --stream sends streaming requests and also
reports when SSE chunks arrive, and the added latency per chunk.

Each target gets at most --duration and --requests, in turns of --slice. With
two rounds of turns or more the report also gives each target's throughput
per slice and compares llmgw with every other target round by round (the
two turns of a round run under nearly the same machine state): the median
of the rounds' ratios and, from six rounds, a distribution-free 95%
confidence interval for it, which tells a real difference from the run's
own variation (--duration 20s --slice 1s gives 20 rounds). It also gives
every target's added p50 and p99 round by round: each round's quantile less
direct's in the same round (rounds of 100 requests or more), their median
and interval, which one pause of the machine cannot move the way it moves a
whole run's p99. Every target is probed
with one request before any load is sent; an unreachable one ends the run.`,
		Example: `  llmgw bench overhead --backend fixed --pin-targets 0 --pin-load 1 --concurrency 32
  llmgw bench overhead --mode open --rps 5000 --duration 10s
  llmgw bench overhead --mode closed --concurrency 32 --stream --decode-per-token 200us
  llmgw bench overhead --upstream 127.0.0.1:8000 --model Qwen/Qwen3-0.6B --targets llmgw-embedded`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if runF != nil {
				return runF(cmd.Context(), opts)
			}
			return benchOverheadRun(cmd.Context(), opts)
		},
	}
	f := cmd.Flags()
	f.StringVar(&opts.Mode, "mode", "closed", "load shape: open (fixed --rps) or closed (fixed --concurrency)")
	f.IntVar(&opts.RPS, "rps", 5000, "open loop: requests per second")
	f.IntVar(&opts.Concurrency, "concurrency", 32, "closed loop: clients; open loop: most outstanding requests")
	f.DurationVar(&opts.Duration, "duration", 5*time.Second, "longest measured load per target")
	f.DurationVar(&opts.Slice, "slice", time.Second, "targets take turns in slices this long, so background load hits all alike (0: one target after the other)")
	f.IntVar(&opts.Requests, "requests", 100000, "most measured requests per target")
	f.IntVar(&opts.Warmup, "warmup", 500, "unmeasured requests sent to each target first")
	f.BoolVar(&opts.Stream, "stream", false, "streaming requests; also report per-chunk arrival")
	f.IntVar(&opts.PromptBytes, "prompt-bytes", 900, "size of each request's user message")
	f.IntVar(&opts.MaxTokens, "max-tokens", 32, "completion cap per request")
	f.DurationVar(&opts.DecodePerToken, "decode-per-token", 0, "simulated engine's delay per generated token (spaces the stream's chunks)")
	f.StringVar(&opts.Upstream, "upstream", "", "host:port of a running loopback OpenAI-compatible engine to use instead of the built-in simulator")
	f.StringVar(&opts.Model, "model", "m", "model name sent in requests")
	f.StringVar(&opts.Targets, "targets", "llmgw,nginx,haproxy", "comma-separated targets besides the direct baseline: llmgw (this binary's serve as a child process), llmgw-embedded (in the benchmark's process), nginx, nginx-nokeepalive (a new upstream connection per request), haproxy")
	f.StringVar(&opts.Backend, "backend", "sim", "sim (built-in simulator, in process) or fixed (nginx answering a fixed 1 KiB completion, its own process); ignored with --upstream")
	f.StringVar(&opts.PinTargets, "pin-targets", "", "CPUs (taskset list) for the target processes and the fixed backend; empty: unpinned")
	f.StringVar(&opts.PinLoad, "pin-load", "", "CPUs (taskset list) for the benchmark's own process (load generator, embedded gateway, simulator); empty: unpinned")
	f.BoolVar(&opts.KeepCPUsAwake, "keep-cpus-awake", false, "run a SCHED_IDLE spinner on each CPU the benchmark may use during the run, so that no CPU halts between requests (Linux; see above)")
	f.StringVar(&opts.Engine, "engine", "", "simulated engine persona and the llmgw rule's kvEngineType: vllm, sglang, trtllm or llamacpp (empty: vllm)")
	completeFlag(cmd, "engine", completeEngines())
	f.BoolVar(&opts.NagleStall, "nagle-stall", false, "with --engine llamacpp: the persona writes like llama-server (Nagle on, head and body apart): ~40 ms per answer on a reused connection for a client that delays its ACKs")
	addOutputFlag(cmd, &opts.Format, outputTable) // table: the Markdown report
	deprecatedFormatFlag(cmd, io, &opts.Format, map[string]string{"markdown": outputTable})
	f.StringVar(&opts.JSONFile, "json", "", "also write the JSON report to this file")
	return cmd
}

func (o *BenchOverheadOptions) config() (overhead.Config, error) {
	cfg := overhead.Config{Mode: overhead.Mode(o.Mode), RPS: o.RPS, Concurrency: o.Concurrency, Duration: o.Duration, Slice: o.Slice,
		MaxRequests: o.Requests, Warmup: o.Warmup, Stream: o.Stream, PromptBytes: o.PromptBytes, MaxTokens: o.MaxTokens,
		DecodePerToken: o.DecodePerToken, Upstream: o.Upstream, Model: o.Model, Engine: engines.Kind(o.Engine), NagleStall: o.NagleStall,
		Backend: o.Backend, Pin: overhead.Placement{Targets: o.PinTargets, Load: o.PinLoad}, KeepCPUsAwake: o.KeepCPUsAwake}
	for _, t := range strings.Split(o.Targets, ",") {
		if t = strings.TrimSpace(t); t != "" && t != overhead.Direct {
			cfg.Targets = append(cfg.Targets, t)
		}
	}
	if len(cfg.Targets) == 0 {
		return cfg, usageErrorf("--targets: name at least one of llmgw, llmgw-embedded, nginx, nginx-nokeepalive, haproxy")
	}
	if err := checkOutput(o.Format); err != nil {
		return cfg, err
	}
	if err := cfg.Validate(); err != nil {
		return cfg, usageErrorf("%s", flagWording(err.Error()))
	}
	return cfg, nil
}

// flagWording strips a library's package prefix from a parameter error so
// the message reads as advice about the command's flags.
func flagWording(msg string) string {
	for _, p := range []string{"overhead: invalid parameters: ", "routing: invalid parameters: "} {
		msg = strings.TrimPrefix(msg, p)
	}
	return "invalid parameters: " + msg
}

func benchOverheadRun(ctx context.Context, o *BenchOverheadOptions) error {
	cfg, err := o.config()
	if err != nil {
		return err
	}
	cfg.Progress = func(target string) { fmt.Fprintf(o.IO.ErrOut, "measuring %s...\n", target) }
	if self, err := os.Executable(); err == nil && slices.Contains(cfg.Targets, overhead.LLMGW) {
		cfg.GatewayBinary = self
	}
	rep, runErr := overhead.Run(ctx, cfg)
	if rep == nil {
		return runErr
	}
	if err := writeOverhead(o, rep); err != nil {
		return errors.Join(runErr, err)
	}
	return runErr
}

func writeOverhead(o *BenchOverheadOptions, rep *overhead.Report) error {
	if o.JSONFile != "" {
		f, err := os.Create(o.JSONFile)
		if err != nil {
			return fmt.Errorf("bench: --json: %w", err)
		}
		werr := overhead.WriteJSON(f, rep)
		if err := errors.Join(werr, f.Close()); err != nil {
			return fmt.Errorf("bench: --json %s: %w", o.JSONFile, err)
		}
	}
	if o.Format != outputTable {
		return writeDoc(o.IO.Out, o.Format, rep)
	}
	return overhead.WriteMarkdown(o.IO.Out, rep)
}

// BenchRoutingOptions are the inputs of `llmgw bench routing`.
type BenchRoutingOptions struct {
	IO              *IOStreams
	Workload        string
	Policies        string
	Requests        int
	Seed            uint64
	Endpoints       int
	Concurrency     int
	CacheBlocks     int
	PrefillPerToken time.Duration
	DecodePerToken  time.Duration
	SimConcurrency  int
	MaxTokens       int
	OutDir          string
	Format          string // -o: table (the Markdown report), json or yaml
}

func newBenchRoutingCmd(io *IOStreams, runF func(context.Context, *BenchRoutingOptions) error) *cobra.Command {
	opts := &BenchRoutingOptions{IO: io}
	cmd := &cobra.Command{
		Use:   "routing",
		Short: "Prefix-cache hit ratio, TTFT, throughput and balance per routing policy",
		Long: `Replay a seeded workload against --endpoints simulated vLLM engines with
bounded prefix caches and a latency model, once per policy, each on fresh
engines (cold caches):

  rr               round robin (sel 0)
  least-inflight   least requests in flight (sel 4)
  chwbl            consistent hashing with bounded loads (sel 8)
  kv-exact         KV-exact routing on the engines' KV events (kvExactMode 3)
  oracle           an exact model of every engine's cache and load, no delay,
                   no gateway: the longest cached prefix among engines with a
                   free serving slot
  oracle-prefix    the same model, always the longest cached prefix (the hit
                   ratio's bound when no block is common to all prompts)

Workloads: shared-prefix (system prompts x many users), multi-turn (growing
chats), long-doc (question answering over long documents), hot-prefix
(Zipf-skewed prompt popularity), random (unique prompts, the control), or all.

Reported per policy: the engine-reported prefix-cache hit ratio (cached /
prompt tokens from the engines' usage), TTFT p50/p99 measured by the client
on streaming requests (send to first generated text), completed requests per
second, and load imbalance (max over mean of each endpoint's in-flight count,
sampled every millisecond). The Markdown table goes to stdout; with --out DIR
the JSON, Markdown and a PNG chart are written there too.`,
		Example: `  llmgw bench routing --workload shared-prefix
  llmgw bench routing --workload all --requests 800 --out /tmp/routing
  llmgw bench routing --workload hot-prefix --policies kv-exact,oracle --seed 7`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if runF != nil {
				return runF(cmd.Context(), opts)
			}
			return benchRoutingRun(cmd.Context(), opts)
		},
	}
	f := cmd.Flags()
	f.StringVar(&opts.Workload, "workload", "shared-prefix", "shared-prefix, multi-turn, long-doc, hot-prefix, random, or all")
	f.StringVar(&opts.Policies, "policies", "all", "comma-separated: rr, least-inflight, chwbl, kv-exact, oracle, oracle-prefix (or all)")
	f.IntVar(&opts.Requests, "requests", 400, "requests per workload and policy")
	f.Uint64Var(&opts.Seed, "seed", 42, "workload seed: equal seeds replay identical requests")
	f.IntVar(&opts.Endpoints, "endpoints", 4, "simulated engines")
	f.IntVar(&opts.Concurrency, "concurrency", 8, "client sessions in flight")
	f.IntVar(&opts.CacheBlocks, "cache-blocks", 256, "prefix-cache capacity of each engine, in 16-token blocks")
	f.DurationVar(&opts.PrefillPerToken, "prefill-per-token", 50*time.Microsecond, "simulated cost of each uncached prompt token")
	f.DurationVar(&opts.DecodePerToken, "decode-per-token", 500*time.Microsecond, "simulated cost of each generated token")
	f.IntVar(&opts.SimConcurrency, "sim-concurrency", 4, "requests each engine serves at once (the rest queue); 0 = unbounded")
	f.IntVar(&opts.MaxTokens, "max-tokens", 4, "completion cap per request")
	f.StringVar(&opts.OutDir, "out", "", "directory for routing.json, routing.md and routing.png")
	addOutputFlag(cmd, &opts.Format, outputTable) // table: the Markdown report
	deprecatedFormatFlag(cmd, io, &opts.Format, map[string]string{"markdown": outputTable})
	return cmd
}

func (o *BenchRoutingOptions) configs() ([]routing.Config, error) {
	if err := checkOutput(o.Format); err != nil {
		return nil, err
	}
	workloads := routing.Workloads()
	if o.Workload != "all" {
		w, err := routing.ParseWorkload(o.Workload)
		if err != nil {
			return nil, usageErrorf("--workload: %s (or all)", flagWording(err.Error()))
		}
		workloads = []routing.Workload{w}
	}
	policies, err := routing.ParsePolicies(o.Policies)
	if err != nil {
		return nil, usageErrorf("--policies: %s", flagWording(err.Error()))
	}
	var out []routing.Config
	for _, w := range workloads {
		cfg := routing.Config{Workload: w, Shape: routing.DefaultShape(w, o.Requests), Seed: o.Seed, Policies: policies,
			Endpoints: o.Endpoints, Concurrency: o.Concurrency, CacheBlocks: o.CacheBlocks,
			PrefillPerToken: o.PrefillPerToken, DecodePerToken: o.DecodePerToken, SimConcurrency: o.SimConcurrency,
			MaxTokens: o.MaxTokens}
		if err := cfg.Validate(); err != nil {
			return nil, usageErrorf("%s", flagWording(err.Error()))
		}
		out = append(out, cfg)
	}
	if o.OutDir != "" {
		if err := os.MkdirAll(o.OutDir, 0o755); err != nil {
			return nil, usageErrorf("--out: %v", err)
		}
	}
	return out, nil
}

func benchRoutingRun(ctx context.Context, o *BenchRoutingOptions) error {
	cfgs, err := o.configs()
	if err != nil {
		return err
	}
	var reports []*routing.Report
	var runErr error
	for _, cfg := range cfgs {
		fmt.Fprintf(o.IO.ErrOut, "workload %s: %s...\n", cfg.Workload, joinPolicies(cfg.Policies))
		rep, err := routing.Run(ctx, cfg)
		if rep != nil && len(rep.Results) > 0 {
			reports = append(reports, rep)
		}
		if err != nil {
			runErr = err
			break
		}
	}
	if len(reports) == 0 {
		return runErr
	}
	if err := writeRouting(o, reports); err != nil {
		return errors.Join(runErr, err)
	}
	return runErr
}

func joinPolicies(ps []routing.Policy) string {
	s := make([]string, len(ps))
	for i, p := range ps {
		s[i] = string(p)
	}
	return strings.Join(s, ", ")
}

func writeRouting(o *BenchRoutingOptions, reports []*routing.Report) error {
	if o.OutDir != "" {
		files := []struct {
			name  string
			write func(*os.File) error
		}{
			{"routing.json", func(f *os.File) error { return routing.WriteJSON(f, reports) }},
			{"routing.md", func(f *os.File) error { return routing.WriteMarkdown(f, reports) }},
			{"routing.png", func(f *os.File) error { return routing.WritePNG(f, reports) }},
		}
		for _, file := range files {
			path := filepath.Join(o.OutDir, file.name)
			f, err := os.Create(path)
			if err != nil {
				return fmt.Errorf("bench: %w", err)
			}
			werr := file.write(f)
			if err := errors.Join(werr, f.Close()); err != nil {
				return fmt.Errorf("bench: write %s: %w", path, err)
			}
		}
		fmt.Fprintf(o.IO.ErrOut, "wrote routing.json, routing.md and routing.png in %s\n", o.OutDir)
	}
	if o.Format != outputTable {
		return writeDoc(o.IO.Out, o.Format, reports)
	}
	return routing.WriteMarkdown(o.IO.Out, reports)
}
