// Package gateway is llmgw's data plane and management plane: an
// OpenAI-compatible full proxy on fasthttp that routes each completion to an
// endpoint of the rule serving its model, a management API that admits rules
// strictly and persists them atomically, active health probes, circuit
// breaking and Prometheus metrics.
package gateway

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"sort"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/valyala/fasthttp"

	"github.com/llmgw/llmgw/gateway/rule"
	"github.com/llmgw/llmgw/gateway/store"
)

// Config configures a Server. The zero value of every optional field takes
// the documented default.
type Config struct {
	// Listen is the shared data-plane address, e.g. "127.0.0.1:8080"; port 0
	// picks a free port (see Server.Addr).
	Listen string
	// Admin is the management API address. Default "127.0.0.1:8081". A
	// non-loopback address requires AdminToken.
	Admin string
	// AdminToken, when set, is required as "Authorization: Bearer <token>"
	// on every mutating admin call.
	AdminToken string
	// StateDir holds the persisted rules. Required.
	StateDir string
	// MaxBodyBytes bounds request bodies; default 8 MiB. Larger bodies get 413.
	MaxBodyBytes int
	// WriteTimeout bounds each write of a response to a client (the
	// deadline moves with every chunk of a stream, so it bounds a stall, not
	// a stream's length): a client that stops reading releases its worker
	// after it. Default DefaultWriteTimeout.
	WriteTimeout time.Duration
	// BufferBudget bounds the bytes of response bodies the gateway holds in
	// memory at once, over all requests. Default DefaultBufferBudget.
	BufferBudget int64
	// TLSCert and TLSKey, when both set, serve the data plane over TLS.
	TLSCert, TLSKey string
	// KVMaxBlocks bounds each endpoint's KV-exact inventory (blocks, LRU
	// beyond it); default 1,048,576 (about 64 MiB per endpoint at the
	// index's ≤ 64 bytes per block).
	KVMaxBlocks int
	// KVTokenCacheBytes is the arena of each KV-exact rule's token cache
	// (the tokenized segments of recent prompts, or for kvTokenizer
	// "engine" the /tokenize answers), in bytes, outside the Go heap;
	// default DefaultKVTokenCacheBytes.
	KVTokenCacheBytes int
	// ReleaseIdleBuffers gives a keep-alive client connection's read and
	// write buffers back to a shared pool while it waits for its next
	// request (fasthttp's ReduceMemoryUsage), so an idle connection holds
	// little more than its goroutine (measured: about 10 KB instead of
	// about 22 KB); the price is about two more system calls per request
	// (the first byte of each is read alone). Off by default.
	ReleaseIdleBuffers bool
	// LogPayloads logs prompt and completion bodies at debug level. Off by
	// default: payloads may carry personal data.
	LogPayloads bool
	// DataPlane is how data listeners serve their connections: PlaneLoop
	// (event loops; Linux only, the default there) or PlaneGoroutine
	// (fasthttp, a goroutine per connection; the default elsewhere). A
	// TLS data plane is always served by goroutines. plane.go says which
	// requests the loop plane hands to the goroutine plane.
	DataPlane string
	// Loops is the loop plane's number of event loops, each on a thread
	// of its own; default: the CPUs the process may run on, at most
	// GOMAXPROCS.
	Loops int
	// NoIOURing: the loop plane writes each request to its worker with a
	// write(2) of its own instead of submitting a loop turn's requests
	// together through io_uring (where the kernel offers it; see
	// internal/evloop, "Batched sends").
	NoIOURing bool
	// Pprof serves net/http/pprof at /debug/pprof/ on the admin listener.
	// Off by default; when AdminToken is set, every profile request needs
	// it (a heap profile shows what the process holds).
	Pprof bool
	// EndpointSource discovers the endpoints of rules with endpoints_from
	// (package k8s); nil: such rules are refused.
	EndpointSource EndpointSource
	// ReadyzStrict makes /readyz require every rule to be ready (the form
	// before issue 42). Off: /readyz is ready while any rule can serve,
	// and names the rules that cannot.
	ReadyzStrict bool
	// AwaitInitialRules holds /readyz at 503 ("starting") after Start
	// until InitialRulesInstalled is called: for a caller that installs
	// rules of its own after Start (serve's --rules, --rules-from
	// kubernetes). Off: ready once Start has installed the persisted rules.
	AwaitInitialRules bool
	// RuleOwner, when set, says the rules are written elsewhere (llmgw
	// serve --rules-from kubernetes: the cluster's Rule objects): given a
	// rule's name it names the object that owns it, and the admin API
	// refuses to create, replace or delete rules (409 rules_managed).
	// Drain and undrain stay allowed: they are not part of a rule.
	RuleOwner func(name string) string
	// Collectors are series of other components served on /metrics beside
	// the gateway's own (package k8s's watch health).
	Collectors []prometheus.Collector
	// Logger receives structured logs; nil means slog.Default().
	Logger *slog.Logger
}

