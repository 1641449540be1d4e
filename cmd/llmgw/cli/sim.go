package cli

import (
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/spf13/cobra"

	"github.com/llmgw/llmgw/engines"
	"github.com/llmgw/llmgw/engines/sim"
)

// SimOptions are the inputs of `llmgw sim`.
type SimOptions struct {
	IO                *IOStreams
	Engine            string
	Listen            string
	Model             string
	Role              string
	Receipts          bool
	BlockSize         int
	HashAlgo          string
	HashSeed          string
	KVEvents          string
	EventEncoding     string
	CacheBlocks       int
	PrefillUSPerToken int
	DecodeUSPerToken  int
	MaxConcurrency    int
	Tokenizer         string
	Seed              int64
	DPRanks           int
	BootstrapListen   string
	RendezvousTimeout time.Duration
	LoadingFor        time.Duration
	IdleTimeout       time.Duration
	NagleStall        bool
	Metrics           bool
	Slots             bool
	Embeddings        bool
}

func newSimCmd(io *IOStreams) *cobra.Command {
	opts := &SimOptions{IO: io}
	cmd := &cobra.Command{
		Use:   "sim",
		Short: "Run an engine simulator (vLLM, SGLang, TensorRT-LLM or llama.cpp)",
		Long: `Run a simulated inference engine that speaks the real engine's wire contract:
its OpenAI-compatible and native endpoints, error bodies, SSE framing and
metric names; its KV-cache events (vLLM and SGLang over ZeroMQ with replay,
TensorRT-LLM through POST /kv_cache_events); its prefill/decode hand-off.

A bounded LRU prefix cache keyed by the engine's own block hashes decides
cached_tokens, and a latency model charges --prefill-us-per-token for every
uncached prompt token and --decode-us-per-token for every generated token,
with at most --max-concurrency requests served at once (the rest queue). So a
cache-aware router shows up as lower time to first token.

At start it prints one JSON line with the bound addresses, e.g.
  {"http":"127.0.0.1:41234","events":"tcp://127.0.0.1:40111","replay":"tcp://127.0.0.1:40112","bootstrap":""}
so that --listen 127.0.0.1:0 can be used by scripts. It serves until
interrupted (SIGINT or SIGTERM).

Control endpoints on the HTTP address (none with --receipts=false):
  GET  /_sim/receipts   one receipt per request (request id, nonce, tokens, cache hits, P/D fields)
  POST /_sim/faults     e.g. {"health_fail":true}, {"error_rate":0.1}, {"added_latency_ms":50},
                        {"crash_after_chunks":3}, {"error_after_chunks":3},
                        {"drop_events":2}, {"seq_gap":5},
                        {"restart_publisher":true}, {"reset":true}`,
		Example: `  # a vLLM worker with KV events on a kernel-chosen port
  llmgw sim --engine vllm --listen 127.0.0.1:0

  # an SGLang prefill/decode pair
  llmgw sim --engine sglang --role prefill --listen 127.0.0.1:30000 --bootstrap-listen 127.0.0.1:8998
  llmgw sim --engine sglang --role decode --listen 127.0.0.1:30001

  # slow prefill, so that cache hits are visible in TTFT
  llmgw sim --engine vllm --prefill-us-per-token 200 --decode-us-per-token 20000 --max-concurrency 8`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return simRun(cmd, opts)
		},
	}
	f := cmd.Flags()
	f.StringVar(&opts.Engine, "engine", "", "engine persona: vllm, sglang, trtllm or llamacpp (required)")
	completeFlag(cmd, "engine", completeEngines())
	f.StringVar(&opts.Listen, "listen", "127.0.0.1:0", "HTTP address (host:port; port 0 picks a free one)")
	f.StringVar(&opts.Model, "model", "Qwen/Qwen3-0.6B", "served model name")
	f.StringVar(&opts.Role, "role", sim.RoleBoth, "disaggregation role: both, prefill or decode")
	f.IntVar(&opts.BlockSize, "block-size", 0, "tokens per KV block (0 = engine default: 16; trtllm 32)")
	f.StringVar(&opts.HashAlgo, "hash-algo", "", "vLLM prefix-caching hash: sha256_cbor (default) or xxhash_cbor; other engines use their own")
	f.StringVar(&opts.HashSeed, "hash-seed", "0", "vLLM PYTHONHASHSEED that roots the block-hash chain")
	f.StringVar(&opts.KVEvents, "kv-events", "", `ZMQ PUB endpoint for vLLM/SGLang KV events ("" = tcp://127.0.0.1:0, "off" disables)`)
	f.StringVar(&opts.EventEncoding, "event-encoding", "", "KV event layout: array or map (default: map for vllm, array for sglang)")
	f.IntVar(&opts.CacheBlocks, "cache-blocks", 4096, "prefix-cache capacity in blocks (LRU; evictions are published)")
	f.IntVar(&opts.PrefillUSPerToken, "prefill-us-per-token", 0, "simulated prefill cost per uncached prompt token, microseconds")
	f.IntVar(&opts.DecodeUSPerToken, "decode-us-per-token", 0, "simulated decode cost per generated token, microseconds")
	f.IntVar(&opts.MaxConcurrency, "max-concurrency", 0, "requests served at once; the rest queue (0 = unbounded)")
	f.StringVar(&opts.Tokenizer, "tokenizer", "", "the model's tokenizer: a tokenizer.json or .gguf path, or a models directory holding the model's snapshot (\"\" = the embedded Qwen3 tokenizer)")
	f.Int64Var(&opts.Seed, "seed", 0, "seed of the deterministic generated text")
	f.IntVar(&opts.DPRanks, "dp-ranks", 1, "data-parallel ranks, each with its own prefix cache and KV event publisher (ports offset by rank)")
	f.StringVar(&opts.BootstrapListen, "bootstrap-listen", "127.0.0.1:0", "SGLang prefill bootstrap server address")
	f.DurationVar(&opts.RendezvousTimeout, "rendezvous-timeout", 20*time.Second, "how long a SGLang P/D leg waits for its peer")
	f.BoolVar(&opts.Receipts, "receipts", true, "serve the /_sim/* control endpoints (receipts, faults, addresses); false makes the simulator as silent as a real engine")
	f.DurationVar(&opts.LoadingFor, "loading-for", 0, `llama.cpp only: answer "Loading model" (503) for this long after start`)
	f.DurationVar(&opts.IdleTimeout, "idle-timeout", 0, "llama.cpp only: close idle keep-alive connections after this long (0 = the engine's 5s)")
	f.BoolVar(&opts.Metrics, "metrics", false, "llama.cpp only: serve /metrics, as llama-server --metrics (without it: 501); other personas always serve it")
	f.BoolVar(&opts.Slots, "slots", false, "llama.cpp only: serve /slots, as llama-server --slots (without it: 501)")
	f.BoolVar(&opts.Embeddings, "embeddings", false, "llama.cpp only: embeddings mode, as llama-server --embeddings --pooling mean (completions answer 501)")
	f.BoolVar(&opts.NagleStall, "nagle-stall", false, "llama.cpp only: write like llama-server (Nagle's algorithm on, a non-streamed answer's head and body in two writes), so a client that delays its ACKs waits ~40 ms for each answer on a reused connection")
	return cmd
}

