package vllm

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"

	"github.com/llmgw/llmgw/engines"
)

// Describer: what a running vLLM says about itself on read-only surfaces.
//
// vLLM reports no P/D role (kv_transfer_config) and no PYTHONHASHSEED on any
// read-only surface; the planner learns the seed only from published events.
// Sources: /v1/models' "max_model_len" (vllm/entrypoints/openai/protocol.py
// ModelCard); the Prometheus info gauge vllm:cache_config_info, whose labels
// are every CacheConfig field as a string (CacheConfig.metrics_info in
// vllm/config/cache.py, exported by log_metrics_info in
// vllm/v1/metrics/loggers.py), among them block_size and
// prefix_caching_hash_algo.
func (*Adapter) OwnedBy() string { return "vllm" }

// The cache configuration info gauge. Every CacheConfig field is a label,
// its value Python's str() of the field ("True", "None", "16"), plus
// "engine" (the engine index); the value is 1. Source: vLLM
// vllm/config/cache.py CacheConfig.metrics_info ({key: str(value) for key,
// value in self.__dict__.items()}, revision
// 002f10e0cfa1373a19a0d2756598a34b700d20e5) and vllm/v1/metrics/loggers.py
// PrometheusStatLogger.log_metrics_info (name, documentation and the
// "engine" label). It is published at start-up, before any request.
const (
	CacheConfigInfo     = "vllm:cache_config_info"
	CacheConfigInfoHelp = "Information of the LLMEngine CacheConfig"
	LabelBlockSize      = "block_size"
	LabelHashAlgo       = "prefix_caching_hash_algo"
	LabelNumGPUBlocks   = "num_gpu_blocks"
)

// CacheConfigLabels are the labels of one engine's vllm:cache_config_info
// sample for a cache of numGPUBlocks blocks of blockSize tokens hashed with
// hashAlgo: the CacheConfig fields of the cited revision that do not depend
// on a GPU or a hybrid (Mamba) model, valued as vLLM does by default. The
// simulator publishes exactly these.
func CacheConfigLabels(blockSize, numGPUBlocks int, hashAlgo string, engineIndex int) map[string]string {
	return map[string]string{
		LabelBlockSize:                    strconv.Itoa(blockSize),
		"user_specified_block_size":       "True",
		"gpu_memory_utilization":          "0.92",
		"cache_dtype":                     "auto",
		"is_attention_free":               "False",
		"num_gpu_blocks_override":         "None",
		"sliding_window":                  "None",
		"enable_prefix_caching":           "True",
		LabelHashAlgo:                     hashAlgo,
		"prefix_cache_retention_interval": "0",
		"kv_cache_dtype_skip_layers":      "[]",
		"mamba_block_size":                "None",
		"mamba_cache_mode":                "none",
		LabelNumGPUBlocks:                 strconv.Itoa(numGPUBlocks),
		"num_cpu_blocks":                  "None",
		"kv_sharing_fast_prefill":         "False",
		"kv_cache_memory_bytes":           "None",
		"kv_offloading_size":              "None",
		"kv_offloading_backend":           "native",
		"engine":                          strconv.Itoa(engineIndex),
	}
}

func (*Adapter) DescribePaths() []string { return []string{"/v1/models", "/metrics"} }

func (*Adapter) Describe(path string, body []byte, d *engines.Description) error {
	switch path {
	case "/v1/models":
		var m struct {
			Data []struct {
				OwnedBy     string `json:"owned_by"`
				MaxModelLen int    `json:"max_model_len"`
			} `json:"data"`
		}
		if err := json.Unmarshal(body, &m); err != nil {
			return fmt.Errorf("vllm: /v1/models: %w", err)
		}
		for _, e := range m.Data {
			if e.OwnedBy != "vllm" {
				return fmt.Errorf("vllm: /v1/models: owned_by %q, not vllm", e.OwnedBy)
			}
			if e.MaxModelLen > 0 && d.ContextLength == 0 {
				d.ContextLength = e.MaxModelLen
				d.Said("context_length", "GET /v1/models max_model_len")
			}
		}
		return nil
	case "/metrics":
		if !bytes.Contains(body, []byte("vllm:")) {
			return errors.New("vllm: /metrics has no vllm: series")
		}
		labels, ok := infoLabels(body, CacheConfigInfo)
		if !ok {
			return nil // older vLLM, or a build without the info gauge
		}
		if n, err := strconv.Atoi(labels[LabelBlockSize]); err == nil && n > 0 {
			d.BlockSize = n
			d.Said("block_size", "GET /metrics "+CacheConfigInfo+"{"+LabelBlockSize+"}")
		}
		if a := labels[LabelHashAlgo]; a != "" {
			d.HashAlgo = a
			d.Said("hash_algo", "GET /metrics "+CacheConfigInfo+"{"+LabelHashAlgo+"}")
		}
		return nil
	}
	return fmt.Errorf("vllm: no description at %s", path)
}