// Defaults of Config.
const (
	// DefaultWriteTimeout is nginx's send_timeout default (60 s): the
	// longest pause in a client's reading that does not cut it off.
	DefaultWriteTimeout = 60 * time.Second
	// DefaultBufferBudget is 256 MiB of buffered response bodies.
	DefaultBufferBudget = 256 << 20
)

// Server is a running gateway. Create it with New, start it with Start, and
// stop it with Close. Its methods are safe for concurrent use.
type Server struct {
	cfg     Config
	log     *slog.Logger
	store   *store.Store
	metrics *metrics

	ctx    context.Context
	cancel context.CancelFunc

	// mu serialises rule changes; the data plane reads table lock-free.
	mu        sync.Mutex
	rules     map[string]*ruleRuntime
	watches   map[string]*epWatch      // discovered rules' source watches, by name
	listeners map[string]*dataListener // by rule.ListenKey; "" = shared
	table     atomic.Pointer[routeTable]

	clientsMu sync.Mutex
	clients   map[clientKey]*fasthttp.HostClient
	kept      map[clientKey]*keptCount // the loop plane's kept connections, over its loops

	decisions *decisionLog
	budget    bufferBudget

	adminSrv *http.Server
	adminLn  net.Listener
	wg       sync.WaitGroup
	closed   atomic.Bool

	// initialDone: the rules given at start are installed (see
	// Config.AwaitInitialRules); draining: Drain was called.
	initialDone atomic.Bool
	draining    atomic.Bool
}

// routeTable is an immutable snapshot of which rule serves which model on
// which listener.
type routeTable struct {
	byListen map[string]*listenRoutes
}

type listenRoutes struct {
	byModel map[string]*ruleRuntime
	def     *ruleRuntime // model_name ""; nil when absent
	models  []string     // served model names, sorted (for /v1/models)
}

// dataListener is one data-plane address: a fasthttp server (the
// goroutine plane), and in front of it the loop plane when one serves the
// address (then ln is the loop plane's hand-over listener).
type dataListener struct {
	key   string
	ln    net.Listener
	retry *retryListener // the TCP listener under ln (TLS wraps it); nil with a loop plane
	srv   *fasthttp.Server
	loop  *loopPlane
}

// acceptState reports whether accepting on l fails, and why.
func (l *dataListener) acceptState() (addr string, failing bool, why string) {
	if l.loop != nil {
		failing, why = l.loop.acc.acceptState()
		return l.loop.acc.addr, failing, why
	}
	failing, why = l.retry.acceptState()
	return l.retry.addr, failing, why
}

// shutdown stops l: the loop plane first stops taking connections and
// finishes its answers, while the goroutine plane does the same with its
// own (both within ctx).
func (l *dataListener) shutdown(ctx context.Context) {
	done := make(chan struct{})
	go func() {
		defer close(done)
		if l.loop != nil {
			l.loop.close(ctx)
		}
	}()
	_ = l.srv.ShutdownWithContext(ctx)
	// fasthttp's Shutdown closes only the listeners its Serve has
	// registered; a Serve goroutine that has not run yet would start
	// serving after it. Closing the listener ourselves makes that Serve
	// return at once (a start-up race that hung Close).
	_ = l.ln.Close()
	<-done
}

