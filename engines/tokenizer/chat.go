package tokenizer

import (
	"fmt"

	"github.com/ardanlabs/jinja"
)

// JinjaRenderer renders a Hugging Face chat template (Jinja) with the
// variables transformers' apply_chat_template passes: messages,
// add_generation_prompt, tools and documents (none), and the special-token
// strings that
// the tokenizer config sets (bos_token, eos_token, pad_token, unk_token;
// an unset one is left undefined, as transformers does). Message content is
// plain text: the caller flattens OpenAI content-part arrays first. The
// library applies transformers' Jinja settings (trim_blocks and
// lstrip_blocks on), which decide the whitespace of templates that do not
// use "{%-".
//
// The compiled template is immutable; JinjaRenderer is safe for concurrent
// use.
type JinjaRenderer struct {
	tpl  *jinja.Template
	vars map[string]string
}

// NewJinjaRenderer compiles a chat template. specialTokens maps template
// variable names (e.g. "bos_token") to their text; nil means none.
func NewJinjaRenderer(template string, specialTokens map[string]string) (*JinjaRenderer, error) {
	tpl, err := jinja.Compile(template)
	if err != nil {
		return nil, fmt.Errorf("tokenizer: compile chat template: %w", err)
	}
	vars := make(map[string]string, len(specialTokens))
	for k, v := range specialTokens {
		vars[k] = v
	}
	return &JinjaRenderer{tpl: tpl, vars: vars}, nil
}

// Render implements Renderer.
func (r *JinjaRenderer) Render(msgs []Message, addGenerationPrompt bool) (string, error) {
	return r.RenderWith(msgs, addGenerationPrompt, nil)
}

// RenderWith is Render with extra template variables: a request's
// chat_template_kwargs (e.g. "enable_thinking": false for Qwen3), which
// engines pass to the template too and which change the prompt. Extra
// variables override the defaults; nil means none. extra is not retained.
func (r *JinjaRenderer) RenderWith(msgs []Message, addGenerationPrompt bool, extra map[string]any) (string, error) {
	list := make([]any, len(msgs))
	for i, m := range msgs {
		list[i] = map[string]any{"role": m.Role, "content": m.Content}
	}
	data := make(map[string]any, len(r.vars)+len(extra)+3)
	for k, v := range r.vars {
		data[k] = v
	}
	data["messages"] = list
	data["add_generation_prompt"] = addGenerationPrompt
	data["tools"] = nil
	data["documents"] = nil
	for k, v := range extra {
		data[k] = v
	}
	out, err := r.tpl.Render(data)
	if err != nil {
		return "", fmt.Errorf("tokenizer: render chat template: %w", err)
	}
	return out, nil
}

// ChatRenderer returns the renderer of tokenizer_config.json's chat_template
// (a *JinjaRenderer, for callers that need RenderWith). The template is
// compiled on first use and the result (or error) kept. It returns an error
// wrapping ErrNoChatTemplate when the config has none.
func (t *HF) ChatRenderer() (Renderer, error) {
	t.renderOnce.Do(func() {
		if t.chatTemplate == "" {
			t.renderErr = fmt.Errorf("%w for %s", ErrNoChatTemplate, t.name)
			return
		}
		r, err := NewJinjaRenderer(t.chatTemplate, t.specialVars)
		if err != nil {
			t.renderErr = err
			return
		}
		t.renderer = r
	})
	return t.renderer, t.renderErr
}

var _ Renderer = (*JinjaRenderer)(nil)
