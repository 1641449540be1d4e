package routing

import (
	"container/list"
	"fmt"
	"sync"

	"github.com/llmgw/llmgw/engines/kvhash"
	"github.com/llmgw/llmgw/engines/tokenizer"
)

// Oracle is the reference router: it keeps an exact model of every
// simulator's prefix cache (same capacity, same LRU lookup and insert rules
// as engines/sim) and knows every endpoint's requests in flight. Its
// knowledge is perfect and has no delay: the model is updated when a
// request is dispatched, before the engine has even started it.
//
// With slots > 0 it routes as a cache-aware router with that knowledge
// would: among endpoints with a free serving slot (fewer in flight than the
// engines' slots, where the simulator's latency model adds no delay), the
// one holding the longest cached prefix when that prefix covers at least
// half of the prompt's blocks, otherwise the least loaded one (a short
// common opening, such as a chat template's first block, is not worth
// piling onto one worker); when every endpoint is full, the fewest in
// flight. Ties go to the longer prefix, then fewer in flight, then the
// lower index.
//
// With slots = 0 it always takes the longest cached prefix (ties to fewer
// in flight): the hit ratio's bound on workloads whose prompts share no
// opening block, and the "everything to one worker" failure on those that
// do.
//
// Oracle is safe for concurrent use.
type Oracle struct {
	blockSize int
	hasher    kvhash.Hasher
	tok       tokenizer.Tokenizer
	render    tokenizer.Renderer

	slots int64 // serving slots per engine; 0 = unbounded

	mu       sync.Mutex
	caches   []*lruModel
	inFlight []int64
}

// NewOracle models endpoints simulators configured as vLLM with their
// default tokenizer (the embedded Qwen3 one, with Qwen3's chat template),
// blockSize tokens per block, the
// sha256_cbor hash with seed "0" (the simulator defaults), cacheBlocks
// blocks of prefix cache and slots serving slots each (0 = unbounded).
func NewOracle(endpoints, blockSize, cacheBlocks, slots int) (*Oracle, error) {
	if endpoints < 1 || blockSize < 1 || cacheBlocks < 1 || slots < 0 {
		return nil, fmt.Errorf("%w: oracle needs endpoints, block size and cache blocks ≥ 1 and slots ≥ 0, got %d, %d, %d, %d", ErrParams, endpoints, blockSize, cacheBlocks, slots)
	}
	h, err := kvhash.New(kvhash.SHA256CBOR, blockSize, "0")
	if err != nil {
		return nil, fmt.Errorf("routing: oracle hasher: %w", err)
	}
	tok, err := tokenizer.Qwen3()
	if err != nil {
		return nil, fmt.Errorf("routing: oracle tokenizer: %w", err)
	}
	render, err := tok.ChatRenderer()
	if err != nil {
		return nil, fmt.Errorf("routing: oracle chat template: %w", err)
	}
	o := &Oracle{blockSize: blockSize, hasher: h, tok: tok, render: render, inFlight: make([]int64, endpoints), slots: int64(slots)}
	for range endpoints {
		o.caches = append(o.caches, newLRUModel(cacheBlocks))
	}
	return o, nil
}

// Decision is one oracle choice.
type Decision struct {
	// Endpoint is the chosen endpoint's index.
	Endpoint int
	// PromptTokens is the rendered prompt's length; PredictedCached is the
	// number of its tokens the model says the engine will find cached.
	PromptTokens    int
	PredictedCached int
}

