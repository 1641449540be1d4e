package gateway

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"os"
	"strconv"
	"sync"
	"time"

	"github.com/cespare/xxhash/v2"
	"github.com/valyala/fasthttp"

	"github.com/llmgw/llmgw/engines"
	_ "github.com/llmgw/llmgw/engines/all"
	"github.com/llmgw/llmgw/gateway/policy"
	"github.com/llmgw/llmgw/gateway/rule"
	"github.com/llmgw/llmgw/gateway/upstream"
)

// ruleRuntime is one admitted rule as the data plane runs it. It is
// immutable once built, except for the endpoints' own live state; an update
// builds a new ruleRuntime and swaps the routing table.
type ruleRuntime struct {
	rule      *rule.Rule // effective
	listenKey string
	eps       []*upstream.Endpoint
	byID      map[string]*upstream.Endpoint
	clients   []*fasthttp.HostClient // by endpoint Index
	picker    policy.Picker
	pd        *pdRuntime // nil unless pd_disagg_mode
	kv        *kvRuntime // nil unless kvExactMode is 1 or 3
	obs       *ruleMetrics
	// scheme is "http", or "https" with backend TLS; httpClient is the
	// net/http client for side requests (canary, /tokenize, TRT polls).
	scheme     string
	tlsCfg     *tls.Config
	httpClient *http.Client

	sessSource string // "header", "cookie", "query" or "" (body user only)
	sessName   []byte
	prefix     int

	// engine is the rule's engine (kvEngineType); conn its connection
	// policy. oneShot, by endpoint Index, is nil unless the engine serves
	// a limited number of connections (keptConns): then clients keeps at
	// most keptConns connections per endpoint and a request that finds
	// them all busy goes on a one-shot connection from oneShot.
	engine  engines.Adapter
	conn    engines.ConnPolicy
	oneShot []*fasthttp.HostClient

	// loopEPs are the endpoints' addresses by Index when the loop plane
	// serves this rule (loopServes), else nil.
	loopEPs []netip.AddrPort
	// reads is what routing reads of a request beyond its body: what the
	// rule's policy reads (policy.InputsOf), and the session value on a
	// P/D rule, which pins sessions to prefill endpoints whatever its sel.
	reads policy.Inputs

	cancel context.CancelFunc // stops the prober
	wg     sync.WaitGroup
}

// buildRuntime turns an effective rule into a runtime. prev, when non-nil,
// is the runtime it replaces: endpoint state (drain, probe verdict, breaker)
// and learned session bindings carry over by endpoint ID.
func (s *Server) buildRuntime(eff *rule.Rule, prev *ruleRuntime) (*ruleRuntime, error) {
	rt := &ruleRuntime{
		rule:      eff,
		listenKey: rule.ListenKey(eff.Listen),
		byID:      make(map[string]*upstream.Endpoint, len(eff.Endpoints)),
		prefix:    eff.CHWBL.PrefixBytes,
	}
	rt.scheme = "http"
	if eff.BackendTLS != nil {
		cfg, err := backendTLSConfig(eff.BackendTLS)
		if err != nil {
			return nil, err
		}
		rt.scheme, rt.tlsCfg = "https", cfg
	}
	ad, err := engines.For(engines.Kind(eff.KVEngineType))
	if err != nil {
		return nil, err
	}
	rt.engine, rt.conn = ad, ad.Conn()
	// Side requests (probes, /tokenize, polls) are few: to an engine with
	// few serving threads each goes on its own connection, so none of them
	// idles holding a thread.
	rt.httpClient = &http.Client{Timeout: 30 * time.Second, Transport: &http.Transport{
		TLSClientConfig: rt.tlsCfg, MaxIdleConnsPerHost: 16, IdleConnTimeout: poolIdle(rt.conn.IdleTimeout), DisableKeepAlives: keptConns(rt.conn) > 0,
	}}
	cbOn := eff.CBEnable == nil || *eff.CBEnable
	for i, e := range eff.Endpoints {
		var br *upstream.Breaker
		if cbOn {
			ruleName, epID := eff.Name, e.ID
			br = upstream.NewBreaker(upstream.BreakerConfig{
				Failures:       eff.CB.Failures,
				OpenFor:        eff.CB.OpenFor.Std(),
				HalfOpenTrials: eff.CB.HalfOpenTrials,
				Origin5xx:      eff.CB.Origin5xx,
				OnChange: func(from, to upstream.BreakerState) {
					s.log.Warn("breaker state change", "rule", ruleName, "endpoint", epID, "from", from.String(), "to", to.String())
					s.metrics.breakerTransitions.WithLabelValues(ruleName, epID, to.String()).Inc()
				},
			})
		}
		addr := net.JoinHostPort(e.EndpointIP, strconv.Itoa(e.TargetPort))
		weight := 1
		if e.Weight != nil {
			weight = *e.Weight
		}
		ep := upstream.New(e.ID, e.EndpointIP, e.TargetPort, addr, weight, upstream.Role(e.EPRole), i, br)
		if prev != nil {
			if old := prev.byID[e.ID]; old != nil && old.Addr == addr {
				ep.CopyStateFrom(old)
			}
		}
		rt.eps = append(rt.eps, ep)
		rt.byID[e.ID] = ep
		rt.clients = append(rt.clients, s.hostClient(addr, eff.Timeouts, rt.tlsCfg, tlsKey(eff.BackendTLS), rt.conn, false))
		if keptConns(rt.conn) > 0 {
			rt.oneShot = append(rt.oneShot, s.hostClient(addr, eff.Timeouts, rt.tlsCfg, tlsKey(eff.BackendTLS), rt.conn, true))
		}
	}
	ids := make([]string, len(rt.eps))
	for i, ep := range rt.eps {
		ids[i] = ep.ID
	}
	rt.obs = s.metrics.forRule(eff.Name, ids)
	p, err := policy.New(policy.Config{
		Sel:        int(eff.Sel),
		LoadFactor: eff.CHWBL.LoadFactor,
		Replicas:   eff.CHWBL.Replicas,
		SessionTTL: eff.SessionTTL.Std(),
	}, rt.eps)
	if err != nil {
		return nil, err
	}
	if prev != nil {
		if inh, ok := p.(policy.Inheritor); ok {
			inh.Inherit(prev.picker)
		}
	}
	rt.picker = p
	if eff.KVExactMode == 1 || eff.KVExactMode == 3 {
		if rt.kv, err = newKVRuntime(s, eff, rt.eps, rt.scheme, rt.httpClient); err != nil {
			return nil, err
		}
	}
	if eff.PDDisaggMode {
		if rt.pd, err = newPDRuntime(eff, rt.eps, rt.tlsCfg, rt.scheme); err != nil {
			return nil, err
		}
		if prev != nil && prev.pd != nil {
			if inh, ok := rt.pd.pickP.(policy.Inheritor); ok {
				inh.Inherit(prev.pd.pickP)
			}
		}
	}
	if eff.SessionHeaderName != "" {
		src, name, err := rule.ParseSessionKey(eff.SessionHeaderName)
		if err != nil {
			return nil, err
		}
		rt.sessSource, rt.sessName = src, []byte(name)
	}
	rt.loopEPs = rt.loopAddrs()
	rt.reads = policy.InputsOf(int(eff.Sel))
	rt.reads.Session = rt.reads.Session || rt.pd != nil
	return rt, nil
}

