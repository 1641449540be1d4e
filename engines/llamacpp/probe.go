package llamacpp

import (
	"encoding/json"
	"fmt"

	"github.com/llmgw/llmgw/engines"
)

// Describer: what a running llama-server says about itself on GET /props:
// default_generation_settings.n_ctx (the context of one slot: -c divided by
// -np), total_slots and build_info. Observed on a real llama-server
// (b0-unknown, -c 4096 -np 2: n_ctx 2048, total_slots 2; /v1/models
// owned_by "llamacpp"). llama.cpp has no P/D and no KV events, so every
// endpoint is converged and publishes nothing.
func (Adapter) OwnedBy() string { return "llamacpp" }

func (Adapter) DescribePaths() []string { return []string{"/props"} }

func (Adapter) Describe(path string, body []byte, d *engines.Description) error {
	if path != "/props" {
		return fmt.Errorf("llamacpp: no description at %s", path)
	}
	var p struct {
		Settings *struct {
			NCtx int `json:"n_ctx"`
		} `json:"default_generation_settings"`
		TotalSlots int    `json:"total_slots"`
		BuildInfo  string `json:"build_info"`
	}
	if err := json.Unmarshal(body, &p); err != nil {
		return fmt.Errorf("llamacpp: /props: %w", err)
	}
	if p.Settings == nil && p.BuildInfo == "" {
		return fmt.Errorf("llamacpp: /props has neither default_generation_settings nor build_info")
	}
	if p.Settings != nil && p.Settings.NCtx > 0 {
		d.ContextLength = p.Settings.NCtx
		d.Said("context_length", "GET /props default_generation_settings.n_ctx (per slot)")
	}
	if p.TotalSlots > 0 {
		d.Slots = p.TotalSlots
		d.Said("slots", "GET /props total_slots")
	}
	d.Role = engines.RoleConverged
	d.Said("role", "llama.cpp has no prefill/decode disaggregation")
	d.EventsOff = true
	d.Said("events", "llama.cpp publishes no KV-cache events")
	return nil
}

// TokenizeBody: POST /tokenize {"content": text} (add_special defaults to
// false).
func (Adapter) TokenizeBody(_, text string) []byte {
	b, _ := json.Marshal(map[string]any{"content": text})
	return b
}

// ParseTokens reads {"tokens":[...]}.
func (Adapter) ParseTokens(body []byte) ([]uint32, error) {
	var t struct {
		Tokens *[]uint32 `json:"tokens"`
	}
	if err := json.Unmarshal(body, &t); err != nil {
		return nil, fmt.Errorf("llamacpp: tokenize: %w", err)
	}
	if t.Tokens == nil {
		return nil, fmt.Errorf("llamacpp: tokenize answer has no \"tokens\"")
	}
	return *t.Tokens, nil
}

// EventsProbe: llama.cpp has no event endpoint.
func (Adapter) EventsProbe() (string, string, int) { return "", "", 0 }

// Guide: llama.cpp runs fullproxy with CHWBL (or session affinity); it has
// neither KV events nor P/D, so nothing follows.
func (Adapter) Guide() engines.Guide {
	return engines.Guide{
		FirstSel:     8,
		FirstWhy:     "the guide runs llama.cpp as fullproxy with CHWBL (or session affinity): each slot keeps its prompt cache, so a prefix must return to the same server",
		NoKVExactWhy: "llama.cpp publishes no KV-cache events: there is nothing for KV-exact routing to read (kvExactMode is refused for kvEngineType llamacpp)",
		NoPDWhy:      "llama.cpp has no prefill/decode disaggregation (pd_disagg_mode is refused for kvEngineType llamacpp)",
	}
}

var (
	_ engines.Describer = Adapter{}
	_ engines.Guided    = Adapter{}
)
