package gateway

import (
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/valyala/fastjson"

	"github.com/llmgw/llmgw/engines"
	"github.com/llmgw/llmgw/engines/kvhash"
	"github.com/llmgw/llmgw/engines/sim"
	"github.com/llmgw/llmgw/engines/tokenizer"
	"github.com/llmgw/llmgw/gateway/kvindex"
	"github.com/llmgw/llmgw/gateway/openai"
	"github.com/llmgw/llmgw/gateway/upstream"
	"github.com/llmgw/llmgw/internal/testfix"
	"github.com/llmgw/llmgw/internal/wait"
)

// prefixWords build the random prompts of TestRoutePrefixMatchesFull: words,
// whitespace runs, digits, non-ASCII text and special-token text.
var prefixWords = []string{"the", " gateway", " routes", " every", " request", "  ", "\n", "\n\n", "\t", " 12345", "3.14", "don't", "'s", "!!", "...", " é", "中文字", " 🙂", "e\u0301", "<|im_start|>", "<|im_end|>", "<|endoftext|>", " ", "ABC", "x_y", "     indented", "\r\n"}

// proseWords make the benchmark's unique user turns: ordinary text.
var proseWords = []string{" the", " gateway", " routes", " every", " request", " to", " an", " engine", ",", ".", "\n", " 2048", " blocks", " of", " tokens", " cache"}

func randomText(rng *rand.Rand, words int) string {
	var b strings.Builder
	for range words {
		b.WriteString(prefixWords[rng.IntN(len(prefixWords))])
	}
	return b.String()
}

