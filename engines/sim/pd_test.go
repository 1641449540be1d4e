package sim

import (
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/llmgw/llmgw/engines"
)

// TestVLLMNixlHandOff runs the toy-proxy sequence: prefill with
// do_remote_decode and max_tokens=1, then decode with the returned params.
func TestVLLMNixlHandOff(t *testing.T) {
	p := startSim(t, Config{Engine: engines.VLLM, Role: RolePrefill, KVEvents: KVEventsOff, PrefillPerToken: time.Microsecond})
	d := startSim(t, Config{Engine: engines.VLLM, Role: RoleDecode, KVEvents: KVEventsOff, PrefillPerToken: time.Microsecond})
	c := client(t)
	prompt := strings.Repeat("disaggregated prefill moves the kv cache ", 10)
	pre := do(t, c, "POST", "http://"+p.Addrs().HTTP+"/v1/completions",
		fmt.Sprintf(`{"prompt":%q,"max_tokens":1,"stream":false,"kv_transfer_params":{"do_remote_decode":true,"do_remote_prefill":false,"remote_engine_id":null,"remote_block_ids":null,"remote_host":null,"remote_port":null}}`, prompt),
		"X-Request-Id: pd-1")
	if pre.status != 200 {
		t.Fatalf("prefill: %d %s", pre.status, pre.body)
	}
	var pb struct {
		KV json.RawMessage `json:"kv_transfer_params"`
	}
	if err := json.Unmarshal(pre.body, &pb); err != nil {
		t.Fatal(err)
	}
	var kv struct {
		DoRemotePrefill bool    `json:"do_remote_prefill"`
		DoRemoteDecode  bool    `json:"do_remote_decode"`
		BlockIDs        []int64 `json:"remote_block_ids"`
		EngineID        string  `json:"remote_engine_id"`
		Host            string  `json:"remote_host"`
		Port            int     `json:"remote_port"`
		RequestID       string  `json:"remote_request_id"`
		TP              int     `json:"tp_size"`
	}
	if err := json.Unmarshal(pb.KV, &kv); err != nil {
		t.Fatalf("kv_transfer_params %s: %v", pb.KV, err)
	}
	if !kv.DoRemotePrefill || kv.DoRemoteDecode || len(kv.BlockIDs) == 0 || kv.EngineID == "" || kv.Host != "127.0.0.1" ||
		fmt.Sprint(kv.Port) != portOf(p.Addrs().HTTP) || kv.RequestID != "pd-1" || kv.TP != 1 {
		t.Errorf("prefill kv_transfer_params: got %s", pb.KV)
	}

	tests := []struct {
		name       string
		kv         string
		wantRemote bool
	}{
		{"with params", string(pb.KV), true},
		{"without params", "", false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			// Start every case from a cold decode cache.
			if res := do(t, c, "POST", "http://"+d.Addrs().HTTP+"/_sim/reset_cache", ""); res.status != 200 {
				t.Fatalf("reset cache: %d", res.status)
			}
			body := fmt.Sprintf(`{"prompt":%q,"max_tokens":5`, prompt)
			if tc.kv != "" {
				body += `,"kv_transfer_params":` + tc.kv
			}
			res := do(t, c, "POST", "http://"+d.Addrs().HTTP+"/v1/completions", body+"}", "X-Request-Id: pd-1")
			if res.status != 200 {
				t.Fatalf("decode: %d %s", res.status, res.body)
			}
			rs := d.Receipts()
			r := rs[len(rs)-1]
			if got := r.RemotePrefillTokens > 0; got != tc.wantRemote {
				t.Errorf("remote prefill tokens: got %d, want remote=%v", r.RemotePrefillTokens, tc.wantRemote)
			}
			if tc.wantRemote && r.PrefillCostUS != 1 {
				t.Errorf("decode with params recomputed: prefill cost %dus, want 1us (last token only)", r.PrefillCostUS)
			}
			if !tc.wantRemote && r.PrefillCostUS != int64(r.PromptTokens) {
				t.Errorf("decode without params: prefill cost %dus, want %dus", r.PrefillCostUS, r.PromptTokens)
			}
		})
	}
	pr := p.Receipts()[0]
	if pr.MaxTokens != 1 || pr.Role != RolePrefill || len(pr.HandOffOut) == 0 || pr.RequestID != "pd-1" {
		t.Errorf("prefill receipt: %+v", pr)
	}
}