// start launches the runtime's background work (health probes).
func (rt *ruleRuntime) start(s *Server) {
	ctx, cancel := context.WithCancel(s.ctx)
	rt.cancel = cancel
	if rt.kv != nil {
		rt.kv.run(ctx, &rt.wg, s, rt.rule.Name)
		rt.wg.Add(1)
		go func() {
			defer rt.wg.Done()
			rt.kv.canaryLoop(ctx, s, rt.rule)
		}()
	}
	if !rt.rule.Probe.Disabled {
		for _, ep := range rt.eps {
			rt.wg.Add(1)
			go func() {
				defer rt.wg.Done()
				s.probeLoop(ctx, rt, ep)
			}()
		}
	}
}

// stop ends the runtime's background work and waits for it.
func (rt *ruleRuntime) stop() {
	if rt.cancel != nil {
		rt.cancel()
	}
	rt.wg.Wait()
	if rt.pd != nil {
		rt.pd.close()
	}
	rt.httpClient.CloseIdleConnections()
}

// inFlight sums the in-flight requests of every endpoint.
func (rt *ruleRuntime) inFlight() int64 {
	var n int64
	for _, ep := range rt.eps {
		n += ep.InFlight()
	}
	return n
}

// sessionValue extracts the session-affinity value: the configured header,
// cookie or query argument, else the body's "user".
func (rt *ruleRuntime) sessionValue(h requestView, user []byte) []byte {
	switch rt.sessSource {
	case "header":
		if v := h.header(rt.sessName); len(v) > 0 {
			return v
		}
	case "cookie":
		if v := h.cookie(rt.sessName); len(v) > 0 {
			return v
		}
	case "query":
		if v := h.queryArg(rt.sessName); len(v) > 0 {
			return v
		}
	}
	return user
}

// requestView is what the gateway reads of a request's head to route it:
// the goroutine plane's fasthttp request (ctxView) and the loop plane's
// request implement it.
type requestView interface {
	isHTTP11() bool
	protocol() []byte
	header(name []byte) []byte   // the first field named name (any case)
	cookie(name []byte) []byte   // a cookie's value
	queryArg(name []byte) []byte // a query argument's value
}

// ctxView is a fasthttp request as a requestView.
type ctxView fasthttp.RequestCtx

func viewOf(ctx *fasthttp.RequestCtx) *ctxView { return (*ctxView)(ctx) }

func (v *ctxView) isHTTP11() bool            { return v.Request.Header.IsHTTP11() }
func (v *ctxView) protocol() []byte          { return v.Request.Header.Protocol() }
func (v *ctxView) header(name []byte) []byte { return v.Request.Header.PeekBytes(name) }
func (v *ctxView) cookie(name []byte) []byte { return v.Request.Header.CookieBytes(name) }
func (v *ctxView) queryArg(name []byte) []byte {
	return (*fasthttp.RequestCtx)(v).QueryArgs().PeekBytes(name)
}

