package openai

import (
	"bytes"
	"errors"
	"mime/multipart"
	"strings"
	"testing"

	"github.com/valyala/fastjson"
)

// TestParseNewRoutes: the embeddings, responses and model-only shapes are
// validated like chat (types, duplicates) and keyed as docs/data-plane.md
// says.
func TestParseNewRoutes(t *testing.T) {
	cases := []struct {
		name    string
		kind    Kind
		body    string
		stream  bool
		hasKey  bool
		wantErr string
	}{
		{"embedding string", Embedding, `{"model":"m","input":"hello"}`, false, true, ""},
		{"embedding list", Embedding, `{"model":"m","input":["a","b"]}`, false, true, ""},
		{"embedding token ids", Embedding, `{"model":"m","input":[1,2]}`, false, true, ""},
		{"embedding chat style", Embedding, `{"model":"m","messages":[{"role":"user","content":"hi"}]}`, false, true, ""},
		{"embedding missing input", Embedding, `{"model":"m"}`, false, false, `missing required field "input"`},
		{"embedding bad input", Embedding, `{"model":"m","input":{}}`, false, false, `field "input" must be a string or an array`},
		{"embedding duplicate input", Embedding, `{"model":"m","input":"a","input":"b"}`, false, false, `"input" appears more than once`},
		{"responses string", Responses, `{"model":"m","input":"hi","stream":true}`, true, true, ""},
		{"responses items", Responses, `{"model":"m","instructions":"be brief","input":[{"role":"user","content":[{"type":"input_text","text":"hi"}]},{"type":"function_call_output","call_id":"c","output":"{}"}]}`, false, true, ""},
		{"responses only tool output", Responses, `{"model":"m","input":[{"type":"function_call_output","call_id":"c","output":"x"}]}`, false, false, ""},
		{"responses bad instructions", Responses, `{"model":"m","instructions":1,"input":"x"}`, false, false, `"instructions" must be a string`},
		{"responses bad item", Responses, `{"model":"m","input":[1]}`, false, false, `input[0] must be an object`},
		{"responses bad role", Responses, `{"model":"m","input":[{"role":1,"content":"x"}]}`, false, false, `input[0].role must be a string`},
		{"responses duplicate role", Responses, `{"model":"m","input":[{"role":"user","role":"system","content":"x"}]}`, false, false, `"input[0].role" appears more than once`},
		{"responses duplicate text", Responses, `{"model":"m","input":[{"role":"user","content":[{"type":"input_text","text":"a","text":"b"}]}]}`, false, false, `"input[0].content[0].text" appears more than once`},
		{"responses duplicate instructions", Responses, `{"model":"m","instructions":"a","instructions":"b","input":"x"}`, false, false, `"instructions" appears more than once`},
		{"responses missing input", Responses, `{"model":"m"}`, false, false, `missing required field "input"`},
		{"model only rerank", ModelOnly, `{"model":"m","query":"q","documents":["a"]}`, false, false, ""},
		{"model only bad stream", ModelOnly, `{"model":"m","stream":"yes"}`, false, false, `"stream" must be a boolean`},
		{"model only duplicate model", ModelOnly, `{"model":"a","model":"b","prompt":"x"}`, false, false, `"model" appears more than once`},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			r, err := parse(t, tc.body, tc.kind, 256)
			if tc.wantErr != "" {
				if err == nil || !errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("err = %v; want ErrInvalid containing %q", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if string(r.Model) != "m" || r.Stream != tc.stream || r.HasKey != tc.hasKey {
				t.Fatalf("got model %q stream %v hasKey %v; want m %v %v", r.Model, r.Stream, r.HasKey, tc.stream, tc.hasKey)
			}
		})
	}
}

// TestResponsesKey: the key covers instructions and message items in
// order, so two bodies with the same leading turns share it and a
// different instruction does not.
func TestResponsesKey(t *testing.T) {
	key := func(body string) uint64 {
		t.Helper()
		r, err := parse(t, body, Responses, 16)
		if err != nil {
			t.Fatal(err)
		}
		return r.KeyHash
	}
	a := key(`{"model":"m","instructions":"system prompt here","input":"question one"}`)
	b := key(`{"model":"m","instructions":"system prompt here","input":"question two"}`)
	c := key(`{"model":"m","instructions":"another prompt..","input":"question one"}`)
	if a != b {
		t.Errorf("same first 16 bytes of instructions, different keys")
	}
	if a == c {
		t.Errorf("different instructions, same key")
	}
	if s, e := key(`{"model":"m","input":"hello"}`), key(`{"model":"m","input":[{"role":"user","content":"hello"}]}`); s != e {
		t.Errorf("a bare string input and the same user message item key differently")
	}
}

func form(t testing.TB, fields ...string) ([]byte, []byte) {
	t.Helper()
	var buf bytes.Buffer
	w := multipart.NewWriter(&buf)
	fw, err := w.CreateFormFile("file", "a.wav")
	if err != nil {
		t.Fatal(err)
	}
	fw.Write(bytes.Repeat([]byte("RIFF"), 4096))
	for i := 0; i+1 < len(fields); i += 2 {
		if err := w.WriteField(fields[i], fields[i+1]); err != nil {
			t.Fatal(err)
		}
	}
	w.Close()
	return []byte(w.FormDataContentType()), buf.Bytes()
}

