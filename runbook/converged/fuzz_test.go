package converged

import (
	"encoding/json"
	"strings"
	"testing"
)

// FuzzParseSSE: worker and gateway bytes are untrusted; the parser never
// panics, and a success means a complete stream (events, then [DONE]).
func FuzzParseSSE(f *testing.F) {
	f.Add("data: {\"choices\":[{\"text\":\"hi\"}]}\n\ndata: [DONE]\n\n")
	f.Add("data: {\"choices\":[{\"delta\":{\"content\":\"a\"}}],\"usage\":{\"prompt_tokens\":3,\"prompt_tokens_details\":{\"cached_tokens\":2}}}\r\n\r\ndata: [DONE]\r\n")
	f.Add("data: [DONE]\n")
	f.Add("event: x\ndata: {}\n\ndata: [DONE]\n\ndata: {}\n")
	f.Add("data: {\"choices\":")
	f.Fuzz(func(t *testing.T, body string) {
		c, err := parseSSE(body)
		if err != nil {
			return
		}
		if !c.Done || c.Chunks == 0 {
			t.Fatalf("success without a complete stream: %+v", c)
		}
		if !strings.Contains(body, "[DONE]") {
			t.Fatalf("success without [DONE] in %q", body)
		}
	})
}

// FuzzParseCompletion: a success is always a valid JSON document.
func FuzzParseCompletion(f *testing.F) {
	f.Add(`{"choices":[{"text":"x"}],"usage":{"prompt_tokens":4,"prompt_tokens_details":{"cached_tokens":0}}}`)
	f.Add(`{"choices":[{"message":{"content":"hello"}}]}`)
	f.Add(`{"choices":[]}`)
	f.Add(`{"choices":null,"usage":{}}`)
	f.Add(`[]`)
	f.Fuzz(func(t *testing.T, body string) {
		c, err := parseCompletion(body)
		if err != nil {
			return
		}
		if !json.Valid([]byte(body)) {
			t.Fatalf("accepted invalid JSON %q as %+v", body, c)
		}
	})
}
