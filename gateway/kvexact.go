package gateway

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/valyala/fastjson"

	"github.com/llmgw/llmgw/engines"
	_ "github.com/llmgw/llmgw/engines/all" // the adapters engines.For reads
	"github.com/llmgw/llmgw/engines/kvhash"
	"github.com/llmgw/llmgw/gateway/kvindex"
	"github.com/llmgw/llmgw/gateway/openai"
	"github.com/llmgw/llmgw/gateway/rule"
	"github.com/llmgw/llmgw/gateway/upstream"
)

// KV-exact routing: route each request to the endpoint that already holds
// the longest prefix of its KV cache, known exactly from the engines' own
// KV-cache events.
//
// Pipeline per request: tokenize as the engine does (chat template, BOS) →
// block keys with the engine's hash (kvhash) → for every scored endpoint the
// number of consecutive blocks, from the first, it holds (kvindex.Match; a
// KV hit is a prefix, set membership is not enough) → the selection law
// below → the endpoint. Misses (no tokenizer result, a prompt shorter than
// one block, no endpoint holding block 0, no ready endpoint) fall back to
// the rule's own policy (CHWBL for sel 8) and say why in X-Llmgw-Route.
//
// Selection law (a cost model with a bound). With B the request's full
// blocks, m_e the blocks endpoint e holds and q_e its requests in flight,
//
//	cost_e = (B − m_e) + α·B·q_e      α = 0.1
//
// estimates e's time to first token in units of one block's prefill: the
// blocks it must compute, plus the work queued ahead. Engines batch
// continuously, so a request in flight delays ours by a fraction of a
// prefill, not a whole one: α = 0.1 counts each as a tenth of a prompt of
// this size. A long match therefore outweighs a few requests in flight,
// while a short one does not. Only endpoints under the load bound take part
// (q_e + 1 ≤ ceil(c·(T+1)/N) over available endpoints, c = max(the rule's
// chwbl.load_factor, 2)), so a hot prefix can never herd every request onto
// one worker: no endpoint takes more than about twice the mean. Among them
// the lowest cost wins, ties to the longer match, then the lower in-flight
// count, then the lower Index. α and c were chosen on the routing benchmark
// (bench/routing): with α = 0.5 and c = 1.25 the load term pushed a third of
// the shared-prefix requests off their warm worker (hit ratio 0.63 against
// the oracle's 0.83); with 0.1 and 2 it is 0.79 with the same balance.
const kvAlpha = 0.1

// kvBoundFactor is the least load factor of the KV-exact bound.
const kvBoundFactor = 2.0

// kvRuntime is a rule's KV-exact state.
type kvRuntime struct {
	mode       rule.KVExactMode
	blockSize  int
	tok        kvTokenizer
	hasher     kvhash.Hasher
	index      *kvindex.Index
	pool       []*upstream.Endpoint // scored endpoints; Index positions in the kvindex
	ingest     []*kvindex.Ingester  // by pool position
	loadFactor float64
	// hitShare is the rule's kvHitMinShare: the share of the prompt's
	// blocks a decision must match to count as a hit.
	hitShare float64
	parity   parityState
	// health is the rule's recent window of decisions and self-checks
	// (effectiveness, the degraded mark).
	health *kvHealth
	// canary records endpoints whose hash parity was proven by a canary
	// check (a readiness condition when their inventory is empty).
	canary []atomic.Bool
	scheme string       // "http" or "https" (backend TLS)
	client *http.Client // side requests: canary, /tokenize, TRT polls
}

