package rule

import (
	"os"
	"testing"
)

func BenchmarkDecode(b *testing.B) {
	yamlBody, err := os.ReadFile("testdata/vllm-kv-exact.yaml")
	if err != nil {
		b.Fatal(err)
	}
	jsonBody, err := os.ReadFile("testdata/trtllm-pd.json")
	if err != nil {
		b.Fatal(err)
	}
	for _, bc := range []struct {
		name string
		body []byte
	}{{"yaml", yamlBody}, {"json", jsonBody}} {
		b.Run(bc.name, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				if _, err := Decode(bc.body); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

func BenchmarkAdmitEffective(b *testing.B) {
	r := mustDecodeFile(b, "testdata/sglang-pd.yaml")
	others := []*Rule{mustDecodeFile(b, "testdata/vllm-kv-exact.yaml"), mustDecodeFile(b, "testdata/llamacpp.yaml")}
	b.ReportAllocs()
	for b.Loop() {
		if err := Admit(r, r, others); err != nil {
			b.Fatal(err)
		}
		_ = r.Effective()
	}
}
