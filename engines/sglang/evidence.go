package sglang

import "github.com/llmgw/llmgw/engines"

// Evidence: SGLang exports no request counter the lab relies on, but every
// finished request adds its prompt tokens to sglang:prompt_tokens_total;
// /metrics is served only with --enable-metrics
// (sgl-project/sglang docs/references/production_metrics.md).
// CacheReportFlag is the launch flag after which answers carry
// usage.prompt_tokens_details.cached_tokens (seen in public launch scripts
// and docs, not pinned to an engine source commit). CacheCounter:
// sglang:cached_tokens_total, "Number of cached prompt tokens", raised by
// each request's cached prompt tokens (TokenizerMetricsCollector in
// python/sglang/srt/metrics/collector.py; later builds add a cache_source
// label, which the lab sums over).
func (*Adapter) Evidence() engines.Evidence {
	return engines.Evidence{WorkCounter: "sglang:prompt_tokens_total", MetricsFlag: "--enable-metrics", CacheReportFlag: "--enable-cache-report",
		CacheCounter: "sglang:cached_tokens_total"}
}

// CachedTokens: usage.prompt_tokens_details.cached_tokens (SGLang fills it
// with --enable-cache-report).
func (*Adapter) CachedTokens(body []byte) (int, bool) { return engines.OpenAICachedTokens(body) }

var _ engines.EvidenceReader = (*Adapter)(nil)
