package trtllm

import (
	"testing"

	"github.com/llmgw/llmgw/engines"
)

func TestDescribe(t *testing.T) {
	a := &Adapter{}
	cases := []struct {
		body string
		role engines.Role
	}{
		{`{"model":"m","tokens_per_block":32,"kv_cache_hash_algo":"v1_block_key","disaggregated_role":"context"}`, engines.RoleContext},
		{`{"model":"m","tokens_per_block":32,"kv_cache_hash_algo":"v1_block_key","disaggregated_role":"generation"}`, engines.RoleGeneration},
		{`{"model":"m","tokens_per_block":32,"kv_cache_hash_algo":"v1_block_key","disaggregated_role":"converged"}`, engines.RoleConverged},
	}
	for _, tc := range cases {
		var d engines.Description
		if err := a.Describe("/server_info", []byte(tc.body), &d); err != nil {
			t.Fatal(err)
		}
		if d.Role != tc.role || d.BlockSize != 32 || d.HashAlgo != "blockhash_trtllm" {
			t.Errorf("%s: %+v", tc.body, d)
		}
	}
	if err := a.Describe("/server_info", []byte(`{"disaggregated_role":"both"}`), &engines.Description{}); err == nil {
		t.Error("unknown role accepted")
	}
	if m, p, st := a.EventsProbe(); m != "GET" || p != "/kv_cache_events" || st != 405 {
		t.Errorf("events probe = %s %s %d; the drain must be tested with a non-POST", m, p, st)
	}
}

func FuzzDescribe(f *testing.F) {
	f.Add([]byte(`{"tokens_per_block":32,"kv_cache_hash_algo":"v1_block_key","disaggregated_role":"context"}`))
	f.Fuzz(func(t *testing.T, b []byte) {
		var d engines.Description
		if err := (&Adapter{}).Describe("/server_info", b, &d); err == nil && d.BlockSize < 0 {
			t.Fatalf("negative block size: %+v", d)
		}
	})
}