// New validates cfg and opens the state directory. It starts nothing.
func New(cfg Config) (*Server, error) {
	if cfg.StateDir == "" {
		return nil, errors.New("gateway: a state directory is required (--state-dir)")
	}
	if cfg.Listen == "" {
		cfg.Listen = "127.0.0.1:8080"
	}
	if cfg.Admin == "" {
		cfg.Admin = "127.0.0.1:8081"
	}
	if cfg.MaxBodyBytes <= 0 {
		cfg.MaxBodyBytes = 8 << 20
	}
	if cfg.KVMaxBlocks <= 0 {
		cfg.KVMaxBlocks = 1 << 20
	}
	if cfg.KVTokenCacheBytes <= 0 {
		cfg.KVTokenCacheBytes = DefaultKVTokenCacheBytes
	}
	if cfg.WriteTimeout <= 0 {
		cfg.WriteTimeout = DefaultWriteTimeout
	}
	if cfg.BufferBudget <= 0 {
		cfg.BufferBudget = DefaultBufferBudget
	}
	switch cfg.DataPlane {
	case "", PlaneLoop, PlaneGoroutine:
	default:
		return nil, fmt.Errorf("gateway: data plane %q: want %q or %q", cfg.DataPlane, PlaneLoop, PlaneGoroutine)
	}
	if cfg.Loops < 0 {
		return nil, fmt.Errorf("gateway: %d event loops: want 0 (one per CPU) or more", cfg.Loops)
	}
	if cfg.DataPlane == PlaneLoop && !loopPlaneSupported {
		return nil, fmt.Errorf("gateway: data plane %q needs Linux (epoll); use %q", PlaneLoop, PlaneGoroutine)
	}
	if cfg.DataPlane == PlaneLoop && cfg.TLSCert != "" {
		return nil, fmt.Errorf("gateway: a TLS data plane is served by goroutines; data plane %q serves plain HTTP only", PlaneLoop)
	}
	if (cfg.TLSCert == "") != (cfg.TLSKey == "") {
		return nil, errors.New("gateway: TLS needs both a certificate and a key (--tls-cert and --tls-key)")
	}
	if cfg.AdminToken == "" && !isLoopbackAddr(cfg.Admin) {
		return nil, fmt.Errorf("gateway: refusing to serve the admin API on non-loopback address %s without a token; set --admin-token-file or bind it to 127.0.0.1", cfg.Admin)
	}
	st, err := store.Open(cfg.StateDir)
	if err != nil {
		return nil, fmt.Errorf("gateway: state directory: %w", err)
	}
	log := cfg.Logger
	if log == nil {
		log = slog.Default()
	}
	s := &Server{
		cfg:       cfg,
		log:       log,
		store:     st,
		rules:     map[string]*ruleRuntime{},
		watches:   map[string]*epWatch{},
		listeners: map[string]*dataListener{},
		clients:   map[clientKey]*fasthttp.HostClient{},
		decisions: newDecisionLog(1024),
	}
	s.initialDone.Store(!cfg.AwaitInitialRules)
	s.budget.limit = cfg.BufferBudget
	s.metrics = newMetrics(s)
	for _, c := range cfg.Collectors {
		if err := s.metrics.reg.Register(c); err != nil {
			return nil, fmt.Errorf("gateway: metrics collector: %w", err)
		}
	}
	s.table.Store(&routeTable{byListen: map[string]*listenRoutes{}})
	return s, nil
}

// plane is the data plane that serves the data listeners.
func (s *Server) plane() string {
	switch {
	case s.cfg.DataPlane != "":
		return s.cfg.DataPlane
	case loopPlaneSupported && s.cfg.TLSCert == "":
		return PlaneLoop
	}
	return PlaneGoroutine
}