func newKVRuntime(s *Server, eff *rule.Rule, eps []*upstream.Endpoint, scheme string, client *http.Client) (*kvRuntime, error) {
	kv := &kvRuntime{mode: eff.KVExactMode, blockSize: eff.KVBlockSize, loadFactor: max(eff.CHWBL.LoadFactor, kvBoundFactor), scheme: scheme, client: client, health: newKVHealth()}
	kv.hitShare = rule.DefaultKVHitMinShare
	if eff.KVHitMinShare != nil {
		kv.hitShare = *eff.KVHitMinShare
	}
	for _, ep := range eps {
		if eff.KVExactMode == 1 && ep.Role != upstream.RolePrefill {
			continue
		}
		kv.pool = append(kv.pool, ep)
	}
	seed := ""
	if eff.KVHashSeed != nil {
		seed = *eff.KVHashSeed
	}
	algo, err := kvhash.ParseAlgo(eff.KVHashAlgo)
	if err != nil {
		return nil, err
	}
	if kv.hasher, err = kvhash.New(algo, eff.KVBlockSize, seed); err != nil {
		return nil, err
	}
	pool := kv.pool
	tokenizePath := ""
	if a, err := engines.For(engines.Kind(eff.KVEngineType)); err == nil {
		tokenizePath = a.Surfaces().Tokenize
	}
	if kv.tok, err = newKVTokenizer(eff.KVTokenizer, eff.ModelName, eff.KVChatTemplate, tokenizePath, func() string {
		for _, ep := range pool {
			if ep.Available() {
				return scheme + "://" + ep.Addr
			}
		}
		return ""
	}, client, s.cfg.KVTokenCacheBytes); err != nil {
		return nil, fmt.Errorf("kvTokenizer %q: %w", eff.KVTokenizer, err)
	}
	a, err := engines.For(engines.Kind(eff.KVEngineType))
	if err != nil {
		return nil, err
	}
	kvc := a.KV()
	if kvc == nil {
		return nil, fmt.Errorf("gateway: %s publishes no KV events; kvExactMode needs them", a.Display())
	}
	kv.index = kvindex.New(len(kv.pool), s.cfg.KVMaxBlocks)
	kv.canary = make([]atomic.Bool, len(kv.pool))
	for i, ep := range kv.pool {
		cfg := kvindex.IngestConfig{Engine: engines.Kind(eff.KVEngineType), Endpoint: i, BlockSize: eff.KVBlockSize, Logger: s.log.With("rule", eff.Name, "endpoint", ep.ID)}
		spec := specOf(eff, ep.ID)
		if kvc.PolledOverHTTP() {
			// Events are drained over HTTP from the endpoint itself and
			// carry token ids, not routing keys: the gateway hashes them.
			cfg.HTTPBase = scheme + "://" + ep.Addr
			cfg.HTTPClient = client
			h, err := kvhash.New(kvhash.Algo(kvc.HashAlgo), eff.KVBlockSize, "")
			if err != nil {
				return nil, err
			}
			cfg.Hasher = h
		} else {
			if spec.KVEventsEndpoint != "" {
				cfg.ZMQ = []string{spec.KVEventsEndpoint}
				if spec.KVReplayEndpoint != "" {
					cfg.Replay = []string{spec.KVReplayEndpoint}
				}
			} else {
				for r := 0; r < max(eff.KVDpRankCount, 1); r++ {
					cfg.ZMQ = append(cfg.ZMQ, "tcp://"+net.JoinHostPort(ep.Host, strconv.Itoa(eff.KVZmqPort+r)))
					cfg.Replay = append(cfg.Replay, "tcp://"+net.JoinHostPort(ep.Host, strconv.Itoa(eff.KVZmqPort+rule.ReplayPortOffset+r)))
				}
			}
		}
		g, err := kvindex.NewIngester(cfg, kv.index)
		if err != nil {
			return nil, fmt.Errorf("endpoint %s: %w", ep.ID, err)
		}
		if kvc.PolledOverHTTP() {
			// A request sent to the worker, or answered, wakes its
			// idle poller.
			ep.OnActivity(g.Kick)
		}
		kv.ingest = append(kv.ingest, g)
	}
	return kv, nil
}

func specOf(r *rule.Rule, id string) rule.Endpoint {
	for _, e := range r.Endpoints {
		if e.ID == id {
			return e
		}
	}
	return rule.Endpoint{}
}