// TestRoutePrefixMatchesFull: on the real tokenizers (Qwen3's chat template
// and tokenizer.json, every GGUF vocabulary of testdata on completions
// prompts), random prompts sharing a random opening and random index
// contents (each endpoint holding a random prefix of some prompt's blocks,
// random requests in flight), the decision matchPrefix and decide take from a prompt
// tokenized only up to the first block no endpoint holds is the decision of
// the whole prompt: endpoint, reason, hit, predicted cached tokens and
// every endpoint's matched blocks. The test fails if the incremental path
// is never taken on Qwen3.
func TestRoutePrefixMatchesFull(t *testing.T) {
	type tc struct {
		name string
		tok  *tokenizer.HF
		kind openai.Kind
	}
	q, err := tokenizer.Qwen3()
	if err != nil {
		t.Fatal(err)
	}
	cases := []tc{{"qwen3 chat", q, openai.Chat}, {"qwen3 completions", q, openai.Completion}}
	files, err := filepath.Glob(filepath.Join(testfix.Path(t, "tokenizers/gguf-vocab"), "*.gguf"))
	if err != nil || len(files) == 0 {
		t.Fatalf("no vocab files: %v", err)
	}
	for _, f := range files {
		tok, err := tokenizer.LoadGGUF(f)
		if err != nil {
			t.Fatal(err)
		}
		cases = append(cases, tc{strings.TrimSuffix(filepath.Base(f), ".gguf"), tok, openai.Completion})
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			const nEP = 4
			lt := &localTokenizer{tok: c.tok, cache: mustTokenCache(t, 1<<20, c.tok)}
			if c.kind == openai.Chat {
				r, err := c.tok.ChatRenderer()
				if err != nil {
					t.Fatal(err)
				}
				lt.render = r.(*tokenizer.JinjaRenderer)
			}
			if id, add := c.tok.BOS(); add {
				lt.bos = []uint32{id}
			}
			pool := make([]*upstream.Endpoint, nEP)
			for i := range pool {
				pool[i] = &upstream.Endpoint{ID: fmt.Sprintf("ep%d", i)}
			}
			rng := rand.New(rand.NewPCG(11, 12))
			incremental, fallback := 0, 0
			for iter := 0; iter < 60; iter++ {
				bs := []int{4, 16, 32}[rng.IntN(3)]
				h, err := kvhash.New(kvhash.SHA256CBOR, bs, "")
				if err != nil {
					t.Fatal(err)
				}
				kv := &kvRuntime{blockSize: bs, tok: lt, hasher: h, index: kvindex.New(nEP, 0), pool: pool, loadFactor: kvBoundFactor, hitShare: []float64{0.5, 0.1, 0, 1}[rng.IntN(4)]}
				system := randomText(rng, 5+rng.IntN(200))
				var body string
				tail := func() string { return randomText(rng, 20+rng.IntN(3000)) }
				if c.kind == openai.Chat {
					body = fmt.Sprintf(`{"messages":[{"role":"system","content":%q},{"role":"user","content":%q}]}`, system, tail())
				} else {
					body = fmt.Sprintf(`{"prompt":%q}`, system+tail())
				}
				var p fastjson.Parser
				if _, err := p.Parse(body); err != nil {
					t.Fatal(err)
				}
				// Index contents: each endpoint holds a random prefix of
				// the blocks of this prompt or of another with the same
				// opening.
				for ep := range nEP {
					var other string
					if c.kind == openai.Chat {
						other = fmt.Sprintf(`{"messages":[{"role":"system","content":%q},{"role":"user","content":%q}]}`, system, tail())
					} else {
						other = fmt.Sprintf(`{"prompt":%q}`, system+tail())
					}
					src := body
					if rng.IntN(2) == 0 {
						src = other
					}
					ov, err := p.Parse(src)
					if err != nil {
						t.Fatal(err)
					}
					ids, err := lt.tokens(t.Context(), nil, ov, c.kind)
					if err != nil {
						t.Fatal(err)
					}
					keys := h.BlockKeys(nil, ids)
					// Mostly the opening (the case the prefix path is
					// for), sometimes anything up to the whole prompt.
					m := min(len(keys), rng.IntN(16))
					if rng.IntN(5) == 0 {
						m = rng.IntN(len(keys) + 1)
					}
					kv.index.Store(ep, keys[:m])
				}
				cands := make([]kvCand, nEP)
				for i := range cands {
					cands[i] = kvCand{avail: rng.IntN(8) != 0, ready: rng.IntN(8) != 0, q: int64(rng.IntN(4))}
				}

				// The whole prompt.
				var full kvScratch
				v, err := p.Parse(body) // parsed again: p served the other prompts
				if err != nil {
					t.Fatal(err)
				}
				full.ids, err = lt.tokens(t.Context(), nil, v, c.kind)
				if err != nil {
					t.Fatal(err)
				}
				full.keys = h.BlockKeys(nil, full.ids)
				full.matched = make([]int, nEP)
				kv.index.Match(full.keys, full.matched)
				want := kv.decide(&full, cands, len(full.keys), len(full.ids), false)

				var sc kvScratch
				sc.matched = make([]int, nEP)
				total, prompt, atLeast, ok, err := kv.matchPrefix(&sc, lt, v, c.kind)
				if err != nil {
					t.Fatal(err)
				}
				got := kv.decide(&sc, cands, total, prompt, atLeast)
				if !ok {
					fallback++
					continue
				}
				if got.totalAtLeast {
					incremental++
					if got.total > want.total || got.prompt > want.prompt {
						t.Fatalf("lower bounds %d blocks, %d tokens exceed the prompt's %d, %d", got.total, got.prompt, want.total, want.prompt)
					}
				}
				if got.pos != want.pos || (got.ep == nil) != (want.ep == nil) || got.reason != want.reason || got.matched != want.matched ||
					got.hit != want.hit || got.predicted != want.predicted || !slices.Equal(got.byPos, want.byPos) {
					t.Fatalf("iteration %d (block %d, share %v): incremental %+v\nwhole prompt %+v", iter, bs, kv.hitShare, got, want)
				}
			}
			t.Logf("%d decisions from the prompt's opening, %d from the whole prompt after a check", incremental, fallback)
			// Qwen3's pieces bound the tail well; a vocabulary missing
			// byte tokens, or SentencePiece words that may merge across
			// spaces, gives the whole-prompt path (still exact).
			if strings.HasPrefix(c.name, "qwen3") && incremental == 0 {
				t.Fatal("the incremental path was never taken")
			}
		})
	}
}

