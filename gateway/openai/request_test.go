package openai

import (
	"errors"
	"strings"
	"testing"

	"github.com/valyala/fastjson"
)

func parse(t *testing.T, body string, k Kind, prefix int) (Request, error) {
	t.Helper()
	var p fastjson.Parser
	var r Request
	err := Parse(&p, []byte(body), k, prefix, &r)
	return r, err
}

func TestParseValid(t *testing.T) {
	cases := []struct {
		name   string
		kind   Kind
		body   string
		model  string
		stream bool
		usage  bool
		user   string
		hasKey bool
		pbytes int
	}{
		{"chat minimal", Chat, `{"model":"m","messages":[{"role":"user","content":"hi"}]}`, "m", false, false, "", true, 2},
		{"chat stream with usage", Chat, `{"model":"m","stream":true,"stream_options":{"include_usage":true},"messages":[{"role":"system","content":"sys"},{"role":"user","content":"hello"}],"user":"u1"}`, "m", true, true, "u1", true, 8},
		{"chat content parts", Chat, `{"model":"m","messages":[{"role":"user","content":[{"type":"text","text":"ab"},{"type":"image_url","image_url":{"url":"x"}}]}]}`, "m", false, false, "", true, 2},
		{"chat null content", Chat, `{"model":"m","messages":[{"role":"assistant","content":null},{"role":"user","content":"x"}]}`, "m", false, false, "", true, 1},
		{"stream null", Chat, `{"model":"m","stream":null,"messages":[{"role":"user","content":"x"}]}`, "m", false, false, "", true, 1},
		{"completion string", Completion, `{"model":"m","prompt":"once upon"}`, "m", false, false, "", true, 9},
		{"completion token ids", Completion, `{"model":"m","prompt":[1,2,3]}`, "m", false, false, "", true, 12},
		{"completion batch", Completion, `{"model":"m","prompt":["a","bc"]}`, "m", false, false, "", true, 3},
		{"escaped unicode", Completion, `{"model":"m\u00e9","prompt":"\u00e9"}`, "mé", false, false, "", true, 2},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			r, err := parse(t, tc.body, tc.kind, 2048)
			if err != nil {
				t.Fatalf("Parse() error = %v", err)
			}
			if string(r.Model) != tc.model || r.Stream != tc.stream || r.IncludeUsage != tc.usage || string(r.User) != tc.user || r.HasKey != tc.hasKey || r.PromptBytes != tc.pbytes {
				t.Errorf("Parse() = model %q stream %v usage %v user %q hasKey %v bytes %d; want %q %v %v %q %v %d",
					r.Model, r.Stream, r.IncludeUsage, r.User, r.HasKey, r.PromptBytes, tc.model, tc.stream, tc.usage, tc.user, tc.hasKey, tc.pbytes)
			}
		})
	}
}

func TestParseInvalid(t *testing.T) {
	cases := []struct {
		name, body string
		kind       Kind
		wantMsg    string
	}{
		{"not json", `{"model":`, Chat, "not valid JSON"},
		{"array body", `[1]`, Chat, "must be a JSON object"},
		{"missing model", `{"messages":[{"role":"user","content":"x"}]}`, Chat, `missing required field "model"`},
		{"model number", `{"model":5,"messages":[]}`, Chat, `"model" must be a string`},
		{"stream string", `{"model":"m","stream":"yes","messages":[{"role":"user","content":"x"}]}`, Chat, `"stream" must be a boolean`},
		{"stream_options scalar", `{"model":"m","stream_options":1,"messages":[{"role":"user","content":"x"}]}`, Chat, `"stream_options" must be an object`},
		{"user number", `{"model":"m","user":1,"messages":[{"role":"user","content":"x"}]}`, Chat, `"user" must be a string`},
		{"missing messages", `{"model":"m"}`, Chat, `missing required field "messages"`},
		{"messages object", `{"model":"m","messages":{}}`, Chat, `"messages" must be an array`},
		{"messages empty", `{"model":"m","messages":[]}`, Chat, "must not be empty"},
		{"message not object", `{"model":"m","messages":["x"]}`, Chat, "messages[0] must be an object"},
		{"role missing", `{"model":"m","messages":[{"content":"x"}]}`, Chat, "messages[0].role must be a string"},
		{"content number", `{"model":"m","messages":[{"role":"user","content":3}]}`, Chat, "messages[0].content must be a string"},
		{"missing prompt", `{"model":"m"}`, Completion, `missing required field "prompt"`},
		{"prompt object", `{"model":"m","prompt":{}}`, Completion, `"prompt" must be a string or an array`},
		// Duplicate names: fastjson reads the first, Python engines the last.
		{"duplicate model", `{"model":"A","model":"B","messages":[{"role":"user","content":"x"}]}`, Chat, `"model" appears more than once`},
		{"duplicate model escaped", `{"model":"A","mod\u0065l":"B","messages":[{"role":"user","content":"x"}]}`, Chat, `"model" appears more than once`},
		{"duplicate stream", `{"model":"m","stream":false,"stream":true,"messages":[{"role":"user","content":"x"}]}`, Chat, `"stream" appears more than once`},
		{"duplicate messages", `{"model":"m","messages":[{"role":"user","content":"x"}],"messages":[]}`, Chat, `"messages" appears more than once`},
		{"duplicate prompt", `{"model":"m","prompt":"a","prompt":"b"}`, Completion, `"prompt" appears more than once`},
		{"duplicate user", `{"model":"m","user":"a","user":"b","prompt":"x"}`, Completion, `"user" appears more than once`},
		{"duplicate stream_options", `{"model":"m","stream_options":{},"stream_options":{"include_usage":true},"prompt":"x"}`, Completion, `"stream_options" appears more than once`},
		{"duplicate include_usage", `{"model":"m","stream_options":{"include_usage":false,"include_usage":true},"prompt":"x"}`, Completion, `"stream_options.include_usage" appears more than once`},
		{"duplicate role", `{"model":"m","messages":[{"role":"user","role":"system","content":"x"}]}`, Chat, `"messages[0].role" appears more than once`},
		{"duplicate content", `{"model":"m","messages":[{"role":"user","content":"x"},{"role":"user","content":"a","content":"b"}]}`, Chat, `"messages[1].content" appears more than once`},
		{"duplicate part text", `{"model":"m","messages":[{"role":"user","content":[{"type":"text","text":"a","text":"b"}]}]}`, Chat, `"messages[0].content[0].text" appears more than once`},
		{"prompt negative id", `{"model":"m","prompt":[-1]}`, Completion, "non-negative integer"},
		{"trailing garbage", `{"model":"m","prompt":"x"} x`, Completion, "not valid JSON"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			_, err := parse(t, tc.body, tc.kind, 2048)
			if !errors.Is(err, ErrInvalid) {
				t.Fatalf("Parse() error = %v; want ErrInvalid", err)
			}
			if !strings.Contains(err.Error(), tc.wantMsg) {
				t.Errorf("Parse() error = %q; want it to mention %q", err, tc.wantMsg)
			}
		})
	}
}

