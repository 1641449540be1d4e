package kvindex

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/llmgw/llmgw/engines"
	_ "github.com/llmgw/llmgw/engines/all" // the adapters NewIngester asks
	"github.com/llmgw/llmgw/engines/kvevents"
	"github.com/llmgw/llmgw/engines/kvhash"
)

// Errors from NewIngester and Run; match them with errors.Is.
var (
	// ErrConfig classifies every configuration error NewIngester returns.
	ErrConfig = errors.New("kvindex: invalid ingest config")
	// ErrSoleConsumer reports that another Ingester in this process is
	// already draining the same TensorRT-LLM /kv_cache_events endpoint.
	// Reading that endpoint removes the events, so two readers would each
	// see gaps and build wrong inventories.
	ErrSoleConsumer = errors.New("kvindex: another ingester already drains this TensorRT-LLM worker")
	// ErrRunning reports a second concurrent Run of the same Ingester.
	ErrRunning = errors.New("kvindex: ingester is already running")
)

// Defaults for the zero values of IngestConfig.
const (
	DefaultPollMin = 5 * time.Millisecond
	// DefaultPollMax bounds the idle back-off: an idle TensorRT-LLM worker
	// is drained twice a second instead of about 46 times (the reference
	// gateway's 20 ms bound). Events are never waited for that long after
	// this gateway sends the worker a request or gets its answer: Kick
	// polls at once and the cadence restarts at PollMin. It stays well below trtllm-serve's
	// keep-alive (uvicorn, 5 s: engines/trtllm.IdleTimeout), so the
	// drains reuse one connection.
	DefaultPollMax          = 500 * time.Millisecond
	DefaultMaxResponseBytes = 64 << 20
	DefaultAdmissionRetry   = 5 * time.Second
	DefaultAdmissionRecheck = 60 * time.Second
	defaultServerInfoLimit  = 1 << 20
	defaultServerInfoTO     = 5 * time.Second
	defaultHTTPTimeout      = 30 * time.Second
)

// IngestConfig configures one endpoint's event ingestion. The zero value of
// every optional field selects the documented default.
type IngestConfig struct {
	// Engine is the engine whose events are ingested; its adapter's
	// KV().Transport says how (ZMQ streams, or the HTTP drain).
	Engine engines.Kind
	// Endpoint is the endpoint's index in the Index.
	Endpoint int

	// ZMQ lists the engine's KV-event PUB addresses ("tcp://host:port") for
	// vLLM and SGLang: one per data-parallel rank. All streams feed the same
	// endpoint inventory. Replay lists the matching replay ROUTER addresses,
	// positionally; it is empty (no replay anywhere) or as long as ZMQ, with
	// "" for a stream without replay.
	ZMQ    []string
	Replay []string
	// Topic is the subscription prefix ("" = every topic).
	Topic string
	// MinBackoff and MaxBackoff bound the ZMQ reconnect delay (defaults from
	// kvevents: 100 ms and 5 s).
	MinBackoff, MaxBackoff time.Duration

	// HTTPBase is a TensorRT-LLM worker's base URL ("http://host:port"),
	// where POST /kv_cache_events and GET /server_info are served.
	HTTPBase string
	// PollMin and PollMax bound the adaptive poll interval: it starts at
	// PollMin, grows ×1.5 per empty response up to PollMax and returns to
	// PollMin when events arrive or Kick is called. Defaults 5 ms and
	// 500 ms.
	PollMin, PollMax time.Duration
	// MaxResponseBytes caps one /kv_cache_events body (default 64 MiB). A
	// larger body is a lost drain: the inventory is cleared.
	MaxResponseBytes int64
	// MaxEvents caps the events of one drain (default
	// kvevents.DefaultTRTMaxEvents).
	MaxEvents int
	// MaxChain caps the TensorRT-LLM engine-hash → routing-key map (default:
	// the Index's per-endpoint cap). When full, an arbitrary entry is
	// forgotten together with its block in the Index, so that a later
	// removal can never be missed.
	MaxChain int
	// AdmissionRetry is the wait before asking /server_info again when it
	// could not be read (default 5 s); AdmissionRecheck the wait after a
	// refusal (default 60 s).
	AdmissionRetry, AdmissionRecheck time.Duration
	// HTTPClient is used for TensorRT-LLM requests; nil means a private
	// client with a 30 s timeout whose idle connections are closed when Run
	// returns.
	HTTPClient *http.Client

	// BlockSize is the rule's kvBlockSize. TensorRT-LLM: required; the
	// worker's tokens_per_block must equal it and only blocks of exactly this
	// many tokens are indexed. vLLM/SGLang: optional; when set, BlockStored
	// events of another block size (SGLang's trailing partial page) are
	// skipped, since a prompt's full-block keys can never match them.
	BlockSize int
	// Hasher computes TensorRT-LLM routing keys: kvhash.BlockHashTRTLLM or
	// kvhash.SHA256SGLang with BlockSize tokens per block; nil selects
	// kvhash.BlockHashTRTLLM. vLLM and SGLang publish routing keys
	// themselves and must leave it nil.
	Hasher kvhash.Hasher
	// SeqWindow is the forward gap tolerated without clearing; 0 (the
	// default) clears on any unrecovered gap. See DecideSeq.
	SeqWindow uint64
	// Group is the vLLM KV-cache group whose events are indexed (hybrid
	// models publish one stream of events per group; only full-attention
	// residency predicts a prefix hit). Default 0.
	Group int64
	// Logger receives resync and admission messages; nil discards them.
	Logger *slog.Logger
}

