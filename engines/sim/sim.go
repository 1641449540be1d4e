// Package sim simulates the inference engines llmgw routes to — vLLM,
// SGLang, TensorRT-LLM and llama.cpp — faithfully enough that the gateway
// can be developed, tested and benchmarked against them without GPUs.
//
// A Sim speaks its persona's HTTP wire contract (endpoints, JSON shapes, SSE
// framing, error bodies, metric names), keeps a bounded LRU prefix cache
// keyed by the engine's own block hashes, publishes that cache's changes as
// the engine does (ZMQ KV events for vLLM and SGLang, the destructive
// /kv_cache_events drain for TensorRT-LLM), models latency (prefill cost per
// uncached token, decode cost per token, a concurrency limit with a FIFO
// queue), and implements each engine's prefill/decode hand-off. Every request
// leaves a receipt at GET /_sim/receipts; faults are injected with
// POST /_sim/faults. Several Sims can run in one process.
//
// The personas are checked against the engines, not against themselves:
// source_conformance_test.go replays the fixture sets built from each
// engine's public source (engines/<engine>/testdata, see their PROVENANCE)
// and the llama.cpp captures. The golden files under testdata/golden pin the
// simulator's own bytes against regressions; they prove nothing about an
// engine.
package sim

import (
	"context"
	"errors"
	"fmt"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/valyala/fasthttp"

	"github.com/llmgw/llmgw/engines"
	_ "github.com/llmgw/llmgw/engines/all" // the personas' adapters
	"github.com/llmgw/llmgw/engines/kvhash"
	"github.com/llmgw/llmgw/engines/tokenizer"
)

// Addrs are the addresses a Sim listens on. A field is "" when the persona
// or configuration has no such endpoint.
type Addrs struct {
	// HTTP is the host:port of the OpenAI-compatible server.
	HTTP string `json:"http"`
	// Events is the ZMQ endpoint of the KV event PUB socket (tcp://host:port).
	Events string `json:"events"`
	// Replay is the ZMQ endpoint of the KV event replay ROUTER socket.
	Replay string `json:"replay"`
	// Bootstrap is the host:port of the SGLang prefill bootstrap server.
	Bootstrap string `json:"bootstrap"`
	// EventsByRank and ReplayByRank list every data-parallel rank's
	// endpoints (rank 0 first) when Config.DPRanks > 1.
	EventsByRank []string `json:"events_by_rank,omitempty"`
	ReplayByRank []string `json:"replay_by_rank,omitempty"`
}

// dpRank is one data-parallel rank: its own prefix cache and publisher.
type dpRank struct {
	cache  *prefixCache
	events *eventHub // nil when events are off
}

// Sim is one running simulated engine. Its methods are safe for concurrent
// use.
type Sim struct {
	cfg    Config
	ctx    context.Context
	cancel context.CancelFunc

	ln       net.Listener
	srv      *fasthttp.Server
	serveErr chan error
	addrs    Addrs
	engineID string
	version  string // the catalog's release of the engine, reported by its version endpoint
	// adapter is the persona's engine contract (engines/<engine>).
	adapter engines.Adapter

	tok    tokenizer.Tokenizer
	render tokenizer.Renderer
	bos    []uint32      // prepended to text prompts when the model's config says so
	hasher kvhash.Hasher // nil for TensorRT-LLM, whose engine key is chained directly
	ranks  []*dpRank
	rr     atomic.Uint64 // round-robin rank choice

	slots   chan struct{} // nil when concurrency is unbounded
	running atomic.Int64
	waiting atomic.Int64
	reqSeq  atomic.Uint64
	started time.Time
	ready   time.Time       // llama.cpp answers "Loading model" before this
	llama   *llamaTransport // llama.cpp's connection behaviour; nil for other personas
	lslots  llamaSlotTable  // llama.cpp's slots

	metrics  metrics
	promOnce sync.Once            // builds promReg on the first scrape
	promReg  *prometheus.Registry // holds collector{s}; see renderMetrics
	promErr  error
	faults   faultState
	receipts receiptLog

	trt        *trtEventQueue
	boot       *bootstrapServer
	bootClient bootstrapClient
	trtCtxSeq  atomic.Uint64

	wg        sync.WaitGroup
	closeOnce sync.Once
	closeErr  error
}

