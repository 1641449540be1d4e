package sglang

import (
	"testing"

	"github.com/llmgw/llmgw/engines"
)

func TestPDRendezvous(t *testing.T) {
	for _, tc := range []struct {
		name     string
		p        engines.PDPair
		wantHost string
		wantPort int64
	}{
		{"ipv4, endpoint port", engines.PDPair{PrefillHost: "10.0.0.1", BootstrapPort: 9000, Nonce: 5}, "10.0.0.1", 9000},
		{"ipv6 bracketed, default port", engines.PDPair{PrefillHost: "fd00::1", Nonce: 6}, "[fd00::1]", DefaultBootstrapPort},
	} {
		t.Run(tc.name, func(t *testing.T) {
			b, err := pd{}.PrefillBody([]byte(`{"prompt":"x"}`), &tc.p)
			if err != nil {
				t.Fatal(err)
			}
			d, _ := pd{}.DecodeBody([]byte(`{"prompt":"x"}`), &tc.p, engines.HandOff{})
			if string(b) != string(d) {
				t.Errorf("legs differ: %s vs %s", b, d)
			}
			leg, err := pd{}.ParseLeg(b)
			if err != nil || leg.Rendezvous == nil || *leg.Rendezvous != (engines.Rendezvous{Host: tc.wantHost, Port: tc.wantPort, Room: tc.p.Nonce}) {
				t.Errorf("leg %+v %v", leg.Rendezvous, err)
			}
		})
	}
	for _, bad := range []string{
		`{"bootstrap_host":"h"}`,
		`{"bootstrap_host":"h","bootstrap_room":-5}`,
		`{"bootstrap_host":"h","bootstrap_room":18446744073709551615}`,
		`{"bootstrap_host":1,"bootstrap_room":1}`,
		`{"bootstrap_host":"h","bootstrap_room":1,"bootstrap_port":"x"}`,
	} {
		if _, err := (pd{}).ParseLeg([]byte(bad)); err == nil {
			t.Errorf("ParseLeg(%s) accepted", bad)
		}
	}
}
