package sim

import (
	"encoding/json"
	"strings"
	"testing"
)

// FuzzLlamaRequest: llama.cpp's request checks never panic; a body they
// refuse gets nlohmann's or llama-server's wording with a 4xx/5xx status,
// a body they accept is a JSON object whose lenient rewrite still parses
// as a request, and whose messages (for chat) the persona can read.
func FuzzLlamaRequest(f *testing.F) {
	for _, s := range []string{
		`{"messages":[{"role":"user","content":"hi"}],"max_tokens":2}`, `{"prompt":"x","n":2}`, ``, ` `, `{`, `[1]`, `"x"`,
		`{"messages":"hi"}`, `{"messages":[{"content":"x"}]}`, `{"messages":[{"role":"u","content":[{"type":"image_url"}]}]}`,
		`{"messages":[],"tools":[1]}`, `{"prompt":5}`, `{"stream":"yes","max_tokens":"2","model":5,"stream_options":{"include_usage":1}}`,
		"{\"a\":\n\"b\" x}", `{"top_logprobs":2,"messages":[]}`, `{"prompt":"x","echo":false}`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		body, err := llamaParseBody(b)
		if err != nil {
			if !strings.HasPrefix(err.Error(), "[json.exception.") {
				t.Fatalf("parse error %q lacks nlohmann's prefix", err)
			}
			return
		}
		for _, api := range []apiKind{apiChat, apiCompletion, apiLlama} {
			copyBody := make(map[string]json.RawMessage, len(body))
			for k, v := range body {
				copyBody[k] = v
			}
			status, msg := llamaValidate(api, copyBody)
			if status != 0 {
				if status < 400 || msg == "" {
					t.Fatalf("refusal %d %q", status, msg)
				}
				continue
			}
			if api == apiChat {
				_ = llamaMessages(copyBody["messages"])
			}
			out, _ := llamaLenient(copyBody)
			if out != nil {
				if _, err := parseGenRequest(out); err != nil && strings.Contains(err.Error(), "expected") {
					t.Fatalf("lenient body %s still mistyped: %v", out, err)
				}
			}
		}
	})
}
