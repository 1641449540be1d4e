// Package trtllm is TensorRT-LLM's trtllm-serve contract (catalog version
// 1.3.0rc29).
//
// Sources: TensorRT-LLM's public source (NVIDIA/TensorRT-LLM), cited per
// fact in testdata/PROVENANCE; where a fact could not be established from
// the source, the comment says so.
package trtllm

import (
	"encoding/json"
	"fmt"
	"time"

	"github.com/llmgw/llmgw/engines"
	"github.com/llmgw/llmgw/engines/kvhash"
)

func init() { engines.Register(&Adapter{}) }

// Adapter is TensorRT-LLM's engines.Adapter.
type Adapter struct{}

func (*Adapter) Kind() engines.Kind { return engines.TRTLLM }
func (*Adapter) Display() string    { return "TensorRT-LLM" }

// IdleTimeout: trtllm-serve runs uvicorn (timeout_keep_alive 5 s default).
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
		Health:  "/health",
		Version: "/version",
		Metrics: "/prometheus/metrics",
		Models:  "/v1/models",
	}
}

// ParseVersion reads GET /version: {"version":"1.3.0rc29"}.
func (*Adapter) ParseVersion(body []byte) (string, error) {
	var v struct {
		Version string `json:"version"`
	}
	if err := json.Unmarshal(body, &v); err != nil {
		return "", fmt.Errorf("trtllm: /version: %w", err)
	}
	if v.Version == "" {
		return "", fmt.Errorf("%w: trtllm /version has no \"version\"", engines.ErrNoVersion)
	}
	return v.Version, nil
}

func (*Adapter) Metrics() engines.MetricNames { return engines.MetricNames{} }

// ReportedHashAlgo is the kv_cache_hash_algo trtllm-serve reports for its
// classic engine block key ("v1_block_key"; kvhash.TRTLLMBlockKey computes
// it). It is TensorRT-LLM's name for its lookup handle, not an llmgw
// algorithm: the routing keys llmgw derives from TRT's events are
// blockhash_trtllm (KV().HashAlgo), the only name llmgw gives TRT's
// algorithm.
const ReportedHashAlgo = "v1_block_key"

// Tokenize: trtllm-serve has no tokenize endpoint.
func (*Adapter) Tokenize() *engines.TokenizeShape { return nil }

// KV: HTTP drain of /kv_cache_events (destructive: one consumer).
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