// run starts one goroutine per ingester, owned by ctx and wg. An ingester
// that stops with an error (e.g. a TensorRT-LLM worker still drained by the
// runtime being replaced) is restarted with a backoff until ctx ends.
func (kv *kvRuntime) run(ctx context.Context, wg *sync.WaitGroup, s *Server, ruleName string) {
	for i, g := range kv.ingest {
		wg.Add(1)
		go func() {
			defer wg.Done()
			backoff := 50 * time.Millisecond
			for {
				err := g.Run(ctx)
				if ctx.Err() != nil {
					return
				}
				s.log.Warn("kv ingester stopped; restarting", "rule", ruleName, "endpoint", kv.pool[i].ID, "err", err)
				t := time.NewTimer(backoff)
				select {
				case <-ctx.Done():
					t.Stop()
					return
				case <-t.C:
				}
				backoff = min(backoff*2, 5*time.Second)
			}
		}()
	}
}

// ready reports the readiness conditions of pool position i (DESIGN §4):
// healthy, event stream connected, and inventory non-zero or a canary hash
// check passed.
func (kv *kvRuntime) ready(i int) (healthy, connected, inventory bool) {
	ep := kv.pool[i]
	st := kv.ingest[i].State()
	healthy = ep.Available()
	connected = st.Connected && (st.Admission == "" || st.Admission == "admitted")
	inventory = kv.index.Blocks(i) > 0 || kv.canary[i].Load()
	return
}

// kvScratch is per-request KV state, pooled in reqState.
type kvScratch struct {
	ids     []uint32
	keys    []uint64
	matched []int
	cands   []kvCand
}

// kvChoice is the outcome of KV-exact selection for one request.
type kvChoice struct {
	ep      *upstream.Endpoint // nil on a miss
	pos     int
	matched int // blocks the chosen endpoint holds
	total   int // full blocks of the prompt
	prompt  int // prompt tokens
	// totalAtLeast: total and prompt are lower bounds (the prompt was
	// tokenized only as far as any endpoint could match: routePrefix).
	totalAtLeast bool
	reason       string
	predicted    int // cached tokens the engine should report
	// hit: the chosen endpoint holds at least the rule's kvHitMinShare of
	// the prompt's blocks (and at least one). A choice below the share is
	// "partial" (reason), one with no block "spill".
	hit   bool
	share float64
	// byPos is every scored endpoint's match (the request's scratch, valid
	// while the request is served); pool maps its positions to endpoints.
	byPos []int
	pool  []*upstream.Endpoint
}

// matchedOn is the number of the prompt's blocks endpoint id holds, for the
// endpoint a request actually went to (a fallback or retry may not be the
// KV choice).
func (c *kvChoice) matchedOn(id string) int {
	if c.ep != nil && c.ep.ID == id {
		return c.matched
	}
	for i, ep := range c.pool {
		if ep.ID == id && i < len(c.byPos) {
			return c.byPos[i]
		}
	}
	return 0
}

// isHit applies the rule's share to m matched blocks of the prompt.
func (c *kvChoice) isHit(m int) bool {
	return m > 0 && float64(m) >= c.share*float64(c.total)
}

