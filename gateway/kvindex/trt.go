package kvindex

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"time"

	"github.com/llmgw/llmgw/engines/kvevents"
	"github.com/llmgw/llmgw/engines/kvhash"
)

// Admission verdicts shown in IngestState.Admission.
const (
	AdmissionPending  = "pending"
	AdmissionAdmitted = "admitted"
	// A refusal reads "refused: <why>".
	admissionRefused = "refused: "
)

// trtState is the TensorRT-LLM poller's chain state. It is guarded by the
// Ingester's mu.
type trtState struct {
	base    string // normalised HTTPBase, the sole-consumer registry key
	lastSeq int64
	// chain maps TRT's engine hash of a block to the gateway's routing key
	// and the full SGLang-chain digest its children chain from. The engine
	// hash is only a lookup handle: parent_hash and removed events name
	// blocks by it.
	chain map[uint64]chainEntry
	// window is the attention window whose events are indexed: the first
	// one seen after a (re)start. Models with several windows publish events
	// per window; only one of them describes the prefix that can be reused.
	window    int64
	hasWindow bool
	keys      []uint64
	tokens    []uint32
}

type chainEntry struct {
	key    uint64
	digest [32]byte
}

func (t *trtState) reset() {
	clear(t.chain)
	t.hasWindow = false
}

// drainOwners is the process-wide sole-consumer registry of TRT workers.
var drainOwners = struct {
	sync.Mutex
	m map[string]bool
}{m: map[string]bool{}}

func claimDrain(base string) bool {
	drainOwners.Lock()
	defer drainOwners.Unlock()
	if drainOwners.m[base] {
		return false
	}
	drainOwners.m[base] = true
	return true
}

func releaseDrain(base string) {
	drainOwners.Lock()
	defer drainOwners.Unlock()
	delete(drainOwners.m, base)
}

func drainOwned(base string) bool {
	drainOwners.Lock()
	defer drainOwners.Unlock()
	return drainOwners.m[base]
}

// normaliseBase makes equal worker URLs compare equal: lower-case scheme and
// host, no default port, no trailing slash. Different names of one host
// (localhost and 127.0.0.1) are not unified.
func normaliseBase(raw string) (string, error) {
	u, err := url.Parse(raw)
	if err != nil {
		return "", fmt.Errorf("%w: HTTP base %q: %w", ErrConfig, raw, err)
	}
	scheme := strings.ToLower(u.Scheme)
	if scheme != "http" && scheme != "https" || u.Host == "" {
		return "", fmt.Errorf("%w: HTTP base %q is not an http(s)://host[:port] URL", ErrConfig, raw)
	}
	host := strings.ToLower(u.Host)
	if p := u.Port(); (scheme == "http" && p == "80") || (scheme == "https" && p == "443") {
		host = strings.TrimSuffix(host, ":"+p)
	}
	return scheme + "://" + host + strings.TrimRight(u.EscapedPath(), "/"), nil
}

