package rule

import (
	"bytes"
	"errors"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"
)

func equalRules(a, b *Rule) bool { return reflect.DeepEqual(a, b) }

// exampleFiles lists the valid rule examples under testdata.
func exampleFiles(t testing.TB) []string {
	t.Helper()
	var files []string
	for _, pat := range []string{"testdata/*.yaml", "testdata/*.json"} {
		m, err := filepath.Glob(pat)
		if err != nil {
			t.Fatal(err)
		}
		for _, f := range m {
			if !strings.HasSuffix(f, ".golden.json") {
				files = append(files, f)
			}
		}
	}
	if len(files) == 0 {
		t.Fatal("no examples under testdata")
	}
	return files
}

func mustDecodeFile(t testing.TB, file string) *Rule {
	t.Helper()
	data, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	r, err := Decode(data)
	if err != nil {
		t.Fatalf("Decode(%s): %v", file, err)
	}
	return r
}

const minimalJSON = `{"name":"pool","model_name":"m","sel":2,"endpoints":[{"endpointIP":"127.0.0.1","targetPort":8001,"weight":3}]}`

func TestDecodeJSONAndYAMLAgree(t *testing.T) {
	tests := []struct{ name, json, yaml string }{
		{
			name: "minimal",
			json: minimalJSON,
			yaml: "name: pool\nmodel_name: m\nsel: 2\nendpoints:\n  - endpointIP: 127.0.0.1\n    targetPort: 8001\n    weight: 3\n",
		},
		{
			name: "nested and durations",
			json: `{"name":"p","sel":0,"session_ttl":"90s","probe":{"interval":10,"timeout":"1500ms","disabled":true},"cb_enable":false,"kvHashSeed":"7","endpoints":[{"endpointIP":"::1","targetPort":1,"ep_role":0}]}`,
			yaml: "name: p\nsel: 0\nsession_ttl: 90s\nprobe:\n  interval: 10\n  timeout: 1500ms\n  disabled: true\ncb_enable: false\nkvHashSeed: \"7\"\nendpoints: [{endpointIP: '::1', targetPort: 1, ep_role: 0}]\n",
		},
		{
			name: "leading whitespace before json",
			json: "\n\t " + minimalJSON,
			yaml: "# a comment\n" + "name: pool\nmodel_name: m\nsel: 2\nendpoints:\n  - {endpointIP: 127.0.0.1, targetPort: 8001, weight: 3}\n",
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			fromJSON, err := Decode([]byte(tc.json))
			if err != nil {
				t.Fatalf("Decode(json): %v", err)
			}
			fromYAML, err := Decode([]byte(tc.yaml))
			if err != nil {
				t.Fatalf("Decode(yaml): %v", err)
			}
			if !equalRules(fromJSON, fromYAML) {
				t.Errorf("json and yaml differ:\n got %+v\nwant %+v", fromYAML, fromJSON)
			}
		})
	}
}

func TestDecodeFields(t *testing.T) {
	r, err := Decode([]byte("name: p\nmode: 4\nsel: 3\nsession_header_name: X-S\nsession_ttl: 15m\nkvHashSeed: \"0\"\ncb_enable: false\n" +
		"chwbl: {load_factor: 1.5}\nendpoints:\n  - {id: a, endpointIP: h.example, targetPort: 80, weight: 2, ep_role: 0, nixl_port: 81}\n"))
	if err != nil {
		t.Fatal(err)
	}
	checks := []struct {
		name      string
		got, want any
	}{
		{"mode", r.Mode, ModeFullProxy},
		{"sel", r.Sel, SelSession},
		{"session header", r.SessionHeaderName, "X-S"},
		{"session ttl", r.SessionTTL.Std(), 15 * time.Minute},
		{"hash seed set", r.KVHashSeed != nil && *r.KVHashSeed == "0", true},
		{"cb disabled", r.CBEnable != nil && !*r.CBEnable, true},
		{"load factor", r.CHWBL.LoadFactor, 1.5},
		{"endpoint id", r.Endpoints[0].ID, "a"},
		{"weight", *r.Endpoints[0].Weight, 2},
		{"nixl", r.Endpoints[0].NixlPort, 81},
	}
	for _, c := range checks {
		t.Run(c.name, func(t *testing.T) {
			if !reflect.DeepEqual(c.got, c.want) {
				t.Errorf("got %v, want %v", c.got, c.want)
			}
		})
	}
}

