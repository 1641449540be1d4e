// Package vllm is vLLM's OpenAI server contract (catalog version 0.31.0).
//
// Sources: vLLM's public source (vllm-project/vllm). Every fact below is
// recorded with its repository, path and commit in testdata/adapter.json
// and testdata/cases (see testdata/PROVENANCE, which also says what could
// not be established: the index read holds no tag mapping, so the commits
// cited are the revisions read, not a verified v0.31.0).
package vllm

import (
	"time"

	"github.com/llmgw/llmgw/engines"
	"github.com/llmgw/llmgw/engines/kvhash"
)

func init() { engines.Register(&Adapter{}) }

// Adapter is vLLM's engines.Adapter.
type Adapter struct{}

func (*Adapter) Kind() engines.Kind { return engines.VLLM }
func (*Adapter) Display() string    { return "vLLM" }

// IdleTimeout: vLLM serves through uvicorn with timeout_keep_alive =
// VLLM_HTTP_TIMEOUT_KEEP_ALIVE, whose default is "5" seconds (vllm/envs.py
// at 001f69f8; the launcher hands it to uvicorn.Config, launcher.py at
// 02828a12).
const IdleTimeout = 5 * time.Second

// Conn: uvicorn keeps a connection alive after a streamed answer (nothing in
// vLLM closes it) and closes it after IdleTimeout idle. No per-connection
// request limit and no concurrency limit are configured.
func (*Adapter) Conn() engines.ConnPolicy {
	return engines.ConnPolicy{IdleTimeout: IdleTimeout}
}

// Classify: vLLM answers the client's mistakes with 4xx (FastAPI request
// validation: 400 "Bad Request"; create_error_response: 400 BadRequestError,
// 404 NotFoundError, 422 UnprocessableEntityError) and with 501 when the
// request asks for a feature the server does not implement
// (NotImplementedError) — the engine is healthy in all of these. Engine
// failures are 500 (EngineDeadError and EngineGenerateError answer an empty
// 500); /health answers 503 when the engine is dead (exception_handling/
// error_response.py at 055e47c2, launcher.py at 02828a12).
func (*Adapter) Classify(status int, _ []byte) engines.Fault {
	return engines.ClassifyStatus(status)
}

// Surfaces: GET /health (200, empty body), GET /version, POST /tokenize,
// GET /metrics (always on), GET /v1/models (instrumentator/health.py and
// basic.py at 055e47c2, serve/tokenize/protocol.py at 030ea52e).
func (*Adapter) Surfaces() engines.Surfaces {
	return engines.Surfaces{
		Health:   "/health",
		Version:  "/version",
		Tokenize: "/tokenize",
		Metrics:  "/metrics",
		Models:   "/v1/models",
	}
}

// ParseVersion reads GET /version: {"version": VLLM_VERSION}.
func (*Adapter) ParseVersion(body []byte) (string, error) {
	return engines.VersionField(body, "vllm /version")
}

// Metrics: vLLM v1's PrometheusStatLogger series (vllm/v1/metrics/loggers.py;
// names as exposed, counters with _total; testdata/cases/metrics.json).
func (*Adapter) Metrics() engines.MetricNames {
	return engines.MetricNames{
		Requests:        "vllm:request_success_total",
		PromptTokens:    "vllm:prompt_tokens_total",
		PrefixQueries:   "vllm:prefix_cache_queries_total",
		PrefixHits:      "vllm:prefix_cache_hits_total",
		RunningRequests: "vllm:num_requests_running",
		WaitingRequests: "vllm:num_requests_waiting",
	}
}

// Tokenize: POST /tokenize with TokenizeCompletionRequest {model, prompt,
// add_special_tokens (default true)} or TokenizeChatRequest {model,
// messages, ...}; the answer is TokenizeResponse {count, max_model_len,
// tokens, token_strs} (vllm/entrypoints/openai/protocol.py).
func (*Adapter) Tokenize() *engines.TokenizeShape {
	return &engines.TokenizeShape{
		TextField: "prompt", MessagesField: "messages", AddSpecialField: "add_special_tokens", AddSpecialDefault: true,
		ModelField: "model", TokensField: "tokens",
	}
}

// KV: ZMQ PUB of msgpack batches. KVEventsConfig's endpoint defaults to
// tcp://*:5557 and replay_endpoint to None, so there is no replay socket
// unless one is configured (ReplayOffset 0; the catalog's launch specs add
// one at port+1) (vllm/config/kv_events.py at 00634b8a). Blocks are 16
// tokens (CacheConfig.DEFAULT_BLOCK_SIZE, vllm/config/cache.py at 002f10e0).
//
// HashAlgo is sha256_cbor, the algorithm llmgw launches vLLM with
// (--prefix-caching-hash-algo sha256_cbor). vLLM's own default is "sha256"
// over pickle (cache.py), which is not reproducible outside CPython and
// which engines/kvhash does not implement: a vLLM started without the flag
// publishes hashes the gateway cannot predict.
func (*Adapter) KV() *engines.KVContract {
	return &engines.KVContract{
		Transport: engines.EventsZMQ,
		HashAlgo:  string(kvhash.SHA256CBOR),
		HashAlgos: []string{string(kvhash.SHA256CBOR), string(kvhash.XXHashCBOR)},
		BlockSize: 16,
		Layout:    engines.EventLayoutMap,
		ZMQPort:   5557,
	}
}

// PD: sequential, prefill then decode (pd.go).
func (*Adapter) PD() engines.PDProtocol { return pd{} }
