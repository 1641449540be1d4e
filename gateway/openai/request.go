// Package openai extracts what the gateway needs from an OpenAI-compatible
// completion request body: the model, the stream flag, the session fallback
// ("user") and the content-affinity key. It validates the types of the
// fields it reads, so a malformed request is refused before it reaches a
// worker, and it never retains the body.
package openai

import (
	"errors"
	"fmt"

	"github.com/cespare/xxhash/v2"
	"github.com/valyala/fastjson"
)

// Kind is the request's API shape.
type Kind uint8

const (
	Chat       Kind = iota // /v1/chat/completions: "messages"
	Completion             // /v1/completions: "prompt"
	// Embedding is /v1/embeddings: "input" (a string, a list of strings,
	// token ids or token-id lists, like "prompt").
	Embedding
	// Responses is /v1/responses: "instructions" and "input" (a string or
	// a list of items; a message item's "role" and "content" are read).
	Responses
	// ModelOnly is every other routed JSON body (rerank, score, tokenize,
	// detokenize): only "model", "stream" and "user" are read; there is
	// no content key.
	ModelOnly
)

// ErrInvalid is wrapped by every error Parse returns: the body is not a
// valid request (HTTP 400). errors.Is(err, ErrInvalid) holds for all of them.
var ErrInvalid = errors.New("invalid request")

// Request is the parsed view of one body. Byte slices point into the
// Parser's memory and are valid only until the Parser is reused; copy what
// must outlive the request.
type Request struct {
	Kind   Kind
	Model  []byte
	Stream bool
	// IncludeUsage is stream_options.include_usage (absent → false).
	IncludeUsage bool
	User         []byte // body "user"; nil when absent
	// KeyHash is the content-affinity key: xxhash of the model and the first
	// PrefixBytes of the conversation (each message as "role\x00content\x00")
	// or of the prompt. HasKey is false when there is no content to hash.
	KeyHash uint64
	HasKey  bool
	// PromptBytes is the total size of the prompt text or message contents.
	PromptBytes int
}

// Parse parses body as a request of kind k into out, hashing at most
// prefixBytes of its content into the affinity key. It is Decode followed by
// Extract, for callers that know prefixBytes before seeing the model.
func Parse(p *fastjson.Parser, body []byte, k Kind, prefixBytes int, out *Request) error {
	v, model, err := Decode(p, body)
	if err != nil {
		*out = Request{Kind: k}
		return err
	}
	return Extract(v, model, k, prefixBytes, out)
}

// Decode parses body and returns its root object and its "model". The
// gateway calls it first, to find the rule (and so prefixBytes) by model,
// then Extract. p is reused between calls (from a pool); Decode does not
// allocate once p has warmed up. The returned value and slice live in p.
func Decode(p *fastjson.Parser, body []byte) (*fastjson.Value, []byte, error) {
	return decode(p, body, false)
}

// DecodeOptional is Decode for the routes whose engines may accept a body
// without a model and serve their own (vLLM's pooling requests, embeddings,
// score and rerank, declare model: str | None = None in
// vllm/entrypoints/pooling/base/protocol.py), and which passed through to
// the default rule before they were routed by model: a missing or null
// "model" yields a nil model, not an error.
func DecodeOptional(p *fastjson.Parser, body []byte) (*fastjson.Value, []byte, error) {
	return decode(p, body, true)
}

func decode(p *fastjson.Parser, body []byte, optional bool) (*fastjson.Value, []byte, error) {
	v, err := p.ParseBytes(body)
	if err != nil {
		return nil, nil, fmt.Errorf("%w: body is not valid JSON: %v", ErrInvalid, err)
	}
	if v.Type() != fastjson.TypeObject {
		return nil, nil, fmt.Errorf("%w: body must be a JSON object, not %s", ErrInvalid, v.Type())
	}
	if d := dupField(v, rootFields[:]); d != "" {
		return nil, nil, dupError(d)
	}
	mv := v.Get("model")
	if optional && (mv == nil || mv.Type() == fastjson.TypeNull) {
		return v, nil, nil
	}
	if mv == nil {
		return nil, nil, fmt.Errorf("%w: missing required field \"model\"", ErrInvalid)
	}
	if mv.Type() != fastjson.TypeString {
		return nil, nil, fmt.Errorf("%w: field \"model\" must be a string, not %s", ErrInvalid, mv.Type())
	}
	model, _ := mv.StringBytes()
	return v, model, nil
}

