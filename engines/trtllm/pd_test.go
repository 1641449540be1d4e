package trtllm

import (
	"fmt"
	"strings"
	"testing"

	"github.com/llmgw/llmgw/engines"
)

func TestPDContextGeneration(t *testing.T) {
	p := &engines.PDPair{RequestID: "r", Nonce: 77}
	cb, err := pd{}.PrefillBody([]byte(`{"prompt":"x","stream":true}`), p)
	if err != nil {
		t.Fatal(err)
	}
	leg, err := pd{}.ParseLeg(cb)
	if err != nil || leg.Role != engines.PDLegPrefill || leg.RequestRef == nil || *leg.RequestRef != 77 || !strings.Contains(string(cb), `"stream":false`) {
		t.Fatalf("context body %s parses to %+v %v", cb, leg, err)
	}
	ref := int64(77)
	params := AnswerParams(ContextAnswer{FirstGenTokens: []uint32{9}, CtxRequestID: 3, Opaque: []byte("state"), DisaggRequestID: &ref})
	for _, tc := range []struct {
		name, finish string
		final        bool
	}{
		{"length hands off", "length", false},
		{"not_finished hands off", "not_finished", false},
		{"stop is the whole answer", "stop", true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			answer := fmt.Sprintf(`{"id":"c","choices":[{"index":0,"text":"a","finish_reason":%q,"disaggregated_params":%s}]}`, tc.finish, params)
			h := pd{}.HandOff([]byte(answer), p)
			if tc.final {
				if h.Final == nil || strings.Contains(string(h.Final), handOffField) {
					t.Errorf("early exit %+v; want the answer without %s", h, handOffField)
				}
				return
			}
			gb, err := pd{}.DecodeBody([]byte(`{"prompt":"x"}`), p, h)
			if err != nil {
				t.Fatal(err)
			}
			g, err := pd{}.ParseLeg(gb)
			if err != nil || g.Role != engines.PDLegDecode || string(g.Opaque) != "state" {
				t.Errorf("generation body %s parses to %+v %v", gb, g, err)
			}
		})
	}
	for _, bad := range []string{
		`{"disaggregated_params":{"request_type":"generation_only"}}`,
		`{"disaggregated_params":{"request_type":"generation_only","encoded_opaque_state":"!!"}}`,
		`{"disaggregated_params":{"request_type":"other"}}`,
	} {
		if _, err := (pd{}).ParseLeg([]byte(bad)); err == nil {
			t.Errorf("ParseLeg(%s) accepted", bad)
		}
	}
	if got := (pd{}).ParseLegAnswer([]byte(`{"choices":[{"disaggregated_params":{"a":1}}]}`)); string(got) != `{"a":1}` {
		t.Errorf("ParseLegAnswer = %s", got)
	}
}
