// Package sglang is SGLang's HTTP server contract (catalog version 0.5.19).
//
// Sources: SGLang's public source (sgl-project/sglang). Every fact below is
// recorded with its repository, path and commit in testdata/adapter.json
// and testdata/cases (see testdata/PROVENANCE, which also says what could
// not be established: the commits cited are the revisions read, not a
// verified v0.5.19).
package sglang

import (
	"time"

	"github.com/llmgw/llmgw/engines"
	"github.com/llmgw/llmgw/engines/kvhash"
)

func init() { engines.Register(&Adapter{}) }

// Adapter is SGLang's engines.Adapter.
type Adapter struct{}

func (*Adapter) Kind() engines.Kind { return engines.SGLang }
func (*Adapter) Display() string    { return "SGLang" }

// IdleTimeout: SGLang runs uvicorn with timeout_keep_alive=5, hard-coded in
// launch_server (python/sglang/srt/entrypoints/http_server.py at 0025436e).
const IdleTimeout = 5 * time.Second

// Conn: uvicorn keeps a connection alive after a streamed answer and closes
// it after IdleTimeout idle.
func (*Adapter) Conn() engines.ConnPolicy {
	return engines.ConnPolicy{IdleTimeout: IdleTimeout}
}

// Classify: request validation answers 400 (type "Bad Request"), the
// serving code's rejections 400 BadRequestError, unknown routes and models
// 404 — the client's fault. /health answers 503 while the server starts,
// shuts down or fails its health generation: alive but refusing work.
// Other 5xx are engine faults (http_server.py at 0025436e).
func (*Adapter) Classify(status int, _ []byte) engines.Fault {
	switch {
	case status < 400:
		return engines.FaultNone
	case status < 500:
		return engines.FaultClient
	case status == 503:
		return engines.FaultOverloaded
	}
	return engines.FaultEngine
}

// Surfaces: GET /health (the same handler as /health_generate: a 1-token
// generation, 200 empty), GET /get_server_info (server args, scheduler info
// and "version"; SGLang has no /version route in the revision read), POST
// /v1/tokenize (also /tokenize), GET /v1/models, and GET /metrics, which
// exists only when the server runs with --enable-metrics (http_server.py at
// 0025436e; docs/advanced_features/server_arguments.md at 004813e1).
func (*Adapter) Surfaces() engines.Surfaces {
	return engines.Surfaces{
		Health:       "/health",
		Version:      "/get_server_info",
		Tokenize:     "/v1/tokenize",
		Metrics:      "/metrics",
		MetricsOptIn: "--enable-metrics",
		Models:       "/v1/models",
	}
}

// ParseVersion reads /get_server_info's "version" (sglang.version's
// __version__).
func (*Adapter) ParseVersion(body []byte) (string, error) {
	return engines.VersionField(body, "sglang server info")
}

// Metrics: the tokenizer's counters and the scheduler's gauges
// (python/sglang/srt/metrics/collector.py at 00ae9c15). SGLang counts
// cached prompt tokens (sglang:cached_tokens_total) but exports no
// prefix-lookup counter, so PrefixQueries is empty.
func (*Adapter) Metrics() engines.MetricNames {
	return engines.MetricNames{
		Requests:        "sglang:num_requests_total",
		PromptTokens:    "sglang:prompt_tokens_total",
		PrefixHits:      "sglang:cached_tokens_total",
		RunningRequests: "sglang:num_running_reqs",
		WaitingRequests: "sglang:num_queue_reqs",
	}
}

// Tokenize: POST /v1/tokenize (also /tokenize) takes TokenizeRequest
// {model, prompt, add_special_tokens} and answers TokenizeResponse
// {tokens, count, max_model_len} (http_server.py at 0025436e,
// openai/protocol.py at 004c82e0; testdata/cases/tokenize.json). No chat
// form is established, so MessagesField is empty. The add_special_tokens
// default (true) is read from the request model, not from a capture.
func (*Adapter) Tokenize() *engines.TokenizeShape {
	return &engines.TokenizeShape{
		TextField: "prompt", AddSpecialField: "add_special_tokens", AddSpecialDefault: true,
		ModelField: "model", TokensField: "tokens",
	}
}

// KV: ZMQ PUB (SGLang's copy of vLLM's event publisher). KVEventsConfig's
// publisher defaults to "null" (events need --kv-events-config with
// publisher "zmq"), endpoint tcp://*:5557, no replay socket by default
// (spec/engine-contracts.md §3.1, [high]). HashAlgo is llmgw's name for
// SGLang's SHA-256 page chain (engines/kvhash). BlockSize is the engine's
// default page size, 1 token (--page-size, server_arguments.md at
// 004813e1): one event per token unless the launch sets a larger page, as
// the catalog's launch specs do.
func (*Adapter) KV() *engines.KVContract {
	return &engines.KVContract{
		Transport: engines.EventsZMQ,
		HashAlgo:  string(kvhash.SHA256SGLang),
		HashAlgos: []string{string(kvhash.SHA256SGLang)},
		BlockSize: 1,
		Layout:    engines.EventLayoutArray,
		ZMQPort:   5557,
	}
}

// PD: concurrent prefill and decode joined by a bootstrap triple (pd.go).
func (*Adapter) PD() engines.PDProtocol { return pd{} }
