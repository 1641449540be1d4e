package engines_test

import (
	"encoding/json"
	"errors"
	"testing"

	"github.com/llmgw/llmgw/engines"
	_ "github.com/llmgw/llmgw/engines/all"
)

func testPair() *engines.PDPair {
	return &engines.PDPair{RequestID: "req-1", PrefillHost: "10.0.0.1", PrefillPort: 8001, DecodeHost: "10.0.0.2", DecodePort: 8002, BootstrapPort: 9000, Nonce: 42}
}

// TestPDLegsRoundTrip: what an adapter writes into a leg, its ParseLeg
// reads back, for every registered P/D protocol.
func TestPDLegsRoundTrip(t *testing.T) {
	const body = `{"model":"m","prompt":"hello","max_tokens":8,"stream":true}`
	for _, a := range engines.Registered() {
		pd := a.PD()
		if pd == nil {
			continue
		}
		t.Run(string(a.Kind()), func(t *testing.T) {
			p := testPair()
			pb, err := pd.PrefillBody([]byte(body), p)
			if err != nil {
				t.Fatal(err)
			}
			var m map[string]any
			if err := json.Unmarshal(pb, &m); err != nil || m["model"] != "m" {
				t.Fatalf("prefill body %s lost the client's fields (%v)", pb, err)
			}
			leg, err := pd.ParseLeg(pb)
			if err != nil {
				t.Fatalf("ParseLeg(prefill body %s): %v", pb, err)
			}
			switch pd.Shape() {
			case engines.PDConcurrent:
				if leg.Role != engines.PDLegRendezvous || leg.Rendezvous == nil || leg.Rendezvous.Room != p.Nonce || leg.Rendezvous.Port != int64(p.BootstrapPort) || leg.Rendezvous.Host != p.PrefillHost {
					t.Errorf("prefill leg %+v; want the pair's rendezvous", leg)
				}
			default:
				if leg.Role != engines.PDLegPrefill {
					t.Errorf("prefill leg role %v; want prefill", leg.Role)
				}
			}
			// An answer without hand-off fields: nothing to carry, and the
			// decode gets no hand-off of its own.
			h := pd.HandOff([]byte(`{"choices":[{"index":0,"text":"a","finish_reason":"length"}]}`), p)
			if h.Params != nil || (h.Missing == "" && !h.OutOfBand) {
				t.Errorf("hand-off from a bare answer %+v; want none, with a reason or out of band", h)
			}
			db, err := pd.DecodeBody([]byte(body), p, h)
			if err != nil {
				t.Fatal(err)
			}
			dleg, err := pd.ParseLeg(db)
			if err != nil {
				t.Fatalf("ParseLeg(decode body %s): %v", db, err)
			}
			if pd.Shape() != engines.PDConcurrent && dleg.Role != engines.PDLegNone {
				t.Errorf("decode leg %+v without a hand-off; want no P/D fields", dleg)
			}
			if _, err := pd.PrefillBody([]byte(`[1,2]`), p); !errors.Is(err, engines.ErrPDBody) {
				t.Errorf("PrefillBody(array) = %v; want ErrPDBody", err)
			}
		})
	}
}

// FuzzPDParse: the P/D parsers read untrusted bytes (client bodies in the
// simulator, upstream answers in the gateway): they never panic and fail
// only with ErrPDBody.
func FuzzPDParse(f *testing.F) {
	for _, a := range engines.Registered() {
		if pd := a.PD(); pd != nil {
			b, _ := pd.PrefillBody([]byte(`{"prompt":"x"}`), testPair())
			f.Add(b)
		}
	}
	f.Add([]byte(`{"choices":[{"finish_reason":"stop"}]}`))
	f.Add([]byte(`{"choices":[]}`))
	f.Add([]byte(`null`))
	f.Fuzz(func(t *testing.T, data []byte) {
		for _, a := range engines.Registered() {
			pd := a.PD()
			if pd == nil {
				continue
			}
			if _, err := pd.ParseLeg(data); err != nil && !errors.Is(err, engines.ErrPDBody) {
				t.Fatalf("%s ParseLeg: %v is not ErrPDBody", a.Kind(), err)
			}
			h := pd.HandOff(data, testPair())
			if h.Params != nil && !json.Valid(h.Params) {
				t.Fatalf("%s HandOff params %q are not JSON", a.Kind(), h.Params)
			}
			if h.Final != nil && !json.Valid(h.Final) {
				t.Fatalf("%s HandOff final %q is not JSON", a.Kind(), h.Final)
			}
			_ = pd.ParseLegAnswer(data)
		}
	})
}