// BenchmarkKVDecision256K: one KV-exact decision on a unique 256 KiB user
// turn behind a system prompt the endpoints hold (Qwen3 chat, 32-token
// blocks): "prefix" is route's path (tokenize up to the first block no
// endpoint holds), "whole" tokenizes and hashes the whole prompt.
func BenchmarkKVDecision256K(b *testing.B) {
	q, err := tokenizer.Qwen3()
	if err != nil {
		b.Fatal(err)
	}
	lt := &localTokenizer{tok: q, cache: mustTokenCache(b, 1<<20, q)}
	r, err := q.ChatRenderer()
	if err != nil {
		b.Fatal(err)
	}
	lt.render = r.(*tokenizer.JinjaRenderer)
	h, err := kvhash.New(kvhash.SHA256CBOR, 32, "")
	if err != nil {
		b.Fatal(err)
	}
	const nEP = 4
	pool := make([]*upstream.Endpoint, nEP)
	for i := range pool {
		pool[i] = &upstream.Endpoint{ID: fmt.Sprintf("ep%d", i)}
	}
	kv := &kvRuntime{blockSize: 32, tok: lt, hasher: h, index: kvindex.New(nEP, 0), pool: pool, loadFactor: kvBoundFactor, hitShare: 0.5}
	system := strings.Repeat("You are a careful assistant. Answer briefly and cite sources. ", 40)
	sysBody := fmt.Sprintf(`{"messages":[{"role":"system","content":%q},{"role":"user","content":"hi"}]}`, system)
	var p fastjson.Parser
	v, _ := p.Parse(sysBody)
	ids, _ := lt.tokens(b.Context(), nil, v, openai.Chat)
	keys := h.BlockKeys(nil, ids)
	for ep := range nEP {
		kv.index.Store(ep, keys[:len(keys)-1])
	}
	cands := make([]kvCand, nEP)
	for i := range cands {
		cands[i] = kvCand{avail: true, ready: true, q: int64(i % 2)}
	}
	rng := rand.New(rand.NewPCG(1, 2))
	unique := func() *fastjson.Value {
		var u strings.Builder
		for u.Len() < 256<<10 {
			u.WriteString(proseWords[rng.IntN(len(proseWords))])
		}
		body := fmt.Sprintf(`{"messages":[{"role":"system","content":%q},{"role":"user","content":%q}]}`, system, u.String())
		v, err := p.Parse(body)
		if err != nil {
			b.Fatal(err)
		}
		return v
	}
	b.Run("prefix", func(b *testing.B) {
		var sc kvScratch
		sc.matched = make([]int, nEP)
		for b.Loop() {
			b.StopTimer()
			v := unique()
			b.StartTimer()
			total, prompt, atLeast, ok, err := kv.matchPrefix(&sc, lt, v, openai.Chat)
			if err != nil || !ok || !atLeast {
				b.Fatalf("prefix path not taken: ok %v atLeast %v err %v", ok, atLeast, err)
			}
			_ = kv.decide(&sc, cands, total, prompt, atLeast)
		}
	})
	b.Run("whole", func(b *testing.B) {
		var sc kvScratch
		sc.matched = make([]int, nEP)
		for b.Loop() {
			b.StopTimer()
			v := unique()
			b.StartTimer()
			sc.ids, _ = lt.tokens(b.Context(), sc.ids[:0], v, openai.Chat)
			sc.keys = h.BlockKeys(sc.keys[:0], sc.ids)
			kv.index.Match(sc.keys, sc.matched)
			_ = kv.decide(&sc, cands, len(sc.keys), len(sc.ids), false)
		}
	})
}

