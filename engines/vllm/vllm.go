// Package vllm is vLLM's OpenAI server contract (catalog version 0.31.0).
//
// Sources: vLLM's public source (vllm-project/vllm), cited per fact in
// testdata/PROVENANCE; where a fact could not be established from the
// source, the comment says so.
package vllm

import (
	"encoding/json"
	"fmt"
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
// VLLM_HTTP_TIMEOUT_KEEP_ALIVE, default 5 s (vllm/envs.py).
const IdleTimeout = 5 * time.Second

// Conn: uvicorn keeps connections alive after streamed answers; idle
// connections close after 5 s.
func (*Adapter) Conn() engines.ConnPolicy {
	return engines.ConnPolicy{IdleTimeout: IdleTimeout}
}

// Classify: vLLM answers request validation failures with 4xx
// (ErrorResponse, BadRequestError) and engine failures with 5xx.
func (*Adapter) Classify(status int, _ []byte) engines.Fault {
	return classifyByStatus(status)
}

func classifyByStatus(status int) engines.Fault {
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

func (*Adapter) Surfaces() engines.Surfaces {
	return engines.Surfaces{
		Health:   "/health",
		Version:  "/version",
		Tokenize: "/tokenize",
		Metrics:  "/metrics",
		Models:   "/v1/models",
	}
}

// ParseVersion reads GET /version: {"version":"0.31.0"}.
func (*Adapter) ParseVersion(body []byte) (string, error) {
	return versionField(body, "vllm")
}

func versionField(body []byte, who string) (string, error) {
	var v struct {
		Version string `json:"version"`
	}
	if err := json.Unmarshal(body, &v); err != nil {
		return "", fmt.Errorf("%s: version: %w", who, err)
	}
	if v.Version == "" {
		return "", fmt.Errorf("%w: %s answer has no \"version\"", engines.ErrNoVersion, who)
	}
	return v.Version, nil
}

// Metrics: vLLM v1's Prometheus series (vllm/v1/metrics/loggers.py).
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

// KV: ZMQ PUB of msgpack batches (--kv-events-config publisher "zmq",
// endpoint tcp://*:5557, replay endpoint optional), sha256_cbor blocks of
// 16 tokens.
func (*Adapter) KV() *engines.KVContract {
	return &engines.KVContract{
		Transport:    engines.EventsZMQ,
		HashAlgo:     string(kvhash.SHA256CBOR),
		HashAlgos:    []string{string(kvhash.SHA256CBOR), string(kvhash.XXHashCBOR)},
		BlockSize:    16,
		Layout:       engines.EventLayoutMap,
		ZMQPort:      5557,
		ReplayOffset: 1000,
	}
}

// PD: sequential, prefill then decode (pd.go).
func (*Adapter) PD() engines.PDProtocol { return pd{} }
