package trtllm

import "github.com/llmgw/llmgw/engines"

// Evidence: trtllm_request_success_total, "Count of successfully processed
// requests" (NVIDIA/TensorRT-LLM tensorrt_llm/metrics/collector.py, commit
// 050f80d), served on Surfaces().Metrics (/prometheus/metrics). Which
// trtllm-serve option switches the collector on was not established from
// the source, so MetricsFlag is empty (openai_server.py mounts
// /prometheus/metrics only when the LLM API option return_perf_metrics is
// true). CacheCounter: trtllm_prompt_cached_tokens_total, "Total prompt
// tokens served from KV cache" (the same collector.py).
func (*Adapter) Evidence() engines.Evidence {
	return engines.Evidence{WorkCounter: "trtllm_request_success_total", CacheCounter: "trtllm_prompt_cached_tokens_total"}
}

// CachedTokens: the OpenAI usage.prompt_tokens_details.cached_tokens field
// when the answer carries it (whether trtllm-serve fills it was not
// established; an answer without it reports none).
func (*Adapter) CachedTokens(body []byte) (int, bool) { return engines.OpenAICachedTokens(body) }

var _ engines.EvidenceReader = (*Adapter)(nil)
