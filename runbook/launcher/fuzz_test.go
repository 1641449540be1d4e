package launcher

import (
	"net"
	"strings"
	"testing"
)

// FuzzParseEndpoints: every accepted endpoint is a host:port with a valid
// port.
func FuzzParseEndpoints(f *testing.F) {
	f.Add("127.0.0.1:8000,10.0.0.5:8001")
	f.Add("[::1]:8000")
	f.Add("host:0")
	f.Add(",,")
	f.Add("a:b:c")
	f.Fuzz(func(t *testing.T, s string) {
		eps, err := ParseEndpoints(s)
		if err != nil {
			return
		}
		for _, e := range eps {
			h, p, err := net.SplitHostPort(e)
			if err != nil || h == "" || p == "" || strings.Contains(e, ",") {
				t.Fatalf("accepted %q from %q", e, s)
			}
		}
	})
}

// FuzzParseImageOverrides: accepted keys are engines or "sim", values are
// non-empty.
func FuzzParseImageOverrides(f *testing.F) {
	f.Add("sim=llmgw-sim:test")
	f.Add("vllm=vllm/vllm-openai:v0.31.0")
	f.Add("tgi=x")
	f.Add("=x")
	f.Fuzz(func(t *testing.T, s string) {
		m, err := ParseImageOverrides([]string{s})
		if err != nil {
			return
		}
		for k, v := range m {
			switch k {
			case "sim", "vllm", "sglang", "trtllm", "llamacpp":
			default:
				t.Fatalf("accepted key %q from %q", k, s)
			}
			if v == "" {
				t.Fatalf("accepted empty image from %q", s)
			}
		}
	})
}