// StreamState is one ZMQ stream's (or the TRT poller's) connection state.
type StreamState struct {
	Endpoint   string
	Connected  bool
	LastSeq    int64
	Reconnects uint64
}

// IngestState is a snapshot of an Ingester's health and counters.
type IngestState struct {
	// Connected is true while every stream is connected (TRT: the last poll
	// succeeded).
	Connected bool
	// Admission is the TRT verdict: "pending", "admitted" or
	// "refused: <why>"; "" for vLLM and SGLang.
	Admission string
	// LastSeq is the last applied sequence number of the first stream
	// (TRT: the last event_id), -1 before any.
	LastSeq int64
	// Events counts events in accepted batches, Batches accepted batches
	// (TRT: drains that returned events).
	Events, Batches uint64
	// Malformed counts batches (TRT: drain responses) that could not be
	// decoded; they are dropped whole and the inventory is cleared.
	Malformed uint64
	// MalformedEvents counts single TRT events rejected as malformed inside
	// an otherwise valid drain response; only that event is lost.
	MalformedEvents uint64
	// Dropped counts events that could not be applied: TRT stored events
	// whose parent is unknown, or whose hashes are not 64-bit handles.
	Dropped uint64
	// Skipped counts events or blocks deliberately not indexed: non-GPU
	// media, other KV groups or attention windows, blocks of another size,
	// ineligible TRT blocks (and the rest of their run), "updated" and
	// unknown TRT event types.
	Skipped uint64
	// Resyncs counts inventory clears after the start; LastResyncReason and
	// LastResync describe the latest.
	Resyncs          uint64
	LastResyncReason string
	LastResync       time.Time
	// Reconnects counts connection re-establishments.
	Reconnects uint64
	// LastEvent is when the last accepted batch was applied.
	LastEvent time.Time
	// Streams details each ZMQ stream (or the TRT poller).
	Streams []StreamState
	// Polls counts TRT drain requests sent; PollInterval is the wait
	// before the next one (0 for vLLM and SGLang).
	Polls        uint64
	PollInterval time.Duration
}