// isLoopbackAddr reports whether a host:port names only loopback interfaces.
func isLoopbackAddr(addr string) bool {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return false
	}
	if host == "localhost" {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

// Start binds the shared data-plane listener and the admin listener, loads
// the persisted rules (binding their dedicated listeners), and starts
// serving. It returns once everything listens; serving goes on until Close
// or until ctx ends.
func (s *Server) Start(ctx context.Context) error {
	s.ctx, s.cancel = context.WithCancel(ctx)
	if _, err := s.ensureListener(""); err != nil {
		s.cancel()
		return err
	}
	saved, err := s.store.Load()
	if err != nil {
		s.Close()
		return fmt.Errorf("gateway: loading persisted rules: %w", err)
	}
	// Discovered rules resolve their endpoints first, without s.mu (their
	// updates take it).
	run := make([]*rule.Rule, len(saved))
	watches := map[string]*epWatch{}
	for i, r := range saved {
		run[i] = r
		if r.EndpointsFrom == nil {
			continue
		}
		w, eps, err := s.startWatch(r)
		if err != nil {
			s.Close()
			return fmt.Errorf("gateway: persisted rule %q: %w", r.Name, err)
		}
		watches[r.Name] = w
		run[i], _ = discovered(r, eps)
	}
	s.mu.Lock()
	for _, r := range run {
		if err := s.installLocked(r); err != nil {
			s.mu.Unlock()
			s.Close()
			return fmt.Errorf("gateway: persisted rule %q: %w", r.Name, err)
		}
	}
	for _, w := range watches {
		s.registerWatchLocked(w)
	}
	s.publishLocked()
	s.mu.Unlock()
	if err := s.startAdmin(); err != nil {
		s.Close()
		return err
	}
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		<-s.ctx.Done()
		ctx, cancel := context.WithTimeout(context.Background(), DefaultCloseTimeout)
		defer cancel()
		s.shutdown(ctx)
	}()
	s.log.Info("gateway started", "listen", s.Addr(), "admin", s.AdminAddr(), "rules", len(saved))
	return nil
}

// Addr is the shared data-plane listener's address.
func (s *Server) Addr() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	if l := s.listeners[""]; l != nil {
		return l.ln.Addr().String()
	}
	return ""
}

// RuleAddr is the address serving rule name: its dedicated listener, or the
// shared one. "" when the rule does not exist.
func (s *Server) RuleAddr(name string) string {
	s.mu.Lock()
	defer s.mu.Unlock()
	rt := s.rules[name]
	if rt == nil {
		return ""
	}
	if l := s.listeners[rt.listenKey]; l != nil {
		return l.ln.Addr().String()
	}
	return ""
}

// AdminAddr is the management API's address.
func (s *Server) AdminAddr() string {
	if s.adminLn == nil {
		return ""
	}
	return s.adminLn.Addr().String()
}

// InitialRulesInstalled ends the start-up hold of Config.AwaitInitialRules:
// /readyz answers by the rules from now on.
func (s *Server) InitialRulesInstalled() { s.initialDone.Store(true) }

// Drain begins a graceful stop: /readyz answers 503 ("draining") at once,
// so load balancers stop sending new connections, while the data listeners
// keep accepting and serving as before, except that every answer from now
// on says Connection: close, so that clients' keep-alive connections end
// after their next request and reconnect elsewhere. Shutdown ends it.
// Idempotent.
func (s *Server) Drain() {
	if !s.draining.Swap(true) {
		s.log.Info("draining: /readyz reports unready; the data plane keeps serving, closing each connection after its answer")
	}
}

// Draining reports whether Drain was called.
func (s *Server) Draining() bool { return s.draining.Load() }

// DefaultCloseTimeout is how long Close gives in-flight requests.
const DefaultCloseTimeout = 5 * time.Second

// Close stops every listener and background goroutine. In-flight requests
// are given up to DefaultCloseTimeout to finish. It is idempotent.
func (s *Server) Close() error {
	ctx, cancel := context.WithTimeout(context.Background(), DefaultCloseTimeout)
	defer cancel()
	return s.Shutdown(ctx)
}

// Shutdown stops the server: the admin API and the data listeners stop
// accepting, idle connections close, and requests and streams in flight
// (P/D ones included) finish until ctx ends, when the rest is cut; then
// background work stops. It returns once everything has; ctx.Err() when
// ctx ended first. Idempotent (a second call waits for the first).
func (s *Server) Shutdown(ctx context.Context) error {
	s.draining.Store(true)
	// Shut down before cancelling the server's context: P/D legs run
	// under it, and Start's context goroutine would shut down with its
	// own deadline. That goroutine is also why Shutdown does it itself:
	// when Start failed half-way it never ran, and wg.Wait would wait on
	// a data listener nobody stops.
	s.shutdown(ctx)
	if s.cancel != nil {
		s.cancel()
	}
	s.wg.Wait()
	return ctx.Err()
}

