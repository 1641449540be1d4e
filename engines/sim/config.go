package sim

import (
	"errors"
	"fmt"
	"net"
	"slices"
	"strings"
	"time"

	"github.com/llmgw/llmgw/engines"
	"github.com/llmgw/llmgw/engines/kvhash"
)

// ErrConfig classifies every configuration error Start returns; test with
// errors.Is.
var ErrConfig = errors.New("sim: invalid config")

// Roles a simulator can play in prefill/decode disaggregation.
const (
	RoleBoth    = "both"
	RolePrefill = "prefill"
	RoleDecode  = "decode"
)

// Event encodings a vLLM or SGLang simulator can publish.
const (
	// EncodingArray is the tagged-array event layout (vLLM ≤ 0.23, SGLang 0.5.x).
	EncodingArray = engines.EventLayoutArray
	// EncodingMap is the tagged-map event layout (vLLM after PR #42892,
	// SGLang after PR #37482).
	EncodingMap = engines.EventLayoutMap
)

// KVEventsOff disables the KV event publisher when used as Config.KVEvents.
const KVEventsOff = "off"

// Config describes one simulated engine. The zero value of every field except
// Engine means "the engine's default" (filled by Start).
type Config struct {
	// Engine selects the persona; required.
	Engine engines.Kind
	// Listen is the HTTP address; default "127.0.0.1:0" (kernel-chosen port).
	Listen string
	// Model is the served model name; default "Qwen/Qwen3-0.6B".
	Model string
	// Role is RoleBoth (default), RolePrefill or RoleDecode.
	Role string
	// Silent: serve no /_sim/* control endpoints (no receipts, faults or
	// addresses), so the simulator is as silent as a real engine and the
	// lab must prove its work from the engine's own surfaces. Such paths
	// get the persona's own 404.
	Silent bool
	// BlockSize is the tokens per KV block: default 16 for vLLM, SGLang
	// (page size) and llama.cpp, 32 for TensorRT-LLM (tokens_per_block).
	BlockSize int
	// HashAlgo is the vLLM prefix-caching hash: "sha256_cbor" (default) or
	// "xxhash_cbor". SGLang and TensorRT-LLM use their own fixed algorithms
	// and reject any other value.
	HashAlgo string
	// HashSeed is vLLM's PYTHONHASHSEED; default "0".
	HashSeed string
	// KVEvents is the ZMQ PUB endpoint for vLLM and SGLang: "" means
	// "tcp://127.0.0.1:0" (bind, kernel-chosen port), KVEventsOff disables
	// events. Whether it binds or connects follows vLLM's rule (bind when the
	// endpoint has "*", "::", or is ipc:// or inproc://, or a 127.0.0.1:0
	// style kernel-chosen port; otherwise connect). Other engines ignore it.
	KVEvents string
	// EventEncoding is EncodingArray or EncodingMap. Default: EncodingMap for
	// vLLM (what current vLLM emits), EncodingArray for SGLang (0.5.19).
	EventEncoding string
	// CacheBlocks is the prefix-cache capacity in blocks (LRU); default 4096.
	CacheBlocks int
	// PrefillPerToken is the simulated cost of each uncached prompt token.
	PrefillPerToken time.Duration
	// DecodePerToken is the simulated cost of each generated token.
	DecodePerToken time.Duration
	// MaxConcurrency bounds requests served at once; the rest queue in
	// arrival order. 0 means unbounded.
	MaxConcurrency int
	// Tokenizer is the model's tokenizer: a tokenizer.json or .gguf path, or
	// a models directory holding Model's snapshot; "" selects the Qwen3
	// tokenizer embedded in the binary (the default model's own).
	Tokenizer string
	// Seed makes generated text deterministic: equal seeds and prompts give
	// equal completions.
	Seed int64
	// DPRanks is the number of data-parallel (attention-DP) ranks: each
	// rank has its own prefix cache and, for vLLM and SGLang, its own KV
	// event publisher whose ports are the base ports plus the rank (a
	// kernel-chosen port stays kernel-chosen per rank). Requests go to the
	// rank named by "routed_dp_rank" or "data_parallel_rank", else round
	// robin. Default 1.
	DPRanks int
	// BootstrapListen is the SGLang prefill bootstrap server address; default
	// "127.0.0.1:0". Only a SGLang prefill (or both-role) sim starts one.
	BootstrapListen string
	// RendezvousTimeout bounds how long a SGLang prefill waits for its decode
	// to join the bootstrap room (and a decode for its prefill); default 20 s.
	RendezvousTimeout time.Duration
	// LoadingFor keeps a llama.cpp persona in its "Loading model" state
	// (health 503, inference refused) for this long after Start; 0 = ready
	// at once. Other engines are not listening until loaded, so they ignore it.
	LoadingFor time.Duration
	// EnableMetrics and EnableSlots are llama-server's --metrics and
	// --slots: without them a llama.cpp persona answers /metrics and /slots
	// with 501 not_supported_error. Other personas always serve /metrics.
	EnableMetrics bool
	EnableSlots   bool
	// Embeddings is llama-server's --embeddings --pooling mean: the
	// persona serves /v1/embeddings and refuses completions with 501.
	// Other personas ignore it.
	Embeddings bool
	// IdleTimeout is how long a llama.cpp persona keeps an idle keep-alive
	// connection (and one that never sent a request) before closing it;
	// 0 means the engine's own (llamacpp.IdleTimeout, 5 s). Tests shorten
	// it. Other personas ignore it.
	IdleTimeout time.Duration
	// NagleStall makes a llama.cpp persona write like llama-server: Nagle's
	// algorithm on and a non-streamed answer's head and body in two
	// writes, so on a reused connection whose client delays its ACKs the
	// body arrives ~40 ms after the head (llamacpp.ReusedConnStall; the
	// kernel's delayed-ACK timer, not a timer of ours), and a client that
	// acknowledges at once is not stalled. Off by default (answers then go
	// out in one write); other personas ignore it.
	NagleStall bool
	// Clock returns the current time for "created" fields and event
	// timestamps; nil means time.Now. Tests pin it for golden bytes.
	Clock func() time.Time
}

