package gateway

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"strings"
	"time"
	"unsafe"

	"github.com/valyala/fastjson"

	"github.com/llmgw/llmgw/engines/tokenizer"
	"github.com/llmgw/llmgw/gateway/idcache"
	"github.com/llmgw/llmgw/gateway/openai"
	"github.com/llmgw/llmgw/gateway/rule"
)

// errKVTokenize: the gateway could not turn the request into token ids; the
// request is routed by the fallback policy (a miss, never a failure).
var errKVTokenize = errors.New("gateway: kv-exact tokenization")

// kvTokenizeError is a tokenization failure with the miss reason it gives
// the decision (X-Llmgw-Route, /v1/decisions) and llmgw_kv_misses_total.
type kvTokenizeError struct {
	reason string // "tokenize", "tokenize_timeout", "tokenize_engine", "tokenize_no_worker"
	err    error
}

func (e *kvTokenizeError) Error() string { return e.err.Error() }
func (e *kvTokenizeError) Unwrap() error { return e.err }

func tokenizeErr(reason string, format string, args ...any) error {
	return &kvTokenizeError{reason: reason, err: fmt.Errorf("%w: "+format, append([]any{errKVTokenize}, args...)...)}
}

// missReason is the decision reason of a tokenization error.
func missReason(err error) string {
	var te *kvTokenizeError
	if errors.As(err, &te) {
		return te.reason
	}
	return "tokenize"
}

// kvTokenizer produces the token ids an engine computes for a request, the
// way the engine does it: chat messages rendered with the model's chat
// template (generation prompt appended, the request's tools and
// chat_template_kwargs passed to the template), the rendered text encoded
// with no BOS added (vLLM tokenizes a chat prompt with
// add_special_tokens=False: a BOS comes from the template's bos_token);
// completions prompts encoded with the model's BOS policy.
type kvTokenizer interface {
	// tokens appends the request's prompt token ids to dst. ctx bounds
	// any remote call (the request's context).
	tokens(ctx context.Context, dst []uint32, v *fastjson.Value, kind openai.Kind) ([]uint32, error)
	// prompt is tokens that also returns the text it encoded: the rendered
	// chat prompt or the completions prompt ("" when the ids came from the
	// engine or the prompt was given as ids).
	prompt(ctx context.Context, dst []uint32, v *fastjson.Value, kind openai.Kind) (string, []uint32, error)
	name() string
	// cacheStats reports the token cache (metrics).
	cacheStats() cacheStats
}

// engineTokenizeTimeout bounds one /tokenize call of kvTokenizer "engine"
// (within the request's own deadline): a slow tokenizer must cost a KV miss,
// not the request.
const engineTokenizeTimeout = 500 * time.Millisecond

// DefaultKVTokenCacheBytes is the arena of the token cache of one KV-exact
// rule (the segment cache of a local tokenizer, the /tokenize answer cache
// of kvTokenizer "engine"): texts, ids and 16-byte entry headers together,
// outside the Go heap (package idcache), so the cache costs this much
// memory once full and no more. 64 MiB holds about 10,000 distinct
// 1,500-token turns with their text; a run of unique long prompts only
// cycles it.
const DefaultKVTokenCacheBytes = 64 << 20

// cacheStats is a token cache's state for the metrics.
type cacheStats = idcache.Stats

