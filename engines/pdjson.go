package engines

import (
	"bytes"
	"fmt"

	"github.com/valyala/fastjson"
)

// RewriteJSON parses body as a JSON object, applies edit and returns the
// re-encoded body. The adapters' P/D rewrites use it; an error wraps
// ErrPDBody.
func RewriteJSON(body []byte, edit func(v *fastjson.Value, a *fastjson.Arena)) ([]byte, error) {
	var p fastjson.Parser
	v, err := p.ParseBytes(body)
	if err != nil {
		return nil, fmt.Errorf("%w: %v", ErrPDBody, err)
	}
	if v.Type() != fastjson.TypeObject {
		return nil, fmt.Errorf("%w: the body is a JSON %s, not an object", ErrPDBody, v.Type())
	}
	var a fastjson.Arena
	edit(v, &a)
	return v.MarshalTo(make([]byte, 0, len(body)+256)), nil
}

// IsJSONNull reports whether raw is absent or the JSON null.
func IsJSONNull(raw []byte) bool {
	raw = bytes.TrimSpace(raw)
	return len(raw) == 0 || bytes.Equal(raw, []byte("null"))
}
