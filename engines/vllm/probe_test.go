package vllm

import (
	"testing"

	"github.com/llmgw/llmgw/engines"
)

// cacheConfigInfo is the shape of vLLM's info gauge: one sample whose
// labels are CacheConfig's fields as strings (vllm/config/cache.py
// metrics_info; vllm/v1/metrics/loggers.py log_metrics_info). Written from
// the source, not captured: the label order and the full label set of a
// given version were not recorded.
const cacheConfigInfo = `# HELP vllm:cache_config_info Information of the LLMEngine CacheConfig
# TYPE vllm:cache_config_info gauge
vllm:cache_config_info{block_size="32",cache_dtype="auto",enable_prefix_caching="True",gpu_memory_utilization="0.9",num_gpu_blocks="2000",prefix_caching_hash_algo="sha256_cbor",swap_space="4"} 1.0
vllm:num_requests_running{engine="0",model_name="m"} 0.0
`

func TestDescribe(t *testing.T) {
	a := &Adapter{}
	var d engines.Description
	if err := a.Describe("/metrics", []byte(cacheConfigInfo), &d); err != nil {
		t.Fatal(err)
	}
	if d.BlockSize != 32 || d.HashAlgo != "sha256_cbor" {
		t.Errorf("description = %+v; want block 32, sha256_cbor", d)
	}
	var m engines.Description
	models := `{"object":"list","data":[{"id":"m","object":"model","owned_by":"vllm","max_model_len":4096}]}`
	if err := a.Describe("/v1/models", []byte(models), &m); err != nil || m.ContextLength != 4096 {
		t.Errorf("models: %+v %v", m, err)
	}
	cases := []struct{ path, body string }{
		{"/metrics", "llamacpp:prompt_tokens_total 1\n"},
		{"/v1/models", `{"data":[{"id":"m","owned_by":"sglang"}]}`},
		{"/v1/models", `{"data":`},
		{"/props", `{}`},
	}
	for _, tc := range cases {
		if err := a.Describe(tc.path, []byte(tc.body), &engines.Description{}); err == nil {
			t.Errorf("Describe(%s, %s) accepted another engine's answer", tc.path, tc.body)
		}
	}
}

func TestParseLabels(t *testing.T) {
	got := parseLabels([]byte(`a="1",b="x\"y\\z",c="line\nnext"} 1`))
	if got["a"] != "1" || got["b"] != `x"y\z` || got["c"] != "line\nnext" || len(got) != 3 {
		t.Errorf("labels = %q", got)
	}
	if got := parseLabels([]byte(`a="unterminated`)); len(got) != 0 {
		t.Errorf("unterminated value gave %q", got)
	}
}

func FuzzDescribe(f *testing.F) {
	f.Add([]byte(cacheConfigInfo))
	f.Add([]byte(`vllm:cache_config_info{block_size="-4",prefix_caching_hash_algo=""} 1`))
	f.Fuzz(func(t *testing.T, b []byte) {
		a := &Adapter{}
		var d engines.Description
		if err := a.Describe("/metrics", b, &d); err == nil && d.BlockSize < 0 {
			t.Fatalf("negative block size accepted: %+v", d)
		}
		_ = a.Describe("/v1/models", b, &engines.Description{})
		_, _ = a.ParseTokens(b)
	})
}