// infoLabels returns the labels of the first sample of the info gauge name
// in Prometheus text.
func infoLabels(text []byte, name string) (map[string]string, bool) {
	for _, line := range bytes.Split(text, []byte("\n")) {
		rest, ok := bytes.CutPrefix(line, []byte(name+"{"))
		if !ok {
			continue
		}
		return parseLabels(rest), true
	}
	return nil, false
}

// parseLabels reads `k="v",k2="v2"}...` (Prometheus text label syntax, with
// \" \\ \n escapes) up to the closing brace.
func parseLabels(b []byte) map[string]string {
	out := map[string]string{}
	for len(b) > 0 && b[0] != '}' {
		eq := bytes.IndexByte(b, '=')
		if eq < 0 || eq+1 >= len(b) || b[eq+1] != '"' {
			return out
		}
		key := string(bytes.TrimLeft(b[:eq], ", "))
		var val []byte
		i := eq + 2
		for ; i < len(b) && b[i] != '"'; i++ {
			if b[i] == '\\' && i+1 < len(b) {
				i++
				switch b[i] {
				case 'n':
					val = append(val, '\n')
				default:
					val = append(val, b[i])
				}
				continue
			}
			val = append(val, b[i])
		}
		if i >= len(b) {
			return out
		}
		out[key] = string(val)
		b = bytes.TrimLeft(b[i+1:], ",")
	}
	return out
}

// TokenizeBody: POST /tokenize {"model","prompt","add_special_tokens":false}
// (vllm/entrypoints/openai/protocol.py TokenizeCompletionRequest).
func (*Adapter) TokenizeBody(model, text string) []byte {
	b, _ := json.Marshal(map[string]any{"model": model, "prompt": text, "add_special_tokens": false})
	return b
}

// ParseTokens reads {"count":n,"max_model_len":m,"tokens":[...]}.
func (*Adapter) ParseTokens(body []byte) ([]uint32, error) { return tokensField(body, "vllm") }

func tokensField(body []byte, who string) ([]uint32, error) {
	var t struct {
		Tokens *[]uint32 `json:"tokens"`
	}
	if err := json.Unmarshal(body, &t); err != nil {
		return nil, fmt.Errorf("%s: tokenize: %w", who, err)
	}
	if t.Tokens == nil {
		return nil, fmt.Errorf("%s: tokenize answer has no \"tokens\"", who)
	}
	return *t.Tokens, nil
}

// EventsProbe: vLLM's events are a ZMQ PUB stream, not destructive.
func (*Adapter) EventsProbe() (string, string, int) { return "", "", 0 }

// Guide: the guide starts vLLM on plain fullproxy, then prefix affinity,
// then single-pool KV-exact once hash parity holds; a role-split pool runs
// sequential P/D (prefill, then decode with kv_transfer_params over NIXL),
// optionally with kvExactMode 1.
func (*Adapter) Guide() engines.Guide {
	return engines.Guide{
		FirstSel:    0,
		FirstWhy:    "the guide starts vLLM on plain health-checked fullproxy (round robin): one capability at a time, so a later failure is attributable",
		AffinityWhy: "vLLM's automatic prefix caching rewards sending a shared prefix to the same worker: CHWBL keeps it there with bounded load",
		KVExactWhy:  "vLLM publishes BlockStored/BlockRemoved over ZeroMQ: kvExactMode 3 routes on the blocks each worker holds, but only after hash parity (algorithm, PYTHONHASHSEED, block size, tokenizer) is verified",
		PDWhy:       "vLLM prefill/decode is sequential: the prefill answers with kv_transfer_params and the decode is sent the hand-off (NIXL); kvExactMode 1 may score prefills once parity holds",
	}
}

var (
	_ engines.Describer = (*Adapter)(nil)
	_ engines.Guided    = (*Adapter)(nil)
)
