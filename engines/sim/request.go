package sim

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"strings"

	"github.com/llmgw/llmgw/engines/tokenizer"
)

// errBadRequest classifies request errors that map to HTTP 400 in every
// engine; errUnknownModel maps to 404 where the engine checks model names.
var (
	errBadRequest   = errors.New("bad request")
	errUnknownModel = errors.New("unknown model")
)

// genRequest is the union of the request fields the personas read from
// OpenAI-style, SGLang /generate and llama.cpp /completion bodies. Fields an
// engine does not know are ignored by that persona (except TensorRT-LLM,
// which rejects unknown top-level fields, see trtKnownFields).
type genRequest struct {
	Model               string          `json:"model"`
	Messages            json.RawMessage `json:"messages"`
	Tools               json.RawMessage `json:"tools"`
	ChatTemplateKwargs  json.RawMessage `json:"chat_template_kwargs"`
	Prompt              json.RawMessage `json:"prompt"`
	MaxTokens           *int            `json:"max_tokens"`
	MaxCompletionTokens *int            `json:"max_completion_tokens"`
	Stream              *bool           `json:"stream"`
	StreamOptions       *streamOptions  `json:"stream_options"`
	// IgnoreEOS (vLLM, TensorRT-LLM and llama.cpp accept it at the top
	// level) makes generation run to max_tokens.
	IgnoreEOS *bool           `json:"ignore_eos"`
	User      *string         `json:"user"`
	Metadata  json.RawMessage `json:"metadata"`

	// The P/D hand-off fields are read by the engine's adapter
	// (engines.PDProtocol.ParseLeg), not here.

	// TensorRT-LLM generation requests.
	PromptTokenIDs []uint32 `json:"prompt_token_ids"`

	// SGLang native /generate.
	Text           json.RawMessage `json:"text"`
	InputIDs       []uint32        `json:"input_ids"`
	SamplingParams *struct {
		MaxNewTokens *int `json:"max_new_tokens"`
	} `json:"sampling_params"`
	RID *string `json:"rid"`
	// Data-parallel rank selection (SGLang router / vLLM DP).
	RoutedDPRank     *int `json:"routed_dp_rank"`
	DataParallelRank *int `json:"data_parallel_rank"`

	// llama.cpp native /completion (seed and temperature are echoed in
	// its generation settings).
	NPredict    *int     `json:"n_predict"`
	Seed        *int64   `json:"seed"`
	Temperature *float64 `json:"temperature"`
	CachePrompt *bool    `json:"cache_prompt"`
	IDSlot      *int     `json:"id_slot"`
}

// streamOptions mirrors OpenAI's stream_options. A nil IncludeUsage means
// the key was absent; vLLM then still includes usage (see includeUsage).
type streamOptions struct {
	IncludeUsage         *bool `json:"include_usage"`
	ContinuousUsageStats bool  `json:"continuous_usage_stats"`
}

type chatMessage struct {
	Role    string          `json:"role"`
	Content json.RawMessage `json:"content"`
}

// parseGenRequest decodes body. Errors wrap errBadRequest and carry a
// message in the style of a Python validation error.
func parseGenRequest(body []byte) (*genRequest, error) {
	var r genRequest
	if len(bytes.TrimSpace(body)) == 0 {
		return nil, fmt.Errorf("%w: request body is empty", errBadRequest)
	}
	dec := json.NewDecoder(bytes.NewReader(body))
	if err := dec.Decode(&r); err != nil {
		var te *json.UnmarshalTypeError
		if errors.As(err, &te) {
			return nil, fmt.Errorf("%w: field %q: expected %s, got %s", errBadRequest, te.Field, te.Type, te.Value)
		}
		return nil, fmt.Errorf("%w: JSON decode error: %v", errBadRequest, err)
	}
	if dec.More() {
		return nil, fmt.Errorf("%w: JSON decode error: extra data after the object", errBadRequest)
	}
	return &r, nil
}

// isNull reports whether raw is absent or JSON null.
func isNull(raw json.RawMessage) bool {
	return len(raw) == 0 || bytes.Equal(raw, []byte("null"))
}

