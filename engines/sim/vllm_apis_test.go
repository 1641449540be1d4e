package sim

import (
	"encoding/base64"
	"encoding/json"
	"strings"
	"testing"

	"github.com/llmgw/llmgw/engines"
)

// TestVLLMEmbeddings: the vLLM persona's /v1/embeddings answers in
// EmbeddingResponse's shape (vllm/entrypoints/pooling/embed/protocol.py).
func TestVLLMEmbeddings(t *testing.T) {
	s := startSim(t, Config{Engine: engines.VLLM, Model: "m"})
	c := client(t)
	url := "http://" + s.Addrs().HTTP + "/v1/embeddings"
	cases := []struct {
		name   string
		body   string
		status int
		n      int // embeddings
		dims   int
		b64    bool
	}{
		{"string", `{"model":"m","input":"hello world"}`, 200, 1, simEmbeddingDims, false},
		{"list", `{"model":"m","input":["a","b","c"]}`, 200, 3, simEmbeddingDims, false},
		{"token ids", `{"input":[1,2,3]}`, 200, 1, simEmbeddingDims, false},
		{"chat style", `{"model":"m","messages":[{"role":"user","content":"hi"}]}`, 200, 1, simEmbeddingDims, false},
		{"dimensions", `{"model":"m","input":"x","dimensions":4}`, 200, 1, 4, false},
		{"base64", `{"model":"m","input":"x","encoding_format":"base64"}`, 200, 1, simEmbeddingDims, true},
		{"unknown model", `{"model":"other","input":"x"}`, 404, 0, 0, false},
		{"no input", `{"model":"m"}`, 400, 0, 0, false},
		{"bad format", `{"model":"m","input":"x","encoding_format":"hex"}`, 400, 0, 0, false},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			r := do(t, c, "POST", url, tc.body)
			if r.status != tc.status {
				t.Fatalf("status %d; want %d: %s", r.status, tc.status, r.body)
			}
			if tc.status != 200 {
				return
			}
			var resp struct {
				ID     string `json:"id"`
				Object string `json:"object"`
				Model  string `json:"model"`
				Data   []struct {
					Index     int             `json:"index"`
					Object    string          `json:"object"`
					Embedding json.RawMessage `json:"embedding"`
				} `json:"data"`
				Usage struct {
					PromptTokens int `json:"prompt_tokens"`
					TotalTokens  int `json:"total_tokens"`
				} `json:"usage"`
			}
			if err := json.Unmarshal(r.body, &resp); err != nil {
				t.Fatal(err)
			}
			if !strings.HasPrefix(resp.ID, "embd-") || resp.Object != "list" || resp.Model != "m" || len(resp.Data) != tc.n ||
				resp.Usage.PromptTokens == 0 || resp.Usage.TotalTokens != resp.Usage.PromptTokens {
				t.Fatalf("answer %s", r.body)
			}
			for i, d := range resp.Data {
				if d.Index != i || d.Object != "embedding" {
					t.Fatalf("data[%d] %+v", i, d)
				}
				dims := 0
				if tc.b64 {
					var s string
					if err := json.Unmarshal(d.Embedding, &s); err != nil {
						t.Fatal(err)
					}
					raw, err := base64.StdEncoding.DecodeString(s)
					if err != nil {
						t.Fatal(err)
					}
					dims = len(raw) / 4
				} else {
					var v []float64
					if err := json.Unmarshal(d.Embedding, &v); err != nil {
						t.Fatal(err)
					}
					dims = len(v)
				}
				if dims != tc.dims {
					t.Fatalf("data[%d] has %d dimensions; want %d", i, dims, tc.dims)
				}
			}
		})
	}
}

// TestVLLMResponses: /v1/responses answers a ResponsesResponse, "incomplete"
// at max_output_tokens, and refuses what the sim cannot render.
func TestVLLMResponses(t *testing.T) {
	s := startSim(t, Config{Engine: engines.VLLM, Model: "m"})
	c := client(t)
	url := "http://" + s.Addrs().HTTP + "/v1/responses"
	cases := []struct {
		name, body, status string
		code               int
		outputTokens       int
	}{
		{"string input", `{"model":"m","input":"hi","max_output_tokens":3}`, "incomplete", 200, 3},
		{"items", `{"model":"m","instructions":"be brief","input":[{"role":"user","content":[{"type":"input_text","text":"hi"}]}],"max_output_tokens":2}`, "incomplete", 200, 2},
		{"unknown model", `{"model":"x","input":"hi"}`, "", 404, 0},
		{"no input", `{"model":"m"}`, "", 400, 0},
		{"tool output item", `{"model":"m","input":[{"type":"function_call_output","call_id":"c","output":"x"}]}`, "", 400, 0},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			r := do(t, c, "POST", url, tc.body)
			if r.status != tc.code {
				t.Fatalf("status %d; want %d: %s", r.status, tc.code, r.body)
			}
			if tc.code != 200 {
				return
			}
			var resp struct {
				ID     string `json:"id"`
				Object string `json:"object"`
				Status string `json:"status"`
				Output []struct {
					Type    string `json:"type"`
					Role    string `json:"role"`
					Content []struct {
						Type string `json:"type"`
						Text string `json:"text"`
					} `json:"content"`
				} `json:"output"`
				Incomplete *struct {
					Reason string `json:"reason"`
				} `json:"incomplete_details"`
				Usage struct {
					OutputTokens int `json:"output_tokens"`
				} `json:"usage"`
			}
			if err := json.Unmarshal(r.body, &resp); err != nil {
				t.Fatal(err)
			}
			if !strings.HasPrefix(resp.ID, "resp_") || resp.Object != "response" || resp.Status != tc.status ||
				resp.Incomplete == nil || resp.Incomplete.Reason != "max_output_tokens" || resp.Usage.OutputTokens != tc.outputTokens ||
				len(resp.Output) != 1 || resp.Output[0].Type != "message" || resp.Output[0].Role != "assistant" ||
				len(resp.Output[0].Content) != 1 || resp.Output[0].Content[0].Type != "output_text" || resp.Output[0].Content[0].Text == "" {
				t.Fatalf("answer %s", r.body)
			}
		})
	}
}