func TestParseForm(t *testing.T) {
	long := strings.Repeat("m", maxFormValue+1)
	cases := []struct {
		name    string
		fields  []string
		ct      string // overrides the writer's content type
		model   string
		stream  bool
		wantErr string
	}{
		{"model after the file", []string{"model", "whisper"}, "", "whisper", false, ""},
		{"stream true", []string{"model", "w", "stream", "True"}, "", "w", true, ""},
		{"no model", []string{"language", "en"}, "", "", false, ""},
		{"duplicate model", []string{"model", "a", "model", "b"}, "", "", false, `"model" appears more than once`},
		{"duplicate stream", []string{"model", "a", "stream", "true", "stream", "false"}, "", "", false, `"stream" appears more than once`},
		{"bad stream", []string{"model", "a", "stream", "maybe"}, "", "", false, `"stream" must be a boolean`},
		{"model too long", []string{"model", long}, "", "", false, "longer than 256 bytes"},
		{"json content type", []string{"model", "a"}, "application/json", "", false, "takes a multipart/form-data body"},
		{"no boundary", []string{"model", "a"}, "multipart/form-data", "", false, "without a boundary"},
		{"wrong boundary", []string{"model", "a"}, "multipart/form-data; boundary=nope", "", false, "malformed multipart body"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			ct, body := form(t, tc.fields...)
			if tc.ct != "" {
				ct = []byte(tc.ct)
			}
			f, err := ParseForm(ct, body)
			if tc.wantErr != "" {
				if err == nil || !errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("err = %v; want ErrInvalid containing %q", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if string(f.Model) != tc.model || f.Stream != tc.stream || (tc.model == "") != (f.Model == nil) {
				t.Fatalf("got %q %v; want %q %v", f.Model, f.Stream, tc.model, tc.stream)
			}
		})
	}
}

// FuzzParseForm: ParseForm never panics, every failure is ErrInvalid, and
// an accepted form names model and stream at most once, with the model Go's
// own multipart reader sees.
func FuzzParseForm(f *testing.F) {
	ct, body := form(f, "model", "whisper", "stream", "false")
	f.Add(ct, body)
	f.Add(ct, []byte("--x\r\nContent-Disposition: form-data; name=\"model\"\r\n\r\nm\r\n--x--\r\n"))
	f.Add([]byte("multipart/form-data; boundary=x"), []byte("--x\r\nContent-Disposition: form-data; name=\"model\"\r\n\r\nm\r\n--x--\r\n"))
	f.Fuzz(func(t *testing.T, ct, body []byte) {
		fm, err := ParseForm(ct, body)
		if err != nil {
			if !errors.Is(err, ErrInvalid) {
				t.Fatalf("error %v is not ErrInvalid", err)
			}
			return
		}
		if len(fm.Model) > maxFormValue {
			t.Fatalf("accepted a %d-byte model", len(fm.Model))
		}
	})
}

// FuzzExtractRoutes: the embeddings and responses parsers never panic and
// fail only with ErrInvalid.
func FuzzExtractRoutes(f *testing.F) {
	for _, s := range []string{
		`{"model":"m","input":"x"}`,
		`{"model":"m","input":[{"role":"user","content":[{"type":"input_text","text":"a"}]}],"instructions":"s"}`,
		`{"model":"m","input":[[1,2],[3]]}`,
	} {
		f.Add([]byte(s), false)
		f.Add([]byte(s), true)
	}
	f.Fuzz(func(t *testing.T, body []byte, responses bool) {
		k := Embedding
		if responses {
			k = Responses
		}
		var r Request
		if _, err := parseBytes(body, k, &r); err != nil && !errors.Is(err, ErrInvalid) {
			t.Fatalf("error %v is not ErrInvalid", err)
		}
	})
}

func parseBytes(body []byte, k Kind, r *Request) (*Request, error) {
	var p fastjson.Parser
	return r, Parse(&p, body, k, 64, r)
}

// TestDecodeOptional: the routes whose engines take a body without a model
// get a nil model for an absent or null one; a model of another type and
// everything Decode refuses is still refused.
func TestDecodeOptional(t *testing.T) {
	cases := []struct {
		name, body string
		model      string
		isNil      bool
		wantErr    bool
	}{
		{"absent", `{"input":"x"}`, "", true, false},
		{"null", `{"model":null,"input":"x"}`, "", true, false},
		{"present", `{"model":"m","input":"x"}`, "m", false, false},
		{"number", `{"model":1,"input":"x"}`, "", false, true},
		{"duplicate", `{"model":"a","model":"b"}`, "", false, true},
		{"not an object", `[1]`, "", false, true},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			var p fastjson.Parser
			v, model, err := DecodeOptional(&p, []byte(tc.body))
			if tc.wantErr {
				if !errors.Is(err, ErrInvalid) {
					t.Fatalf("err = %v; want ErrInvalid", err)
				}
				return
			}
			if err != nil || v == nil || string(model) != tc.model || (model == nil) != tc.isNil {
				t.Fatalf("got %v %q %v", v, model, err)
			}
		})
	}
	var p fastjson.Parser
	if _, _, err := Decode(&p, []byte(`{"input":"x"}`)); !errors.Is(err, ErrInvalid) {
		t.Fatalf("Decode of a body without a model: %v; want ErrInvalid", err)
	}
}
