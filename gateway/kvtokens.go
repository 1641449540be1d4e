package gateway

import (
	"bytes"
	"container/list"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"

	"github.com/cespare/xxhash/v2"
	"github.com/valyala/fastjson"

	"github.com/llmgw/llmgw/engines/tokenizer"
	"github.com/llmgw/llmgw/gateway/openai"
)

// errKVTokenize: the gateway could not turn the request into token ids; the
// request is routed by the fallback policy (a miss, never a failure).
var errKVTokenize = errors.New("gateway: kv-exact tokenization")

// kvTokenizer produces the token ids an engine computes for a request, the
// way the engine does it: chat messages rendered with the model's chat
// template (generation prompt appended), completions prompts as text, BOS
// per the model's tokenizer config.
type kvTokenizer interface {
	// tokens appends the request's prompt token ids to dst.
	tokens(dst []uint32, v *fastjson.Value, kind openai.Kind) ([]uint32, error)
	name() string
}

// newKVTokenizer builds the tokenizer a rule's kvTokenizer names: "" or
// "builtin" (the simulator's), "engine" (ask a worker's /tokenize), or a
// path to a tokenizer.json.
func newKVTokenizer(spec string, engineURL func() string, client *http.Client) (kvTokenizer, error) {
	switch spec {
	case "", "builtin":
		return &localTokenizer{tok: tokenizer.Builtin{}, render: tokenizer.ChatML{}, cache: newTokenCache(4096, tokenizer.Builtin{})}, nil
	case "engine":
		return &engineTokenizer{baseURL: engineURL, client: client, cache: newTokenCache(4096, nil)}, nil
	}
	hf, err := tokenizer.LoadHF(spec)
	if err != nil {
		return nil, err
	}
	r, err := hf.ChatRenderer()
	if err != nil && !errors.Is(err, tokenizer.ErrNoChatTemplate) {
		return nil, err
	}
	lt := &localTokenizer{tok: hf, render: r, cache: newTokenCache(4096, hf)}
	if id, add := hf.BOS(); add {
		lt.bos = []uint32{id}
	}
	return lt, nil
}

// messages extracts the chat messages of v as the chat template sees them.
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
			msg.Content = string(c.GetStringBytes())
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

// localTokenizer tokenizes in process.
type localTokenizer struct {
	tok    tokenizer.Tokenizer
	render tokenizer.Renderer // nil: the model has no chat template
	bos    []uint32
	cache  *tokenCache
}

func (t *localTokenizer) name() string { return t.tok.Name() }

func (t *localTokenizer) tokens(dst []uint32, v *fastjson.Value, kind openai.Kind) ([]uint32, error) {
	var text string
	switch kind {
	case openai.Chat:
		if t.render == nil {
			return dst, fmt.Errorf("%w: tokenizer %s has no chat template", errKVTokenize, t.tok.Name())
		}
		msgs, err := messages(v)
		if err != nil {
			return dst, fmt.Errorf("%w: %v", errKVTokenize, err)
		}
		if text, err = t.render.Render(msgs, true); err != nil {
			return dst, fmt.Errorf("%w: chat template: %v", errKVTokenize, err)
		}
	default:
		p := v.Get("prompt")
		switch p.Type() {
		case fastjson.TypeString:
			text = string(p.GetStringBytes())
		case fastjson.TypeArray:
			items := p.GetArray()
			if len(items) == 0 {
				return dst, fmt.Errorf("%w: empty prompt", errKVTokenize)
			}
			switch items[0].Type() {
			case fastjson.TypeNumber: // one prompt of token ids: used as given
				for _, it := range items {
					dst = append(dst, uint32(it.GetUint()))
				}
				return dst, nil
			case fastjson.TypeString:
				text = string(items[0].GetStringBytes())
			case fastjson.TypeArray:
				for _, it := range items[0].GetArray() {
					dst = append(dst, uint32(it.GetUint()))
				}
				return dst, nil
			}
		}
	}
	dst = append(dst, t.bos...)
	return t.cache.encode(dst, text, t.tok), nil
}

// tokenCache memoises tokenization by segment. Special-token text splits a
// prompt into segments that a Hugging Face tokenizer encodes independently
// (added tokens are matched before the BPE runs), so encoding segment by
// segment gives exactly the ids of encoding the whole text. Chat prompts are
// mostly special-token-delimited messages, so a growing conversation
// re-tokenizes only its new turn. The cache is bounded (LRU).
type tokenCache struct {
	// markers are the special tokens of the tokenizer at which prompts are
	// cut: only texts the tokenizer encodes as one added token qualify,
	// since cutting anywhere else could change how the text around the cut
	// is pre-tokenized.
	markers []string
	mu      sync.Mutex
	max     int
	ll      *list.List
	items   map[uint64]*list.Element
	hits    uint64
	miss    uint64
}

type tokenCacheEntry struct {
	key uint64
	seg string
	ids []uint32
}