func (s *Server) shutdown(ctx context.Context) {
	if !s.closed.CompareAndSwap(false, true) {
		return
	}
	if s.adminSrv != nil {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		_ = s.adminSrv.Shutdown(ctx)
		cancel()
	}
	s.mu.Lock()
	lns := make([]*dataListener, 0, len(s.listeners))
	for _, l := range s.listeners {
		lns = append(lns, l)
	}
	rts := make([]*ruleRuntime, 0, len(s.rules))
	for _, rt := range s.rules {
		rts = append(rts, rt)
	}
	s.mu.Unlock()
	for _, l := range lns {
		l.shutdown(ctx)
	}
	for _, rt := range rts {
		rt.stop()
	}
	s.clientsMu.Lock()
	for _, hc := range s.clients {
		hc.CloseIdleConnections()
	}
	s.clientsMu.Unlock()
}

func timeoutCtx(d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	time.AfterFunc(d, cancel)
	return ctx
}

// ensureListener returns the listener for key, binding it when missing.
// Callers hold s.mu, except Start before anything else runs.
func (s *Server) ensureListener(key string) (*dataListener, error) {
	if l := s.listeners[key]; l != nil {
		return l, nil
	}
	if s.closed.Load() {
		// A listener bound now would never be shut down.
		return nil, fmt.Errorf("gateway: listen %q: %w", key, ErrServerClosed)
	}
	addr := key
	if key == "" {
		addr = s.cfg.Listen
	}
	var l *dataListener
	if s.plane() == PlaneLoop {
		lp, err := s.startLoopPlane(key, addr)
		if err != nil {
			return nil, err
		}
		l = &dataListener{key: key, ln: lp.hand, loop: lp}
	} else {
		tcp, err := net.Listen("tcp", addr)
		if err != nil {
			return nil, fmt.Errorf("gateway: listen %s: %w", addr, err)
		}
		retry := newRetryListener(tcp, s.metrics.acceptErrors, s.log)
		var ln net.Listener = retry
		if s.cfg.TLSCert != "" {
			cert, err := tls.LoadX509KeyPair(s.cfg.TLSCert, s.cfg.TLSKey)
			if err != nil {
				ln.Close()
				return nil, fmt.Errorf("gateway: TLS key pair: %w", err)
			}
			ln = tls.NewListener(ln, &tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12})
		}
		l = &dataListener{key: key, ln: ln, retry: retry}
	}
	l.srv = s.newDataServer(key)
	s.listeners[key] = l
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		if err := l.srv.Serve(l.ln); err != nil && !s.closed.Load() {
			s.log.Error("data listener stopped", "addr", addr, "err", err)
		}
	}()
	return l, nil
}

// acceptFailures lists the data listeners that cannot accept connections
// right now (address → latest accept error).
func (s *Server) acceptFailures() map[string]string {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out map[string]string
	for _, l := range s.listeners {
		if addr, failing, why := l.acceptState(); failing {
			if out == nil {
				out = map[string]string{}
			}
			out[addr] = why
		}
	}
	return out
}

// publishLocked rebuilds the routing table from s.rules. Caller holds s.mu.
func (s *Server) publishLocked() {
	t := &routeTable{byListen: map[string]*listenRoutes{}}
	for _, rt := range s.rules {
		lr := t.byListen[rt.listenKey]
		if lr == nil {
			lr = &listenRoutes{byModel: map[string]*ruleRuntime{}}
			t.byListen[rt.listenKey] = lr
		}
		if rt.rule.ModelName == "" {
			lr.def = rt
		} else {
			lr.byModel[rt.rule.ModelName] = rt
			lr.models = append(lr.models, rt.rule.ModelName)
		}
	}
	for _, lr := range t.byListen {
		sort.Strings(lr.models)
	}
	s.table.Store(t)
	// Dedicated listeners no rule uses any more are closed.
	for key, l := range s.listeners {
		if key == "" {
			continue
		}
		if _, used := t.byListen[key]; !used {
			delete(s.listeners, key)
			s.wg.Add(1)
			go func() {
				defer s.wg.Done()
				l.shutdown(timeoutCtx(30 * time.Second))
			}()
		}
	}
}