// TestKVExactLongUniquePromptStopsAtTheOpening: through the gateway, a
// long unique user turn behind a system prompt one worker holds goes to
// that worker as a partial match whose total is a lower bound ("T+", the
// decision's total_blocks_at_least), the engine reports the cached tokens
// predicted, and the whole-prompt tokenization (what the rule's tokenize
// endpoint answers) still gives every id.
func TestKVExactLongUniquePromptStopsAtTheOpening(t *testing.T) {
	var sims []*sim.Sim
	for range 2 {
		s, err := sim.Start(t.Context(), sim.Config{Engine: engines.VLLM, Model: "m", KVEvents: "tcp://127.0.0.1:0", PrefillPerToken: time.Nanosecond})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { s.Close() })
		sims = append(sims, s)
	}
	gw := startGateway(t, "", nil)
	mustApply(t, gw, kvRule(t, "kv", "vllm", 16, sims))
	rt := gw.rules["kv"]
	wait.For(t, 10*time.Second, "event streams to connect", func() bool {
		for i := range rt.kv.pool {
			if _, conn, _ := rt.kv.ready(i); !conn {
				return false
			}
		}
		return true
	})
	c := newClient(t)
	url := "http://" + gw.Addr() + "/v1/chat/completions"
	system := kvPrompt("long prompts", 12)
	resp, out := post(t, c, url, chatBodyFor(system, "warm"))
	if resp.StatusCode != 200 {
		t.Fatalf("warm: %d %s", resp.StatusCode, out)
	}
	warmID := resp.Header.Get("X-Llmgw-Endpoint")
	pos := slices.IndexFunc(rt.kv.pool, func(ep *upstream.Endpoint) bool { return ep.ID == warmID })
	wait.For(t, 10*time.Second, "the warmed worker's inventory to fill", func() bool { return rt.kv.index.Blocks(pos) > 0 })

	user := strings.Repeat("a unique long question about routing, ", 48<<10/38)
	resp, out = post(t, c, url, chatBodyFor(system, user))
	route := resp.Header.Get("X-Llmgw-Route")
	if resp.StatusCode != 200 || resp.Header.Get("X-Llmgw-Endpoint") != warmID || !strings.HasPrefix(route, "kv-exact partial=") || !strings.HasSuffix(route, "+") {
		t.Fatalf("long prompt: %d to %s route %q; want %s, kv-exact partial=M/T+ (%s)", resp.StatusCode, resp.Header.Get("X-Llmgw-Endpoint"), route, warmID, out)
	}
	ds := gw.decisions.list("kv", time.Time{})
	last := ds[len(ds)-1]
	if !last.TotalBlocksAtLeast || last.MatchedBlocks == nil || *last.MatchedBlocks == 0 {
		t.Fatalf("decision %+v: want matched blocks and total_blocks_at_least", last)
	}
	// The engine's reuse is what the gateway predicted.
	var cached struct {
		Usage struct {
			Details struct {
				Cached int `json:"cached_tokens"`
			} `json:"prompt_tokens_details"`
		} `json:"usage"`
	}
	if err := json.Unmarshal([]byte(out), &cached); err != nil {
		t.Fatal(err)
	}
	if want := *last.MatchedBlocks * 16; cached.Usage.Details.Cached != want {
		t.Errorf("engine reported %d cached tokens; the gateway predicted %d", cached.Usage.Details.Cached, want)
	}
	// The diagnostic still tokenizes the whole prompt.
	var p fastjson.Parser
	v, err := p.Parse(chatBodyFor(system, user))
	if err != nil {
		t.Fatal(err)
	}
	_, ids, err := rt.kv.tok.prompt(t.Context(), nil, v, openai.Chat)
	if err != nil {
		t.Fatal(err)
	}
	if len(ids)/16 < *last.TotalBlocks || len(ids)/16 <= *last.MatchedBlocks*10 {
		t.Errorf("whole prompt %d blocks; decision said at least %d with %d matched", len(ids)/16, *last.TotalBlocks, *last.MatchedBlocks)
	}
}