// Start validates cfg, binds every socket and serves until ctx ends or Close
// is called. It returns once all listeners are bound, so Addrs is final.
func Start(ctx context.Context, cfg Config) (*Sim, error) {
	cfg, err := cfg.withDefaults()
	if err != nil {
		return nil, err
	}
	adapter, err := engines.For(cfg.Engine)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrConfig, err)
	}
	s := &Sim{cfg: cfg, serveErr: make(chan error, 1)}
	if s.version, err = engineVersion(cfg.Engine); err != nil {
		return nil, err
	}
	if s.adapter, err = engines.For(cfg.Engine); err != nil {
		return nil, fmt.Errorf("%w: %w", ErrConfig, err)
	}
	for i := 0; i < cfg.DPRanks; i++ {
		s.ranks = append(s.ranks, &dpRank{cache: newPrefixCache(cfg.CacheBlocks)})
	}
	s.receipts.limit = maxReceipts
	if err := s.initTokenizer(); err != nil {
		return nil, err
	}
	// An engine whose events are drained over HTTP (TensorRT-LLM) publishes
	// token ids, not keys; the others key their prefix cache by the hash.
	if kv := s.adapter.KV(); kv != nil && kv.Transport == engines.EventsHTTPPoll {
		s.trt = newTRTEventQueue(cfg.CacheBlocks)
		s.trt.faults = &s.faults
	} else {
		h, err := kvhash.New(kvhash.Algo(cfg.HashAlgo), cfg.BlockSize, cfg.HashSeed)
		if err != nil {
			return nil, fmt.Errorf("%w: %w", ErrConfig, err)
		}
		s.hasher = h
	}
	if cfg.MaxConcurrency > 0 {
		s.slots = make(chan struct{}, cfg.MaxConcurrency)
	}
	s.ctx, s.cancel = context.WithCancel(ctx)
	s.ln, err = net.Listen("tcp", cfg.Listen)
	if err != nil {
		s.cancel()
		return nil, fmt.Errorf("sim: listen %s: %w", cfg.Listen, err)
	}
	if cfg.Engine == engines.LlamaCpp {
		s.llama = newLlamaTransport(s.ctx, cfg)
		s.ln = s.llama.listener(s.ln)
	}
	s.addrs.HTTP = s.ln.Addr().String()
	s.engineID = fmt.Sprintf("%s-sim-%s", cfg.Engine, portOf(s.addrs.HTTP))
	s.started = cfg.Clock()
	s.ready = s.started.Add(cfg.LoadingFor)

	if err := s.startSidecars(); err != nil {
		s.cancel()
		_ = s.ln.Close()
		s.stopSidecars()
		return nil, err
	}
	s.srv = &fasthttp.Server{
		Handler:              s.handle,
		Name:                 serverName(cfg.Engine),
		NoDefaultContentType: true,
		CloseOnShutdown:      true,
		MaxRequestBodySize:   maxBodyBytes,
		// fasthttp's idle-worker cleaner checks for shutdown only between
		// sleeps of this length; keep it short so Close is prompt.
		MaxIdleWorkerDuration: idleWorkerCheck,
		// The engine's HTTP server closes a kept-alive connection idle this
		// long (uvicorn's timeout_keep_alive for the Python servers); zero
		// when the adapter knows no limit, which fasthttp reads as none.
		IdleTimeout: adapter.Conn().IdleTimeout,
	}
	if s.llama != nil {
		s.llama.configure(s.srv)
	}
	s.wg.Add(2)
	go func() {
		defer s.wg.Done()
		s.serveErr <- s.srv.Serve(s.ln)
	}()
	go func() {
		defer s.wg.Done()
		<-s.ctx.Done()
		// Ending the context closes the server even without Close; Close
		// itself is idempotent and waits. Closing the listener too covers a
		// Shutdown that runs before Serve has registered it.
		_ = s.srv.Shutdown()
		_ = s.ln.Close()
	}()
	return s, nil
}

// idleWorkerCheck bounds how long fasthttp keeps an idle worker goroutine
// and how long its cleaner outlives Close.
const idleWorkerCheck = 100 * time.Millisecond

// maxBodyBytes bounds request bodies (vLLM has no hard cap; 16 MiB is ample
// for the longest contexts the simulated models accept).
const maxBodyBytes = 16 << 20