func newTokenCache(max int, tok tokenizer.Tokenizer) *tokenCache {
	c := &tokenCache{max: max, ll: list.New(), items: map[uint64]*list.Element{}}
	if tok != nil {
		for _, m := range specialMarkers {
			if ids := tok.Encode(nil, m); len(ids) == 1 {
				c.markers = append(c.markers, m)
			}
		}
	}
	return c
}

// specialMarkers are the candidate texts at which the cache cuts a prompt:
// the turn delimiters of common chat templates.
var specialMarkers = []string{"<|im_start|>", "<|im_end|>", "<|endoftext|>", "<|begin_of_text|>", "<|start_header_id|>", "<|eot_id|>", "<start_of_turn>", "<end_of_turn>", "[|system|]", "[|user|]", "[|assistant|]", "[|endofturn|]"}

// encode appends the ids of text, segment by segment.
func (c *tokenCache) encode(dst []uint32, text string, tok tokenizer.Tokenizer) []uint32 {
	for len(text) > 0 {
		cut := len(text)
		for _, m := range c.markers {
			// the next marker after position 0 starts the next segment
			if i := strings.Index(text[1:], m); i >= 0 && i+1 < cut {
				cut = i + 1
			}
		}
		seg := text[:cut]
		text = text[cut:]
		dst = c.segment(dst, seg, tok)
	}
	return dst
}

func (c *tokenCache) segment(dst []uint32, seg string, tok tokenizer.Tokenizer) []uint32 {
	key := xxhash.Sum64String(seg)
	c.mu.Lock()
	if el, ok := c.items[key]; ok && el.Value.(*tokenCacheEntry).seg == seg {
		c.ll.MoveToFront(el)
		c.hits++
		ids := el.Value.(*tokenCacheEntry).ids
		c.mu.Unlock()
		return append(dst, ids...)
	}
	c.miss++
	c.mu.Unlock()
	start := len(dst)
	dst = tok.Encode(dst, seg)
	ids := append([]uint32(nil), dst[start:]...)
	c.mu.Lock()
	if el, ok := c.items[key]; ok {
		c.ll.Remove(el)
	}
	c.items[key] = c.ll.PushFront(&tokenCacheEntry{key: key, seg: seg, ids: ids})
	for c.ll.Len() > c.max {
		old := c.ll.Back()
		c.ll.Remove(old)
		delete(c.items, old.Value.(*tokenCacheEntry).key)
	}
	c.mu.Unlock()
	return dst
}

// engineTokenizer asks a worker's /tokenize endpoint (vLLM and SGLang take
// {"messages"} or {"prompt"}), caching answers by request content.
type engineTokenizer struct {
	baseURL func() string // an available worker's base URL, "" if none
	client  *http.Client
	cache   *tokenCache
}

func (t *engineTokenizer) name() string { return "engine" }

func (t *engineTokenizer) tokens(dst []uint32, v *fastjson.Value, kind openai.Kind) ([]uint32, error) {
	var body []byte
	switch kind {
	case openai.Chat:
		body = fmt.Appendf(nil, `{"model":%s,"messages":%s,"add_generation_prompt":true}`, v.Get("model"), v.Get("messages"))
	default:
		body = fmt.Appendf(nil, `{"model":%s,"prompt":%s}`, v.Get("model"), v.Get("prompt"))
	}
	key := xxhash.Sum64(body)
	t.cache.mu.Lock()
	if el, ok := t.cache.items[key]; ok && el.Value.(*tokenCacheEntry).seg == string(body) {
		t.cache.ll.MoveToFront(el)
		ids := el.Value.(*tokenCacheEntry).ids
		t.cache.mu.Unlock()
		return append(dst, ids...), nil
	}
	t.cache.mu.Unlock()
	base := t.baseURL()
	if base == "" {
		return dst, fmt.Errorf("%w: no available worker to ask /tokenize", errKVTokenize)
	}
	resp, err := t.client.Post(base+"/tokenize", "application/json", bytes.NewReader(body))
	if err != nil {
		return dst, fmt.Errorf("%w: %v", errKVTokenize, err)
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(io.LimitReader(resp.Body, 16<<20))
	if err != nil || resp.StatusCode != 200 {
		return dst, fmt.Errorf("%w: /tokenize answered %d: %.200s", errKVTokenize, resp.StatusCode, data)
	}
	var out struct {
		Tokens []uint32 `json:"tokens"`
	}
	if err := json.Unmarshal(data, &out); err != nil {
		return dst, fmt.Errorf("%w: /tokenize answer: %v", errKVTokenize, err)
	}
	t.cache.mu.Lock()
	t.cache.items[key] = t.cache.ll.PushFront(&tokenCacheEntry{key: key, seg: string(body), ids: out.Tokens})
	for t.cache.ll.Len() > t.cache.max {
		old := t.cache.ll.Back()
		t.cache.ll.Remove(old)
		delete(t.cache.items, old.Value.(*tokenCacheEntry).key)
	}
	t.cache.mu.Unlock()
	return append(dst, out.Tokens...), nil
}
