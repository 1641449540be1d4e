package llamacpp

import (
	"encoding/json"

	"github.com/llmgw/llmgw/engines"
)

// Evidence: llama-server exports no request counter; every completion
// evaluates at least one prompt token (the last one is always re-evaluated),
// so llamacpp:prompt_tokens_total rises on each (measured on a real
// llama-server: 0 → 29 after one 29-token chat completion). /metrics needs
// --metrics (501 otherwise); /slots lists each slot's last "id_task" and
// needs --slots on the builds that gate it.
func (Adapter) Evidence() engines.Evidence {
	return engines.Evidence{
		WorkCounter: "llamacpp:prompt_tokens_total", MetricsFlag: "--metrics",
		Slots: "/slots", SlotsFlag: "--slots",
	}
}

// CachedTokens: llama-server reports reuse in the answer's timings (cache_n:
// prompt tokens taken from the slot's cache, beside prompt_n evaluated) on
// builds that have it, and newer builds also fill the OpenAI
// usage.prompt_tokens_details.cached_tokens. An answer with neither (the
// c392e50-era builds report only prompt_n) reports none.
func (Adapter) CachedTokens(body []byte) (int, bool) {
	if n, ok := engines.OpenAICachedTokens(body); ok {
		return n, true
	}
	var b struct {
		Timings *struct {
			CacheN *int `json:"cache_n"`
		} `json:"timings"`
	}
	if json.Unmarshal(body, &b) != nil || b.Timings == nil || b.Timings.CacheN == nil {
		return 0, false
	}
	return *b.Timings.CacheN, true
}

var _ engines.EvidenceReader = Adapter{}