func (g *Ingester) initTRT() error {
	cfg := &g.cfg
	if cfg.BlockSize <= 0 {
		return fmt.Errorf("%w: trtllm needs the rule's block size (tokens_per_block)", ErrConfig)
	}
	base, err := normaliseBase(cfg.HTTPBase)
	if err != nil {
		return err
	}
	if cfg.Hasher == nil {
		h, err := kvhash.New(kvhash.BlockHashTRTLLM, cfg.BlockSize, "")
		if err != nil {
			return fmt.Errorf("%w: %w", ErrConfig, err)
		}
		cfg.Hasher = h
	}
	switch cfg.Hasher.Algo() {
	case kvhash.BlockHashTRTLLM, kvhash.SHA256SGLang:
	default:
		return fmt.Errorf("%w: trtllm routing keys are the SGLang chain; hasher %s does not compute it", ErrConfig, cfg.Hasher.Algo())
	}
	if cfg.Hasher.BlockSize() != cfg.BlockSize {
		return fmt.Errorf("%w: hasher block size %d != block size %d", ErrConfig, cfg.Hasher.BlockSize(), cfg.BlockSize)
	}
	if cfg.PollMin <= 0 {
		cfg.PollMin = DefaultPollMin
	}
	if cfg.PollMax <= 0 {
		cfg.PollMax = DefaultPollMax
	}
	cfg.PollMax = max(cfg.PollMax, cfg.PollMin)
	if cfg.MaxResponseBytes <= 0 {
		cfg.MaxResponseBytes = DefaultMaxResponseBytes
	}
	if cfg.MaxChain <= 0 {
		cfg.MaxChain = g.x.MaxBlocks()
	}
	if cfg.AdmissionRetry <= 0 {
		cfg.AdmissionRetry = DefaultAdmissionRetry
	}
	if cfg.AdmissionRecheck <= 0 {
		cfg.AdmissionRecheck = DefaultAdmissionRecheck
	}
	if drainOwned(base) {
		return fmt.Errorf("%w: %s", ErrSoleConsumer, base)
	}
	g.algo = cfg.Hasher.Algo()
	g.trt = &trtState{base: base, lastSeq: -1, chain: map[uint64]chainEntry{}}
	g.st.Admission = AdmissionPending
	return nil
}

func (g *Ingester) runTRT(ctx context.Context) error {
	if !claimDrain(g.trt.base) {
		return fmt.Errorf("%w: %s", ErrSoleConsumer, g.trt.base)
	}
	defer releaseDrain(g.trt.base)

	client := g.cfg.HTTPClient
	if client == nil {
		tr := http.DefaultTransport.(*http.Transport).Clone()
		defer tr.CloseIdleConnections()
		client = &http.Client{Transport: tr, Timeout: defaultHTTPTimeout}
	}

	g.mu.Lock()
	g.x.Clear(g.cfg.Endpoint)
	g.trt.reset()
	g.trt.lastSeq = -1
	g.st.Admission = AdmissionPending
	g.mu.Unlock()

	interval := g.cfg.PollMin
	errBackoff := g.cfg.PollMin
	everConnected := false
	for {
		if ctx.Err() != nil {
			return ctx.Err()
		}
		if g.admission() != AdmissionAdmitted {
			verdict, wait := g.checkAdmission(ctx, client)
			g.setAdmission(verdict)
			if verdict != AdmissionAdmitted {
				if !sleepCtx(ctx, wait) {
					return ctx.Err()
				}
				continue
			}
		}
		g.mu.Lock()
		g.st.Polls++
		g.mu.Unlock()
		body, err := g.drain(ctx, client)
		if err != nil {
			if ctx.Err() != nil {
				return ctx.Err()
			}
			g.mu.Lock()
			g.st.Connected = false
			g.mu.Unlock()
			g.log.Debug("kv_cache_events poll failed", "err", err)
			if !sleepCtx(ctx, errBackoff) {
				return ctx.Err()
			}
			errBackoff = min(2*errBackoff, max(g.cfg.PollMax, time.Second))
			continue
		}
		errBackoff = g.cfg.PollMin
		g.mu.Lock()
		if !g.st.Connected && everConnected {
			g.st.Reconnects++
		}
		g.st.Connected, everConnected = true, true
		g.mu.Unlock()
		interval = nextPoll(interval, g.cfg.PollMin, g.cfg.PollMax, g.applyTRTBody(body) > 0)
		g.mu.Lock()
		g.st.PollInterval = interval
		g.mu.Unlock()
		ok, kicked := g.sleep(ctx, interval, g.kick)
		if !ok {
			return ctx.Err()
		}
		if kicked {
			// A request went to the worker: poll now, and at PollMin
			// until its events are in.
			interval = g.cfg.PollMin
		}
	}
}

// Kick tells a TensorRT-LLM poller that events are coming (the gateway
// just sent the worker a request): it polls at once and restarts its
// cadence at PollMin. It never blocks; for vLLM and SGLang it does nothing.
func (g *Ingester) Kick() {
	if g.trt == nil {
		return
	}
	select {
	case g.kick <- struct{}{}:
	default:
	}
}