const (
	defaultModel             = "Qwen/Qwen3-0.6B"
	defaultListen            = "127.0.0.1:0"
	defaultEventsEndpoint    = "tcp://127.0.0.1:0"
	defaultCacheBlocks       = 4096
	defaultRendezvousTimeout = 20 * time.Second
	maxModelLen              = 40960
)

// withDefaults validates c and returns it with defaults filled in.
func (c Config) withDefaults() (Config, error) {
	switch c.Engine {
	case engines.VLLM, engines.SGLang, engines.TRTLLM, engines.LlamaCpp:
	case "":
		return c, fmt.Errorf("%w: engine is required", ErrConfig)
	default:
		if _, err := engines.ParseKind(string(c.Engine)); err != nil {
			return c, fmt.Errorf("%w: %w", ErrConfig, err)
		}
	}
	if c.Listen == "" {
		c.Listen = defaultListen
	}
	if c.Model == "" {
		c.Model = defaultModel
	}
	switch c.Role {
	case "":
		c.Role = RoleBoth
	case RoleBoth, RolePrefill, RoleDecode:
	default:
		return c, fmt.Errorf("%w: role %q: valid roles are both, prefill, decode", ErrConfig, c.Role)
	}
	if c.BlockSize < 0 || c.BlockSize > kvhash.MaxBlockSize {
		return c, fmt.Errorf("%w: block size %d out of range 1..%d", ErrConfig, c.BlockSize, kvhash.MaxBlockSize)
	}
	// Block size, hash algorithm and event transport are the engine's
	// adapter's KV contract. An engine without one (llama.cpp) still keeps
	// a prefix cache: it is modelled with vLLM's hash and 16-token blocks,
	// and publishes nothing.
	kv := engines.MustFor(c.Engine).KV()
	if c.BlockSize == 0 {
		c.BlockSize = 16
		if kv != nil {
			c.BlockSize = kv.BlockSize
		}
	}
	algos := []string{string(kvhash.SHA256CBOR), string(kvhash.XXHashCBOR)}
	if kv != nil {
		algos = kv.HashAlgos
	}
	switch {
	case c.HashAlgo == "":
		c.HashAlgo = algos[0]
	case !slices.Contains(algos, c.HashAlgo) && len(algos) == 1:
		return c, fmt.Errorf("%w: hash algo %q for %s: the only algorithm is %s", ErrConfig, c.HashAlgo, c.Engine, algos[0])
	case !slices.Contains(algos, c.HashAlgo):
		return c, fmt.Errorf("%w: hash algo %q for %s: valid algorithms are %s", ErrConfig, c.HashAlgo, c.Engine, strings.Join(algos, ", "))
	}
	if c.HashSeed == "" {
		c.HashSeed = "0"
	}
	if c.KVEvents == "" {
		c.KVEvents = defaultEventsEndpoint
	}
	if !kv.PublishesZMQ() {
		c.KVEvents = KVEventsOff
	}
	switch c.EventEncoding {
	case "":
		c.EventEncoding = EncodingMap
		if kv != nil && kv.Layout != "" {
			c.EventEncoding = kv.Layout
		}
	case EncodingArray, EncodingMap:
	default:
		return c, fmt.Errorf("%w: event encoding %q: valid encodings are array, map", ErrConfig, c.EventEncoding)
	}
	if c.CacheBlocks < 0 {
		return c, fmt.Errorf("%w: cache blocks %d is negative", ErrConfig, c.CacheBlocks)
	}
	if c.CacheBlocks == 0 {
		c.CacheBlocks = defaultCacheBlocks
	}
	if c.PrefillPerToken < 0 || c.DecodePerToken < 0 {
		return c, fmt.Errorf("%w: per-token costs must not be negative", ErrConfig)
	}
	if c.IdleTimeout < 0 || c.LoadingFor < 0 {
		return c, fmt.Errorf("%w: idle timeout and loading time must not be negative", ErrConfig)
	}
	if c.MaxConcurrency < 0 {
		return c, fmt.Errorf("%w: max concurrency %d is negative", ErrConfig, c.MaxConcurrency)
	}
	if c.DPRanks < 0 || c.DPRanks > 64 {
		return c, fmt.Errorf("%w: dp ranks %d out of range 1..64", ErrConfig, c.DPRanks)
	}
	if c.DPRanks == 0 {
		c.DPRanks = 1
	}
	if c.BootstrapListen == "" {
		c.BootstrapListen = defaultListen
	}
	if _, _, err := net.SplitHostPort(c.BootstrapListen); err != nil {
		return c, fmt.Errorf("%w: bootstrap listen %q: %w", ErrConfig, c.BootstrapListen, err)
	}
	if c.RendezvousTimeout <= 0 {
		c.RendezvousTimeout = defaultRendezvousTimeout
	}
	if c.Clock == nil {
		c.Clock = time.Now
	}
	if strings.TrimSpace(c.Model) != c.Model {
		return c, fmt.Errorf("%w: model %q has surrounding spaces", ErrConfig, c.Model)
	}
	return c, nil
}
