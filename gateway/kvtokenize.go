package gateway

import (
	"context"
	"fmt"
	"io"
	"net/http"

	"github.com/valyala/fastjson"

	"github.com/llmgw/llmgw/gateway/openai"
)

// KVTokenization is the answer of POST /v1/rules/{name}/tokenize: what the
// gateway's KV-exact path computes for a chat or completions body, exactly
// as it routes it (same tokenizer, template, BOS policy, cache, hasher).
type KVTokenization struct {
	Rule      string `json:"rule"`
	Tokenizer string `json:"tokenizer"`
	// API is "chat" (the body has messages) or "completions".
	API string `json:"api"`
	// Prompt is the text that was encoded: the rendered chat prompt or the
	// completions prompt. It is omitted when the ids came from the engine's
	// /tokenize (kvTokenizer "engine") or the prompt was given as ids.
	Prompt    string   `json:"prompt,omitempty"`
	Tokens    []uint32 `json:"tokens"`
	HashAlgo  string   `json:"hash_algo"`
	BlockSize int      `json:"block_size"`
	// BlockKeys are the full blocks' keys as the inventory holds them (the
	// event integers of the engine's KV events), block 0 first.
	BlockKeys []uint64 `json:"block_keys"`
}

// KVTokenize tokenizes and hashes body (a chat or completions request) for
// rule name the way its KV-exact routing does. It changes nothing: no
// request is sent to a worker except, for kvTokenizer "engine", the
// worker's /tokenize (under ctx).
func (s *Server) KVTokenize(ctx context.Context, name string, body []byte) (*KVTokenization, error) {
	s.mu.Lock()
	rt := s.rules[name]
	s.mu.Unlock()
	if rt == nil {
		return nil, fmt.Errorf("%w: %q", ErrRuleNotFound, name)
	}
	if rt.kv == nil {
		return nil, fmt.Errorf("%w: rule %q has kvExactMode 0: it does not tokenize requests", errAdminBadRequest, name)
	}
	var p fastjson.Parser
	v, err := p.ParseBytes(body)
	if err != nil {
		return nil, fmt.Errorf("%w: body: %v", errAdminBadRequest, err)
	}
	kind, api := openai.Completion, "completions"
	switch {
	case v.Get("messages") != nil:
		kind, api = openai.Chat, "chat"
	case v.Get("prompt") == nil:
		return nil, fmt.Errorf("%w: body has neither messages nor prompt", errAdminBadRequest)
	}
	prompt, ids, err := rt.kv.tok.prompt(ctx, nil, v, kind)
	if err != nil {
		return nil, fmt.Errorf("%w: %v", errAdminBadRequest, err)
	}
	out := &KVTokenization{
		Rule: name, Tokenizer: rt.kv.tok.name(), API: api, Prompt: prompt, Tokens: ids,
		HashAlgo: rt.rule.KVHashAlgo, BlockSize: rt.kv.blockSize, BlockKeys: rt.kv.hasher.BlockKeys(nil, ids),
	}
	if out.Tokens == nil {
		out.Tokens = []uint32{}
	}
	if out.BlockKeys == nil {
		out.BlockKeys = []uint64{}
	}
	return out, nil
}

// handleKVTokenize is POST /v1/rules/{name}/tokenize (read-only, behind the
// admin token like the mutating routes: it runs the tokenizer, and for
// kvTokenizer "engine" a worker's /tokenize, on the caller's body).
func (s *Server) handleKVTokenize(w http.ResponseWriter, r *http.Request) {
	body, err := io.ReadAll(io.LimitReader(r.Body, maxTokenizeBody+1))
	if err != nil {
		writeAdminError(w, fmt.Errorf("%w: reading body: %v", errAdminBadRequest, err))
		return
	}
	if len(body) > maxTokenizeBody {
		writeAdminError(w, fmt.Errorf("%w: the limit is %d bytes", ErrBodyTooLarge, maxTokenizeBody))
		return
	}
	out, err := s.KVTokenize(r.Context(), r.PathValue("name"), body)
	if err != nil {
		writeAdminError(w, err)
		return
	}
	writeJSON(w, http.StatusOK, out)
}

// maxTokenizeBody bounds a tokenize request: a prompt of the largest
// context windows with room to spare.
const maxTokenizeBody = 16 << 20