// pollSleep waits d, or less when kicked; ok is false when ctx ended.
func pollSleep(ctx context.Context, d time.Duration, kick <-chan struct{}) (ok, kicked bool) {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false, false
	case <-kick:
		return true, true
	case <-t.C:
		return true, false
	}
}

// nextPoll is the adaptive cadence: back to lo as soon as a drain returns
// events, otherwise ×1.5 up to hi, so an idle worker is asked rarely and a
// busy one often.
func nextPoll(cur, lo, hi time.Duration, gotEvents bool) time.Duration {
	if gotEvents {
		return lo
	}
	return min(max(cur+cur/2, lo), hi)
}

func (g *Ingester) admission() string {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.st.Admission
}

func (g *Ingester) setAdmission(v string) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if v == g.st.Admission {
		return
	}
	g.log.Info("TensorRT-LLM admission", "verdict", v)
	g.st.Admission = v
	if strings.HasPrefix(v, admissionRefused) {
		// Whatever was indexed under the old verdict is no longer vouched for.
		g.resyncLocked(ReasonAdmission)
	}
}

// checkAdmission asks /server_info whether the worker's KV blocks are the
// rule's: tokens_per_block must equal BlockSize, and the engine hashes must
// be 64-bit handles (kv_cache_hash_algo absent, v1_block_key or
// v2_sha256_64). A worker that reports neither field is admitted, as the
// reference does: blocks of another size would never pass the exact-size
// eligibility check anyway. It returns the verdict and how long to wait
// before asking again when not admitted.
func (g *Ingester) checkAdmission(ctx context.Context, client *http.Client) (string, time.Duration) {
	rctx, cancel := context.WithTimeout(ctx, defaultServerInfoTO)
	defer cancel()
	req, err := http.NewRequestWithContext(rctx, http.MethodGet, g.trt.base+"/server_info", nil)
	if err != nil {
		return admissionRefused + err.Error(), g.cfg.AdmissionRecheck
	}
	resp, err := client.Do(req)
	if err != nil {
		return AdmissionPending, g.cfg.AdmissionRetry
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, defaultServerInfoLimit+1))
	if err != nil || resp.StatusCode != http.StatusOK {
		return AdmissionPending, g.cfg.AdmissionRetry
	}
	var info struct {
		TokensPerBlock *int64  `json:"tokens_per_block"`
		HashAlgo       *string `json:"kv_cache_hash_algo"`
	}
	if len(body) > defaultServerInfoLimit || json.Unmarshal(body, &info) != nil {
		return admissionRefused + "server_info is not a JSON object", g.cfg.AdmissionRecheck
	}
	if info.HashAlgo != nil {
		switch *info.HashAlgo {
		case "v1_block_key", "v2_sha256_64":
		default:
			return admissionRefused + fmt.Sprintf("kv_cache_hash_algo %q has no 64-bit block handles", *info.HashAlgo), g.cfg.AdmissionRecheck
		}
	}
	if info.TokensPerBlock != nil && *info.TokensPerBlock != int64(g.cfg.BlockSize) {
		return admissionRefused + fmt.Sprintf("tokens_per_block %d != kvBlockSize %d", *info.TokensPerBlock, g.cfg.BlockSize), g.cfg.AdmissionRecheck
	}
	return AdmissionAdmitted, 0
}

// drain fetches one /kv_cache_events response. An oversize body is returned
// as such (longer than MaxResponseBytes) so that applyTRTBody can count it:
// the events it held are gone from the engine either way.
func (g *Ingester) drain(ctx context.Context, client *http.Client) ([]byte, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, g.trt.base+"/kv_cache_events", http.NoBody)
	if err != nil {
		return nil, fmt.Errorf("kvindex: kv_cache_events request: %w", err)
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := client.Do(req)
	if err != nil {
		return nil, fmt.Errorf("kvindex: kv_cache_events: %w", err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 4096))
		return nil, fmt.Errorf("kvindex: kv_cache_events: status %d", resp.StatusCode)
	}
	body, err := io.ReadAll(io.LimitReader(resp.Body, g.cfg.MaxResponseBytes+1))
	if err != nil {
		return nil, fmt.Errorf("kvindex: kv_cache_events body: %w", err)
	}
	return body, nil
}