// Extract validates the fields of v (a root object from Decode) that the
// gateway reads, and fills out.
func Extract(v *fastjson.Value, model []byte, k Kind, prefixBytes int, out *Request) error {
	*out = Request{Kind: k, Model: model}
	if sv := v.Get("stream"); sv != nil && sv.Type() != fastjson.TypeNull {
		b, err := sv.Bool()
		if err != nil {
			return fmt.Errorf("%w: field \"stream\" must be a boolean, not %s", ErrInvalid, sv.Type())
		}
		out.Stream = b
	}
	if so := v.Get("stream_options"); so != nil && so.Type() != fastjson.TypeNull {
		if so.Type() != fastjson.TypeObject {
			return fmt.Errorf("%w: field \"stream_options\" must be an object, not %s", ErrInvalid, so.Type())
		}
		if d := dupField(so, streamOptionFields[:]); d != "" {
			return dupError("stream_options." + d)
		}
		if iu := so.Get("include_usage"); iu != nil {
			b, err := iu.Bool()
			if err != nil {
				return fmt.Errorf("%w: field \"stream_options.include_usage\" must be a boolean", ErrInvalid)
			}
			out.IncludeUsage = b
		}
	}
	if uv := v.Get("user"); uv != nil && uv.Type() != fastjson.TypeNull {
		if uv.Type() != fastjson.TypeString {
			return fmt.Errorf("%w: field \"user\" must be a string, not %s", ErrInvalid, uv.Type())
		}
		out.User, _ = uv.StringBytes()
	}

	h := keyHasher{left: prefixBytes}
	h.d.Reset()
	_, _ = h.d.Write(out.Model)
	_, _ = h.d.WriteString("\x00")
	switch k {
	case Chat:
		if err := parseMessages(v.Get("messages"), &h, out); err != nil {
			return err
		}
	case Completion:
		if err := parsePrompt("prompt", v.Get("prompt"), &h, out); err != nil {
			return err
		}
	case Embedding:
		// vLLM's EmbeddingRequest is a completion-style body ("input") or
		// a chat-style one ("messages", EmbeddingChatRequest).
		if v.Get("input") == nil && v.Get("messages") != nil {
			if err := parseMessages(v.Get("messages"), &h, out); err != nil {
				return err
			}
		} else if err := parsePrompt("input", v.Get("input"), &h, out); err != nil {
			return err
		}
	case Responses:
		if err := parseResponsesInput(v, &h, out); err != nil {
			return err
		}
	}
	if h.wrote {
		out.KeyHash, out.HasKey = h.d.Sum64(), true
	}
	return nil
}

// The fields the gateway reads, by object. JSON leaves duplicate names
// undefined (RFC 8259 §4); the gateway's parser (fastjson) answers the first
// occurrence while Python engines (json.loads, pydantic) keep the last, so a
// body such as {"model":"A","model":"B"} would be routed by A's rule to an
// engine that serves B. A duplicate of any field read here is refused.
var (
	rootFields         = [...]string{"model", "stream", "stream_options", "user", "messages", "prompt", "input", "instructions"}
	streamOptionFields = [...]string{"include_usage"}
	messageFields      = [...]string{"role", "content"}
	partFields         = [...]string{"text"}
)

// dupField returns the first of names that object v holds more than once,
// or "". fastjson keeps every member of an object in document order,
// duplicates included (Object.Visit sees them all; Get answers the first),
// which is what makes the check possible. It does not allocate.
func dupField(v *fastjson.Value, names []string) string {
	o, err := v.Object()
	if err != nil {
		return "" // not an object: the caller's type check reports it
	}
	var seen uint64 // bit i: names[i] was seen (len(names) <= 64)
	dup := ""
	o.Visit(func(key []byte, _ *fastjson.Value) {
		if dup != "" {
			return
		}
		for i, n := range names {
			if string(key) == n {
				if seen&(1<<i) != 0 {
					dup = n
				}
				seen |= 1 << i
				return
			}
		}
	})
	return dup
}

func dupError(field string) error {
	return fmt.Errorf("%w: field %q appears more than once; duplicate JSON names are ambiguous (the gateway and the engine could read different values)", ErrInvalid, field)
}

// keyHasher feeds at most left bytes of content into an xxhash digest.
type keyHasher struct {
	d     xxhash.Digest
	left  int
	wrote bool
}

func (h *keyHasher) write(b []byte) {
	if h.left <= 0 || len(b) == 0 {
		return
	}
	if len(b) > h.left {
		b = b[:h.left]
	}
	_, _ = h.d.Write(b)
	h.left -= len(b)
	h.wrote = true
}

