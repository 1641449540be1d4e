package engines

import (
	"bytes"

	"github.com/valyala/fastjson"
)

// RewriteJSON parses body as a JSON object, applies edit and returns the
// re-encoded body. The adapters' P/D rewrites use it; an error wraps
// ErrPDBody.
func RewriteJSON(body []byte, edit func(v *fastjson.Value, a *fastjson.Arena)) ([]byte, error) {
	var p fastjson.Parser
	v, err := p.ParseBytes(body)
	if err != nil {
		return nil, PDErrorf("%v", err)
	}
	if v.Type() != fastjson.TypeObject {
		return nil, PDErrorf("the body is a JSON %s, not an object", v.Type())
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