// applyTRTBody decodes and applies one drain response and returns how many
// events it held. The whole response is decoded before anything is applied.
func (g *Ingester) applyTRTBody(body []byte) int {
	g.mu.Lock()
	defer g.mu.Unlock()
	if int64(len(body)) > g.cfg.MaxResponseBytes {
		g.st.Malformed++
		g.resyncLocked(ReasonOversize)
		return 0
	}
	items, err := kvevents.DecodeTRTItems(body, g.cfg.MaxEvents)
	if err != nil {
		// The drain removed these events from the engine: whatever they
		// said is lost, so the inventory can no longer be trusted.
		g.st.Malformed++
		g.log.Warn("undecodable kv_cache_events response; the endpoint's KV inventory is cleared", "err", err)
		g.resyncLocked(ReasonMalformed)
		return 0
	}
	if len(items) == 0 {
		return 0
	}
	var rejected int
	var firstErr error
	for i := range items {
		it := &items[i]
		if it.Err != nil {
			// Only this event is lost. It still takes its place in the
			// sequence (its own id when readable, else the next one:
			// ids rise by one per event), so the events after it are
			// not taken for a gap.
			rejected++
			if firstErr == nil {
				firstErr = it.Err
			}
			switch {
			case it.HasID && it.Event.EventID <= math.MaxInt64:
				g.advanceSeqLocked(it.Event.EventID)
			case !it.HasID && g.trt.lastSeq >= 0:
				g.trt.lastSeq++
			}
			continue
		}
		g.applyTRTEventLocked(&it.Event)
	}
	if rejected > 0 {
		g.st.MalformedEvents += uint64(rejected)
		g.log.Warn("malformed TRT-LLM KV events rejected; the other events of the drain were applied",
			"rejected", rejected, "events", len(items), "first", firstErr)
	}
	g.st.Events += uint64(len(items) - rejected)
	g.st.Batches++
	g.st.LastEvent = time.Now()
	return len(items)
}

// advanceSeqLocked records a rejected event's id as seen, as an event of an
// unknown type would be.
func (g *Ingester) advanceSeqLocked(id uint64) {
	t := g.trt
	prior := t.lastSeq
	t.lastSeq = int64(id)
	if v := DecideSeq(prior, id, g.cfg.SeqWindow); !v.Keep {
		g.resyncLocked(v.Reason)
	}
}

