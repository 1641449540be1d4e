package gateway

import (
	"fmt"
	"net/http"
	"strings"
	"testing"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"
	"github.com/openai/openai-go/v3/responses"

	"github.com/llmgw/llmgw/engines"
	"github.com/llmgw/llmgw/engines/sim"
)

// TestOpenAISDK drives the gateway with the official Go SDK (openai-go):
// the model list, then chat, chat stream, completions, embeddings,
// responses and a responses stream, each for two models served by two
// rules over vLLM simulators. The vLLM persona answers 404 for a model it
// does not serve, so every success also proves the request reached its
// model's rule; the X-Llmgw-Endpoint header names the simulator.
func TestOpenAISDK(t *testing.T) {
	gw := startGateway(t, "", nil)
	for _, model := range []string{"org/model-a", "org/model-b"} {
		s, err := sim.Start(t.Context(), sim.Config{Engine: engines.VLLM, Model: model})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { s.Close() })
		h, p := hostPort(t, s.Addrs().HTTP)
		name := strings.TrimPrefix(model, "org/")
		mustApply(t, gw, fmt.Sprintf("name: %s\nmodel_name: %s\nprobe: {disabled: true}\nendpoints:\n  - {id: %s-w1, endpointIP: %s, targetPort: %d}\n", name, model, name, h, p))
	}
	client := openai.NewClient(
		option.WithBaseURL("http://"+gw.Addr()+"/v1/"),
		option.WithAPIKey("unused"),
		option.WithMaxRetries(0),
		option.WithHTTPClient(newClient(t)),
	)
	t.Run("models", func(t *testing.T) {
		page, err := client.Models.List(t.Context())
		if err != nil {
			t.Fatal(err)
		}
		var ids []string
		for _, m := range page.Data {
			ids = append(ids, m.ID)
		}
		if strings.Join(ids, ",") != "org/model-a,org/model-b" {
			t.Fatalf("models %v", ids)
		}
	})
	for _, model := range []string{"org/model-a", "org/model-b"} {
		wantEP := strings.TrimPrefix(model, "org/") + "-w1"
		var hdr *http.Response
		checkEP := func(t *testing.T) {
			t.Helper()
			if got := hdr.Header.Get("X-Llmgw-Endpoint"); got != wantEP {
				t.Fatalf("X-Llmgw-Endpoint = %q; want %q", got, wantEP)
			}
		}
		t.Run(model+"/chat", func(t *testing.T) {
			c, err := client.Chat.Completions.New(t.Context(), openai.ChatCompletionNewParams{
				Model:    model,
				Messages: []openai.ChatCompletionMessageParamUnion{openai.UserMessage("hello")},
			}, option.WithResponseInto(&hdr))
			if err != nil {
				t.Fatal(err)
			}
			checkEP(t)
			if len(c.Choices) != 1 || c.Choices[0].Message.Content == "" || c.Model != model {
				t.Fatalf("chat answer %+v", c)
			}
		})
		t.Run(model+"/chat stream", func(t *testing.T) {
			st := client.Chat.Completions.NewStreaming(t.Context(), openai.ChatCompletionNewParams{
				Model:    model,
				Messages: []openai.ChatCompletionMessageParamUnion{openai.UserMessage("hello")},
			}, option.WithResponseInto(&hdr))
			var acc openai.ChatCompletionAccumulator
			chunks := 0
			for st.Next() {
				acc.AddChunk(st.Current())
				chunks++
			}
			if err := st.Err(); err != nil {
				t.Fatal(err)
			}
			checkEP(t)
			if chunks < 2 || len(acc.Choices) != 1 || acc.Choices[0].Message.Content == "" {
				t.Fatalf("%d chunks, accumulated %+v", chunks, acc.ChatCompletion)
			}
		})
		t.Run(model+"/completions", func(t *testing.T) {
			c, err := client.Completions.New(t.Context(), openai.CompletionNewParams{
				Model:     openai.CompletionNewParamsModel(model),
				Prompt:    openai.CompletionNewParamsPromptUnion{OfString: openai.String("once upon a time")},
				MaxTokens: openai.Int(4),
			}, option.WithResponseInto(&hdr))
			if err != nil {
				t.Fatal(err)
			}
			checkEP(t)
			if len(c.Choices) != 1 || c.Choices[0].Text == "" || c.Usage.CompletionTokens != 4 {
				t.Fatalf("completion %+v", c)
			}
		})
		t.Run(model+"/embeddings", func(t *testing.T) {
			e, err := client.Embeddings.New(t.Context(), openai.EmbeddingNewParams{
				Model: openai.EmbeddingModel(model),
				Input: openai.EmbeddingNewParamsInputUnion{OfArrayOfStrings: []string{"first text", "second text"}},
			}, option.WithResponseInto(&hdr))
			if err != nil {
				t.Fatal(err)
			}
			checkEP(t)
			if len(e.Data) != 2 || len(e.Data[0].Embedding) == 0 || e.Data[1].Index != 1 || e.Usage.PromptTokens == 0 {
				t.Fatalf("embeddings %+v", e)
			}
		})
		t.Run(model+"/responses", func(t *testing.T) {
			r, err := client.Responses.New(t.Context(), responses.ResponseNewParams{
				Model:           model,
				Instructions:    openai.String("answer briefly"),
				Input:           responses.ResponseNewParamsInputUnion{OfString: openai.String("hello")},
				MaxOutputTokens: openai.Int(5),
			}, option.WithResponseInto(&hdr))
			if err != nil {
				t.Fatal(err)
			}
			checkEP(t)
			if r.OutputText() == "" || r.Usage.OutputTokens != 5 || string(r.Model) != model {
				t.Fatalf("response %+v", r)
			}
		})
		t.Run(model+"/responses stream", func(t *testing.T) {
			st := client.Responses.NewStreaming(t.Context(), responses.ResponseNewParams{
				Model:           model,
				Input:           responses.ResponseNewParamsInputUnion{OfString: openai.String("hello")},
				MaxOutputTokens: openai.Int(5),
			}, option.WithResponseInto(&hdr))
			var deltas strings.Builder
			var types []string
			completed := ""
			for st.Next() {
				ev := st.Current()
				types = append(types, ev.Type)
				switch ev.Type {
				case "response.output_text.delta":
					deltas.WriteString(ev.Delta)
				case "response.completed":
					completed = ev.Response.OutputText()
				}
			}
			if err := st.Err(); err != nil {
				t.Fatal(err)
			}
			checkEP(t)
			if types[0] != "response.created" || types[len(types)-1] != "response.completed" || deltas.Len() == 0 || completed != deltas.String() {
				t.Fatalf("events %v; deltas %q; completed text %q", types, deltas.String(), completed)
			}
		})
	}
}
