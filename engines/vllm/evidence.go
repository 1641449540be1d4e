package vllm

import "github.com/llmgw/llmgw/engines"

// Evidence: every finished request raises vllm:request_success_total
// (vllm/v1/metrics/loggers.py); /metrics is always served.
// CacheReportFlag is the launch flag after which answers carry
// usage.prompt_tokens_details.cached_tokens (seen in public launch scripts
// and docs, not pinned to an engine source commit). CacheCounter:
// vllm:prefix_cache_hits_total, "Prefix cache hits, in terms of number of
// cached tokens" (counter_prefix_cache_hits in vllm/v1/metrics/loggers.py).
func (*Adapter) Evidence() engines.Evidence {
	return engines.Evidence{WorkCounter: "vllm:request_success_total", CacheReportFlag: "--enable-prompt-tokens-details",
		CacheCounter: "vllm:prefix_cache_hits_total"}
}

// CachedTokens: usage.prompt_tokens_details.cached_tokens, which vLLM fills
// when started with --enable-prompt-tokens-details
// (vllm/entrypoints/openai/serving_chat.py, serving_completion.py).
func (*Adapter) CachedTokens(body []byte) (int, bool) { return engines.OpenAICachedTokens(body) }

// ResponseID: vLLM takes the request id from the X-Request-Id header
// (OpenAIServing._base_request_id in vllm/entrypoints/openai/serving_engine.py:
// raw_request.headers.get("X-Request-Id", default)) and answers with id
// "chatcmpl-<id>" for chat completions and "cmpl-<id>" for completions
// (serving_chat.py, serving_completion.py: request_id = f"chatcmpl-{...}").
func (*Adapter) ResponseID(requestID string, chat bool) string {
	if chat {
		return "chatcmpl-" + requestID
	}
	return "cmpl-" + requestID
}

var (
	_ engines.EvidenceReader = (*Adapter)(nil)
	_ engines.RequestIDEcho  = (*Adapter)(nil)
)