// parseMessages decodes an OpenAI messages array into template messages.
// Content may be a string, null, or an array of parts whose text parts are
// joined (non-text parts are rejected: the simulated models are text-only).
func parseMessages(raw json.RawMessage) ([]tokenizer.Message, error) {
	if isNull(raw) {
		return nil, fmt.Errorf("%w: field \"messages\" is required", errBadRequest)
	}
	var msgs []chatMessage
	if err := json.Unmarshal(raw, &msgs); err != nil {
		return nil, fmt.Errorf("%w: field \"messages\": expected a list of messages: %v", errBadRequest, err)
	}
	if len(msgs) == 0 {
		return nil, fmt.Errorf("%w: field \"messages\": list should have at least 1 item", errBadRequest)
	}
	out := make([]tokenizer.Message, len(msgs))
	for i, m := range msgs {
		if m.Role == "" {
			return nil, fmt.Errorf("%w: messages[%d].role is required", errBadRequest, i)
		}
		text, err := contentText(m.Content)
		if err != nil {
			return nil, fmt.Errorf("%w: messages[%d].content: %v", errBadRequest, i, err)
		}
		out[i] = tokenizer.Message{Role: m.Role, Content: text}
	}
	return out, nil
}

func contentText(raw json.RawMessage) (string, error) {
	if isNull(raw) {
		return "", nil
	}
	switch raw[0] {
	case '"':
		var s string
		err := json.Unmarshal(raw, &s)
		return s, err
	case '[':
		var parts []struct {
			Type string  `json:"type"`
			Text *string `json:"text"`
		}
		if err := json.Unmarshal(raw, &parts); err != nil {
			return "", err
		}
		var b strings.Builder
		for i, p := range parts {
			if p.Type != "text" || p.Text == nil {
				return "", fmt.Errorf("part %d: only text parts are supported", i)
			}
			b.WriteString(*p.Text)
		}
		return b.String(), nil
	}
	return "", errors.New("expected a string or a list of content parts")
}

// promptInput is a completions prompt: either text or token ids.
type promptInput struct {
	text   string
	ids    []uint32
	isText bool
}

// parsePrompt decodes a completions "prompt": a string, a list of token ids,
// or a one-element list of either. Batched prompts are rejected: each sim
// request serves one sequence.
func parsePrompt(raw json.RawMessage, field string) (promptInput, error) {
	if isNull(raw) {
		return promptInput{}, fmt.Errorf("%w: field %q is required", errBadRequest, field)
	}
	switch raw[0] {
	case '"':
		var s string
		if err := json.Unmarshal(raw, &s); err != nil {
			return promptInput{}, fmt.Errorf("%w: field %q: %v", errBadRequest, field, err)
		}
		return promptInput{text: s, isText: true}, nil
	case '[':
		var ids []uint32
		if err := json.Unmarshal(raw, &ids); err == nil {
			if len(ids) == 0 {
				return promptInput{}, fmt.Errorf("%w: field %q: prompt cannot be empty", errBadRequest, field)
			}
			return promptInput{ids: ids}, nil
		}
		var list []json.RawMessage
		if err := json.Unmarshal(raw, &list); err != nil {
			return promptInput{}, fmt.Errorf("%w: field %q: expected a string or a list of token ids: %v", errBadRequest, field, err)
		}
		if len(list) != 1 {
			return promptInput{}, fmt.Errorf("%w: field %q: batched prompts (%d) are not supported by the simulator; send one prompt per request", errBadRequest, field, len(list))
		}
		if len(list[0]) > 0 && list[0][0] == '[' || len(list[0]) > 0 && list[0][0] == '"' {
			return parsePrompt(list[0], field)
		}
		return promptInput{}, fmt.Errorf("%w: field %q: expected a string or a list of token ids", errBadRequest, field)
	}
	return promptInput{}, fmt.Errorf("%w: field %q: expected a string or a list of token ids", errBadRequest, field)
}

// nonce returns the request's correlation nonce for receipts: metadata.nonce
// when it is a string, otherwise the OpenAI "user" field, otherwise "".
func (r *genRequest) nonce() string {
	if !isNull(r.Metadata) {
		var md struct {
			Nonce *string `json:"nonce"`
		}
		if json.Unmarshal(r.Metadata, &md) == nil && md.Nonce != nil {
			return *md.Nonce
		}
	}
	if r.User != nil {
		return *r.User
	}
	return ""
}

// maxTokens returns the requested generation cap (max_completion_tokens wins
// over max_tokens, as in vLLM) or -1 when absent.
func (r *genRequest) maxTokens() int {
	switch {
	case r.MaxCompletionTokens != nil:
		return *r.MaxCompletionTokens
	case r.MaxTokens != nil:
		return *r.MaxTokens
	case r.SamplingParams != nil && r.SamplingParams.MaxNewTokens != nil:
		return *r.SamplingParams.MaxNewTokens
	case r.NPredict != nil && *r.NPredict >= 0:
		return *r.NPredict
	}
	return -1
}

func (r *genRequest) stream() bool { return r.Stream != nil && *r.Stream }
