package openai

import (
	"bytes"
	"encoding/json"
	"errors"
	"testing"

	"github.com/valyala/fastjson"
)

// FuzzParseUnambiguous: Parse never panics, every failure is ErrInvalid, and a body it
// accepts names each field the gateway reads at most once at the top level,
// so the model it routes by is the model any JSON reader sees (encoding/json,
// like Python's json, keeps the last of duplicate names).
func FuzzParseUnambiguous(f *testing.F) {
	for _, s := range []string{
		`{"model":"m","messages":[{"role":"user","content":"hi"}]}`,
		`{"model":"A","model":"B","messages":[{"role":"user","content":"x"}]}`,
		`{"model":"m","stream":false,"stream":true,"prompt":"x"}`,
		`{"model":"m","mod\u0065l":"n","prompt":[1,2]}`,
		`{"model":"m","stream_options":{"include_usage":true,"include_usage":false},"prompt":"x"}`,
		`{"model":"m","messages":[{"role":"user","content":[{"type":"text","text":"a","text":"b"}]}]}`,
	} {
		f.Add([]byte(s), false)
		f.Add([]byte(s), true)
	}
	f.Fuzz(func(t *testing.T, body []byte, completion bool) {
		k := Chat
		if completion {
			k = Completion
		}
		var p fastjson.Parser
		var r Request
		err := Parse(&p, body, k, 64, &r)
		if err != nil {
			if !errors.Is(err, ErrInvalid) {
				t.Fatalf("Parse error %v is not ErrInvalid", err)
			}
			return
		}
		counts := topLevelNames(t, body)
		for _, n := range rootFields {
			if counts[n] > 1 {
				t.Fatalf("accepted a body with %d top-level %q fields: %q", counts[n], n, body)
			}
		}
		var std struct {
			Model *string `json:"model"`
		}
		if json.Unmarshal(body, &std) == nil && std.Model != nil && *std.Model != string(r.Model) {
			t.Fatalf("routed by model %q, encoding/json reads %q: %q", r.Model, *std.Model, body)
		}
	})
}

// topLevelNames counts the (unescaped) member names of the root object, as
// encoding/json's token stream sees them; nil when it cannot read the body.
func topLevelNames(t *testing.T, body []byte) map[string]int {
	t.Helper()
	dec := json.NewDecoder(bytes.NewReader(body))
	if tok, err := dec.Token(); err != nil || tok != json.Delim('{') {
		return nil
	}
	counts := map[string]int{}
	for dec.More() {
		tok, err := dec.Token()
		if err != nil {
			return nil
		}
		name, _ := tok.(string)
		counts[name]++
		var skip json.RawMessage
		if err := dec.Decode(&skip); err != nil {
			return nil
		}
	}
	return counts
}