// writeContent hashes a message's content into h and counts its bytes into
// out.PromptBytes: a string, or an array of parts whose "text" counts
// (input_image and file parts carry none); null (an assistant tool-call
// turn) and absence count nothing. list and i name the message in errors
// ("messages[3]", "input[0]").
func writeContent(h *keyHasher, out *Request, cv *fastjson.Value, list string, i int) error {
	if cv == nil {
		return nil
	}
	switch cv.Type() {
	case fastjson.TypeString:
		c, _ := cv.StringBytes()
		h.write(c)
		out.PromptBytes += len(c)
	case fastjson.TypeArray:
		parts, _ := cv.Array()
		for j, part := range parts {
			if part.Type() != fastjson.TypeObject {
				return fmt.Errorf("%w: %s[%d].content[%d] must be an object, not %s", ErrInvalid, list, i, j, part.Type())
			}
			if d := dupField(part, partFields[:]); d != "" {
				return dupError(fmt.Sprintf("%s[%d].content[%d].%s", list, i, j, d))
			}
			if tv := part.Get("text"); tv != nil {
				if tv.Type() != fastjson.TypeString {
					return fmt.Errorf("%w: %s[%d].content[%d].text must be a string", ErrInvalid, list, i, j)
				}
				c, _ := tv.StringBytes()
				h.write(c)
				out.PromptBytes += len(c)
			}
		}
	case fastjson.TypeNull:
	default:
		return fmt.Errorf("%w: %s[%d].content must be a string or an array of parts, not %s", ErrInvalid, list, i, cv.Type())
	}
	return nil
}

func (h *keyHasher) sep() {
	if h.left > 0 {
		_, _ = h.d.WriteString("\x00")
	}
}

func parseMessages(mv *fastjson.Value, h *keyHasher, out *Request) error {
	if mv == nil {
		return fmt.Errorf("%w: missing required field \"messages\"", ErrInvalid)
	}
	msgs, err := mv.Array()
	if err != nil {
		return fmt.Errorf("%w: field \"messages\" must be an array, not %s", ErrInvalid, mv.Type())
	}
	if len(msgs) == 0 {
		return fmt.Errorf("%w: field \"messages\" must not be empty", ErrInvalid)
	}
	for i, m := range msgs {
		if m.Type() != fastjson.TypeObject {
			return fmt.Errorf("%w: messages[%d] must be an object, not %s", ErrInvalid, i, m.Type())
		}
		if d := dupField(m, messageFields[:]); d != "" {
			return dupError(fmt.Sprintf("messages[%d].%s", i, d))
		}
		rv := m.Get("role")
		if rv == nil || rv.Type() != fastjson.TypeString {
			return fmt.Errorf("%w: messages[%d].role must be a string", ErrInvalid, i)
		}
		role, _ := rv.StringBytes()
		h.write(role)
		h.sep()
		if err := writeContent(h, out, m.Get("content"), "messages", i); err != nil {
			return err
		}
		h.sep()
	}
	return nil
}

func parsePrompt(field string, pv *fastjson.Value, h *keyHasher, out *Request) error {
	if pv == nil {
		return fmt.Errorf("%w: missing required field %q", ErrInvalid, field)
	}
	switch pv.Type() {
	case fastjson.TypeString:
		c, _ := pv.StringBytes()
		h.write(c)
		out.PromptBytes = len(c)
	case fastjson.TypeArray:
		// A list of strings, a list of token ids, or a list of token-id lists
		// (batched prompts). The key covers the first element only: that is
		// the prefix a worker caches first.
		items, _ := pv.Array()
		if len(items) == 0 {
			return fmt.Errorf("%w: field %q must not be empty", ErrInvalid, field)
		}
		for i, it := range items {
			switch it.Type() {
			case fastjson.TypeString:
				c, _ := it.StringBytes()
				if i == 0 {
					h.write(c)
				}
				out.PromptBytes += len(c)
			case fastjson.TypeNumber:
				n, err := it.Int64()
				if err != nil || n < 0 {
					return fmt.Errorf("%w: %s[%d] must be a non-negative integer token id", ErrInvalid, field, i)
				}
				if i == 0 || h.wrote {
					var buf [4]byte
					for b := range buf {
						buf[b] = byte(n >> (8 * b))
					}
					h.write(buf[:])
				}
				out.PromptBytes += 4
			case fastjson.TypeArray:
				ids, _ := it.Array()
				for _, id := range ids {
					n, err := id.Int64()
					if err != nil || n < 0 {
						return fmt.Errorf("%w: %s[%d] must hold non-negative integer token ids", ErrInvalid, field, i)
					}
					if i == 0 {
						var buf [4]byte
						for b := range buf {
							buf[b] = byte(n >> (8 * b))
						}
						h.write(buf[:])
					}
					out.PromptBytes += 4
				}
			default:
				return fmt.Errorf("%w: %s[%d] must be a string, a token id or a list of token ids, not %s", ErrInvalid, field, i, it.Type())
			}
		}
	default:
		return fmt.Errorf("%w: field %q must be a string or an array, not %s", ErrInvalid, field, pv.Type())
	}
	return nil
}
