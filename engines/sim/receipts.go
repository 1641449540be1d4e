package sim

import (
	"encoding/json"
	"sync"
	"time"
)

// Receipt is the evidence one request leaves: what arrived, what the
// simulated engine did with it, and how it answered. Gateway tests correlate
// client requests with engine work through it (GET /_sim/receipts).
type Receipt struct {
	// Seq numbers receipts from 1 in arrival order.
	Seq uint64 `json:"seq"`
	// Time is when the request arrived.
	Time time.Time `json:"time"`
	// Path is the request path, e.g. "/v1/chat/completions".
	Path string `json:"path"`
	// RequestID is the X-Request-Id header, or the id the sim generated.
	RequestID string `json:"request_id"`
	// Headers holds the headers of interest that were present: every X-*
	// header, Authorization (value replaced by "present"), and traceparent.
	Headers map[string]string `json:"headers,omitempty"`
	// Nonce is metadata.nonce when it is a string, else the "user" field.
	Nonce string `json:"nonce,omitempty"`
	// Model is the requested model name.
	Model string `json:"model,omitempty"`
	// Role is the sim's configured role.
	Role string `json:"role"`
	// Stream reports whether the client asked for SSE.
	Stream bool `json:"stream"`
	// MaxTokens is the generation cap the body carried (-1 when none).
	MaxTokens int `json:"max_tokens"`
	// PromptTokens, CachedTokens and CompletionTokens are as in usage.
	PromptTokens     int `json:"prompt_tokens"`
	CachedTokens     int `json:"cached_tokens"`
	CompletionTokens int `json:"completion_tokens"`
	// RemotePrefillTokens are prompt tokens whose KV arrived from a prefill
	// instance (P/D hand-off), so they were not recomputed.
	RemotePrefillTokens int `json:"remote_prefill_tokens"`
	// PrefillCostUS is the modelled prefill time in microseconds (uncached
	// tokens × per-token cost), before added-latency faults and queueing.
	PrefillCostUS int64 `json:"prefill_cost_us"`
	// QueuedUS is how long the request waited for a serving slot.
	QueuedUS int64 `json:"queued_us"`
	// KVTransferParams is the vLLM kv_transfer_params the request carried.
	KVTransferParams json.RawMessage `json:"kv_transfer_params,omitempty"`
	// KVTransferParamsOut is the kv_transfer_params a vLLM prefill returned.
	KVTransferParamsOut json.RawMessage `json:"kv_transfer_params_out,omitempty"`
	// Bootstrap is the SGLang bootstrap triple the request carried.
	Bootstrap *BootstrapTriple `json:"bootstrap,omitempty"`
	// DisaggregatedParams is the TensorRT-LLM disaggregated_params received.
	DisaggregatedParams json.RawMessage `json:"disaggregated_params,omitempty"`
	// Status is the HTTP status sent (200 once a stream started).
	Status int `json:"status"`
	// Error is the error message sent, if any.
	Error string `json:"error,omitempty"`
	// FinishReason is the completion's finish reason.
	FinishReason string `json:"finish_reason,omitempty"`
	// Crashed reports that a crash fault cut the response.
	Crashed bool `json:"crashed,omitempty"`
	// Cancelled reports that the client (for the sim: the gateway) closed
	// the connection before the answer was complete and generation stopped,
	// and CancelledAt when the sim noticed. vLLM does the same: its routes
	// are wrapped in with_cancellation, which cancels the handler when
	// Starlette reports http.disconnect (vllm-project/vllm
	// vllm/entrypoints/utils.py @ 00fc8809, with_cancellation), and a
	// streaming response stops when its write fails.
	Cancelled   bool      `json:"cancelled,omitempty"`
	CancelledAt time.Time `json:"cancelled_at,omitzero"`
}

// BootstrapTriple is SGLang's P/D rendezvous key.
type BootstrapTriple struct {
	Host string `json:"bootstrap_host"`
	Port int64  `json:"bootstrap_port"`
	Room uint64 `json:"bootstrap_room"`
}

// maxReceipts bounds the receipt log; older receipts are dropped first.
const maxReceipts = 10000

// receiptLog is a ring of the last limit receipts. It is safe for
// concurrent use.
type receiptLog struct {
	mu    sync.Mutex
	limit int
	seq   uint64
	items []Receipt
	head  int // index of the oldest receipt once the ring is full
}

func (l *receiptLog) add(r Receipt) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.seq++
	r.Seq = l.seq
	if len(l.items) < l.limit {
		l.items = append(l.items, r)
		return
	}
	l.items[l.head] = r
	l.head = (l.head + 1) % len(l.items)
}

func (l *receiptLog) snapshot() []Receipt {
	l.mu.Lock()
	defer l.mu.Unlock()
	out := make([]Receipt, 0, len(l.items))
	out = append(out, l.items[l.head:]...)
	return append(out, l.items[:l.head]...)
}

func (l *receiptLog) reset() {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.items, l.head = nil, 0
}
