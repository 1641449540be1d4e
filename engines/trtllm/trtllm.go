// Package trtllm is TensorRT-LLM's trtllm-serve contract (catalog version
// 1.3.0rc29, PyTorch backend).
//
// Sources: TensorRT-LLM's public source (NVIDIA/TensorRT-LLM). Every fact
// below is recorded with its repository, path and commit in
// testdata/adapter.json and testdata/cases (see testdata/PROVENANCE, which
// also says what could not be established: the commits cited are the
// revisions read, not a verified 1.3.0rc29).
package trtllm

import (
	"time"

	"github.com/llmgw/llmgw/engines"
	"github.com/llmgw/llmgw/engines/kvhash"
)

func init() { engines.Register(&Adapter{}) }

// Adapter is TensorRT-LLM's engines.Adapter.
type Adapter struct{}

func (*Adapter) Kind() engines.Kind { return engines.TRTLLM }
func (*Adapter) Display() string    { return "TensorRT-LLM" }

// IdleTimeout: trtllm-serve runs uvicorn with TIMEOUT_KEEP_ALIVE = 5
// seconds (tensorrt_llm/serve/openai_server.py at 00057725).
const IdleTimeout = 5 * time.Second

// Conn: uvicorn keeps a connection alive after a streamed answer and closes
// it after IdleTimeout idle.
func (*Adapter) Conn() engines.ConnPolicy {
	return engines.ConnPolicy{IdleTimeout: IdleTimeout}
}

// Classify: request validation answers 400 {"error": ...}, handler
// exceptions 400 BadRequestError, unsupported features 501
// (_create_not_supported_error) — the client's fault. /health answers 503
// "LLM is unavailable". Other 5xx are engine faults; a CppExecutorError
// makes the server signal itself to stop (openai_server.py at 00057725).
func (*Adapter) Classify(status int, _ []byte) engines.Fault {
	return engines.ClassifyStatus(status)
}

// Surfaces: GET /health (200 empty), GET /version, GET /v1/models and the
// Prometheus text at /prometheus/metrics, mounted only when the LLM API
// option return_perf_metrics is set (a YAML config key, not a CLI flag).
// GET /metrics is a JSON list of iteration stats, not Prometheus. No
// tokenize route is registered (openai_server.py at 00057725).
func (*Adapter) Surfaces() engines.Surfaces {
	return engines.Surfaces{
		Health:       "/health",
		Version:      "/version",
		Metrics:      "/prometheus/metrics",
		MetricsOptIn: "return_perf_metrics",
		Models:       "/v1/models",
	}
}

// ParseVersion reads GET /version: {"version": tensorrt_llm.__version__}.
func (*Adapter) ParseVersion(body []byte) (string, error) {
	return engines.VersionField(body, "trtllm /version")
}

// Metrics: MetricsCollector's series (prefix trtllm_,
// tensorrt_llm/metrics/collector.py at 050f80de). The collector also exports
// trtllm_prompt_cached_tokens_total and trtllm_prompt_cache_hit_tokens_total,
// whose exact meaning (and which one matches vLLM's prefix-cache hits) was
// not established, so the prefix series are left empty.
func (*Adapter) Metrics() engines.MetricNames {
	return engines.MetricNames{
		Requests:        "trtllm_request_success_total",
		PromptTokens:    "trtllm_prompt_tokens_total",
		RunningRequests: "trtllm_num_requests_running",
		WaitingRequests: "trtllm_num_requests_waiting",
	}
}

// ReportedHashAlgo is the kv_cache_hash_algo trtllm-serve reports for its
// classic engine block key ("v1_block_key"; kvhash.TRTLLMBlockKey computes
// it). It is TensorRT-LLM's name for its lookup handle, not an llmgw
// algorithm: the routing keys llmgw derives from TRT's events are
// blockhash_trtllm (KV().HashAlgo), the only name llmgw gives TRT's
// algorithm.
const ReportedHashAlgo = "v1_block_key"

// Tokenize: trtllm-serve has no tokenize endpoint.
func (*Adapter) Tokenize() *engines.TokenizeShape { return nil }

// KV: POST /kv_cache_events drains the engine's event queue (a read removes
// the events: one consumer; openai_server.py at 00057725). Events need
// kv_cache_config.event_buffer_max_size > 0 (default 0,
// spec/engine-contracts.md §4.1). BlockSize is KvCacheConfig's
// tokens_per_block default, 32 (tensorrt_llm/llmapi/llm_args.py; two stored
// versions show it, the index named no commit for them). HashAlgo is
// llmgw's name (engines/kvhash); the engine reports its own algorithm as
// "v1_block_key" (ReportedHashAlgo).
func (*Adapter) KV() *engines.KVContract {
	return &engines.KVContract{
		Transport:   engines.EventsHTTPPoll,
		HashAlgo:    string(kvhash.BlockHashTRTLLM),
		HashAlgos:   []string{string(kvhash.BlockHashTRTLLM)},
		BlockSize:   32,
		PollPath:    "/kv_cache_events",
		Destructive: true,
	}
}

// PD: a context-only request, then generation with disaggregated params
// (pd.go).
func (*Adapter) PD() engines.PDProtocol { return pd{} }