// route tokenizes and hashes the request and applies the selection law over
// the pool, skipping exclude. On a miss, choice.ep is nil and reason names
// the miss (a failed tokenization: "tokenize", or for kvTokenizer "engine"
// "tokenize_timeout", "tokenize_engine", "tokenize_no_worker"). ctx is the
// request's context; it bounds the engine's /tokenize.
func (kv *kvRuntime) route(ctx context.Context, sc *kvScratch, v *fastjson.Value, kind openai.Kind, exclude *upstream.Endpoint) kvChoice {
	// The match of the last request served with this scratch must not be
	// read for this one before Match fills it.
	sc.matched = sc.matched[:0]
	if cap(sc.matched) < len(kv.pool) {
		sc.matched = make([]int, len(kv.pool))
	}
	sc.matched = sc.matched[:len(kv.pool)]
	// A publisher restart known from a reconnect must empty its endpoint's
	// inventory before the match, not after it.
	for _, g := range kv.ingest {
		g.CheckRestarts()
	}
	if lt, ok := kv.tok.(*localTokenizer); ok {
		total, prompt, atLeast, ok, err := kv.matchPrefix(sc, lt, v, kind)
		if err != nil {
			return kvChoice{reason: missReason(err), share: kv.hitShare}
		}
		if ok {
			return kv.decide(sc, kv.candidates(sc, exclude), total, prompt, atLeast)
		}
	}
	var err error
	sc.ids, err = kv.tok.tokens(ctx, sc.ids[:0], v, kind)
	if err != nil {
		return kvChoice{reason: missReason(err), share: kv.hitShare}
	}
	sc.keys = kv.hasher.BlockKeys(sc.keys[:0], sc.ids)
	kv.index.Match(sc.keys, sc.matched)
	return kv.decide(sc, kv.candidates(sc, exclude), len(sc.keys), len(sc.ids), false)
}

// candidates is the pool as the selection law sees it now, exclude left out.
func (kv *kvRuntime) candidates(sc *kvScratch, exclude *upstream.Endpoint) []kvCand {
	cands := sc.cands[:0]
	for i, ep := range kv.pool {
		cd := kvCand{}
		if ep != exclude && ep.Available() {
			_, conn, inv := kv.ready(i)
			cd = kvCand{avail: true, ready: conn && inv, q: ep.InFlight()}
		}
		cands = append(cands, cd)
	}
	sc.cands = cands
	return cands
}

// matchPrefix is route's tokenize, hash and match for a prompt that no endpoint can hold far: the
// prompt is tokenized and hashed only until a block that no endpoint holds
// (every match then ends before it: a KV hit is a prefix), and the rest is
// only counted, giving a lower bound B on its full blocks. The decision is
// the one the whole prompt gives whenever it cannot depend on where in
// [B, ∞) the true block count lies: with K the longest match, α·B > K+1
// makes every in-flight difference outweigh every match difference in the
// cost law at any count from B up (the order is in-flight, then match,
// then Index), and K < share·B (or a zero share) makes no endpoint a hit at
// any of them; atLeast then says total and prompt are those lower bounds.
// Otherwise ok is false and route tokenizes the whole prompt.
// TestRoutePrefixMatchesFull checks the equivalence on the real tokenizers.
//
// Blocks are hashed and matched when the ids reach a growing threshold
// (about 1.25 times the blocks checked last): each check hashes from the
// root, so checking at every block would cost the square of the shared
// opening, while the threshold costs a constant factor of it.
func (kv *kvRuntime) matchPrefix(sc *kvScratch, lt *localTokenizer, v *fastjson.Value, kind openai.Kind) (total, prompt int, atLeast, ok bool, err error) {
	bs := kv.blockSize
	next, longest, encoded := 1, 0, 0
	more := func(ids []uint32) bool {
		full := len(ids) / bs
		if full < next {
			return true
		}
		sc.keys = kv.hasher.BlockKeys(sc.keys[:0], ids)
		kv.index.Match(sc.keys, sc.matched)
		longest = 0
		for _, m := range sc.matched {
			longest = max(longest, m)
		}
		if longest < len(sc.keys) {
			encoded = len(ids)
			return false // block longest is held by no endpoint
		}
		next = max(full+1, full+full/4)
		return true
	}
	// decisive: a prompt of at least lower blocks gives the decision of any
	// longer one (see above).
	decisive := func(lower int) bool {
		return longest == 0 || (kvAlpha*float64(lower) > float64(longest+1) && (kv.hitShare == 0 || float64(longest) < kv.hitShare*float64(lower)))
	}
	// Counting the tail stops as soon as the bound is decisive: the rest
	// of a long unique prompt is then not even pre-tokenized.
	enough := func(rest int) bool { return decisive((encoded + rest) / bs) }
	var (
		rest int
		done bool
	)
	sc.ids, rest, done, err = lt.tokensUntil(sc.ids[:0], v, kind, more, enough)
	if err != nil {
		return 0, 0, false, false, err
	}
	if done {
		sc.keys = kv.hasher.BlockKeys(sc.keys[:0], sc.ids)
		kv.index.Match(sc.keys, sc.matched)
		return len(sc.keys), len(sc.ids), false, true, nil
	}
	lower := (len(sc.ids) + rest) / bs
	if !decisive(lower) {
		return 0, 0, false, false, nil
	}
	return lower, len(sc.ids) + rest, true, true, nil
}

