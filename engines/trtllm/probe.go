package trtllm

import (
	"encoding/json"
	"fmt"
	"net/http"

	"github.com/llmgw/llmgw/engines"
)

// Describer: what a running trtllm-serve says about itself on GET
// /server_info: tokens_per_block, kv_cache_hash_algo and the disaggregated
// role. Source: the reference gateway requires exactly these fields there
// (kv_cache_hash_algo "v1_block_key" and a tokens_per_block equal to
// kvBlockSize, re-checked every 60 s; runbooks reference §1.4). The public
// trtllm-serve source does not serve them: in NVIDIA/TensorRT-LLM
// tensorrt_llm/serve/openai_server.py (revision
// 00057725d9a6591f033e44f31c219e2426827bb7) GET /server_info answers only
// {"disaggregated_params": ...}, /metrics is the drained iteration-stats
// array, and no read-only surface names tokens_per_block or the hash
// algorithm. Against such a build the block size and hash stay unknown
// until published events tell them (and the role must be declared with
// --endpoints host:port=context). The simulator answers the reference's
// fields.
func (*Adapter) OwnedBy() string { return "tensorrt_llm" }

func (*Adapter) DescribePaths() []string { return []string{"/server_info"} }

func (*Adapter) Describe(path string, body []byte, d *engines.Description) error {
	if path != "/server_info" {
		return fmt.Errorf("trtllm: no description at %s", path)
	}
	var info struct {
		TokensPerBlock int    `json:"tokens_per_block"`
		HashAlgo       string `json:"kv_cache_hash_algo"`
		Role           string `json:"disaggregated_role"`
	}
	if err := json.Unmarshal(body, &info); err != nil {
		return fmt.Errorf("trtllm: /server_info: %w", err)
	}
	const src = "GET /server_info "
	if info.TokensPerBlock > 0 {
		d.BlockSize = info.TokensPerBlock
		d.Said("block_size", src+"tokens_per_block")
	}
	switch info.HashAlgo {
	case "":
	case "v1_block_key":
		// The classic block key the gateway re-hashes as blockhash_trtllm.
		d.HashAlgo = "blockhash_trtllm"
		d.Said("hash_algo", src+"kv_cache_hash_algo v1_block_key")
	default:
		d.HashAlgo = info.HashAlgo
		d.Said("hash_algo", src+"kv_cache_hash_algo")
	}
	switch info.Role {
	case "":
	case "converged":
		d.Role = engines.RoleConverged
	case "context":
		d.Role = engines.RoleContext
	case "generation":
		d.Role = engines.RoleGeneration
	default:
		return fmt.Errorf("trtllm: /server_info: disaggregated_role %q is not converged, context or generation", info.Role)
	}
	if info.Role != "" {
		d.Said("role", src+"disaggregated_role")
	}
	return nil
}

// TokenizeBody: trtllm-serve has no tokenize surface.
func (*Adapter) TokenizeBody(string, string) []byte { return nil }

func (*Adapter) ParseTokens([]byte) ([]uint32, error) {
	return nil, fmt.Errorf("trtllm: no tokenize surface")
}

// EventsProbe: POST /kv_cache_events drains the queue, so the planner never
// POSTs it. A GET reaches the same route and is answered 405 Method Not
// Allowed (FastAPI refuses the method before the handler runs), which
// proves the endpoint is served without touching the queue. Whether
// another consumer already drains it cannot be told from outside: the
// engine exposes no consumer count, and an empty drain looks the same to
// every reader.
func (*Adapter) EventsProbe() (string, string, int) {
	return http.MethodGet, "/kv_cache_events", http.StatusMethodNotAllowed
}

// Guide: TensorRT-LLM starts on plain fullproxy; KV-exact or P/D follow.
func (*Adapter) Guide() engines.Guide {
	return engines.Guide{
		FirstSel:    0,
		FirstWhy:    "the guide starts TensorRT-LLM on plain health-checked fullproxy (round robin) before any KV feature",
		AffinityWhy: "TensorRT-LLM's KV block reuse rewards prefix affinity: CHWBL keeps a shared prefix on one worker",
		KVExactWhy:  "TensorRT-LLM's /kv_cache_events is a destructive drain: kvExactMode 3 works only when this gateway is its sole consumer, after parity (tokens_per_block, v1_block_key) is verified",
		PDWhy:       "TensorRT-LLM P/D is context-first: a context_only request, then generation_only with its disaggregated_params",
	}
}

var (
	_ engines.Describer = (*Adapter)(nil)
	_ engines.Guided    = (*Adapter)(nil)
)