func TestDecodeErrors(t *testing.T) {
	tests := []struct {
		name string
		in   string
		// wantPath set: a *FieldError with this path is expected.
		wantPath string
		// wantIn: substring of the error text.
		wantIn   string
		wantKind error
	}{
		{name: "unknown endpoint field camel", in: `{"name":"a","endpoints":[{"endpointIP":"1.1.1.1","targetPort":1},{"epRole":1}]}`,
			wantPath: "endpoints[1].epRole", wantIn: `endpoints[1].epRole: unknown field; did you mean "ep_role"?`},
		{name: "unknown field yaml", in: "name: a\nendpoints:\n  - endpointIP: 1.1.1.1\n    epRole: 1\n",
			wantPath: "endpoints[0].epRole", wantIn: `did you mean "ep_role"?`},
		{name: "case variant refused", in: `{"NAME":"a"}`, wantPath: "NAME", wantIn: `did you mean "name"?`},
		{name: "typo suggestion", in: `{"kvEngineTyp":"vllm"}`, wantPath: "kvEngineTyp", wantIn: `did you mean "kvEngineType"?`},
		{name: "nested typo", in: `{"probe":{"intervall":"5s"}}`, wantPath: "probe.intervall", wantIn: `did you mean "interval"?`},
		{name: "snake vs camel", in: `{"kv_block_size":16}`, wantPath: "kv_block_size", wantIn: `did you mean "kvBlockSize"?`},
		{name: "no suggestion", in: `{"zzzzzz":1}`, wantPath: "zzzzzz", wantIn: "unknown field"},
		{name: "reference envelope", in: `{"serviceArguments":{}}`, wantPath: "serviceArguments", wantIn: "no serviceArguments envelope"},
		{name: "reference chwbl knob", in: `{"chwbl_mean_load_factor":125}`, wantPath: "chwbl_mean_load_factor", wantIn: "chwbl.load_factor"},
		{name: "duplicate key json", in: `{"name":"a","sel":0,"name":"b"}`, wantPath: "name", wantIn: "duplicate key"},
		{name: "duplicate key yaml", in: "name: a\nname: b\n", wantKind: ErrSyntax},
		{name: "string for int", in: `{"endpoints":[{"targetPort":"8000"}]}`, wantPath: "endpoints[0].targetPort", wantIn: `want integer, got string "8000"`},
		{name: "fraction for int", in: `{"sel":1.5}`, wantPath: "sel", wantIn: "want integer"},
		{name: "int overflow", in: `{"sel":99999999999999999999}`, wantPath: "sel", wantIn: "out of range"},
		{name: "object for string", in: `{"name":{}}`, wantPath: "name", wantIn: "want string, got object"},
		{name: "number for seed yaml", in: "kvHashSeed: 0\n", wantPath: "kvHashSeed", wantIn: "want string, got number 0"},
		{name: "string for bool", in: `{"pd_disagg_mode":"true"}`, wantPath: "pd_disagg_mode", wantIn: "want boolean"},
		{name: "object for list", in: `{"endpoints":{}}`, wantPath: "endpoints", wantIn: "want list, got object"},
		{name: "list for object", in: `{"chwbl":[]}`, wantPath: "chwbl", wantIn: "want object, got list"},
		{name: "bool for mode", in: `{"mode":true}`, wantPath: "mode", wantIn: `want "fullproxy" or 4`},
		{name: "bad duration", in: `{"session_ttl":"soon"}`, wantPath: "session_ttl", wantIn: "want a duration"},
		{name: "negative duration", in: `{"probe":{"timeout":"-1s"}}`, wantPath: "probe.timeout", wantIn: "must not be negative"},
		{name: "negative duration seconds", in: `{"cb":{"open_for":-3}}`, wantPath: "cb.open_for", wantIn: "must not be negative"},
		{name: "fractional seconds", in: `{"session_ttl":1.5}`, wantPath: "session_ttl", wantIn: "integer seconds"},
		{name: "huge seconds", in: `{"session_ttl":9223372036854775807}`, wantPath: "session_ttl", wantIn: "out of range"},
		{name: "trailing json", in: minimalJSON + ` {}`, wantKind: ErrSyntax, wantIn: "trailing data"},
		{name: "trailing garbage", in: minimalJSON + `x`, wantKind: ErrSyntax},
		{name: "second yaml document", in: "name: a\n---\nname: b\n", wantKind: ErrSyntax, wantIn: "more than one YAML document"},
		{name: "truncated json", in: `{"name":"a",`, wantKind: ErrSyntax},
		{name: "yaml flow mapping read as json", in: `{name: a}`, wantKind: ErrSyntax, wantIn: "read as JSON"},
		{name: "empty", in: "  \n", wantKind: ErrSyntax, wantIn: "empty"},
		{name: "list instead of rule", in: `[{"name":"a"}]`, wantIn: "want a rule object, got list"},
		{name: "yaml scalar", in: "just text", wantIn: "want a rule object"},
		{name: "bad yaml", in: "name: [a\n", wantKind: ErrSyntax},
		{name: "too large", in: `{"name":"` + strings.Repeat("a", MaxRuleBytes) + `"}`, wantKind: ErrTooLarge},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			r, err := Decode([]byte(tc.in))
			if err == nil {
				t.Fatalf("Decode: got rule %+v, want an error", r)
			}
			if r != nil {
				t.Errorf("Decode: got a rule with an error")
			}
			if tc.wantPath != "" {
				var fe *FieldError
				if !errors.As(err, &fe) {
					t.Fatalf("got %T %v, want *FieldError", err, err)
				}
				if fe.Path != tc.wantPath {
					t.Errorf("path: got %q, want %q", fe.Path, tc.wantPath)
				}
			}
			if tc.wantKind != nil && !errors.Is(err, tc.wantKind) {
				t.Errorf("got %v, want errors.Is %v", err, tc.wantKind)
			}
			if !strings.HasPrefix(err.Error(), "rule: ") {
				t.Errorf("error %q lacks the package prefix", err)
			}
			if !strings.Contains(err.Error(), tc.wantIn) {
				t.Errorf("error: got %q, want it to contain %q", err, tc.wantIn)
			}
		})
	}
}