// kvCand is one pool endpoint as the selection law sees it.
type kvCand struct {
	avail bool  // available and not excluded
	ready bool  // events connected, inventory or canary proof
	q     int64 // requests in flight
}

// selectKV is the selection law over cands (by pool position) for a prompt
// of total full blocks: the chosen position, or -1 and the miss reason.
func (kv *kvRuntime) selectKV(cands []kvCand, matched []int, total int) (int, string) {
	var inflight int64
	n := 0
	anyReady, anyMatch := false, false
	for i, cd := range cands {
		if !cd.avail {
			continue
		}
		inflight += cd.q
		n++
		if cd.ready {
			anyReady = true
			if matched[i] > 0 {
				anyMatch = true
			}
		}
	}
	switch {
	case n == 0 || !anyReady:
		return -1, "not_ready"
	case !anyMatch:
		return -1, "no_match"
	}
	// ceil(c·(T+1)/N) in integer arithmetic on per-mille load factors.
	lf := int64(kv.loadFactor*1000 + 0.5)
	bound := (lf*(inflight+1) + int64(n)*1000 - 1) / (int64(n) * 1000)
	B := float64(total)
	best := -1
	var bestCost float64
	for i, cd := range cands {
		if !cd.avail || !cd.ready || cd.q+1 > bound {
			continue
		}
		cost := (B - float64(matched[i])) + kvAlpha*B*float64(cd.q)
		if best < 0 || cost < bestCost ||
			(cost == bestCost && (matched[i] > matched[best] ||
				(matched[i] == matched[best] && cd.q < cands[best].q))) {
			best, bestCost = i, cost
		}
	}
	if best < 0 {
		return -1, "overloaded"
	}
	return best, ""
}

// decide applies the selection law to sc.matched over cands for a prompt
// of total full blocks and prompt tokens; atLeast: both are lower bounds
// (matchPrefix).
func (kv *kvRuntime) decide(sc *kvScratch, cands []kvCand, total, prompt int, atLeast bool) kvChoice {
	c := kvChoice{total: total, prompt: prompt, share: kv.hitShare, totalAtLeast: atLeast}
	if total == 0 {
		c.reason = "short"
		return c
	}
	c.byPos, c.pool = sc.matched, kv.pool
	best, reason := kv.selectKV(cands, sc.matched, total)
	if best < 0 {
		c.reason = reason
		return c
	}
	c.ep, c.pos, c.matched = kv.pool[best], best, sc.matched[best]
	maxHit := 0
	if prompt > 0 {
		maxHit = (prompt - 1) / kv.blockSize
	}
	c.predicted = min(c.matched, maxHit) * kv.blockSize
	c.hit = c.isHit(c.matched)
	switch {
	case c.matched == 0:
		c.reason = "spill"
	case !c.hit:
		c.reason = "partial"
	}
	return c
}

// routeLabel is the X-Llmgw-Route value of a KV decision: "hit=M/T" only
// when the match reaches the rule's share, "partial=M/T" below it.
func (c *kvChoice) routeLabel() string {
	if c.ep == nil {
		return "kv-exact miss=" + c.reason
	}
	tot := strconv.Itoa(c.total)
	if c.totalAtLeast {
		tot += "+" // at least: the prompt's tail was counted, not tokenized
	}
	frac := strconv.Itoa(c.matched) + "/" + tot
	switch c.reason {
	case "spill":
		return "kv-exact spill hit=0/" + tot
	case "partial":
		return "kv-exact partial=" + frac
	}
	return "kv-exact hit=" + frac
}