// newKVTokenizer builds the tokenizer a rule's kvTokenizer names: "engine"
// (ask a worker's /tokenize), or a tokenizer source for the rule's model
// (a tokenizer.json or .gguf path, or a models directory holding the
// model's snapshot: tokenizer.Resolve). Admission refuses anything else.
// chatTemplate is the rule's kvChatTemplate file ("": the tokenizer's own
// template); a local tokenizer left with no chat template is refused, since
// every chat request would miss. cacheBytes bounds the rule's token cache
// (DefaultKVTokenCacheBytes when not positive).
func newKVTokenizer(spec, model, chatTemplate, tokenizePath string, engineURL func() string, client *http.Client, cacheBytes int) (kvTokenizer, error) {
	if cacheBytes <= 0 {
		cacheBytes = DefaultKVTokenCacheBytes
	}
	switch spec {
	case "engine":
		if tokenizePath == "" {
			return nil, fmt.Errorf("%w: the engine has no tokenize endpoint", tokenizer.ErrNoSource)
		}
		cache, err := newEngineCache(cacheBytes)
		if err != nil {
			return nil, err
		}
		return &engineTokenizer{path: tokenizePath, baseURL: engineURL, client: client, cache: cache}, nil
	case "", "builtin":
		return nil, fmt.Errorf("%w: KV-exact routing needs the model's tokenizer (kvTokenizer: a tokenizer.json or .gguf path, a models directory, or \"engine\")", tokenizer.ErrNoSource)
	}
	hf, err := tokenizer.Open(spec, model)
	if err != nil {
		return nil, err
	}
	var render *tokenizer.JinjaRenderer
	if chatTemplate != "" {
		text, err := os.ReadFile(chatTemplate)
		if err != nil {
			return nil, &rule.AdmissionError{Code: rule.CodeKVChatTemplate, Field: "kvChatTemplate", Message: fmt.Sprintf("kvChatTemplate %q: %v", chatTemplate, err)}
		}
		if render, err = hf.RendererFor(string(text)); err != nil {
			return nil, &rule.AdmissionError{Code: rule.CodeKVChatTemplate, Field: "kvChatTemplate", Message: fmt.Sprintf("kvChatTemplate %q: %v", chatTemplate, err)}
		}
	} else {
		r, err := hf.ChatRenderer()
		switch {
		case errors.Is(err, tokenizer.ErrNoChatTemplate):
			return nil, &rule.AdmissionError{Code: rule.CodeKVTokenizer, Field: "kvTokenizer", Message: fmt.Sprintf(
				"kvTokenizer %q: %v: KV-exact routing could not render chat requests as the engine does, so every one would miss; use the model's tokenizer files with its tokenizer_config.json (chat_template), or name the engine's template file with kvChatTemplate", spec, err)}
		case err != nil:
			return nil, err
		}
		render, _ = r.(*tokenizer.JinjaRenderer)
	}
	cache, err := newTokenCache(cacheBytes, hf)
	if err != nil {
		return nil, err
	}
	lt := &localTokenizer{tok: hf, cache: cache, prefixMinBytes: kvPrefixMinBytes, render: render}
	if id, add := hf.BOS(); add {
		lt.bos = []uint32{id}
	}
	return lt, nil
}

// messages extracts the chat messages of v as the chat template sees them.
// A string content shares v's bytes (the parser's buffer, reused by the
// next request on the connection), so the messages are valid only until
// the request's routing ends and must not be kept: their one user, text,
// renders them into a prompt of its own (the renderer writes every value
// into a new string) and drops them.
func messages(v *fastjson.Value) ([]tokenizer.Message, error) {
	arr, err := v.Get("messages").Array()
	if err != nil {
		return nil, err
	}
	out := make([]tokenizer.Message, 0, len(arr))
	for _, m := range arr {
		msg := tokenizer.Message{Role: string(m.GetStringBytes("role"))}
		c := m.Get("content")
		switch {
		case c == nil || c.Type() == fastjson.TypeNull:
		case c.Type() == fastjson.TypeString:
			// Not copied: a 256 KiB turn would be copied once here and
			// once more into the rendered prompt. See the contract above.
			b := c.GetStringBytes()
			msg.Content = unsafe.String(unsafe.SliceData(b), len(b))
		case c.Type() == fastjson.TypeArray:
			var b strings.Builder
			for _, part := range c.GetArray() {
				b.Write(part.GetStringBytes("text"))
			}
			msg.Content = b.String()
		}
		out = append(out, msg)
	}
	return out, nil
}

// templateVars are the request fields a chat template sees besides the
// messages: "tools" (key order kept) and the chat_template_kwargs (e.g.
// Qwen3's enable_thinking), as vLLM passes them to apply_chat_template.
func templateVars(v *fastjson.Value) map[string]any {
	var vars map[string]any
	if t := v.Get("tools"); t != nil && t.Type() != fastjson.TypeNull {
		vars = map[string]any{"tools": tokenizer.JSONValue(t.MarshalTo(nil))}
	}
	if kwv := v.Get("chat_template_kwargs"); kwv != nil && kwv.Type() == fastjson.TypeObject {
		kwv.GetObject().Visit(func(k []byte, val *fastjson.Value) {
			if vars == nil {
				vars = map[string]any{}
			}
			vars[string(k)] = tokenizer.JSONValue(val.MarshalTo(nil))
		})
	}
	return vars
}

// localTokenizer tokenizes in process.
type localTokenizer struct {
	tok    tokenizer.Tokenizer
	render *tokenizer.JinjaRenderer // nil: the model has no chat template
	bos    []uint32
	cache  *tokenCache
	// prefixMinBytes: tokensUntil encodes shorter prompts whole.
	prefixMinBytes int
}