func (s *Sim) startSidecars() error {
	// KVEvents is off unless the adapter's transport is ZMQ (withDefaults).
	if s.cfg.KVEvents != KVEventsOff {
		for r, rank := range s.ranks {
			hub, err := newEventHub(s.ctx, s.cfg, &s.faults, r)
			if err != nil {
				return err
			}
			rank.events = hub
			ev, rp := hub.addrs()
			if r == 0 {
				s.addrs.Events, s.addrs.Replay = ev, rp
			}
			if len(s.ranks) > 1 {
				s.addrs.EventsByRank = append(s.addrs.EventsByRank, ev)
				s.addrs.ReplayByRank = append(s.addrs.ReplayByRank, rp)
			}
		}
	}
	if pd := s.adapter.PD(); pd != nil && pd.BootstrapPort() != 0 && s.cfg.Role != RoleDecode {
		b, err := startBootstrap(s.ctx, s.cfg.BootstrapListen, s.cfg.RendezvousTimeout)
		if err != nil {
			return err
		}
		s.boot = b
		s.addrs.Bootstrap = b.addr
	}
	return nil
}

func (s *Sim) stopSidecars() {
	for _, r := range s.ranks {
		if r.events != nil {
			r.events.close()
		}
	}
	if s.boot != nil {
		s.boot.close()
	}
	s.bootClient.close()
}

// Addrs returns the bound addresses; they never change after Start (a
// publisher restart fault rebinds the same ports). The slices are copies.
func (s *Sim) Addrs() Addrs {
	a := s.addrs
	if len(a.EventsByRank) > 0 {
		a.EventsByRank = append([]string(nil), a.EventsByRank...)
		a.ReplayByRank = append([]string(nil), a.ReplayByRank...)
	}
	return a
}

// cacheLen is the number of cached blocks over all ranks.
func (s *Sim) cacheLen() int {
	n := 0
	for _, r := range s.ranks {
		n += r.cache.len()
	}
	return n
}

// Close stops the HTTP server, the event publisher and the bootstrap server
// and waits for every goroutine the Sim started. It is idempotent and
// returns the first shutdown error.
func (s *Sim) Close() error {
	s.closeOnce.Do(func() {
		s.cancel()
		err := s.srv.Shutdown()
		_ = s.ln.Close() // Serve may not have started when Shutdown ran
		s.wg.Wait()
		if serr := <-s.serveErr; serr != nil && !errors.Is(serr, net.ErrClosed) {
			err = errors.Join(err, serr)
		}
		s.stopSidecars()
		if err != nil {
			s.closeErr = fmt.Errorf("sim: close: %w", err)
		}
	})
	return s.closeErr
}

// Receipts returns a copy of the receipts logged so far, oldest first (the
// same data as GET /_sim/receipts).
func (s *Sim) Receipts() []Receipt { return s.receipts.snapshot() }

func (s *Sim) initTokenizer() error {
	tok, render, bos, addBOS, err := loadTokenizer(s.cfg.Tokenizer, s.cfg.Model)
	if err != nil {
		return fmt.Errorf("%w: tokenizer %q: %w", ErrConfig, s.cfg.Tokenizer, err)
	}
	s.tok, s.render = tok, render
	if addBOS {
		s.bos = []uint32{bos}
	}
	return nil
}

func serverName(k engines.Kind) string {
	switch k {
	case engines.LlamaCpp:
		return "llama.cpp"
	default:
		return "uvicorn"
	}
}

func portOf(hostport string) string {
	_, p, err := net.SplitHostPort(hostport)
	if err != nil {
		return "0"
	}
	return p
}

func hostOf(hostport string) string {
	h, _, err := net.SplitHostPort(hostport)
	if err != nil {
		return hostport
	}
	return h
}

// nextRequestID returns a 32-hex-digit id, deterministic for a given seed and
// request order (so runs with a pinned seed give identical receipts).
func (s *Sim) nextRequestID() string {
	n := s.reqSeq.Add(1)
	a := splitmix64(uint64(s.cfg.Seed) ^ n*0x9e3779b97f4a7c15)
	b := splitmix64(a ^ n)
	var buf [32]byte
	const hex = "0123456789abcdef"
	for i := 0; i < 16; i++ {
		buf[i] = hex[(a>>(60-4*i))&0xf]
		buf[16+i] = hex[(b>>(60-4*i))&0xf]
	}
	return string(buf[:])
}

func splitmix64(x uint64) uint64 {
	x += 0x9e3779b97f4a7c15
	x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9
	x = (x ^ (x >> 27)) * 0x94d049bb133111eb
	return x ^ (x >> 31)
}