var (
	hdrConversationID = []byte("X-Conversation-Id")
	hdrSessionID      = []byte("X-Session-Id")
)

// conversationHash hashes a conversation header for CHWBL requests that
// carry no content key. X-Request-Id is deliberately not a conversation key:
// it is unique per request (reference gateway bug §16 #10).
func (rt *ruleRuntime) conversationHash(h requestView) (uint64, bool) {
	if rt.sessSource == "header" {
		if v := h.header(rt.sessName); len(v) > 0 {
			return xxhash.Sum64(v), true
		}
	}
	for _, name := range [...][]byte{hdrConversationID, hdrSessionID} {
		if v := h.header(name); len(v) > 0 {
			return xxhash.Sum64(v), true
		}
	}
	return 0, false
}

// hostClient returns the shared pool for addr with the given timeouts and
// engine connection policy, creating it on first use. Pools are shared
// across rules and rule updates so that an edit does not drop warm
// connections.
//
// The pool follows the engine (engines.Adapter.Conn): an idle connection is
// dropped before the engine's keep-alive timeout (poolIdle), a connection
// is not reused past the engine's request limit, and every reuse first
// checks that the worker has not closed it (upConn). The HostClient is the
// pool only: the data plane's requests go through roundTrip, never
// HostClient.Do, so fasthttp neither retries nor adds a header; forward
// decides what may be sent again.
//
// With oneShot the pool keeps no connection: every request it sends
// carries Connection: close (roundTrip writes it). Otherwise it keeps at
// most keptConns(pol) connections when the engine serves a limited number
// (and answers ErrNoFreeConns at once, nothing sent, when all are busy),
// else up to 8192. Answers are quick-acknowledged (connOpts.quickAck) on
// kept connections of an engine with ReusedConnStall; a one-shot
// connection's single answer arrives while the kernel still acknowledges
// a new connection's data at once, so it needs no extra system call.
func (s *Server) hostClient(addr string, t rule.TimeoutsConfig, tlsCfg *tls.Config, tlsID string, pol engines.ConnPolicy, oneShot bool) *fasthttp.HostClient {
	key := clientKey{addr: addr, connect: t.Connect.Std(), firstByte: t.FirstByte.Std(), idle: t.Idle.Std(), tls: tlsID, conn: pol, oneShot: oneShot}
	s.clientsMu.Lock()
	defer s.clientsMu.Unlock()
	if hc := s.clients[key]; hc != nil {
		return hc
	}
	o := &connOpts{connect: key.connect, idle: key.idle, maxIdle: poolIdle(pol.IdleTimeout), maxRequests: pol.MaxRequestsPerConn, quickAck: pol.ReusedConnStall && !oneShot, tls: tlsCfg}
	maxConns := 8192
	if n := keptConns(pol); n > 0 && !oneShot {
		maxConns, o.maxIdle = n, min(o.maxIdle, keptIdle)
	}
	hc := &fasthttp.HostClient{
		Addr:                          addr,
		Dial:                          func(a string) (net.Conn, error) { return dialUpstream(a, o) },
		ReadBufferSize:                maxUpstreamHead,
		MaxConns:                      maxConns,
		MaxIdleConnDuration:           o.maxIdle,
		ReadTimeout:                   key.firstByte,
		WriteTimeout:                  30 * time.Second,
		DisableHeaderNamesNormalizing: true,
		IsTLS:                         tlsCfg != nil,
		TLSConfig:                     tlsCfg,
	}
	s.clients[key] = hc
	return hc
}

type clientKey struct {
	addr                     string
	connect, firstByte, idle time.Duration
	tls                      string // "" plain; else the TLS settings' identity
	conn                     engines.ConnPolicy
	oneShot                  bool
}

// tlsKey identifies backend TLS settings for sharing connection pools.
func tlsKey(t *rule.BackendTLSConfig) string {
	if t == nil {
		return ""
	}
	return fmt.Sprintf("tls|%s|%s|%v", t.CAFile, t.ServerName, t.InsecureSkipVerify)
}

// backendTLSConfig builds the client TLS settings for talking to workers.
func backendTLSConfig(t *rule.BackendTLSConfig) (*tls.Config, error) {
	// InsecureSkipVerify is the operator's explicit choice (admission refuses
	// it together with a CA file); it exists for labs with throwaway certs.
	cfg := &tls.Config{MinVersion: tls.VersionTLS12, ServerName: t.ServerName, InsecureSkipVerify: t.InsecureSkipVerify}
	if t.CAFile != "" {
		pem, err := os.ReadFile(t.CAFile)
		if err != nil {
			return nil, fmt.Errorf("backend_tls.ca_file: %w", err)
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("backend_tls.ca_file %s: no PEM certificate", t.CAFile)
		}
		cfg.RootCAs = pool
	}
	return cfg, nil
}