// kvPrefixMinBytes is the prompt length from which KV-exact routing
// tokenizes only as far as an endpoint can match. Each check of a growing
// prefix hashes it from the root, so stopping early costs about two to
// three times the hashing of the blocks it reaches: on a short prompt that
// is more than the encoding it saves (Qwen3 encodes about 8 KiB in 0.5 ms;
// a 40-block prompt's extra hashing is about 0.1 ms), on a long unique one
// it saves nearly all of it.
const kvPrefixMinBytes = 8 << 10

func (t *localTokenizer) name() string { return t.tok.Name() }

func (t *localTokenizer) cacheStats() cacheStats { return t.cache.Stats() }

func (t *localTokenizer) tokens(ctx context.Context, dst []uint32, v *fastjson.Value, kind openai.Kind) ([]uint32, error) {
	_, ids, err := t.prompt(ctx, dst, v, kind)
	return ids, err
}

func (t *localTokenizer) prompt(_ context.Context, dst []uint32, v *fastjson.Value, kind openai.Kind) (string, []uint32, error) {
	text, dst, ok, err := t.text(dst, v, kind)
	if err != nil || !ok {
		return "", dst, err
	}
	return text, t.cache.encode(dst, text, t.tok), nil
}

// tokensUntil is tokens in independent units (tokenizer.HF.EncodeUntil),
// asking more before each whether to go on. Once more refuses, the rest of
// the prompt is only counted, until enough (nil: never) accepts the count:
// rest is a lower bound on the ids it holds, and done is false. A prompt
// shorter than prefixMinBytes is encoded whole. A tokenizer that cannot stop part way encodes it all.
func (t *localTokenizer) tokensUntil(dst []uint32, v *fastjson.Value, kind openai.Kind, more func([]uint32) bool, enough func(rest int) bool) (ids []uint32, rest int, done bool, err error) {
	text, dst, ok, err := t.text(dst, v, kind)
	if err != nil || !ok {
		return dst, 0, true, err
	}
	if len(text) < t.prefixMinBytes {
		return t.cache.encode(dst, text, t.tok), 0, true, nil
	}
	ids, rest, done = t.cache.encodeUntil(dst, text, t.tok, more, enough)
	return ids, rest, done, nil
}

// text returns the text a request's prompt encodes (the rendered chat
// prompt, or the completions prompt after the BOS appended to dst); ok is
// false when the prompt was given as token ids, which are appended to dst.
func (t *localTokenizer) text(dst []uint32, v *fastjson.Value, kind openai.Kind) (text string, out []uint32, ok bool, err error) {
	switch kind {
	case openai.Chat:
		if t.render == nil {
			return "", dst, false, tokenizeErr("tokenize", "tokenizer %s has no chat template", t.tok.Name())
		}
		msgs, err := messages(v)
		if err != nil {
			return "", dst, false, tokenizeErr("tokenize", "%v", err)
		}
		if text, err = t.render.RenderWith(msgs, true, templateVars(v)); err != nil {
			return "", dst, false, tokenizeErr("tokenize", "chat template: %v", err)
		}
		return text, dst, true, nil
	default:
		p := v.Get("prompt")
		if ids, ok := givenIDs(dst, p); ok {
			return "", ids, false, nil
		}
		switch p.Type() {
		case fastjson.TypeString:
			text = string(p.GetStringBytes())
		case fastjson.TypeArray:
			items := p.GetArray()
			if len(items) == 0 {
				return "", dst, false, tokenizeErr("tokenize", "empty prompt")
			}
			if items[0].Type() == fastjson.TypeString {
				text = string(items[0].GetStringBytes())
			}
		default:
			return "", dst, false, tokenizeErr("tokenize", "no prompt")
		}
	}
	return text, append(dst, t.bos...), true, nil
}

// givenIDs appends the ids of a completions prompt given as token ids (one
// prompt of ids, or the first of a list of them), which the engine uses as
// given: no tokenizer, local or the engine's, is asked. ok is false when the
// prompt is not ids. Every kvTokenizer goes through it.
func givenIDs(dst []uint32, p *fastjson.Value) ([]uint32, bool) {
	if p == nil || p.Type() != fastjson.TypeArray {
		return dst, false
	}
	items := p.GetArray()
	if len(items) == 0 {
		return dst, false
	}
	switch items[0].Type() {
	case fastjson.TypeNumber:
	case fastjson.TypeArray:
		items = items[0].GetArray()
	default:
		return dst, false
	}
	for _, it := range items {
		dst = append(dst, uint32(it.GetUint()))
	}
	return dst, true
}