// Pick chooses the endpoint for msgs, counts it in flight (call Done with
// the returned index when the request ends) and records the prompt in the
// model of that endpoint's cache.
func (o *Oracle) Pick(msgs []tokenizer.Message) (Decision, error) {
	text, err := o.render.Render(msgs, true)
	if err != nil {
		return Decision{}, fmt.Errorf("routing: oracle render: %w", err)
	}
	prompt := o.tok.Encode(nil, text)
	keys := o.hasher.BlockKeys(nil, prompt)
	// As the engine: the last prompt token is always computed, so a hit
	// covers at most (len-1)/bs blocks.
	maxHit := min((len(prompt)-1)/o.blockSize, len(keys))
	if len(prompt) == 0 {
		maxHit = 0
	}
	o.mu.Lock()
	defer o.mu.Unlock()
	best := o.choose(keys[:maxHit])
	bestHit := o.caches[best].peek(keys[:maxHit])
	c := o.caches[best]
	c.lookup(keys[:maxHit])
	c.insert(keys)
	o.inFlight[best]++
	return Decision{Endpoint: best, PromptTokens: len(prompt), PredictedCached: bestHit * o.blockSize}, nil
}

// choose applies the selection rule to a prompt's lookup keys; o.mu is
// held.
func (o *Oracle) choose(keys []uint64) int {
	hits := make([]int, len(o.caches))
	for i, c := range o.caches {
		hits[i] = c.peek(keys)
	}
	better := func(i, j int, loadFirst bool) bool { // is i better than j?
		if j < 0 {
			return true
		}
		if loadFirst && o.inFlight[i] != o.inFlight[j] {
			return o.inFlight[i] < o.inFlight[j]
		}
		if hits[i] != hits[j] {
			return hits[i] > hits[j]
		}
		return o.inFlight[i] < o.inFlight[j]
	}
	if o.slots == 0 {
		best := -1
		for i := range hits {
			if better(i, best, false) {
				best = i
			}
		}
		return best
	}
	byHit, byLoad, full := -1, -1, -1
	for i := range hits {
		if o.inFlight[i] >= o.slots {
			if better(i, full, true) {
				full = i
			}
			continue
		}
		if better(i, byHit, false) {
			byHit = i
		}
		if better(i, byLoad, true) {
			byLoad = i
		}
	}
	switch {
	case byHit < 0:
		return full
	case 2*hits[byHit] >= len(keys) && hits[byHit] > 0:
		return byHit
	}
	return byLoad
}

// Done ends a request Pick sent to endpoint.
func (o *Oracle) Done(endpoint int) {
	o.mu.Lock()
	o.inFlight[endpoint]--
	o.mu.Unlock()
}

// InFlight returns the requests in flight per endpoint.
func (o *Oracle) InFlight() []int64 {
	o.mu.Lock()
	defer o.mu.Unlock()
	return append([]int64(nil), o.inFlight...)
}

// lruModel mirrors engines/sim's prefix cache: a bounded set of chained
// block keys, least recently used evicted first; a lookup stops at the first
// miss and marks the hits used; an insert marks every key used, adds the
// missing ones, then evicts beyond capacity. Not safe for concurrent use.
type lruModel struct {
	capacity int
	order    *list.List // front = most recently used; values are uint64 keys
	index    map[uint64]*list.Element
}

func newLRUModel(capacity int) *lruModel {
	return &lruModel{capacity: capacity, order: list.New(), index: make(map[uint64]*list.Element)}
}

// peek returns how many leading keys are cached without touching recency.
func (m *lruModel) peek(keys []uint64) int {
	for i, k := range keys {
		if _, ok := m.index[k]; !ok {
			return i
		}
	}
	return len(keys)
}

func (m *lruModel) lookup(keys []uint64) int {
	for i, k := range keys {
		e, ok := m.index[k]
		if !ok {
			return i
		}
		m.order.MoveToFront(e)
	}
	return len(keys)
}

func (m *lruModel) insert(keys []uint64) {
	for _, k := range keys {
		if e, ok := m.index[k]; ok {
			m.order.MoveToFront(e)
			continue
		}
		m.index[k] = m.order.PushFront(k)
	}
	for m.order.Len() > m.capacity {
		e := m.order.Back()
		m.order.Remove(e)
		delete(m.index, e.Value.(uint64))
	}
}
