package rule

import (
	"encoding/json"
	"os"
	"testing"
)

// FuzzDecode checks that Decode never panics, and that a rule which decodes
// and is admitted survives json.Marshal and Decode with the same effective
// form (so the store and the admin API's read-back lose nothing).
func FuzzDecode(f *testing.F) {
	for _, file := range exampleFiles(f) {
		data, err := os.ReadFile(file)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(data)
	}
	for _, s := range []string{
		minimalJSON,
		`{"name":"a","endpoints":[{"epRole":1}]}`,
		`{"name":"a","mode":4,"session_ttl":30,"probe":{"timeout":"1s"}}`,
		"name: a\nendpoints: [{endpointIP: '::1', targetPort: 1}]\n",
		"- a\n- b\n",
		`{"name":"a","name":"a"}`,
		`{"chwbl":{"load_factor":1e308}}`,
		"name: a\nendpoints_from: {namespace: llm, selector: {app: vllm, tier: x}, target_ports: [8000, 8001]}\n",
		`{"name":"a","endpoints_from":{"namespace":"llm","service":"vllm","selector":{},"port_name":"http"}}`,
		`{"name":"a","endpoints_from":{"namespace":"llm","selector":{"app":"a","app":"b"},"target_ports":[1]}}`,
		"",
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		r, err := Decode(data)
		if err != nil {
			if r != nil {
				t.Fatalf("Decode returned both a rule and %v", err)
			}
			return
		}
		if Admit(r, nil, nil) != nil {
			return
		}
		out, err := json.Marshal(r)
		if err != nil {
			t.Fatalf("Marshal of a decoded rule: %v", err)
		}
		back, err := Decode(out)
		if err != nil {
			t.Fatalf("Decode(Marshal(r)) = %v\n%s", err, out)
		}
		if !equalRules(back.Effective(), r.Effective()) {
			t.Fatalf("round trip changed the effective rule:\n got %+v\nwant %+v", back.Effective(), r.Effective())
		}
		if !equalRules(r.Effective().Effective(), r.Effective()) {
			t.Fatalf("Effective not idempotent")
		}
	})
}

// FuzzDecodeList checks that DecodeList never panics and that what it
// returns holds uniquely named rules that each decode again on their own.
func FuzzDecodeList(f *testing.F) {
	for _, s := range []string{
		"- name: a\n- name: b\n",
		`[{"name":"a"},{"name":"b","endpoints":[{"endpointIP":"::1","targetPort":1}]}]`,
		"rules:\n  - name: a\n    sel: 8\n",
		`{"rules":[],"rules":[]}`,
		`{"rules":null}`,
		"[]",
		"rules: 3\n",
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		rules, err := DecodeList(data)
		if err != nil {
			if rules != nil {
				t.Fatalf("DecodeList returned both rules and %v", err)
			}
			return
		}
		seen := map[string]bool{}
		for _, r := range rules {
			if seen[r.Name] {
				t.Fatalf("duplicate name %q accepted", r.Name)
			}
			seen[r.Name] = true
			out, err := json.Marshal(r)
			if err != nil {
				t.Fatalf("Marshal: %v", err)
			}
			back, err := Decode(out)
			if err != nil {
				t.Fatalf("Decode of a listed rule: %v\n%s", err, out)
			}
			if !equalRules(back.Effective(), r.Effective()) {
				t.Fatalf("round trip changed rule %q", r.Name)
			}
		}
	})
}