// tokenCache memoises tokenization by segment. Special-token text splits a
// prompt into segments that a Hugging Face tokenizer encodes independently
// (added tokens are matched before the BPE runs), so encoding segment by
// segment gives exactly the ids of encoding the whole text. Chat prompts are
// mostly special-token-delimited messages, so a growing conversation
// re-tokenizes only its new turn. The cache (package idcache) holds segment
// texts and ids in an arena of its byte bound; a segment that keeps being
// asked for stays, the others go oldest first.
type tokenCache struct {
	// markers are the special tokens of the tokenizer at which prompts are
	// cut: only added tokens that do not absorb the whitespace before them
	// qualify, since cutting anywhere else could change how the text around
	// the cut is encoded.
	markers []string
	*idcache.Cache
}

func newTokenCache(maxBytes int, tok tokenizer.Tokenizer) (*tokenCache, error) {
	// One segment may not evict most of the cache: at most an eighth.
	ic, err := idcache.New(maxBytes, 8)
	if err != nil {
		return nil, err
	}
	c := &tokenCache{Cache: ic}
	// A marker qualifies when the tokenizer says a prompt may be cut before
	// it (an added token that does not absorb the whitespace before it).
	if cutter, ok := tok.(interface{ CutsBefore(string) bool }); ok {
		for _, m := range specialMarkers {
			if cutter.CutsBefore(m) {
				c.markers = append(c.markers, m)
			}
		}
	}
	return c, nil
}

// specialMarkers are the candidate texts at which the cache cuts a prompt:
// the turn delimiters of common chat templates.
var specialMarkers = []string{"<|im_start|>", "<|im_end|>", "<|endoftext|>", "<|begin_of_text|>", "<|start_header_id|>", "<|eot_id|>", "<start_of_turn>", "<end_of_turn>", "[|system|]", "[|user|]", "[|assistant|]", "[|endofturn|]"}

// encode appends the ids of text, segment by segment.
func (c *tokenCache) encode(dst []uint32, text string, tok tokenizer.Tokenizer) []uint32 {
	dst, _, _ = c.encodeUntil(dst, text, tok, nil, nil)
	return dst
}

// untilEncoder is a tokenizer that can stop part way (tokenizer.HF).
type untilEncoder interface {
	EncodeUntilEnough(dst []uint32, text string, more func([]uint32) bool, enough func(int) bool) ([]uint32, int, bool)
}

// encodeUntil is encode asking more (nil: always go on) before each
// segment and, inside a segment it encodes, before each of the
// tokenizer's independent units; once more refuses, the rest is counted
// until enough (nil: never) accepts the bound; see
// localTokenizer.tokensUntil. Only segments encoded whole enter the cache.
func (c *tokenCache) encodeUntil(dst []uint32, text string, tok tokenizer.Tokenizer, more func([]uint32) bool, enough func(int) bool) (ids []uint32, rest int, done bool) {
	ue, canStop := tok.(untilEncoder)
	stopped := false
	// next[i] is where marker i occurs next in the whole text (at or after
	// off+1; -1: nowhere), found again only once passed, so a prompt full
	// of markers is scanned once per marker, not once per segment.
	var nextBuf [16]int
	next := nextBuf[:0]
	for range c.markers {
		next = append(next, 0)
	}
	whole := text
	for off := 0; off < len(whole); {
		cut := len(whole)
		for i, m := range c.markers {
			// the next marker after position off starts the next segment
			if next[i] >= 0 && next[i] <= off {
				if j := strings.Index(whole[off+1:], m); j >= 0 {
					next[i] = off + 1 + j
				} else {
					next[i] = -1
				}
			}
			if next[i] >= 0 && next[i] < cut {
				cut = next[i]
			}
		}
		seg := whole[off:cut]
		off = cut
		switch {
		case more == nil || !canStop:
			dst = c.segment(dst, seg, tok)
			continue
		case stopped:
		case !more(dst):
			stopped = true
		default:
			var ok bool
			if dst, ok = c.Append(dst, seg); ok {
				continue
			}
			start := len(dst)
			var entire bool
			var n int
			dst, n, entire = ue.EncodeUntilEnough(dst, seg, more, func(r int) bool { return enough != nil && enough(r) })
			if entire {
				c.Put(seg, dst[start:])
				continue
			}
			stopped = true
			rest += n
			if enough != nil && enough(rest) {
				return dst, rest, false
			}
			continue
		}
		// Stopped: count the segment.
		base := rest
		_, n, _ := ue.EncodeUntilEnough(nil, seg, refuse, func(r int) bool { return enough != nil && enough(base+r) })
		rest += n
		if enough != nil && enough(rest) {
			return dst, rest, false
		}
	}
	return dst, rest, !stopped
}

// refuse is the more of EncodeUntil calls that only count.
func refuse([]uint32) bool { return false }