// Ingester feeds one endpoint's KV-cache events into an Index and tracks the
// stream's health. Its methods are safe for concurrent use; Run may be
// called once at a time.
type Ingester struct {
	cfg    IngestConfig
	x      *Index
	log    *slog.Logger
	algo   kvhash.Algo // TRT routing-key algorithm
	runner atomic.Bool

	// mu serialises application (several DP-rank streams write one
	// endpoint) and guards st and streams.
	mu      sync.Mutex
	st      IngestState
	streams []streamSeq
	subs    []*kvevents.Subscriber
	trt     *trtState // nil unless Engine is trtllm

	// kick wakes the TRT poller (Kick); sleep is its wait, replaced by
	// tests that count the schedule instead of waiting it out.
	kick  chan struct{}
	sleep func(ctx context.Context, d time.Duration, kick <-chan struct{}) (ok, kicked bool)
}

type streamSeq struct {
	endpoint string
	lastSeq  int64
	scratch  kvevents.Batch
	// restarts is the subscriber's Restarts count already acted on;
	// clearedEarly says the inventory was cleared for the latest one
	// before its Restarted batch arrived (see CheckRestarts).
	restarts     uint64
	clearedEarly bool
}

// NewIngester validates cfg against x and returns an Ingester; Run starts
// it. For TensorRT-LLM it fails with ErrSoleConsumer while another Ingester
// of this process is running against the same worker.
func NewIngester(cfg IngestConfig, x *Index) (*Ingester, error) {
	if x == nil {
		return nil, fmt.Errorf("%w: nil index", ErrConfig)
	}
	if cfg.Endpoint < 0 || cfg.Endpoint >= x.Endpoints() {
		return nil, fmt.Errorf("%w: endpoint %d out of range [0, %d)", ErrConfig, cfg.Endpoint, x.Endpoints())
	}
	if cfg.BlockSize < 0 || cfg.BlockSize > kvhash.MaxBlockSize {
		return nil, fmt.Errorf("%w: block size %d out of range", ErrConfig, cfg.BlockSize)
	}
	g := &Ingester{cfg: cfg, x: x, log: cfg.Logger, kick: make(chan struct{}, 1), sleep: pollSleep}
	if g.log == nil {
		g.log = slog.New(slog.DiscardHandler)
	}
	g.log = g.log.With("component", "kvindex", "engine", cfg.Engine, "endpoint", cfg.Endpoint)
	a, err := engines.For(cfg.Engine)
	if err != nil {
		return nil, fmt.Errorf("%w: %v", ErrConfig, err)
	}
	switch kv := a.KV(); {
	case kv.PublishesZMQ():
		if len(cfg.ZMQ) == 0 {
			return nil, fmt.Errorf("%w: %s needs at least one ZMQ endpoint", ErrConfig, cfg.Engine)
		}
		if len(cfg.Replay) != 0 && len(cfg.Replay) != len(cfg.ZMQ) {
			return nil, fmt.Errorf("%w: %d replay endpoints for %d ZMQ endpoints", ErrConfig, len(cfg.Replay), len(cfg.ZMQ))
		}
		for _, ep := range cfg.ZMQ {
			if !strings.Contains(ep, "://") {
				return nil, fmt.Errorf("%w: ZMQ endpoint %q has no transport (tcp://host:port)", ErrConfig, ep)
			}
		}
		if cfg.Hasher != nil {
			return nil, fmt.Errorf("%w: %s publishes routing keys; Hasher must be nil", ErrConfig, cfg.Engine)
		}
		g.streams = make([]streamSeq, len(cfg.ZMQ))
		for i, ep := range cfg.ZMQ {
			g.streams[i] = streamSeq{endpoint: ep, lastSeq: -1}
		}
	case kv.PolledOverHTTP():
		// The HTTP drain decoder is TensorRT-LLM's JSON event format, the
		// only engine with this transport.
		if err := g.initTRT(); err != nil {
			return nil, err
		}
	default:
		return nil, fmt.Errorf("%w: %s publishes no KV events", ErrConfig, a.Display())
	}
	g.st.LastSeq = -1
	return g, nil
}

