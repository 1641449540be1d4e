package sim

import (
	"fmt"
	"time"

	"github.com/llmgw/llmgw/engines"
	"github.com/llmgw/llmgw/engines/kvhash"
)

// apiKind is the request family a job came from; it selects response shapes.
type apiKind int

const (
	apiChat       apiKind = iota // /v1/chat/completions
	apiCompletion                // /v1/completions
	apiGenerate                  // SGLang /generate
	apiLlama                     // llama.cpp /completion
)

// genJob is one parsed inference request.
type genJob struct {
	api       apiKind
	req       *genRequest
	prompt    []uint32
	requestID string
	max       int // -1 when the client set no cap
	stream    bool
	// remoteTokens are prompt tokens whose KV arrived from a prefill
	// instance (P/D); they cost no prefill time here.
	remoteTokens int
	rec          Receipt
	pd           pdState
	// truncated: llama.cpp cut the prompt to fit its slot's context;
	// slot is the llama.cpp slot that serves the job (-1: none free).
	truncated bool
	slot      int
}

// genOutcome is what the simulated engine computed for a job.
type genOutcome struct {
	promptTokens     int
	cachedTokens     int
	completionTokens int
	pieces           []string
	ids              []uint32
	finish           string // "stop" or "length"
	keys             []uint64
	blockIDs         []int64
	prefillCost      time.Duration
	queued           time.Duration
	start            time.Time
}

// outputWords are the generated tokens: short words with their leading
// space, each a single token in byte-level BPE vocabularies such as
// Qwen3's (TestOutputWordsAreSingleTokens), so completion_tokens equals the
// word count.
var outputWords = [...]string{
	" a", " I", " an", " as", " at", " be", " by", " do", " go", " he", " if", " in", " is",
	" it", " me", " my", " no", " of", " on", " or", " so", " to", " up", " us", " we",
}

// admit waits for a serving slot (FIFO among waiters) and returns its
// release function; it fails only when the sim is closing.
func (s *Sim) admit() (release func(), queued time.Duration, err error) {
	if s.slots == nil {
		s.running.Add(1)
		return func() { s.running.Add(-1) }, 0, nil
	}
	select {
	case s.slots <- struct{}{}:
	default:
		t0 := time.Now()
		s.waiting.Add(1)
		select {
		case s.slots <- struct{}{}:
			s.waiting.Add(-1)
			queued = time.Since(t0)
		case <-s.ctx.Done():
			s.waiting.Add(-1)
			return nil, 0, fmt.Errorf("sim: shutting down: %w", s.ctx.Err())
		}
	}
	s.running.Add(1)
	return func() { s.running.Add(-1); <-s.slots }, queued, nil
}

// sleep waits d unless the sim closes first; it reports whether the full
// duration elapsed.
func (s *Sim) sleep(d time.Duration) bool {
	if d <= 0 {
		return s.ctx.Err() == nil
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-s.ctx.Done():
		return false
	}
}

// blockKeys returns the engine's published hash of every full block of
// prompt, chained from the root.
func (s *Sim) blockKeys(prompt []uint32) []uint64 {
	if s.hasher != nil {
		return s.hasher.BlockKeys(make([]uint64, 0, len(prompt)/s.cfg.BlockSize), prompt)
	}
	// TensorRT-LLM: its own v1 block key, parent 0 for the first block.
	bs := s.cfg.BlockSize
	keys := make([]uint64, 0, len(prompt)/bs)
	var parent uint64
	for i := 0; i+bs <= len(prompt); i += bs {
		parent = kvhash.TRTLLMBlockKey(parent, prompt[i:i+bs])
		keys = append(keys, parent)
	}
	return keys
}

// prefill runs the prompt through the prefix cache and the latency model,
// publishing the cache changes, and returns the outcome without output.
func (s *Sim) prefill(job *genJob) *genOutcome {
	out := &genOutcome{promptTokens: len(job.prompt), start: time.Now()}
	rank := s.pickRank(job)
	bs := s.cfg.BlockSize
	out.keys = s.blockKeys(job.prompt)
	useCache := job.req == nil || job.req.CachePrompt == nil || *job.req.CachePrompt
	// Like vLLM, the last prompt token is always computed (its logits start
	// decoding), so a hit may cover at most (len-1)/bs blocks.
	maxHit := 0
	if len(job.prompt) > 0 {
		maxHit = (len(job.prompt) - 1) / bs
	}
	hit := 0
	if useCache {
		hit = rank.cache.lookup(out.keys[:min(maxHit, len(out.keys))])
	}
	cached := hit * bs
	if r := min(job.remoteTokens, max(len(job.prompt)-1, 0)); r > cached {
		cached = r
	}
	out.cachedTokens = cached
	out.prefillCost = time.Duration(len(job.prompt)-cached) * s.cfg.PrefillPerToken
	s.metrics.prefixQueries.Add(int64(len(job.prompt)))
	s.metrics.prefixHits.Add(int64(cached))
	s.metrics.promptTokens.Add(int64(len(job.prompt)))
	s.sleep(out.prefillCost + s.faults.addedLatency())
	if useCache {
		res := rank.cache.insert(out.keys)
		out.blockIDs = res.ids
		s.publishCacheChange(rank, job.prompt, out.keys, res)
	}
	return out
}