// parityState is the self-check: the engine's reported cached tokens
// against the gateway's prediction. A hash seed, block size or tokenizer
// mismatch makes every prediction wrong in the same way (the gateway never
// matches what the engine reuses), so a run of clear mismatches with no
// agreement in between raises a parity warning within a few requests.
type parityState struct {
	mu         sync.Mutex
	agree      uint64 // predicted == reported, both > 0
	mismatch   uint64 // differ by at least one block
	neutral    uint64 // both zero, or no report
	streak     int    // clear mismatches since the last agreement
	broken     bool
	lastDetail string
}

// parityThreshold is the mismatch streak that raises the warning.
const parityThreshold = 5

// observe records one response. reported < 0 means the engine reported
// nothing. It returns true when this observation raised the warning.
func (p *parityState) observe(predicted, reported, blockSize int) (raised bool, detail string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	switch {
	case reported < 0 || (predicted == 0 && reported == 0):
		p.neutral++
	case abs(predicted-reported) < blockSize && reported > 0:
		p.agree++
		p.streak = 0
		p.broken = false
	case abs(predicted-reported) >= blockSize:
		p.mismatch++
		p.streak++
		p.lastDetail = fmt.Sprintf("predicted %d cached tokens, engine reported %d", predicted, reported)
		if p.streak >= parityThreshold && !p.broken {
			p.broken = true
			return true, p.lastDetail
		}
	default:
		p.neutral++
	}
	return false, ""
}

func abs(x int) int {
	if x < 0 {
		return -x
	}
	return x
}

// ParityStatus is the self-check's state, as the admin API shows it.
type ParityStatus struct {
	Agreements uint64 `json:"agreements"`
	Mismatches uint64 `json:"mismatches"`
	Neutral    uint64 `json:"neutral"`
	Streak     int    `json:"mismatch_streak"`
	Broken     bool   `json:"parity_broken"`
	LastDetail string `json:"last_mismatch,omitempty"`
}

func (p *parityState) status() ParityStatus {
	p.mu.Lock()
	defer p.mu.Unlock()
	return ParityStatus{Agreements: p.agree, Mismatches: p.mismatch, Neutral: p.neutral, Streak: p.streak, Broken: p.broken, LastDetail: p.lastDetail}
}

// cachedScanner finds the last "cached_tokens": N in a byte stream that
// arrives in pieces (a JSON body or an SSE stream with a usage chunk).
type cachedScanner struct {
	tail  []byte
	value int
	seen  bool
}

var cachedKey = []byte(`"cached_tokens":`)

func (c *cachedScanner) write(b []byte) {
	buf := append(c.tail, b...)
	for i := 0; ; {
		j := bytes.Index(buf[i:], cachedKey)
		if j < 0 {
			break
		}
		k := i + j + len(cachedKey)
		for k < len(buf) && buf[k] == ' ' {
			k++
		}
		start := k
		for k < len(buf) && buf[k] >= '0' && buf[k] <= '9' {
			k++
		}
		if k == len(buf) { // the number may continue in the next piece
			break
		}
		if k > start {
			if n, err := strconv.Atoi(string(buf[start:k])); err == nil {
				c.value, c.seen = n, true
			}
		}
		i = k
	}
	keep := min(len(buf), len(cachedKey)+24)
	c.tail = append(c.tail[:0], buf[len(buf)-keep:]...)
}

// reported returns the last cached_tokens seen, or -1.
func (c *cachedScanner) reported() int {
	if !c.seen {
		return -1
	}
	return c.value
}

// kvObservation carries one response's self-check inputs.
type kvObservation struct {
	predicted int
	scan      cachedScanner
}