func (g *Ingester) applyTRTEventLocked(ev *kvevents.TRTEvent) {
	t := g.trt
	if ev.AttentionDPRank != nil && *ev.AttentionDPRank != 0 {
		// Attention-DP ranks number their events separately; the gateway
		// follows rank 0 only (the reference refuses such workers).
		g.st.Skipped++
		return
	}
	if ev.EventID > math.MaxInt64 {
		g.st.Dropped++
		g.resyncLocked(ReasonMalformed)
		return
	}
	prior := t.lastSeq
	t.lastSeq = int64(ev.EventID)
	if ev.Data.Type == kvevents.TRTCreated {
		// A fresh cache (event ids restart at 0 with it). At the start of a
		// run there is nothing to clear; later it is an engine restart,
		// whose configuration may have changed: admission is asked again
		// before the next drain.
		if prior >= 0 {
			g.resyncLocked(ReasonCreated)
			g.st.Admission = AdmissionPending
		} else {
			g.x.Clear(g.cfg.Endpoint)
			t.reset()
		}
		return
	}
	if v := DecideSeq(prior, ev.EventID, g.cfg.SeqWindow); !v.Keep {
		g.resyncLocked(v.Reason)
	}
	ep := g.cfg.Endpoint
	switch ev.Data.Type {
	case kvevents.TRTStored:
		if !g.windowOK(ev.WindowSize) {
			g.st.Skipped++
			return
		}
		var prev []byte
		if p := ev.Data.ParentHash; p != nil {
			pe, ok := t.chain[p.Value]
			if p.Hex != "" || !ok {
				g.st.Dropped++
				return
			}
			prev = pe.digest[:]
		}
		for i := range ev.Data.Blocks {
			b := &ev.Data.Blocks[i]
			if b.BlockHash.Hex != "" || !g.eligible(b) {
				g.st.Skipped += uint64(len(ev.Data.Blocks) - i)
				break
			}
			t.tokens = b.TokenIDs(t.tokens[:0])
			d := kvhash.SGLangPageHash(prev, t.tokens)
			key := kvhash.KeyFromDigest(g.algo, d[:])
			// Remember before storing: remembering may evict another
			// entry together with its block.
			g.rememberLocked(b.BlockHash.Value, chainEntry{key: key, digest: d})
			t.keys = append(t.keys[:0], key)
			g.x.Store(ep, t.keys)
			prev = d[:]
		}
	case kvevents.TRTRemoved:
		if !g.windowOK(ev.WindowSize) {
			g.st.Skipped++
			return
		}
		t.keys = t.keys[:0]
		for _, h := range ev.Data.BlockHashes {
			if e, ok := t.chain[h.Value]; ok && h.Hex == "" {
				t.keys = append(t.keys, e.key)
				delete(t.chain, h.Value)
			}
		}
		g.x.Remove(ep, t.keys)
	default:
		// "updated" moves a block between cache levels or priorities; it
		// stays reusable, so the inventory does not change. Unknown types
		// still advanced the sequence above.
		g.st.Skipped++
	}
}

// windowOK pins the first attention window seen and accepts only it. An
// event without a window (0: an executor from before variable sliding-window
// attention, which has a single window) is accepted.
func (g *Ingester) windowOK(w int64) bool {
	t := g.trt
	if w == 0 {
		return true
	}
	if !t.hasWindow {
		t.window, t.hasWindow = w, true
	}
	return w == t.window
}

// eligible reports whether a stored block can be routed on: exactly
// BlockSize plain-text tokens (no extra ids: multimodal placeholders share
// token ids with text), no cache salt, no multimodal keys, no LoRA adapter.
// Such blocks' KV differs from what the same token ids produce in a plain
// prompt, and the routing key (the SGLang chain over token ids) cannot tell.
func (g *Ingester) eligible(b *kvevents.TRTStoredBlock) bool {
	if len(b.Tokens) != g.cfg.BlockSize {
		return false
	}
	for _, tok := range b.Tokens {
		if tok.TokenExtraID != 0 {
			return false
		}
	}
	if b.LoraID != nil && *b.LoraID != 0 {
		return false
	}
	return absentJSON(b.CacheSalt) && absentJSON(b.MMKeys)
}

// absentJSON treats a missing field, null and an empty array or object as
// absent.
func absentJSON(raw json.RawMessage) bool {
	r := bytes.TrimSpace(raw)
	if len(r) == 0 || bytes.Equal(r, []byte("null")) {
		return true
	}
	var v any
	if json.Unmarshal(r, &v) != nil {
		return false
	}
	switch v := v.(type) {
	case []any:
		return len(v) == 0
	case map[string]any:
		return len(v) == 0
	case string:
		return v == ""
	}
	return false
}

// rememberLocked adds a chain entry, first forgetting an arbitrary one (and
// its block in the Index) when the map is full: an indexed key without a
// chain entry could never be removed, and a phantom block is worse than a
// forgotten one.
func (g *Ingester) rememberLocked(h uint64, e chainEntry) {
	t := g.trt
	if _, ok := t.chain[h]; !ok && len(t.chain) >= g.cfg.MaxChain {
		for old, oe := range t.chain {
			delete(t.chain, old)
			g.x.Remove(g.cfg.Endpoint, []uint64{oe.key})
			break
		}
	}
	t.chain[h] = e
}

func sleepCtx(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}
