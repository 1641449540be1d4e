package sim

import (
	"encoding/json"
	"sync"
	"time"
)

// Faults is the fault-injection state of a Sim, read and changed with
// GET/POST /_sim/faults. A POST body holds only the fields to change; the
// response is the whole state after the change.
type Faults struct {
	// HealthFail makes the health endpoints answer with the engine's
	// unhealthy status (503 for every persona).
	HealthFail bool `json:"health_fail"`
	// ErrorRate is the fraction (0..1) of inference requests answered with
	// HTTP 500 in the engine's error shape. Failures are spread
	// deterministically: request n fails when floor(n·rate) increases.
	ErrorRate float64 `json:"error_rate"`
	// AddedLatencyMS is added to every inference request's prefill time.
	AddedLatencyMS int `json:"added_latency_ms"`
	// CrashAfterChunks > 0 makes every streaming response close its TCP
	// connection after that many SSE chunks (no terminating chunk, no
	// [DONE]); a non-streaming response closes the connection before any
	// byte. 0 disables.
	CrashAfterChunks int `json:"crash_after_chunks"`
	// ErrorAfterChunks > 0 makes every streaming response end after that
	// many SSE events with the engine's mid-stream error event and then
	// data: [DONE] (llama.cpp native streams: the error event only), as an
	// engine does when generation fails after the headers were sent.
	ErrorAfterChunks int `json:"error_after_chunks"`
	// DropEvents is how many upcoming KV event batches are lost on the way
	// out: their sequence numbers are used and they stay in the replay
	// buffer (vLLM/SGLang: as a PUB socket dropping at its high-water mark,
	// so replay fills the gap), but subscribers never see them live.
	// TensorRT-LLM: the event ids are used and the events are not queued.
	DropEvents int `json:"drop_events"`
	// SeqGap is how many sequence numbers (TensorRT-LLM: event ids) the next
	// batch skips; nothing can fill that gap, not even replay.
	SeqGap int `json:"seq_gap"`
}

// faultPatch is a POST /_sim/faults body; nil fields are left unchanged.
// RestartPublisher is an action, not state: it stops the KV event publisher,
// empties the prefix cache and starts a fresh publisher (sequence from 0,
// empty replay buffer) on the same ports, as an engine restart would.
type faultPatch struct {
	HealthFail       *bool    `json:"health_fail"`
	ErrorRate        *float64 `json:"error_rate"`
	AddedLatencyMS   *int     `json:"added_latency_ms"`
	CrashAfterChunks *int     `json:"crash_after_chunks"`
	ErrorAfterChunks *int     `json:"error_after_chunks"`
	DropEvents       *int     `json:"drop_events"`
	SeqGap           *int     `json:"seq_gap"`
	RestartPublisher bool     `json:"restart_publisher"`
	Reset            bool     `json:"reset"`
}

type faultState struct {
	mu       sync.Mutex
	f        Faults
	requests uint64 // inference requests seen, for ErrorRate
}

func (fs *faultState) get() Faults {
	fs.mu.Lock()
	defer fs.mu.Unlock()
	return fs.f
}

func (fs *faultState) apply(p faultPatch) Faults {
	fs.mu.Lock()
	defer fs.mu.Unlock()
	if p.Reset {
		fs.f = Faults{}
	}
	if p.HealthFail != nil {
		fs.f.HealthFail = *p.HealthFail
	}
	if p.ErrorRate != nil {
		fs.f.ErrorRate = min(max(*p.ErrorRate, 0), 1)
	}
	if p.AddedLatencyMS != nil {
		fs.f.AddedLatencyMS = max(*p.AddedLatencyMS, 0)
	}
	if p.CrashAfterChunks != nil {
		fs.f.CrashAfterChunks = max(*p.CrashAfterChunks, 0)
	}
	if p.ErrorAfterChunks != nil {
		fs.f.ErrorAfterChunks = max(*p.ErrorAfterChunks, 0)
	}
	if p.DropEvents != nil {
		fs.f.DropEvents = max(*p.DropEvents, 0)
	}
	if p.SeqGap != nil {
		fs.f.SeqGap = max(*p.SeqGap, 0)
	}
	return fs.f
}

// shouldFail counts one inference request and reports whether the error
// rate selects it.
func (fs *faultState) shouldFail() bool {
	fs.mu.Lock()
	defer fs.mu.Unlock()
	n := fs.requests
	fs.requests++
	r := fs.f.ErrorRate
	if r <= 0 {
		return false
	}
	return uint64(float64(n+1)*r) > uint64(float64(n)*r)
}

func (fs *faultState) addedLatency() time.Duration {
	fs.mu.Lock()
	defer fs.mu.Unlock()
	return time.Duration(fs.f.AddedLatencyMS) * time.Millisecond
}

func (fs *faultState) healthFail() bool {
	fs.mu.Lock()
	defer fs.mu.Unlock()
	return fs.f.HealthFail
}

func (fs *faultState) crashAfter() int {
	fs.mu.Lock()
	defer fs.mu.Unlock()
	return fs.f.CrashAfterChunks
}

func (fs *faultState) errorAfter() int {
	fs.mu.Lock()
	defer fs.mu.Unlock()
	return fs.f.ErrorAfterChunks
}

// takeEventFaults consumes one batch's worth of event faults: whether this
// batch is dropped and how many sequence numbers to skip before it.
func (fs *faultState) takeEventFaults() (drop bool, gap int) {
	fs.mu.Lock()
	defer fs.mu.Unlock()
	gap, fs.f.SeqGap = fs.f.SeqGap, 0
	if fs.f.DropEvents > 0 {
		fs.f.DropEvents--
		drop = true
	}
	return drop, gap
}

func marshalFaults(f Faults) []byte {
	b, _ := json.Marshal(f) // a struct of plain fields cannot fail
	return b
}