func TestDecodeNullMeansUnset(t *testing.T) {
	r, err := Decode([]byte(`{"name":"a","mode":null,"kvHashSeed":null,"session_ttl":null,"endpoints":[{"endpointIP":"1.1.1.1","targetPort":1,"weight":null}]}`))
	if err != nil {
		t.Fatal(err)
	}
	if r.Mode != "" || r.KVHashSeed != nil || r.SessionTTL != 0 || r.Endpoints[0].Weight != nil {
		t.Errorf("null fields: got %+v, want all unset", r)
	}
}

func TestModeSynonyms(t *testing.T) {
	tests := []struct {
		name, in string
		want     Mode
	}{
		{name: "string", in: `"fullproxy"`, want: ModeFullProxy},
		{name: "number 4", in: `4`, want: ModeFullProxy},
		{name: "quoted 4", in: `"4"`, want: ModeFullProxy},
		{name: "number 2 kept for admission", in: `2`, want: "2"},
		{name: "other string kept for admission", in: `"dnat"`, want: "dnat"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			r, err := Decode([]byte(`{"mode":` + tc.in + `}`))
			if err != nil {
				t.Fatal(err)
			}
			if r.Mode != tc.want {
				t.Errorf("mode: got %q, want %q", r.Mode, tc.want)
			}
			out, err := r.Mode.MarshalJSON()
			if err != nil {
				t.Fatal(err)
			}
			if want := `"` + string(tc.want) + `"`; string(out) != want {
				t.Errorf("marshal: got %s, want %s", out, want)
			}
		})
	}
}

func TestDuration(t *testing.T) {
	tests := []struct {
		name, in string
		want     time.Duration
		wantOut  string
	}{
		{name: "seconds string", in: `"5s"`, want: 5 * time.Second, wantOut: `"5s"`},
		{name: "milliseconds", in: `"250ms"`, want: 250 * time.Millisecond, wantOut: `"250ms"`},
		{name: "integer seconds", in: `30`, want: 30 * time.Second, wantOut: `"30s"`},
		{name: "whole hour", in: `"60m"`, want: time.Hour, wantOut: `"1h"`},
		{name: "hour and minutes", in: `"1h30m"`, want: 90 * time.Minute, wantOut: `"1h30m"`},
		{name: "whole minutes", in: `120`, want: 2 * time.Minute, wantOut: `"2m"`},
		{name: "hour minute second", in: `"1h0m5s"`, want: time.Hour + 5*time.Second, wantOut: `"1h0m5s"`},
		{name: "zero", in: `0`, want: 0, wantOut: `"0s"`},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			var d Duration
			if err := d.UnmarshalJSON([]byte(tc.in)); err != nil {
				t.Fatal(err)
			}
			if d.Std() != tc.want {
				t.Errorf("got %v, want %v", d.Std(), tc.want)
			}
			out, err := d.MarshalJSON()
			if err != nil {
				t.Fatal(err)
			}
			if string(out) != tc.wantOut {
				t.Errorf("marshal: got %s, want %s", out, tc.wantOut)
			}
			var back Duration
			if err := back.UnmarshalJSON(out); err != nil || back != d {
				t.Errorf("round trip: got %v (%v), want %v", back, err, d)
			}
		})
	}
}

