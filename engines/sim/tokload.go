package sim

import (
	"encoding/json"
	"errors"
	"fmt"

	"github.com/llmgw/llmgw/engines/tokenizer"
)

// loadTokenizer loads the sim's tokenizer: the embedded Qwen3 one when
// source is "", else the model's tokenizer that source names (a
// tokenizer.json or .gguf file, or a models directory holding model's
// snapshot; tokenizer.Open). Either way the sim's ids are a real model's ids.
func loadTokenizer(source, model string) (tok tokenizer.Tokenizer, render tokenizer.Renderer, bos uint32, addBOS bool, err error) {
	var hf *tokenizer.HF
	if source == "" {
		hf, err = tokenizer.Qwen3()
	} else {
		hf, err = tokenizer.Open(source, model)
	}
	if err != nil {
		return nil, nil, 0, false, err
	}
	r, err := hf.ChatRenderer()
	if err != nil && !errors.Is(err, tokenizer.ErrNoChatTemplate) {
		return nil, nil, 0, false, err
	}
	// A vocabulary without a chat template (a base model's GGUF) serves
	// completions; chat requests are refused (renderChat).
	bos, addBOS = hf.BOS()
	return hf, r, bos, addBOS, nil
}

// renderChat renders a chat with the model's template as vLLM does: the
// request's tools (key order kept) and chat_template_kwargs are template
// variables.
func (s *Sim) renderChat(msgs []tokenizer.Message, addGenerationPrompt bool, tools, kwargs json.RawMessage) (string, error) {
	if s.render == nil {
		return "", fmt.Errorf("%w: the model's tokenizer has no chat template", tokenizer.ErrNoChatTemplate)
	}
	jr, ok := s.render.(*tokenizer.JinjaRenderer)
	if !ok {
		return s.render.Render(msgs, addGenerationPrompt)
	}
	var extra map[string]any
	if len(tools) > 0 && string(tools) != "null" {
		extra = map[string]any{"tools": tokenizer.JSONValue(tools)}
	}
	if len(kwargs) > 0 && string(kwargs) != "null" {
		var kw map[string]json.RawMessage
		if err := json.Unmarshal(kwargs, &kw); err != nil {
			return "", fmt.Errorf("chat_template_kwargs: %w", err)
		}
		if extra == nil {
			extra = make(map[string]any, len(kw))
		}
		for k, v := range kw {
			extra[k] = tokenizer.JSONValue(v)
		}
	}
	return jr.RenderWith(msgs, addGenerationPrompt, extra)
}