// Run ingests until ctx ends and returns ctx.Err(), or an error at once when
// the Ingester is already running or (TRT) another Ingester drains the same
// worker. It first clears the endpoint's inventory, since whatever it holds
// was built from a stream whose position is unknown now. Connection failures
// are retried with backoff; hostile or malformed input is counted and
// dropped, never applied in part, and never makes it panic.
func (g *Ingester) Run(ctx context.Context) error {
	if !g.runner.CompareAndSwap(false, true) {
		return ErrRunning
	}
	defer g.runner.Store(false)
	if g.trt != nil {
		return g.runTRT(ctx)
	}
	return g.runZMQ(ctx)
}

func (g *Ingester) runZMQ(ctx context.Context) error {
	g.mu.Lock()
	g.x.Clear(g.cfg.Endpoint)
	for i := range g.streams {
		g.streams[i].lastSeq = -1
	}
	g.subs = make([]*kvevents.Subscriber, len(g.cfg.ZMQ))
	for i, ep := range g.cfg.ZMQ {
		replay := ""
		if len(g.cfg.Replay) > 0 {
			replay = g.cfg.Replay[i]
		}
		g.subs[i] = kvevents.NewSubscriber(kvevents.SubscriberConfig{
			Endpoint: ep, ReplayEndpoint: replay, Topic: g.cfg.Topic,
			MinBackoff: g.cfg.MinBackoff, MaxBackoff: g.cfg.MaxBackoff,
		})
	}
	subs := g.subs
	g.mu.Unlock()

	var wg sync.WaitGroup
	for i, sub := range subs {
		wg.Go(func() {
			_ = sub.Run(ctx, func(m kvevents.Message) {
				if m.Restarted {
					// The publisher is not the stream applied so far (its
					// replay buffer disagrees): a restart whose sequence
					// numbers may already have caught up. Start over,
					// unless CheckRestarts already did for this restart.
					g.mu.Lock()
					s := &g.streams[i]
					if s.clearedEarly {
						s.clearedEarly = false
					} else {
						s.lastSeq = -1
						g.resyncLocked(ReasonRestart)
					}
					s.restarts = max(s.restarts, sub.State().Restarts)
					g.mu.Unlock()
				}
				g.handleBatch(i, m.Seq, m.Payload)
			})
		})
	}
	wg.Wait()
	return ctx.Err()
}

// handleBatch decodes and applies one batch of stream i. It is the whole
// ZMQ application path (the fuzz target drives it directly): sequence
// verdict first, then decode, then apply, all under g.mu so that the streams
// of a multi-rank endpoint apply one batch at a time.
func (g *Ingester) handleBatch(i int, seq uint64, payload []byte) {
	s := &g.streams[i]
	g.mu.Lock()
	defer g.mu.Unlock()
	if seq > math.MaxInt64 {
		// No engine counts this far; such a seq is garbage, and what the
		// batch held is unknown.
		g.st.Malformed++
		g.resyncLocked(ReasonMalformed)
		return
	}
	v := DecideSeq(s.lastSeq, seq, g.cfg.SeqWindow)
	s.lastSeq = int64(seq)
	if !v.Keep {
		g.resyncLocked(v.Reason)
	}
	if _, err := kvevents.DecodeBatch(payload, &s.scratch); err != nil {
		// The batch consumed a sequence number, so its events are lost;
		// they may have removed blocks.
		g.st.Malformed++
		g.log.Warn("undecodable KV event batch", "seq", seq, "err", err)
		g.resyncLocked(ReasonMalformed)
		return
	}
	g.applyBatchLocked(s, &s.scratch)
}