func (c *tokenCache) segment(dst []uint32, seg string, tok tokenizer.Tokenizer) []uint32 {
	if dst, ok := c.Append(dst, seg); ok {
		return dst
	}
	start := len(dst)
	dst = tok.Encode(dst, seg)
	c.Put(seg, dst[start:])
	return dst
}

// engineTokenizer asks a worker's tokenize endpoint in vLLM's form
// ({"messages"} or {"prompt"}; admission accepts "engine" only for an engine
// whose adapter names a tokenize endpoint, and of the KV-exact engines only
// vLLM has one), caching answers by request content. Each
// call runs under the request's context and at most
// engineTokenizeTimeout; a failure is a KV miss whose reason says why.
type engineTokenizer struct {
	path    string        // the engine's tokenize endpoint (adapter)
	baseURL func() string // an available worker's base URL, "" if none
	client  *http.Client
	cache   *idcache.Cache
}

func (t *engineTokenizer) name() string { return "engine" }

func (t *engineTokenizer) cacheStats() cacheStats { return t.cache.Stats() }

func (t *engineTokenizer) tokens(ctx context.Context, dst []uint32, v *fastjson.Value, kind openai.Kind) ([]uint32, error) {
	var body []byte
	switch kind {
	case openai.Chat:
		body = fmt.Appendf(nil, `{"model":%s,"messages":%s,"add_generation_prompt":true`, v.Get("model"), v.Get("messages"))
		if tools := v.Get("tools"); tools != nil {
			body = fmt.Appendf(body, `,"tools":%s`, tools)
		}
		if kw := v.Get("chat_template_kwargs"); kw != nil {
			body = fmt.Appendf(body, `,"chat_template_kwargs":%s`, kw)
		}
		body = append(body, '}')
	default:
		if ids, ok := givenIDs(dst, v.Get("prompt")); ok {
			return ids, nil
		}
		body = fmt.Appendf(nil, `{"model":%s,"prompt":%s}`, v.Get("model"), v.Get("prompt"))
	}
	if dst, ok := t.cache.AppendBytes(dst, body); ok {
		return dst, nil
	}
	base := t.baseURL()
	if base == "" {
		return dst, tokenizeErr("tokenize_no_worker", "no available worker to ask /tokenize")
	}
	if ctx == nil {
		ctx = context.Background()
	}
	cctx, cancel := context.WithTimeout(ctx, engineTokenizeTimeout)
	defer cancel()
	req, err := http.NewRequestWithContext(cctx, http.MethodPost, base+t.path, bytes.NewReader(body))
	if err != nil {
		return dst, tokenizeErr("tokenize_engine", "%v", err)
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := t.client.Do(req)
	if err != nil {
		if errors.Is(err, context.DeadlineExceeded) || errors.Is(cctx.Err(), context.DeadlineExceeded) {
			return dst, tokenizeErr("tokenize_timeout", "/tokenize took longer than %v", engineTokenizeTimeout)
		}
		return dst, tokenizeErr("tokenize_engine", "/tokenize: %v", err)
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(io.LimitReader(resp.Body, 16<<20))
	if err != nil {
		if errors.Is(cctx.Err(), context.DeadlineExceeded) {
			return dst, tokenizeErr("tokenize_timeout", "/tokenize took longer than %v", engineTokenizeTimeout)
		}
		return dst, tokenizeErr("tokenize_engine", "/tokenize answer: %v", err)
	}
	if resp.StatusCode != http.StatusOK {
		return dst, tokenizeErr("tokenize_engine", "/tokenize answered %d", resp.StatusCode)
	}
	var out struct {
		Tokens []uint32 `json:"tokens"`
	}
	if err := json.Unmarshal(data, &out); err != nil {
		return dst, tokenizeErr("tokenize_engine", "/tokenize answer: %v", err)
	}
	if len(out.Tokens) == 0 {
		// A prompt always has tokens; an empty answer means the engine
		// did not understand the body (llama.cpp answers 200 with no
		// tokens to a body without "content").
		return dst, tokenizeErr("tokenize_engine", "/tokenize answered no tokens")
	}
	t.cache.Put(string(body), out.Tokens)
	return append(dst, out.Tokens...), nil
}

func (t *engineTokenizer) prompt(ctx context.Context, dst []uint32, v *fastjson.Value, kind openai.Kind) (string, []uint32, error) {
	ids, err := t.tokens(ctx, dst, v, kind)
	return "", ids, err
}

// newEngineCache caches an engine's /tokenize answers by request body; one
// answer may take at most a quarter of it.
func newEngineCache(max int) (*idcache.Cache, error) { return idcache.New(max, 4) }
