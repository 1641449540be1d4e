package engines

import (
	"encoding/json"
	"errors"
	"fmt"
	"time"
)

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
	// Tokenize is how the engine's tokenize endpoint (Surfaces().Tokenize)
	// is called, or nil when the engine has none.
	Tokenize() *TokenizeShape

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

// Demotes reports whether the fault counts toward the endpoint's demotion
// (origin-5xx streak): an engine fault or overload, never the client's.
func (f Fault) Demotes() bool { return f == FaultEngine || f == FaultOverloaded }

// Healthy reports whether the answer says nothing against the endpoint
// (FaultNone).
func (f Fault) Healthy() bool { return f == FaultNone }

// ClientsFault reports whether the answer is the client's fault: relayed,
// never counted toward the endpoint's demotion, whatever its status.
func (f Fault) ClientsFault() bool { return f == FaultClient }

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
	// acknowledges such an engine's answers at once (TCP_QUICKACK before
	// reading each answer; gateway/upconn.go).
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

// TokenizeShape is the request and answer of an engine's tokenize
// endpoint.
type TokenizeShape struct {
	// TextField is the request field carrying raw text ("prompt",
	// "content").
	TextField string
	// MessagesField is the request field carrying chat messages, rendered
	// by the engine's own chat template; "" when the endpoint takes text
	// only.
	MessagesField string
	// AddSpecialField is the request field that asks for the BOS/special
	// tokens, and AddSpecialDefault its value when absent.
	AddSpecialField   string
	AddSpecialDefault bool
	// ModelField: the request names the model in this field ("" when it
	// does not).
	ModelField string
	// TokensField is the answer's array of token ids.
	TokensField string
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
	// algorithm; engines/kvhash parses it). This is the only engine→hash
	// default table: rules, profiles and the simulator ask it.
	HashAlgo string
	// HashAlgos are all the algorithms the engine can be configured with,
	// HashAlgo first.
	HashAlgos []string
	// BlockSize is the engine's default KV block (page) size in tokens.
	BlockSize int
	// Layout is the msgpack event layout the engine publishes at the
	// catalog version (ZMQ transports): EventLayoutMap or EventLayoutArray.
	Layout string
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

// Event layouts of the ZMQ msgpack batches (engines/kvevents decodes both).
const (
	// EventLayoutArray: tagged arrays (vLLM ≤ 0.23, SGLang 0.5.x).
	EventLayoutArray = "array"
	// EventLayoutMap: tagged maps (vLLM after PR #42892).
	EventLayoutMap = "map"
)

// PolledOverHTTP reports whether the contract's events are drained over
// HTTP from the engine's own port; false for a nil contract.
func (c *KVContract) PolledOverHTTP() bool { return c != nil && c.Transport == EventsHTTPPoll }

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

// Concurrent reports whether the shape sends both legs at once (the
// decode joins the prefill through a rendezvous), rather than the decode
// after the prefill's answer.
func (s PDShape) Concurrent() bool { return s == PDConcurrent }

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

// PDProtocol is an engine's prefill/decode hand-off: every body rewrite the
// gateway does for a P/D pair and every hand-off field, written once. The
// gateway's P/D orchestrators (one per Shape) drive it without knowing the
// engine; the simulator and the P/D runbook read the same fields through
// ParseLeg.
type PDProtocol interface {
	Shape() PDShape

	// LegRequestID is the X-Request-Id both legs carry: the client's id
	// (p.RequestID), or an id naming the pair's KV addresses (vLLM, when
	// the pair has P2P-NCCL or NIXL ports).
	LegRequestID(p *PDPair) string
	// PrefillBody rewrites the client's JSON body for the prefill (context)
	// leg. An error wraps ErrPDBody (the client's body is not a JSON object).
	PrefillBody(body []byte, p *PDPair) ([]byte, error)
	// HandOff reads the prefill leg's 2xx answer. It never fails: an answer
	// without usable hand-off fields is a HandOff with Missing set, and the
	// decode then recomputes the prompt.
	HandOff(answer []byte, p *PDPair) HandOff
	// DecodeBody rewrites the client's body for the decode (generation)
	// leg, carrying h's parameters (none when h.Params is nil). For the
	// concurrent shape h is the zero HandOff.
	DecodeBody(body []byte, p *PDPair, h HandOff) ([]byte, error)

	// ParseLeg reads the P/D fields of one leg's request body, as the
	// engine would: the simulator's persona and the P/D runbook's checks
	// use it. A body without P/D fields is the zero PDLeg and no error; a
	// malformed field is an error wrapping ErrPDBody, naming the field.
	ParseLeg(body []byte) (PDLeg, error)
	// ParseLegAnswer reads the hand-off a prefill (context) leg's answer
	// carried, in the engine's own field (nil when none).
	ParseLegAnswer(answer []byte) []byte
	// ParseHandOff reads a hand-off object itself (what ParseLeg found in
	// the body's hand-off field, as receipts record it); the concurrent
	// shape has none and returns the zero PDLeg.
	ParseHandOff(raw []byte) (PDLeg, error)
	// CarryParams is the hand-off object a decode leg carries, given the
	// one the prefill answered with (HandOff applies it).
	CarryParams(answered []byte) []byte
	// Summary says in one phrase what a correct hand-off shows (evidence
	// text of the P/D runbook).
	Summary() string

	// BootstrapPort is the engine's default KV bootstrap port for the
	// rendezvous shape (SGLang 8998); 0 when the engine has none, and then
	// a rule may not name one.
	BootstrapPort() int
	// KVPorts reports whether per-endpoint KV-transfer ports mean
	// something to the engine's hand-off (vLLM: nixl_port, the NIXL
	// side-channel port the legs' request id names; p2p_nccl_port, the
	// P2P-NCCL connector's).
	KVPorts() bool
}

// ErrPDBody: a P/D body or field is malformed (the client's fault).
var ErrPDBody = errors.New("engines: malformed P/D body")

// PDFieldError is a malformed P/D body or field. Its message is the
// engine's own wording (the simulator answers with it verbatim);
// errors.Is(err, ErrPDBody) holds.
type PDFieldError struct{ Msg string }

func (e *PDFieldError) Error() string        { return e.Msg }
func (e *PDFieldError) Is(target error) bool { return target == ErrPDBody }

// PDErrorf returns a PDFieldError.
func PDErrorf(format string, a ...any) error {
	return &PDFieldError{Msg: fmt.Sprintf(format, a...)}
}

// PDPair is one prefill/decode pair as the orchestrator chose it.
type PDPair struct {
	// RequestID is the client's request id (X-Request-Id).
	RequestID string
	// PrefillHost and DecodeHost are the endpoints' hosts (IP literal or
	// name, never bracketed); the ports are their HTTP ports.
	PrefillHost, DecodeHost string
	PrefillPort, DecodePort int
	// BootstrapPort is the prefill's KV bootstrap port (SGLang); 0: the
	// engine's default.
	BootstrapPort int
	// PrefillKVPort and DecodeKVPort are the endpoints' P2P-NCCL KV ports
	// (vLLM, rule field p2p_nccl_port); 0 when the rule names none.
	PrefillKVPort, DecodeKVPort int
	// PrefillNixlPort and DecodeNixlPort are the endpoints' NIXL
	// side-channel ports (vLLM, rule field nixl_port), which the reference
	// gateway advertises in the legs' X-Request-Id; 0 when the rule names
	// none.
	PrefillNixlPort, DecodeNixlPort int
	// Nonce is a fresh random value for this pair, below 2^63 (SGLang's
	// bootstrap room, TensorRT-LLM's disagg_request_id, the P2P-NCCL id's
	// tail).
	Nonce uint64
}

// HandOff is what a prefill answer hands the decode leg.
type HandOff struct {
	// Params is the engine-native hand-off object (JSON), nil when the
	// answer carries none.
	Params []byte
	// Missing says why Params is nil: a short route token
	// ("kv-params-missing", "context-unparsable", ...).
	Missing string
	// OutOfBand: the KV moves between the engines without the gateway
	// (vLLM P2P-NCCL, keyed by the legs' request id); nothing is carried
	// and nothing is missing.
	OutOfBand bool
	// Final, when non-nil, is the whole answer: the prefill finished the
	// request (TensorRT-LLM's early exit); the hand-off fields are removed
	// and the decode leg is not sent.
	Final []byte
}

// PDLegRole is what a leg's P/D fields ask of the engine.
type PDLegRole uint8

const (
	// PDLegNone: no P/D fields.
	PDLegNone PDLegRole = iota
	// PDLegPrefill: compute the prompt and hand its KV off (vLLM
	// do_remote_decode, TensorRT-LLM context_only).
	PDLegPrefill
	// PDLegDecode: take the prompt's KV from a prefill (vLLM
	// do_remote_prefill, TensorRT-LLM generation_only).
	PDLegDecode
	// PDLegRendezvous: prefill and decode meet at a bootstrap room
	// (SGLang); which side a server is depends on its own role.
	PDLegRendezvous
)

func (r PDLegRole) String() string {
	switch r {
	case PDLegPrefill:
		return "prefill"
	case PDLegDecode:
		return "decode"
	case PDLegRendezvous:
		return "rendezvous"
	}
	return "none"
}

// PDLeg is one leg's P/D fields, engine-neutral.
type PDLeg struct {
	Role PDLegRole
	// Raw is the engine's hand-off object exactly as sent (receipts), nil
	// for the rendezvous shape (its fields are top-level).
	Raw []byte
	// RemoteBlocks is how many KV blocks a decode leg is told to pull
	// (vLLM remote_block_ids; the first group for hybrid models); -1 when
	// the engine does not say.
	RemoteBlocks int
	// RemoteTokens is how many prompt tokens the hand-off covers, when the
	// engine says (vLLM remote_num_tokens); -1 otherwise.
	RemoteTokens int
	// Opaque is the prefill's opaque state a decode leg carries
	// (TensorRT-LLM encoded_opaque_state, base64-decoded); nil otherwise.
	Opaque []byte
	// HasOpaque: the field was present (it may decode to nothing).
	HasOpaque bool
	// RequestRef is the correlation id the hand-off carries (TensorRT-LLM
	// disagg_request_id); nil when absent.
	RequestRef *int64
	// Rendezvous is the bootstrap triple (SGLang), nil otherwise.
	Rendezvous *Rendezvous
}

// Rendezvous is SGLang's bootstrap triple.
type Rendezvous struct {
	Host string `json:"host"`
	Port int64  `json:"port"`
	Room uint64 `json:"room"`
}

// ClassifyStatus is the classification of an engine whose error answers
// say whose fault they are by their status alone (vLLM and TensorRT-LLM
// behind FastAPI/uvicorn): 4xx and 501 Not Implemented are the client's,
// 503 is overload, other 5xx the engine's.
func ClassifyStatus(status int) Fault {
	switch {
	case status < 400:
		return FaultNone
	case status < 500, status == 501:
		return FaultClient
	case status == 503:
		return FaultOverloaded
	}
	return FaultEngine
}

// VersionField reads {"version": "..."} (the version endpoints of vLLM,
// SGLang's server info and TensorRT-LLM); who names the engine and surface
// in errors. A body without a version is an error wrapping ErrNoVersion.
func VersionField(body []byte, who string) (string, error) {
	var v struct {
		Version string `json:"version"`
	}
	if err := json.Unmarshal(body, &v); err != nil {
		return "", fmt.Errorf("%s: %w", who, err)
	}
	if v.Version == "" {
		return "", fmt.Errorf("%w: %s has no \"version\"", ErrNoVersion, who)
	}
	return v.Version, nil
}
