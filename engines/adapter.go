package engines

import "time"

// Adapter is one engine's wire contract, written once and read by the
// gateway, the simulator, the lab and the planner alike. Each engine's
// package (engines/vllm, engines/sglang, engines/trtllm, engines/llamacpp)
// provides exactly one; For returns it. Nothing outside engines/ switches on
// an engine kind: it asks the adapter.
//
// Every fact an adapter states is backed by a recorded capture of the real
// engine or by the engine's public source; the package doc of each adapter
// and its testdata/PROVENANCE say which.
type Adapter interface {
	// Kind is the engine's name in rules, profiles and flags.
	Kind() Kind
	// Display is the engine's human name ("vLLM", "llama.cpp").
	Display() string

	// Conn is how the engine's HTTP server treats connections; the
	// gateway's upstream pool must respect it.
	Conn() ConnPolicy
	// Classify says whether an answer with this status and body is the
	// client's fault (must not demote the endpoint) or the engine's.
	Classify(status int, body []byte) Fault

	// Surfaces names the engine's HTTP surfaces: health, version,
	// tokenize, metrics.
	Surfaces() Surfaces
	// ParseVersion reads the engine's version from the body its version
	// endpoint answered; an engine with no version endpoint returns an
	// error wrapping ErrNoVersion.
	ParseVersion(body []byte) (string, error)
	// Metrics names the engine-native Prometheus series the lab reads.
	Metrics() MetricNames

	// KV is the engine's KV-cache event contract, or nil when the engine
	// publishes none (llama.cpp).
	KV() *KVContract
	// PD is the engine's prefill/decode protocol, or nil when it has none.
	PD() PDProtocol
}

// Fault classifies an engine's error answer.
type Fault uint8

const (
	// FaultNone: not an error (status < 400).
	FaultNone Fault = iota
	// FaultClient: the request was bad; the engine is healthy. Such an
	// answer is relayed and never counts toward origin-5xx demotion, even
	// when its status is 5xx (llama.cpp answers 500 for malformed JSON).
	FaultClient
	// FaultEngine: the engine failed; it counts toward demotion.
	FaultEngine
	// FaultOverloaded: the engine is alive but refuses work for now
	// (loading, queue full). Counts toward demotion like an engine fault.
	FaultOverloaded
)

func (f Fault) String() string {
	switch f {
	case FaultNone:
		return "none"
	case FaultClient:
		return "client"
	case FaultEngine:
		return "engine"
	case FaultOverloaded:
		return "overloaded"
	}
	return "unknown"
}

// ConnPolicy is what the engine's HTTP server does with a connection, as
// observed on the wire. The gateway must never reuse a connection the
// engine is about to close: a request written to it is lost.
type ConnPolicy struct {
	// CloseAfterStream: the engine closes the connection after every
	// streamed (chunked SSE) answer, whatever its Keep-Alive header says.
	CloseAfterStream bool
	// IdleTimeout: the engine closes a keep-alive connection idle this
	// long. Zero: not known; the gateway uses its own default.
	IdleTimeout time.Duration
	// MaxRequestsPerConn: the engine closes a connection after this many
	// requests (0: no limit known).
	MaxRequestsPerConn int
	// ServingConns: how many connections the server serves at once; a
	// further connection is accepted by the kernel but waits (0: no
	// limit known). llama.cpp serves one per HTTP thread.
	ServingConns int
	// ReusedConnStall: a reused connection's answer arrives late because
	// the engine writes head and body separately and Nagle's algorithm
	// meets the client's delayed ACK (llama.cpp: ~40 ms). The gateway
	// avoids it (see gateway/upstream).
	ReusedConnStall bool
}

// Surfaces are the engine's HTTP paths the gateway and lab use.
type Surfaces struct {
	Health   string // GET, 200 when ready
	Version  string // GET; "" when the engine has none
	Tokenize string // POST; "" when the engine has none
	Metrics  string // GET Prometheus text; "" when none
	// MetricsOptIn: the metrics endpoint answers only when the engine was
	// started with this flag (llama.cpp: "--metrics"); "" when always on.
	MetricsOptIn string
	// Models is the OpenAI model list path.
	Models string
}

// MetricNames are engine-native Prometheus series names ("" when the
// engine exports no such series). Counters are named with their exposed
// "_total" suffix.
type MetricNames struct {
	Requests        string // finished requests (counter)
	PromptTokens    string // prompt tokens processed (counter)
	PrefixQueries   string // prefix-cache lookups, in tokens (counter)
	PrefixHits      string // prefix-cache hits, in tokens (counter)
	RunningRequests string // requests running now (gauge)
	WaitingRequests string // requests queued now (gauge)
}

// KVContract is an engine's KV-cache event contract.
type KVContract struct {
	// Transport is how events are delivered.
	Transport EventTransport
	// HashAlgo is the default block-hash algorithm name (one name per
	// algorithm; engines/kvhash parses it).
	HashAlgo string
	// BlockSize is the engine's default KV block (page) size in tokens.
	BlockSize int
	// ZMQPort is the default event publisher port (ZMQ transports).
	ZMQPort int
	// ReplayOffset: the replay (ROUTER) socket is the publisher port plus
	// this; 0 when the engine has no replay socket.
	ReplayOffset int
	// PollPath is the HTTP path events are drained from (HTTP poll).
	PollPath string
	// Destructive: reading events removes them, so one consumer only.
	Destructive bool
}

// EventTransport names how an engine delivers KV events.
type EventTransport uint8

const (
	EventsNone     EventTransport = iota
	EventsZMQ                     // ZeroMQ PUB/SUB, msgpack batches
	EventsHTTPPoll                // HTTP GET drain, JSON
)

// PDShape is how a prefill/decode pair is driven.
type PDShape uint8

const (
	PDNone PDShape = iota
	// PDSequential: prefill answers first (with hand-off fields), then
	// decode is sent the hand-off (vLLM NIXL).
	PDSequential
	// PDConcurrent: prefill and decode are sent at once, joined by a
	// bootstrap triple (SGLang).
	PDConcurrent
	// PDContextGeneration: a context-only request, then a generation
	// request carrying its disaggregated params (TensorRT-LLM).
	PDContextGeneration
)

func (s PDShape) String() string {
	switch s {
	case PDSequential:
		return "sequential"
	case PDConcurrent:
		return "concurrent"
	case PDContextGeneration:
		return "context-generation"
	}
	return "none"
}

// PDProtocol is an engine's prefill/decode hand-off. The gateway's P/D
// orchestrators (one per Shape) drive it; the simulator and the P/D
// runbook parse the same fields through it.
type PDProtocol interface {
	Shape() PDShape
}
