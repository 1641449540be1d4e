package tokenizer

import (
	"testing"

	"github.com/ardanlabs/jinja"
)

// TestOrderedTojson: tojson with arguments writes what Python's json.dumps
// writes (transformers' filter): request key order, Python separators and
// indentation, raw non-ASCII, Python float repr.
func TestOrderedTojson(t *testing.T) {
	cases := []struct {
		name, tpl, vars, want string
	}{
		{"indent keeps key order", `{{ t | tojson(indent=2) }}`, `{"z":1,"a":[true,null],"m":{}}`, "{\n  \"z\": 1,\n  \"a\": [\n    true,\n    null\n  ],\n  \"m\": {}\n}"},
		{"sort_keys", `{{ t | tojson(indent=None, sort_keys=true) }}`, `{"z":1,"a":2}`, `{"a": 2, "z": 1}`},
		{"separators", `{{ t | tojson(separators=[",", ":"]) }}`, `{"b":[1,2],"a":"x"}`, `{"b":[1,2],"a":"x"}`},
		{"strings as ensure_ascii=False", `{{ t.s | tojson(indent=0) }}`, `{"s":"é\"\\\n\u0001<>&\u2028"}`, "\"é\\\"\\\\\\n\\u0001<>&\u2028\""},
		{"floats as Python repr", `{{ t | tojson(indent=None) }}`, `[1.0, 0.5, 1e-05, 1e16, 3]`, `[1.0, 0.5, 1e-05, 1e+16, 3]`},
		{"dotted operand", `{{ t.a.b | tojson(indent=1) }}`, `{"a":{"b":[1]}}`, "[\n 1\n]"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			r, err := NewJinjaRenderer(tc.tpl, nil)
			if err != nil {
				t.Fatal(err)
			}
			v, err := jsonToValue([]byte(tc.vars))
			if err != nil {
				t.Fatal(err)
			}
			data := map[string]jinja.Value{"t": v, tojsonFunc: tojsonValue}
			got, err := r.tpl.RenderValues(data)
			if err != nil {
				t.Fatal(err)
			}
			if got != tc.want {
				t.Errorf("got %q\nwant %q", got, tc.want)
			}
		})
	}
}
