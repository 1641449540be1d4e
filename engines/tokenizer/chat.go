package tokenizer

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strings"

	"github.com/ardanlabs/jinja"
)

// JSONValue is a JSON document given to a template as a variable (a
// request's "tools", say) with its objects' key order kept: transformers
// renders Python dicts, which keep the order of the request, and a
// template's tojson writes keys in that order. A Go map would sort them and
// change the prompt.
type JSONValue []byte

// jsonToValue decodes a JSON document into a template value, objects as
// ordered dicts, integers as integers.
func jsonToValue(raw []byte) (jinja.Value, error) {
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.UseNumber()
	v, err := decodeValue(dec, 0)
	if err != nil {
		return jinja.Undefined(), fmt.Errorf("tokenizer: template variable: %w", err)
	}
	if _, err := dec.Token(); !errors.Is(err, io.EOF) {
		return jinja.Undefined(), fmt.Errorf("tokenizer: template variable: trailing data after the JSON value")
	}
	return v, nil
}

func decodeValue(dec *json.Decoder, depth int) (jinja.Value, error) {
	if depth > 64 {
		return jinja.Undefined(), errors.New("JSON nested deeper than 64")
	}
	tok, err := dec.Token()
	if err != nil {
		return jinja.Undefined(), err
	}
	switch t := tok.(type) {
	case json.Delim:
		switch t {
		case '[':
			var items []jinja.Value
			for dec.More() {
				v, err := decodeValue(dec, depth+1)
				if err != nil {
					return jinja.Undefined(), err
				}
				items = append(items, v)
			}
			if _, err := dec.Token(); err != nil {
				return jinja.Undefined(), err
			}
			return jinja.NewList(items), nil
		case '{':
			d := jinja.NewDict()
			for dec.More() {
				k, err := dec.Token()
				if err != nil {
					return jinja.Undefined(), err
				}
				key, _ := k.(string)
				v, err := decodeValue(dec, depth+1)
				if err != nil {
					return jinja.Undefined(), err
				}
				d.AsDict().Set(key, v)
			}
			if _, err := dec.Token(); err != nil {
				return jinja.Undefined(), err
			}
			return d, nil
		}
		return jinja.Undefined(), fmt.Errorf("unexpected %v", t)
	default:
		return jinja.FromGoValue(t), nil
	}
}

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
	tpl, err := jinja.Compile(rewriteConcat(rewriteTojson(template)))
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
// variables override the defaults; nil means none. A JSONValue keeps its
// objects' key order (pass a request's "tools" that way). extra is not
// retained.
func (r *JinjaRenderer) RenderWith(msgs []Message, addGenerationPrompt bool, extra map[string]any) (string, error) {
	list := make([]jinja.Value, len(msgs))
	for i, m := range msgs {
		d := jinja.NewDict()
		d.AsDict().Set("role", jinja.NewString(m.Role))
		d.AsDict().Set("content", jinja.NewString(m.Content))
		list[i] = d
	}
	data := make(map[string]jinja.Value, len(r.vars)+len(extra)+4)
	for k, v := range r.vars {
		data[k] = jinja.NewString(v)
	}
	data["messages"] = jinja.NewList(list)
	data["add_generation_prompt"] = jinja.NewBool(addGenerationPrompt)
	data["tools"] = jinja.None()
	data["documents"] = jinja.None()
	data[tojsonFunc] = tojsonValue // rewritten tojson(...) calls (tojson.go)
	for k, v := range extra {
		if raw, ok := v.(JSONValue); ok {
			jv, err := jsonToValue(raw)
			if err != nil {
				return "", err
			}
			data[k] = jv
			continue
		}
		data[k] = jinja.FromGoValue(v)
	}
	out, err := r.tpl.RenderValues(data)
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

// RendererFor compiles template (a chat template given apart from the
// tokenizer's own files, e.g. a rule's kvChatTemplate, as vLLM's
// --chat-template) with the tokenizer's special-token variables
// (bos_token, eos_token, ...), as ChatRenderer does with its own.
func (t *HF) RendererFor(template string) (*JinjaRenderer, error) {
	if strings.TrimSpace(template) == "" {
		return nil, fmt.Errorf("%w: the given template is empty", ErrNoChatTemplate)
	}
	return NewJinjaRenderer(template, t.specialVars)
}

var _ Renderer = (*JinjaRenderer)(nil)