func TestKeyHashPrefixSemantics(t *testing.T) {
	key := func(body string, prefix int) uint64 {
		r, err := parse(t, body, Chat, prefix)
		if err != nil {
			t.Fatal(err)
		}
		return r.KeyHash
	}
	sys := `{"role":"system","content":"You are a careful assistant."}`
	a := key(`{"model":"m","messages":[`+sys+`,{"role":"user","content":"question A"}]}`, 2048)
	b := key(`{"model":"m","messages":[`+sys+`,{"role":"user","content":"question B"}]}`, 2048)
	if a == b {
		t.Errorf("different conversations within prefix_bytes share a key")
	}
	// With a prefix that covers only the system prompt, they share the key.
	a = key(`{"model":"m","messages":[`+sys+`,{"role":"user","content":"question A"}]}`, 20)
	b = key(`{"model":"m","messages":[`+sys+`,{"role":"user","content":"question B"}]}`, 20)
	if a != b {
		t.Errorf("conversations equal in their first 20 bytes got different keys")
	}
	// The model is part of the key.
	c := key(`{"model":"other","messages":[`+sys+`,{"role":"user","content":"question A"}]}`, 20)
	if c == a {
		t.Errorf("model is not part of the key")
	}
	// A growing conversation keeps its key once past prefix_bytes.
	turn1 := key(`{"model":"m","messages":[`+sys+`,{"role":"user","content":"q1"}]}`, 16)
	turn2 := key(`{"model":"m","messages":[`+sys+`,{"role":"user","content":"q1"},{"role":"assistant","content":"a1"},{"role":"user","content":"q2"}]}`, 16)
	if turn1 != turn2 {
		t.Errorf("multi-turn conversation changed key within its prefix")
	}
}

func TestParseNoAllocsWarm(t *testing.T) {
	if testing.Short() {
		t.Skip("allocation counts are checked in the full run")
	}
	body := []byte(`{"model":"Qwen/Qwen3-0.6B","stream":true,"messages":[{"role":"system","content":"You are helpful."},{"role":"user","content":"Tell me a story about a gateway."}],"user":"alice"}`)
	var p fastjson.Parser
	var r Request
	_ = Parse(&p, body, Chat, 2048, &r)
	allocs := testing.AllocsPerRun(100, func() {
		_ = Parse(&p, body, Chat, 2048, &r)
	})
	if allocs != 0 {
		t.Errorf("Parse allocates %.1f times per call on a warm parser; want 0", allocs)
	}
}

func FuzzParse(f *testing.F) {
	f.Add([]byte(`{"model":"m","messages":[{"role":"user","content":"hi"}]}`), true)
	f.Add([]byte(`{"model":"m","prompt":[[1,2],[3]]}`), false)
	f.Add([]byte(`{"model":"m","messages":[{"role":"user","content":[{"type":"text","text":"x"}]}],"stream":true}`), true)
	f.Add([]byte(`{"model":"\ud800","prompt":"\u0000"}`), false)
	f.Fuzz(func(t *testing.T, body []byte, chat bool) {
		k := Completion
		if chat {
			k = Chat
		}
		var p fastjson.Parser
		var r Request
		err := Parse(&p, body, k, 64, &r)
		if err != nil && !errors.Is(err, ErrInvalid) {
			t.Fatalf("error not classified as ErrInvalid: %v", err)
		}
		if err == nil && r.Model == nil {
			t.Fatalf("accepted a body without model")
		}
	})
}
