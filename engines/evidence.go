package engines

import (
	"encoding/json"
	"fmt"
)

// Evidence names what an engine's own surfaces let the lab prove about the
// work it did, without a simulator's receipt log: a real engine has none, so
// the lab asks the adapter which counters and pages witness a completion.
type Evidence struct {
	// WorkCounter is a Prometheus counter, served at Surfaces().Metrics,
	// that every completion the engine runs raises by at least one: a
	// request count where the engine exports one, else prompt tokens
	// (every completion evaluates at least one prompt token). "" when the
	// engine exports no such counter.
	WorkCounter string
	// MetricsFlag is the launch flag that switches the metrics endpoint on
	// when it is off by default ("" when always on, or not established).
	MetricsFlag string
	// Slots is a GET path listing the server's slots with the id of the
	// last task each ran ("id_task"); a new completion raises the largest
	// id. "" when the engine has none.
	Slots string
	// SlotsFlag is the launch flag that switches Slots on ("" when always on).
	SlotsFlag string
	// CacheReportFlag is the launch flag that makes answers report cached
	// prompt tokens ("" when always reported, or not established).
	CacheReportFlag string
	// CacheCounter is a Prometheus counter, served at Surfaces().Metrics,
	// that rises by the prompt tokens an engine served from its prefix
	// cache: where an answer the gateway relays does not carry them (a P/D
	// prefill leg), its rise proves cache reuse. "" when the engine exports
	// none.
	CacheCounter string
}

// EvidenceReader is implemented by the adapters that state their Evidence
// (each engine package, in its evidence.go).
type EvidenceReader interface {
	Evidence() Evidence
	// CachedTokens reads the engine-reported cached (reused) prompt tokens
	// from a non-streaming completion body (untrusted bytes); ok is false
	// when the answer reports none.
	CachedTokens(body []byte) (n int, ok bool)
}

// RequestIDEcho is implemented by adapters whose completion id is built
// from the request's X-Request-Id header, so an answer proves the engine
// saw that request id.
type RequestIDEcho interface {
	// ResponseID is the completion id the engine answers a request carrying
	// X-Request-Id requestID with (chat: chat completions, else completions).
	ResponseID(requestID string, chat bool) string
}

// EvidenceOf returns a's EvidenceReader, or false when a states none.
func EvidenceOf(a Adapter) (EvidenceReader, bool) {
	e, ok := a.(EvidenceReader)
	return e, ok
}

// OpenAICachedTokens reads usage.prompt_tokens_details.cached_tokens, the
// OpenAI field vLLM, SGLang and llama.cpp fill when prefix caching reports
// (ok false when the answer has no such field).
func OpenAICachedTokens(body []byte) (int, bool) {
	var b struct {
		Usage *struct {
			Details *struct {
				Cached *int `json:"cached_tokens"`
			} `json:"prompt_tokens_details"`
		} `json:"usage"`
	}
	if json.Unmarshal(body, &b) != nil || b.Usage == nil || b.Usage.Details == nil || b.Usage.Details.Cached == nil {
		return 0, false
	}
	return *b.Usage.Details.Cached, true
}

// ParseSlotsTask reads the largest "id_task" of a /slots answer (a JSON
// array of slot objects; untrusted bytes). A server that ran no task yet
// answers -1 for every slot.
func ParseSlotsTask(body []byte) (int64, error) {
	var slots []struct {
		ID     *int64 `json:"id"`
		IDTask *int64 `json:"id_task"`
	}
	if err := json.Unmarshal(body, &slots); err != nil {
		return 0, fmt.Errorf("engines: slots: %w", err)
	}
	if len(slots) == 0 {
		return 0, fmt.Errorf("engines: slots: no slot listed")
	}
	top := int64(-1)
	for i, s := range slots {
		if s.ID == nil || s.IDTask == nil {
			return 0, fmt.Errorf("engines: slots: slot %d has no id or id_task", i)
		}
		top = max(top, *s.IDTask)
	}
	return top, nil
}
