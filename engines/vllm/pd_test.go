package vllm

import (
	"fmt"
	"regexp"
	"strings"
	"testing"

	"github.com/llmgw/llmgw/engines"
)

func TestPDNIXLHandOff(t *testing.T) {
	p := &engines.PDPair{RequestID: "r1", PrefillHost: "10.0.0.1", PrefillPort: 8001, DecodeHost: "10.0.0.2", DecodePort: 8002}
	pb, err := pd{}.PrefillBody([]byte(`{"prompt":"x","max_completion_tokens":50,"min_tokens":5,"stream":true,"stream_options":{"include_usage":true}}`), p)
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{`"max_tokens":1`, `"max_completion_tokens":1`, `"min_tokens":1`, `"stream":false`, `"kv_transfer_params":{"do_remote_decode":true`} {
		if !strings.Contains(string(pb), want) {
			t.Errorf("prefill body %s lacks %s", pb, want)
		}
	}
	if strings.Contains(string(pb), "stream_options") {
		t.Errorf("prefill body %s keeps stream_options", pb)
	}
	params := AnswerParams(PrefillAnswer{BlockIDs: []int64{3, 4}, EngineID: "e", Host: "10.0.0.1", Port: 8001, RequestID: "r1", PromptTokens: 40})
	h := pd{}.HandOff([]byte(fmt.Sprintf(`{"id":"c","choices":[],"kv_transfer_params":%s}`, params)), p)
	if string(h.Params) != string(params) {
		t.Fatalf("hand-off %s; want the answer's %s", h.Params, params)
	}
	db, err := pd{}.DecodeBody([]byte(`{"prompt":"x","stream":true}`), p, h)
	if err != nil {
		t.Fatal(err)
	}
	leg, err := pd{}.ParseLeg(db)
	if err != nil {
		t.Fatal(err)
	}
	if leg.Role != engines.PDLegDecode || leg.RemoteBlocks != 2 || leg.RemoteTokens != 40 {
		t.Errorf("decode leg %+v; want a decode pulling 2 blocks for 40 tokens", leg)
	}
	if h := (pd{}).HandOff([]byte(`{"choices":[]}`), p); h.Params != nil || h.Missing != "kv-params-missing" {
		t.Errorf("hand-off without params %+v", h)
	}
}

func TestPDParseLegErrors(t *testing.T) {
	for _, tc := range []struct{ name, body, want string }{
		{"not an object", `{"kv_transfer_params":[1]}`, "kv_transfer_params"},
		{"bad block ids", `{"kv_transfer_params":{"do_remote_prefill":true,"remote_block_ids":"x"}}`, "remote_block_ids"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if _, err := (pd{}).ParseLeg([]byte(tc.body)); err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("ParseLeg(%s) = %v; want an error naming %s", tc.body, err, tc.want)
			}
		})
	}
	leg, err := pd{}.ParseLeg([]byte(`{"kv_transfer_params":{"do_remote_prefill":true,"remote_block_ids":[[1,2,3],[4]]}}`))
	if err != nil || leg.RemoteBlocks != 3 {
		t.Errorf("hybrid block ids: %+v %v; want the first group's 3", leg, err)
	}
}

// The P2P-NCCL id as P2pNcclConnector.parse_request_id reads it
// (p2p_nccl_connector.py @ ee0cdef382af1f489c17570cbddcbf8e8928be36).
var (
	prefillSide = regexp.MustCompile(`___decode_addr_(.*):(\d+)`)
	decodeSide  = regexp.MustCompile(`___prefill_addr_(.*):(\d+)___`)
)

func TestPDP2PNCCLRequestID(t *testing.T) {
	for _, tc := range []struct {
		name           string
		p              engines.PDPair
		wantP, wantD   string
		wantPrefillKey bool
	}{
		{"both ports", engines.PDPair{PrefillHost: "10.0.0.1", PrefillPort: 8000, PrefillKVPort: 9001, DecodeHost: "10.0.0.2", DecodePort: 8000, DecodeKVPort: 9002, Nonce: 7}, "10.0.0.1:9001", "10.0.0.2:9002", false},
		{"decode falls back to targetPort", engines.PDPair{PrefillHost: "10.0.0.1", PrefillPort: 8000, PrefillKVPort: 9001, DecodeHost: "10.0.0.2", DecodePort: 8002, Nonce: 7}, "10.0.0.1:9001", "10.0.0.2:8002", false},
		{"no ports: NIXL, the client's id", engines.PDPair{RequestID: "client", PrefillHost: "10.0.0.1", PrefillPort: 8000, DecodeHost: "10.0.0.2", DecodePort: 8000}, "", "", true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			id := pd{}.LegRequestID(&tc.p)
			if tc.wantP == "" {
				if id != tc.p.RequestID {
					t.Errorf("id %q; want the client's %q", id, tc.p.RequestID)
				}
				return
			}
			d := prefillSide.FindStringSubmatch(id)
			pp := decodeSide.FindStringSubmatch(id)
			if d == nil || pp == nil || d[1]+":"+d[2] != tc.wantD || pp[1]+":"+pp[2] != tc.wantP {
				t.Errorf("id %q parses to prefill %v decode %v; want %s and %s", id, pp, d, tc.wantP, tc.wantD)
			}
			if !regexp.MustCompile(`_[0-9a-f]{32}$`).MatchString(id) {
				t.Errorf("id %q does not end in 32 hex digits", id)
			}
			pb, _ := pd{}.PrefillBody([]byte(`{"prompt":"x"}`), &tc.p)
			if strings.Contains(string(pb), handOffField) {
				t.Errorf("P2P-NCCL prefill body %s carries NIXL params", pb)
			}
			if h := (pd{}).HandOff([]byte(`{}`), &tc.p); !h.OutOfBand {
				t.Errorf("P2P-NCCL hand-off %+v; want out of band", h)
			}
		})
	}
}