func TestDecodeList(t *testing.T) {
	tests := []struct {
		name      string
		in        string
		wantNames []string
		wantErr   string
	}{
		{name: "yaml sequence", in: "- name: a\n  endpoints: []\n- name: b\n", wantNames: []string{"a", "b"}},
		{name: "json array", in: `[{"name":"a"},{"name":"b"}]`, wantNames: []string{"a", "b"}},
		{name: "rules key yaml", in: "rules:\n  - name: a\n  - name: b\n", wantNames: []string{"a", "b"}},
		{name: "rules key json", in: `{"rules":[{"name":"a"}]}`, wantNames: []string{"a"}},
		{name: "empty list", in: `[]`, wantNames: []string{}},
		{name: "null rules", in: "rules:\n", wantNames: []string{}},
		{name: "error path has index", in: "rules:\n  - name: a\n  - name: b\n    endpoints: [{epRole: 1}]\n", wantErr: `rules[1].endpoints[0].epRole: unknown field; did you mean "ep_role"?`},
		{name: "error path in array", in: `[{"name":"a"},{"sel":"x"}]`, wantErr: `[1].sel: unknown name "x"`},
		{name: "duplicate names", in: `[{"name":"a"},{"name":"a"}]`, wantErr: `[1].name: duplicate rule name "a"`},
		{name: "single rule object", in: `{"name":"a"}`, wantErr: "wrap it in a list"},
		{name: "unknown top key", in: "rulez: []\n", wantErr: "rulez: unknown field"},
		{name: "rules not a list", in: `{"rules":{"name":"a"}}`, wantErr: "rules: want a list of rules, got object"},
		{name: "item not an object", in: `[1]`, wantErr: "[0]: want a rule object, got number 1"},
		{name: "yaml scalar file", in: "hello\n", wantErr: "want a list of rules"},
		{name: "duplicate rules key", in: `{"rules":[],"rules":[{"name":"a"}]}`, wantErr: "rules: duplicate key"},
		{name: "missing rules key", in: `{}`, wantErr: "rules: missing"},
		{name: "trailing data after array", in: `[{"name":"a"}] []`, wantErr: "malformed body"},
		{name: "trailing data after object", in: `{"rules":[]} {}`, wantErr: "trailing data"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			rules, err := DecodeList([]byte(tc.in))
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("DecodeList: got %v, want error containing %q", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatalf("DecodeList: %v", err)
			}
			got := make([]string, 0, len(rules))
			for _, r := range rules {
				got = append(got, r.Name)
			}
			if !reflect.DeepEqual(got, tc.wantNames) {
				t.Errorf("names: got %v, want %v", got, tc.wantNames)
			}
		})
	}
}

func TestDecodeListTooLarge(t *testing.T) {
	big := bytes.Repeat([]byte(" "), MaxListBytes+1)
	if _, err := DecodeList(big); !errors.Is(err, ErrTooLarge) {
		t.Fatalf("got %v, want ErrTooLarge", err)
	}
}

func TestSuggest(t *testing.T) {
	fields := fieldsOf(reflect.TypeFor[Endpoint]())
	tests := []struct{ key, want string }{
		{"epRole", "ep_role"},
		{"EndpointIp", "endpointIP"},
		{"target_port", "targetPort"},
		{"wieght", "weight"},
		{"nixlPort", "nixl_port"},
		{"x", ""},
		{"backup", ""},
	}
	for _, tc := range tests {
		t.Run(tc.key, func(t *testing.T) {
			if got := suggest(tc.key, fields); got != tc.want {
				t.Errorf("suggest(%q): got %q, want %q", tc.key, got, tc.want)
			}
		})
	}
}