// kvSelfCheck compares the engine's cached tokens with the prediction and
// raises the parity warning (log, status, metric) when it breaks.
func (s *Server) kvSelfCheck(rt *ruleRuntime, obs *kvObservation) {
	if rt.kv == nil {
		return
	}
	reported := obs.scan.reported()
	raised, detail := rt.kv.parity.observe(obs.predicted, reported, rt.kv.blockSize)
	outcome := "neutral"
	switch {
	case reported < 0 || (obs.predicted == 0 && reported == 0):
	case abs(obs.predicted-reported) < rt.kv.blockSize:
		outcome = "agree"
	default:
		outcome = "mismatch"
	}
	s.metrics.kvParity.WithLabelValues(rt.rule.Name, outcome).Inc()
	rt.kv.health.check(outcome)
	if raised {
		s.log.Error("kv-exact hash parity broken: the engine's cache reuse does not match the gateway's prediction; "+rt.kv.parityHint(),
			"rule", rt.rule.Name, "mismatches_in_a_row", parityThreshold, "last", detail)
	}
}

// parityHint says what to check when the engine's cache does not match the
// gateway's hashes. Events rejected as malformed are named first: their
// blocks are missing from the inventory whatever the hash settings, so
// blaming kvHashSeed would send the operator the wrong way.
func (kv *kvRuntime) parityHint() string {
	var batches, events uint64
	for _, g := range kv.ingest {
		st := g.State()
		batches += st.Malformed
		events += st.MalformedEvents
	}
	if batches > 0 || events > 0 {
		return fmt.Sprintf("KV events were lost (%d malformed responses dropped whole, %d malformed events rejected; llmgw_kv_malformed_batches_total, llmgw_kv_malformed_events_total), so the inventory lacks what they said: fix the engine's event stream before suspecting kvHashSeed, kvBlockSize or the tokenizer", batches, events)
	}
	return "check kvHashSeed (PYTHONHASHSEED), kvBlockSize and the tokenizer"
}

func (kv *kvRuntime) endpointStatus(i int) *EndpointKVStatus {
	healthy, conn, inv := kv.ready(i)
	st := kv.ingest[i].State()
	return &EndpointKVStatus{
		Ready: healthy && conn && inv, Healthy: healthy, EventsConnected: conn, InventoryOrProof: inv,
		InventoryBlocks: kv.index.Blocks(i), Admission: st.Admission, LastSeq: st.LastSeq, Events: st.Events,
		Resyncs: st.Resyncs, LastResyncReason: st.LastResyncReason, Malformed: st.Malformed, MalformedEvents: st.MalformedEvents, Dropped: st.Dropped,
		Polls: st.Polls,
	}
}

// InventoryStatus is GET /v1/rules/{name}/inventory.
type InventoryStatus struct {
	Rule      string              `json:"rule"`
	HashAlgo  string              `json:"hash_algo"`
	BlockSize int                 `json:"block_size"`
	Endpoints []InventoryEndpoint `json:"endpoints"`
}

// InventoryEndpoint is one endpoint's inventory summary with a sample of
// its keys (as unsigned decimal, the engines' 64-bit bit patterns).
type InventoryEndpoint struct {
	ID string `json:"id"`
	EndpointKVStatus
	Sample []uint64 `json:"sample_keys"`
}

// Inventory returns rule name's KV inventory summary.
func (s *Server) Inventory(name string, sample int) (*InventoryStatus, error) {
	s.mu.Lock()
	rt := s.rules[name]
	s.mu.Unlock()
	if rt == nil {
		return nil, fmt.Errorf("%w: %q", ErrRuleNotFound, name)
	}
	if rt.kv == nil {
		return nil, fmt.Errorf("%w: rule %q has kvExactMode 0: it keeps no KV inventory", errAdminBadRequest, name)
	}
	out := &InventoryStatus{Rule: name, HashAlgo: rt.rule.KVHashAlgo, BlockSize: rt.rule.KVBlockSize}
	for i, ep := range rt.kv.pool {
		keys := rt.kv.index.Keys(i, sample)
		if keys == nil {
			keys = []uint64{}
		}
		out.Endpoints = append(out.Endpoints, InventoryEndpoint{ID: ep.ID, EndpointKVStatus: *rt.kv.endpointStatus(i), Sample: keys})
	}
	return out, nil
}