// simConfig validates the flags and builds the simulator's configuration.
func simConfig(opts *SimOptions) (sim.Config, error) {
	if opts.Engine == "" {
		return sim.Config{}, usageErrorf("--engine is required: one of vllm, sglang, trtllm, llamacpp")
	}
	kind, err := engines.ParseKind(opts.Engine)
	if err != nil {
		return sim.Config{}, usageErrorf("--engine: %w", err)
	}
	for name, v := range map[string]int{
		"--block-size": opts.BlockSize, "--cache-blocks": opts.CacheBlocks, "--prefill-us-per-token": opts.PrefillUSPerToken,
		"--decode-us-per-token": opts.DecodeUSPerToken, "--max-concurrency": opts.MaxConcurrency, "--dp-ranks": opts.DPRanks,
	} {
		if v < 0 {
			return sim.Config{}, usageErrorf("%s %d: must not be negative", name, v)
		}
	}
	return sim.Config{
		Engine:            kind,
		Listen:            opts.Listen,
		Model:             opts.Model,
		Role:              opts.Role,
		Silent:            !opts.Receipts,
		BlockSize:         opts.BlockSize,
		HashAlgo:          opts.HashAlgo,
		HashSeed:          opts.HashSeed,
		KVEvents:          opts.KVEvents,
		EventEncoding:     opts.EventEncoding,
		CacheBlocks:       opts.CacheBlocks,
		PrefillPerToken:   time.Duration(opts.PrefillUSPerToken) * time.Microsecond,
		DecodePerToken:    time.Duration(opts.DecodeUSPerToken) * time.Microsecond,
		MaxConcurrency:    opts.MaxConcurrency,
		Tokenizer:         opts.Tokenizer,
		Seed:              opts.Seed,
		DPRanks:           opts.DPRanks,
		BootstrapListen:   opts.BootstrapListen,
		RendezvousTimeout: opts.RendezvousTimeout,
		LoadingFor:        opts.LoadingFor,
		IdleTimeout:       opts.IdleTimeout,
		NagleStall:        opts.NagleStall,
		EnableMetrics:     opts.Metrics,
		EnableSlots:       opts.Slots,
		Embeddings:        opts.Embeddings,
	}, nil
}

func simRun(cmd *cobra.Command, opts *SimOptions) error {
	cfg, err := simConfig(opts)
	if err != nil {
		return err
	}
	ctx := cmd.Context()
	s, err := sim.Start(ctx, cfg)
	if errors.Is(err, sim.ErrConfig) {
		return &UsageError{Err: err}
	}
	if err != nil {
		return err
	}
	line, err := json.Marshal(s.Addrs())
	if err == nil {
		_, err = fmt.Fprintf(opts.IO.Out, "%s\n", line)
	}
	if err != nil {
		_ = s.Close()
		return fmt.Errorf("sim: print addresses: %w", err)
	}
	<-ctx.Done()
	return s.Close()
}
