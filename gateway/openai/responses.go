package openai

import (
	"fmt"

	"github.com/valyala/fastjson"
)

// inputItemFields are the members of a Responses input item the gateway
// reads; a duplicate of either is refused like a duplicate message field.
var inputItemFields = [...]string{"role", "content"}

// parseResponsesInput validates and hashes a Responses API body's
// "instructions" and "input". The key follows the order an engine renders
// the prompt in (vLLM turns "instructions" into the leading system message,
// then the input items): instructions, then each message item as
// "role\x00content\x00". Items that are not messages (function_call,
// function_call_output, reasoning) carry no "role" and add nothing to the
// key; the engine validates their shape.
func parseResponsesInput(v *fastjson.Value, h *keyHasher, out *Request) error {
	if iv := v.Get("instructions"); iv != nil && iv.Type() != fastjson.TypeNull {
		if iv.Type() != fastjson.TypeString {
			return fmt.Errorf("%w: field \"instructions\" must be a string, not %s", ErrInvalid, iv.Type())
		}
		c, _ := iv.StringBytes()
		h.write(c)
		h.sep()
		out.PromptBytes += len(c)
	}
	in := v.Get("input")
	if in == nil {
		return fmt.Errorf("%w: missing required field \"input\"", ErrInvalid)
	}
	switch in.Type() {
	case fastjson.TypeString:
		// A bare string is one user message.
		c, _ := in.StringBytes()
		h.write([]byte("user"))
		h.sep()
		h.write(c)
		h.sep()
		out.PromptBytes += len(c)
		return nil
	case fastjson.TypeArray:
	default:
		return fmt.Errorf("%w: field \"input\" must be a string or an array of items, not %s", ErrInvalid, in.Type())
	}
	items, _ := in.Array()
	for i, it := range items {
		if it.Type() != fastjson.TypeObject {
			return fmt.Errorf("%w: input[%d] must be an object, not %s", ErrInvalid, i, it.Type())
		}
		if d := dupField(it, inputItemFields[:]); d != "" {
			return dupError(fmt.Sprintf("input[%d].%s", i, d))
		}
		rv := it.Get("role")
		if rv == nil {
			continue // not a message item
		}
		if rv.Type() != fastjson.TypeString {
			return fmt.Errorf("%w: input[%d].role must be a string, not %s", ErrInvalid, i, rv.Type())
		}
		role, _ := rv.StringBytes()
		h.write(role)
		h.sep()
		if err := writeContent(h, out, it.Get("content"), "input", i); err != nil {
			return err
		}
		h.sep()
	}
	return nil
}
