// Package sglang is SGLang's HTTP server contract.
//
// Sources: SGLang's public source (sgl-project/sglang), cited per fact in
// testdata/PROVENANCE; where a fact could not be established from the
// source, the comment says so.
package sglang

import (
	"encoding/json"
	"fmt"
	"time"

	"github.com/llmgw/llmgw/engines"
	"github.com/llmgw/llmgw/engines/kvhash"
)

func init() { engines.Register(&Adapter{}) }

// Adapter is SGLang's engines.Adapter.
type Adapter struct{}

func (*Adapter) Kind() engines.Kind { return engines.SGLang }
func (*Adapter) Display() string    { return "SGLang" }

// IdleTimeout: SGLang serves through uvicorn (timeout_keep_alive 5 s).
const IdleTimeout = 5 * time.Second

func (*Adapter) Conn() engines.ConnPolicy {
	return engines.ConnPolicy{IdleTimeout: IdleTimeout}
}

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

func (*Adapter) Surfaces() engines.Surfaces {
	return engines.Surfaces{
		Health:   "/health",
		Version:  "/get_server_info",
		Metrics:  "/metrics", // with --enable-metrics
		Models:   "/v1/models",
		Tokenize: "",
	}
}

// ParseVersion reads /get_server_info's "version".
func (*Adapter) ParseVersion(body []byte) (string, error) {
	var v struct {
		Version string `json:"version"`
	}
	if err := json.Unmarshal(body, &v); err != nil {
		return "", fmt.Errorf("sglang: server info: %w", err)
	}
	if v.Version == "" {
		return "", fmt.Errorf("%w: sglang server info has no \"version\"", engines.ErrNoVersion)
	}
	return v.Version, nil
}

func (*Adapter) Metrics() engines.MetricNames {
	return engines.MetricNames{
		PromptTokens:    "sglang:prompt_tokens_total",
		RunningRequests: "sglang:num_running_reqs",
		WaitingRequests: "sglang:num_queue_reqs",
	}
}

// Tokenize: SGLang's catalog version has no tokenize endpoint that this
// package has established from the source (Surfaces().Tokenize is empty).
func (*Adapter) Tokenize() *engines.TokenizeShape { return nil }

// KV: ZMQ PUB (the vLLM-compatible event publisher), SGLang's signed
// 64-bit block hashes over pages of 16 tokens... see testdata/PROVENANCE.
func (*Adapter) KV() *engines.KVContract {
	return &engines.KVContract{
		Transport:    engines.EventsZMQ,
		HashAlgo:     string(kvhash.SHA256SGLang),
		HashAlgos:    []string{string(kvhash.SHA256SGLang)},
		BlockSize:    16,
		Layout:       engines.EventLayoutArray,
		ZMQPort:      5557,
		ReplayOffset: 1000,
	}
}

// PD: concurrent prefill and decode joined by a bootstrap triple (pd.go).
func (*Adapter) PD() engines.PDProtocol { return pd{} }