// applyBatchLocked applies a decoded batch. An AllBlocksCleared from any
// rank clears the endpoint's whole inventory: the inventory is the union of
// the ranks' blocks without per-rank ownership (tracking owners would cost
// memory per block), so the cleared rank's blocks cannot be singled out, and
// over-clearing only costs the other ranks a cold window.
func (g *Ingester) applyBatchLocked(s *streamSeq, b *kvevents.Batch) {
	ep := g.cfg.Endpoint
	for i := range b.Events {
		e := &b.Events[i]
		switch e.Kind {
		case kvevents.BlockStored:
			if !g.indexable(e) || (g.cfg.BlockSize > 0 && e.BlockSize != g.cfg.BlockSize) {
				g.st.Skipped++
				continue
			}
			g.x.Store(ep, e.BlockHashes)
		case kvevents.BlockRemoved:
			if !g.indexable(e) {
				g.st.Skipped++
				continue
			}
			g.x.Remove(ep, e.BlockHashes)
		case kvevents.AllBlocksCleared:
			g.resyncLocked(ReasonCleared)
		}
	}
	g.st.Events += uint64(len(b.Events))
	g.st.Batches++
	g.st.LastEvent = time.Now()
}

// indexable reports whether an event describes the GPU-resident,
// full-attention KV cache, the only residency that predicts a prefix hit.
// Offload tiers (CPU, disk) publish their own stores and removals of the
// same hashes; mixing them in would let a CPU-tier removal delete a block
// the GPU still holds, or the reverse.
func (g *Ingester) indexable(e *kvevents.Event) bool {
	if e.Medium != nil && !strings.EqualFold(*e.Medium, "GPU") {
		return false
	}
	if e.GroupIdx != nil && *e.GroupIdx != g.cfg.Group {
		return false
	}
	if e.KVCacheSpecKind != nil && *e.KVCacheSpecKind != "full_attention" {
		return false
	}
	return e.SlidingWindow == nil
}

// resyncLocked clears the endpoint's inventory (and TRT chain state) and
// counts why.
func (g *Ingester) resyncLocked(reason string) {
	g.x.Clear(g.cfg.Endpoint)
	if g.trt != nil {
		g.trt.reset()
	}
	g.st.Resyncs++
	g.st.LastResyncReason = reason
	g.st.LastResync = time.Now()
	g.log.Info("KV inventory cleared", "reason", reason)
}

// CheckRestarts clears the inventory as soon as a subscriber has found,
// on reconnecting, that its publisher restarted. The subscriber learns it
// from the replay buffer right after the reconnect but reports it only on
// its next delivered batch; a restarted engine with an empty cache may
// publish nothing for a long while, and until then the inventory would
// describe blocks the engine no longer holds (phantom hits). Routing calls
// this before matching a request against the index. Safe for concurrent
// use; cheap when nothing changed.
func (g *Ingester) CheckRestarts() {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.checkRestartsLocked()
}

func (g *Ingester) checkRestartsLocked() {
	for i := range g.streams {
		if i >= len(g.subs) || g.subs[i] == nil {
			continue
		}
		s := &g.streams[i]
		if n := g.subs[i].State().Restarts; n > s.restarts {
			s.restarts = n
			s.lastSeq = -1
			s.clearedEarly = true
			g.resyncLocked(ReasonRestart)
		}
	}
}

// State returns a snapshot of the Ingester's state. Safe for concurrent use.
func (g *Ingester) State() IngestState {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.checkRestartsLocked()
	st := g.st
	st.Streams = nil
	if g.trt != nil {
		st.LastSeq = g.trt.lastSeq
		st.Streams = []StreamState{{Endpoint: g.cfg.HTTPBase, Connected: g.st.Connected, LastSeq: g.trt.lastSeq, Reconnects: g.st.Reconnects}}
		return st
	}
	st.Connected = len(g.streams) > 0
	st.Reconnects = 0
	for i, s := range g.streams {
		ss := StreamState{Endpoint: s.endpoint, LastSeq: s.lastSeq}
		if i < len(g.subs) && g.subs[i] != nil {
			sub := g.subs[i].State()
			ss.Connected, ss.Reconnects = sub.Connected, sub.Reconnects
		}
		st.Connected = st.Connected && ss.Connected
		st.Reconnects += ss.Reconnects
		st.Streams = append(st.Streams, ss)
	}
	if len(g.streams) > 0 {
		st.LastSeq = g.streams[0].lastSeq
	}
	return st
}