// generate fills in the deterministic completion: its length is drawn from
// the seed and prompt (8..32 tokens, finish "stop"), capped by max (finish
// "length"); with ignore_eos and a max it is max.
func (s *Sim) generate(job *genJob, out *genOutcome) {
	h := uint64(s.cfg.Seed)
	for _, t := range job.prompt {
		h = splitmix64(h ^ uint64(t))
	}
	natural := 8 + int(h%25)
	if r := job.req; r != nil && r.IgnoreEOS != nil && *r.IgnoreEOS && job.max >= 0 {
		natural = job.max
	}
	n, finish := natural, "stop"
	if job.max >= 0 && job.max <= natural {
		n, finish = job.max, "length"
	}
	out.pieces = make([]string, n)
	out.ids = make([]uint32, 0, n)
	for i := range out.pieces {
		h = splitmix64(h + uint64(i))
		w := outputWords[h%uint64(len(outputWords))]
		out.pieces[i] = w
		out.ids = s.tok.Encode(out.ids, w)
	}
	out.completionTokens = n
	out.finish = finish
	s.metrics.generationTokens.Add(int64(n))
}

// publishCacheChange emits the persona's events for one prefix-cache insert:
// removals for evicted blocks, then one stored event for the new blocks
// (vLLM, TensorRT-LLM) or one per page (SGLang).
func (s *Sim) publishCacheChange(rank *dpRank, prompt []uint32, keys []uint64, res insertResult) {
	if rank.events == nil && s.trt == nil {
		return
	}
	bs := s.cfg.BlockSize
	var evs []simEvent
	for _, k := range res.evicted {
		evs = append(evs, simEvent{kind: evRemoved, hashes: []uint64{k}})
	}
	if res.firstNew < len(keys) {
		parent, hasParent := uint64(0), res.firstNew > 0
		if hasParent {
			parent = keys[res.firstNew-1]
		}
		if s.cfg.Engine == engines.SGLang {
			for i := res.firstNew; i < len(keys); i++ {
				evs = append(evs, simEvent{kind: evStored, hashes: keys[i : i+1], parent: parent, hasParent: hasParent,
					tokens: prompt[i*bs : (i+1)*bs]})
				parent, hasParent = keys[i], true
			}
		} else {
			evs = append(evs, simEvent{kind: evStored, hashes: keys[res.firstNew:], parent: parent, hasParent: hasParent,
				tokens: prompt[res.firstNew*bs : len(keys)*bs]})
		}
	}
	if len(evs) == 0 {
		return
	}
	if s.trt != nil {
		s.trt.push(evs, bs)
		return
	}
	rank.events.publish(evs)
}

// pickRank returns the data-parallel rank that serves job: the one the
// request names, else the next in round robin.
func (s *Sim) pickRank(job *genJob) *dpRank {
	if len(s.ranks) == 1 {
		return s.ranks[0]
	}
	if r := job.req; r != nil {
		for _, v := range []*int{r.RoutedDPRank, r.DataParallelRank} {
			if v != nil && *v >= 0 && *v < len(s.ranks) {
				return s.ranks[*v]
			}
		}
	}
	return s.ranks[int(s.rr.Add(1)-1)%len(s.ranks)]
}

// simEvent is one KV cache event in engine-neutral form.
type simEvent struct {
	kind      eventKind
	hashes    []uint64
	parent    uint64
	hasParent bool
	tokens    []uint32
}

type eventKind int

const (
	evStored eventKind = iota
	evRemoved
	evCleared
)

// resetCache empties the prefix cache and announces it (AllBlocksCleared).
func (s *Sim) resetCache() {
	for _, rank := range s.ranks {
		keys := rank.cache.clear()
		switch {
		case s.trt != nil:
			// TensorRT-LLM has no "all cleared" event; it reports removals.
			if len(keys) > 0 {
				s.trt.push([]simEvent{{kind: evRemoved, hashes: keys}}, s.cfg.BlockSize)
			}
		case rank.events != nil:
			rank.events.publish([]simEvent{{kind: evCleared}})
		}
	}
}