// canaryEvery is how often endpoints still lacking parity proof are probed.
const canaryEvery = 3 * time.Second

// canaryLoop gives each scored endpoint its readiness proof before it holds
// inventory: an endpoint whose event stream is connected but whose
// inventory is empty gets one small canary completion (max_tokens 1); when
// the block hashes the gateway computes for it appear in the endpoint's
// published inventory, hash parity is proven and the endpoint is ready.
// Once proven it is never probed again. It runs until ctx ends.
func (kv *kvRuntime) canaryLoop(ctx context.Context, s *Server, r *rule.Rule) {
	client := kv.client
	t := time.NewTimer(200 * time.Millisecond)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		for i, ep := range kv.pool {
			if kv.canary[i].Load() || kv.index.Blocks(i) > 0 {
				continue
			}
			if _, conn, _ := kv.ready(i); !conn || !ep.Available() {
				continue
			}
			if ok, err := kv.canaryOnce(ctx, client, i, r); err != nil {
				s.log.Debug("kv canary not run", "rule", r.Name, "endpoint", ep.ID, "err", err)
			} else if ok {
				kv.canary[i].Store(true)
				s.log.Info("kv canary proved hash parity", "rule", r.Name, "endpoint", ep.ID)
			} else {
				s.log.Warn("kv canary: the endpoint's published block hashes do not include the gateway's; "+kv.parityHint(), "rule", r.Name, "endpoint", ep.ID)
			}
		}
		t.Reset(canaryEvery)
	}
}

// canaryOnce sends the canary to pool position i and reports whether every
// block key the gateway computes for it shows up in its inventory within 3 s.
func (kv *kvRuntime) canaryOnce(ctx context.Context, client *http.Client, i int, r *rule.Rule) (bool, error) {
	ep := kv.pool[i]
	prompt := strings.Repeat("llmgw canary: prove that gateway and engine hash the same blocks. ", 8)
	body := fmt.Appendf(nil, `{"model":%q,"prompt":%q,"max_tokens":1,"stream":false}`, r.ModelName, prompt)
	var p fastjson.Parser
	v, err := p.ParseBytes(body)
	if err != nil {
		return false, err
	}
	var sc kvScratch
	if sc.ids, err = kv.tok.tokens(ctx, nil, v, openai.Completion); err != nil {
		return false, err
	}
	sc.keys = kv.hasher.BlockKeys(nil, sc.ids)
	if len(sc.keys) == 0 {
		return false, fmt.Errorf("canary prompt shorter than one block of %d tokens", kv.blockSize)
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, kv.scheme+"://"+ep.Addr+"/v1/completions", bytes.NewReader(body))
	if err != nil {
		return false, err
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("X-Request-Id", "llmgw-canary-"+strconv.FormatInt(time.Now().UnixNano(), 16))
	resp, err := client.Do(req)
	if err != nil {
		return false, err
	}
	_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 1<<20))
	resp.Body.Close()
	kv.ingest[i].Kick() // its events are coming (a polled engine)
	if resp.StatusCode != http.StatusOK {
		return false, fmt.Errorf("canary answered %d", resp.StatusCode)
	}
	// Every block must show up: block 0 alone would pass a gateway whose
	// parent-hash chaining is wrong.
	deadline := time.Now().Add(3 * time.Second)
	for time.Now().Before(deadline) {
		all := true
		for _, k := range sc.keys {
			all = all && kv.index.Contains(i, k)
		}
		if all {
			return true, nil
		}
		select {
		case <-ctx.Done():
			return false, ctx.Err()
		case <-time.After(20 * time.Millisecond):
		}
	}
	return false, nil
}
