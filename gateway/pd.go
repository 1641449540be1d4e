package gateway

import (
	"bufio"
	"bytes"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/valyala/fasthttp"
	"github.com/valyala/fastjson"

	"github.com/llmgw/llmgw/engines"
	"github.com/llmgw/llmgw/gateway/openai"
	"github.com/llmgw/llmgw/gateway/policy"
	"github.com/llmgw/llmgw/gateway/rule"
	"github.com/llmgw/llmgw/gateway/upstream"
)

// P/D failures, each with its own status and code (mapped in statusFor).
var (
	// ErrPDPoolUnavailable: no available prefill or no available decode (503).
	ErrPDPoolUnavailable = errors.New("gateway: pd pool unavailable")
	// ErrPDPrefillFailed: the prefill leg failed before the decode produced
	// output (502).
	ErrPDPrefillFailed = errors.New("gateway: pd prefill failed")
	// ErrPDPrefillTimeout: the prefill leg did not finish in time (504).
	ErrPDPrefillTimeout = errors.New("gateway: pd prefill timed out")
	// ErrPDDecodeTimeout: the decode leg sent no response headers in time (504).
	ErrPDDecodeTimeout = errors.New("gateway: pd decode timed out before its first byte")
	// ErrPDDecodeStalled: the decode stream went silent past the idle timeout (502).
	ErrPDDecodeStalled = errors.New("gateway: pd decode stream stalled")
	// ErrPDDecodeDied: the decode worker failed (502).
	ErrPDDecodeDied = errors.New("gateway: pd decode backend died")
	// ErrPDBodyTooLarge: the body is too large to rewrite for the legs (413).
	ErrPDBodyTooLarge = errors.New("gateway: request body too large for a pd rewrite")
)

// pdMaxRewriteBytes bounds the bodies the gateway rewrites for P/D legs.
// Each leg holds its own copy, so the bound is half the data-plane default.
const pdMaxRewriteBytes = 4 << 20

// pdMaxLegResponse bounds a buffered prefill/context response.
const pdMaxLegResponse = 8 << 20

// pdRuntime is the prefill/decode part of a rule runtime.
type pdRuntime struct {
	engine   engines.Adapter
	proto    engines.PDProtocol
	label    string // route prefix: "pd-" + the engine kind
	bootPort int    // the rule's pdBootstrapPort (rendezvous shape)
	// kvPort is each endpoint's P2P-NCCL port (p2p_nccl_port), nixlPort
	// its NIXL side-channel port (nixl_port), by endpoint id; absent when
	// the rule names none.
	kvPort    map[string]int
	nixlPort  map[string]int
	bootOf    map[string]int // per-prefill bootstrapPort, by endpoint id
	prefill   []*upstream.Endpoint
	decode    []*upstream.Endpoint
	pickP     policy.Picker // the rule's sel (after the session pin and KV-exact)
	pickD     policy.Picker // least in-flight
	pins      *pinTable     // session → prefill endpoint
	client    *http.Client
	transport *http.Transport
	scheme    string // "http" or "https"
}

func newPDRuntime(eff *rule.Rule, eps []*upstream.Endpoint, tlsCfg *tls.Config, scheme string) (*pdRuntime, error) {
	a, err := engines.For(engines.Kind(eff.KVEngineType))
	if err != nil {
		return nil, err
	}
	if a.PD() == nil {
		return nil, fmt.Errorf("gateway: %s has no prefill/decode protocol", a.Display())
	}
	pd := &pdRuntime{engine: a, proto: a.PD(), label: "pd-" + string(a.Kind()), bootPort: eff.PDBootstrapPort, scheme: scheme,
		kvPort: map[string]int{}, nixlPort: map[string]int{}, bootOf: map[string]int{}}
	for _, e := range eff.Endpoints {
		if e.P2PNcclPort != 0 {
			pd.kvPort[e.ID] = e.P2PNcclPort
		}
		if e.NixlPort != 0 {
			pd.nixlPort[e.ID] = e.NixlPort
		}
		if e.BootstrapPort != 0 {
			pd.bootOf[e.ID] = e.BootstrapPort
		}
	}
	for _, ep := range eps {
		switch ep.Role {
		case upstream.RolePrefill:
			pd.prefill = append(pd.prefill, ep)
		case upstream.RoleDecode:
			pd.decode = append(pd.decode, ep)
		}
	}
	pd.pins = newPinTable(eff.SessionTTL.Std(), 100_000)
	// The prefill pick honours the rule's sel (the decode holds no prompt
	// state worth an affinity, so it is always least in-flight).
	if pd.pickP, err = policy.New(policy.Config{
		Sel:        int(eff.Sel),
		LoadFactor: eff.CHWBL.LoadFactor,
		Replicas:   eff.CHWBL.Replicas,
		SessionTTL: eff.SessionTTL.Std(),
	}, pd.prefill); err != nil {
		return nil, err
	}
	if pd.pickD, err = policy.New(policy.Config{Sel: 4}, pd.decode); err != nil {
		return nil, err
	}
	connect := eff.Timeouts.Connect.Std()
	pd.transport = &http.Transport{
		DialContext: func(ctx context.Context, network, addr string) (net.Conn, error) {
			d := net.Dialer{Timeout: connect}
			c, err := d.DialContext(ctx, network, addr)
			if err != nil {
				return nil, &DialError{Addr: addr, Err: err}
			}
			return c, nil
		},
		MaxIdleConnsPerHost: 256,
		IdleConnTimeout:     pdIdleConnTimeout(a.Conn()),
		DisableCompression:  true,
		TLSClientConfig:     tlsCfg,
	}
	pd.client = &http.Client{Transport: pd.transport}
	return pd, nil
}

// pdIdleConnTimeout keeps a pooled leg connection for less than the
// engine's own keep-alive timeout (uvicorn: 5 s), so that a leg is never
// written to a connection the engine is closing: a POST on it is not
// replayable and would fail. Engines that say nothing keep the 90 s default.
func pdIdleConnTimeout(c engines.ConnPolicy) time.Duration {
	if c.IdleTimeout <= 0 {
		return 90 * time.Second
	}
	return c.IdleTimeout * 4 / 5
}

func (pd *pdRuntime) close() { pd.transport.CloseIdleConnections() }

// ready reports whether at least one prefill and one decode are available.
func (pd *pdRuntime) ready() bool {
	return anyAvailable(pd.prefill) && anyAvailable(pd.decode)
}

func anyAvailable(eps []*upstream.Endpoint) bool {
	for _, ep := range eps {
		if ep.Available() {
			return true
		}
	}
	return false
}

// pdRequest is one client request being served by a prefill/decode pair.
type pdRequest struct {
	s    *Server
	rt   *ruleRuntime
	pd   *pdRuntime
	ctx  *fasthttp.RequestCtx
	body []byte // the client's body
	path string
	// hdr is the client's headers to forward, captured once on the handler
	// goroutine: fasthttp headers are not safe to read from the legs'
	// goroutines concurrently.
	hdr    http.Header
	stream bool
	id     string
	preq   policy.Request
	start  time.Time
	route  string
	// KV-exact (kvExactMode 1) inputs and outcome for the prefill choice.
	v    *fastjson.Value
	kind openai.Kind
	kvs  kvScratch
	kvc  kvChoice
	// prefillHow says how the prefill endpoint was chosen, for X-Llmgw-Route.
	prefillHow string
	// legID is the X-Request-Id the legs of the current pair carry (the
	// adapter's LegRequestID).
	legID string
}

// servePD serves a completion on a P/D rule with the engine's hand-off.
func (s *Server) servePD(ctx *fasthttp.RequestCtx, rt *ruleRuntime, st *reqState, v *fastjson.Value, kind openai.Kind, stream bool, start time.Time) {
	body := ctx.PostBody()
	if len(body) > pdMaxRewriteBytes {
		writeError(ctx, fmt.Errorf("%w: %d bytes; P/D legs are rewritten and the limit is %d bytes", ErrPDBodyTooLarge, len(body), pdMaxRewriteBytes))
		s.metrics.rejected.WithLabelValues("pd_body_too_large").Inc()
		return
	}
	id := string(requestID(ctx, st))
	ctx.Response.Header.Set("X-Request-Id", id)
	r := &pdRequest{s: s, rt: rt, pd: rt.pd, ctx: ctx, body: body, path: string(ctx.Path()), hdr: http.Header{}, stream: stream, id: id, start: start, v: v, kind: kind}
	// The legs get the client's headers as forward sends them (no
	// connection-scoped ones), less those each leg sets itself.
	conn := ctx.Request.Header.Peek(fasthttp.HeaderConnection)
	named := namesHeaders(conn)
	for k, v := range ctx.Request.Header.All() {
		if isHopHeader(k) || named && connectionNames(conn, k) || bytes.EqualFold(k, hdrRequestID) || bytes.EqualFold(k, hdrHost) || bytes.EqualFold(k, hdrContentLength) {
			continue
		}
		r.hdr.Add(string(k), string(v))
	}
	r.hdr.Set("Content-Type", "application/json")
	r.hdr.Set("X-Request-Id", id)
	r.preq = st.preq
	r.preq.Exclude = nil
	if len(r.preq.Session) == 0 {
		if v := ctx.Request.Header.PeekBytes(hdrConversationID); len(v) > 0 {
			r.preq.Session = v
		} else if v := ctx.Request.Header.PeekBytes(hdrSessionID); len(v) > 0 {
			r.preq.Session = v
		}
	}
	serve, ok := orchestrators[rt.pd.proto.Shape()]
	if !ok {
		serve = (*pdRequest).serveSequential
	}
	if err := serve(r); err != nil {
		writeError(ctx, err)
		s.metrics.pdRequests.WithLabelValues(rt.rule.Name, "complete", pdStatus(err)).Inc()
	}
}

// orchestrators drive a P/D pair, one per shape; none knows an engine.
var orchestrators = map[engines.PDShape]func(*pdRequest) error{
	engines.PDSequential:        (*pdRequest).serveSequential,
	engines.PDConcurrent:        (*pdRequest).serveConcurrent,
	engines.PDContextGeneration: (*pdRequest).serveContextGeneration,
}

func pdStatus(err error) string {
	if err == nil {
		return "success"
	}
	if status, _, _ := statusFor(err); status == fasthttp.StatusGatewayTimeout {
		return "timeout"
	}
	return "error"
}

// pick chooses a prefill (excluding exP) and a decode endpoint. The
// prefill: the session's pinned endpoint while it is available, else the
// KV-exact choice (kvExactMode 1 scores prefill endpoints only), else the
// rule's sel over the available prefills. The decode: the least in-flight
// one. Both legs' choices are recorded in /v1/decisions.
func (r *pdRequest) pick(exP *upstream.Endpoint) (*upstream.Endpoint, *upstream.Endpoint, error) {
	var P *upstream.Endpoint
	how := ""
	sess := r.preq.Session
	if len(sess) > 0 {
		if ep := r.pd.pins.get(sess); ep != nil && ep != exP && ep.Available() {
			P, how = ep, "pinned"
		}
	}
	r.kvc = kvChoice{}
	if P == nil && r.rt.kv != nil {
		r.kvc = r.rt.kv.route(r.ctx, &r.kvs, r.v, r.kind, exP)
		r.s.metrics.kvObserve(r.rt.rule.Name, r.rt.kv, &r.kvc)
		if r.kvc.ep != nil {
			P, how = r.kvc.ep, r.kvc.routeLabel()
		}
	}
	if P == nil {
		preq := r.preq
		preq.Exclude = exP
		d, err := r.pd.pickP.Pick(&preq)
		if err != nil {
			return nil, nil, fmt.Errorf("%w: rule %q has no available prefill endpoint", ErrPDPoolUnavailable, r.rt.rule.Name)
		}
		P, how = d.Endpoint, d.Reason.String()
		if r.rt.kv != nil {
			how = "kv-exact miss=" + r.kvc.reason + " " + how
		}
	}
	if len(sess) > 0 {
		r.pd.pins.set(sess, P)
	}
	dd, err := r.pd.pickD.Pick(&policy.Request{})
	if err != nil {
		return nil, nil, fmt.Errorf("%w: rule %q has no available decode endpoint", ErrPDPoolUnavailable, r.rt.rule.Name)
	}
	r.prefillHow = how
	id := []byte(r.id)
	var kvc *kvChoice
	if r.rt.kv != nil {
		kvc = &r.kvc
	}
	r.s.decisions.addLeg(r.rt.rule.Name, "prefill", P.ID, r.pd.label+" prefill "+how, id, 0, kvc, P.ID)
	r.s.decisions.addLeg(r.rt.rule.Name, "decode", dd.Endpoint.ID, r.pd.label+" decode "+dd.Reason.String(), id, 0, nil, dd.Endpoint.ID)
	return P, dd.Endpoint, nil
}

// pair is the adapter's view of the chosen endpoints.
func (r *pdRequest) pair(P, D *upstream.Endpoint) *engines.PDPair {
	boot := r.pd.bootPort
	if b := r.pd.bootOf[P.ID]; b != 0 {
		boot = b
	}
	return &engines.PDPair{
		RequestID:       r.id,
		PrefillHost:     P.Host,
		PrefillPort:     P.Port,
		DecodeHost:      D.Host,
		DecodePort:      D.Port,
		BootstrapPort:   boot,
		PrefillKVPort:   r.pd.kvPort[P.ID],
		DecodeKVPort:    r.pd.kvPort[D.ID],
		PrefillNixlPort: r.pd.nixlPort[P.ID],
		DecodeNixlPort:  r.pd.nixlPort[D.ID],
		Nonce:           rand.Uint64() & (1<<63 - 1),
	}
}

// kvCheck feeds a prefill leg's answer to the KV-exact self-check.
func (r *pdRequest) kvCheck(P *upstream.Endpoint, body []byte) {
	if r.rt.kv == nil {
		return
	}
	obs := &kvObservation{}
	if r.kvc.ep == P {
		obs.predicted = r.kvc.predicted
	}
	obs.scan.write(body)
	r.s.kvSelfCheck(r.rt, obs)
}

// pinTable pins sessions to prefill endpoints for a TTL, bounded in size
// (the oldest pins go first). Safe for concurrent use.
type pinTable struct {
	mu    sync.Mutex
	ttl   time.Duration
	max   int
	pins  map[string]pin
	order []string // insertion order, for eviction
}

type pin struct {
	ep      *upstream.Endpoint
	expires time.Time
}

func newPinTable(ttl time.Duration, max int) *pinTable {
	if ttl <= 0 {
		ttl = time.Hour
	}
	return &pinTable{ttl: ttl, max: max, pins: map[string]pin{}}
}

func (t *pinTable) get(key []byte) *upstream.Endpoint {
	t.mu.Lock()
	defer t.mu.Unlock()
	p, ok := t.pins[string(key)]
	if !ok || time.Now().After(p.expires) {
		return nil
	}
	return p.ep
}

func (t *pinTable) set(key []byte, ep *upstream.Endpoint) {
	t.mu.Lock()
	defer t.mu.Unlock()
	k := string(key)
	if _, ok := t.pins[k]; !ok {
		t.order = append(t.order, k)
		for len(t.pins) >= t.max && len(t.order) > 0 {
			delete(t.pins, t.order[0])
			t.order = t.order[1:]
		}
	}
	t.pins[k] = pin{ep: ep, expires: time.Now().Add(t.ttl)}
}

// legResult is one finished, buffered leg.
type legResult struct {
	status int
	header http.Header
	body   []byte
	err    error
	dur    time.Duration
}

// sendLeg sends body to ep and, when buffer is true, reads the whole answer.
// It records the outcome on ep's breaker. The caller owns resp.Body when
// buffer is false and err is nil.
func (r *pdRequest) sendLeg(ctx context.Context, ep *upstream.Endpoint, body []byte) (*http.Response, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, r.pd.scheme+"://"+ep.Addr+r.path, bytes.NewReader(body))
	if err != nil {
		return nil, err
	}
	req.Header = r.hdr.Clone()
	if r.legID != "" {
		req.Header.Set("X-Request-Id", r.legID)
	}
	resp, err := r.pd.client.Do(req)
	if err != nil {
		if b := ep.Breaker(); b != nil && !errors.Is(ctx.Err(), context.Canceled) {
			b.RecordConnFailure()
		}
		return nil, err
	}
	r.recordStatus(ep, resp.StatusCode)
	return resp, nil
}

// recordStatus charges ep's breaker with an answer's status as the engine's
// adapter classifies it: the client's faults never demote an endpoint.
func (r *pdRequest) recordStatus(ep *upstream.Endpoint, status int) {
	b := ep.Breaker()
	if b == nil {
		return
	}
	switch f := r.pd.engine.Classify(status, nil); {
	case f.Demotes():
		b.RecordOrigin5xx()
	case f == engines.FaultClient:
		b.RecordClientError()
	default:
		b.RecordSuccess()
	}
}

// bufferedLeg sends a non-streaming leg and reads its answer, within timeout.
func (r *pdRequest) bufferedLeg(parent context.Context, ep *upstream.Endpoint, body []byte, timeout time.Duration) legResult {
	release := ep.Acquire()
	defer release()
	ctx, cancel := context.WithTimeout(parent, timeout)
	defer cancel()
	t0 := time.Now()
	resp, err := r.sendLeg(ctx, ep, body)
	if err != nil {
		return legResult{err: err, dur: time.Since(t0)}
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(io.LimitReader(resp.Body, pdMaxLegResponse+1))
	if err == nil && len(data) > pdMaxLegResponse {
		err = fmt.Errorf("answer larger than %d bytes", pdMaxLegResponse)
	}
	return legResult{status: resp.StatusCode, header: resp.Header, body: data, err: err, dur: time.Since(t0)}
}

func isCtxTimeout(err error) bool {
	return errors.Is(err, context.DeadlineExceeded) || isTimeout(err)
}

// prefillErr classifies a failed prefill/context leg.
func (r *pdRequest) prefillErr(ep *upstream.Endpoint, err error) error {
	if isCtxTimeout(err) {
		return fmt.Errorf("%w: prefill endpoint %s (%s) did not answer within %s", ErrPDPrefillTimeout, ep.ID, ep.Addr, r.rt.rule.Timeouts.Prefill.Std())
	}
	return fmt.Errorf("%w: prefill endpoint %s (%s): %v", ErrPDPrefillFailed, ep.ID, ep.Addr, err)
}

// relayVerbatim answers the client with a leg's buffered response.
func (r *pdRequest) relayVerbatim(ep *upstream.Endpoint, lr legResult) {
	copyHeaders(r.ctx, lr.header)
	r.ctx.SetStatusCode(lr.status)
	r.ctx.SetBody(lr.body)
	r.ctx.Response.Header.Set("X-Llmgw-Endpoint", ep.ID)
	r.ctx.Response.Header.Set("X-Llmgw-Route", r.route)
	r.s.metrics.requests.WithLabelValues(r.rt.rule.Name, ep.ID, statusLabel(lr.status)).Inc()
}

func copyHeaders(ctx *fasthttp.RequestCtx, h http.Header) {
	for k, vs := range h {
		switch strings.ToLower(k) {
		case "connection", "keep-alive", "transfer-encoding", "content-length", "te", "trailer", "upgrade", "x-request-id":
			continue
		}
		for _, v := range vs {
			ctx.Response.Header.Add(k, v)
		}
	}
}

// legBodyErr maps an adapter's rewrite failure: the client's body is not a
// JSON object (400).
func legBodyErr(err error) error {
	if errors.Is(err, engines.ErrPDBody) {
		return fmt.Errorf("%w: %v", ErrBadRequest, err)
	}
	return err
}

// isDialErr reports a leg that provably never reached the worker (the
// connection was never established): only such a leg is re-driven on
// another endpoint, so that no request executes twice.
func isDialErr(err error) bool {
	var de *DialError
	return errors.As(err, &de)
}

// serveSequential drives the sequential shape: a buffered prefill leg, its
// hand-off, then the decode leg.
func (r *pdRequest) serveSequential() error { return r.twoPhase("prefill") }

// serveContextGeneration drives the context→generation shape: like the
// sequential one, except that the context answer may already be the whole
// answer (the adapter's HandOff.Final), which is relayed without a
// generation leg.
func (r *pdRequest) serveContextGeneration() error { return r.twoPhase("context") }

// twoPhase is the prefill-then-decode flow of the sequential and
// context→generation shapes; leg names the first leg in routes.
func (r *pdRequest) twoPhase(leg string) error {
	m := r.s.metrics
	name := r.rt.rule.Name
	P, D, err := r.pick(nil)
	if err != nil {
		return err
	}
	pair := r.pair(P, D)
	r.legID = r.pd.proto.LegRequestID(pair)
	pBody, err := r.pd.proto.PrefillBody(r.body, pair)
	if err != nil {
		return legBodyErr(err)
	}
	timeout := r.rt.rule.Timeouts.Prefill.Std()
	pr := r.bufferedLeg(r.s.ctx, P, pBody, timeout)
	if pr.err != nil && isDialErr(pr.err) {
		// One re-drive on another prefill endpoint: the first never got
		// the request.
		m.retries.WithLabelValues(name).Inc()
		if P2, D2, perr := r.pick(P); perr == nil && P2 != P {
			P, D = P2, D2
			pair = r.pair(P, D)
			r.legID = r.pd.proto.LegRequestID(pair)
			if pBody, err = r.pd.proto.PrefillBody(r.body, pair); err != nil {
				return legBodyErr(err)
			}
			pr = r.bufferedLeg(r.s.ctx, P, pBody, timeout)
		}
	}
	m.pdPrefillDuration.WithLabelValues(name).Observe(pr.dur.Seconds())
	if pr.err != nil {
		m.pdRequests.WithLabelValues(name, "prefill", pdStatus(r.prefillErr(P, pr.err))).Inc()
		return r.prefillErr(P, pr.err)
	}
	r.route = r.pd.label + " " + leg + "=" + P.ID + " (" + r.prefillHow + ")"
	var h engines.HandOff
	switch {
	case pr.status >= 400 && pr.status < 500:
		// The request itself is at fault: the decode would refuse it too.
		m.pdRequests.WithLabelValues(name, "prefill", "error").Inc()
		r.route += " " + leg + "-rejected"
		r.relayVerbatim(P, pr)
		return nil
	case pr.status >= 500:
		// The decode recomputes the prompt: slower, but the client is
		// served; the 5xx streak demotes the prefill endpoint.
		m.pdRequests.WithLabelValues(name, "prefill", "error").Inc()
		r.route += " " + leg + "-5xx recompute"
		h.Missing = leg + "-5xx"
	default:
		m.pdRequests.WithLabelValues(name, "prefill", "success").Inc()
		r.kvCheck(P, pr.body)
		h = r.pd.proto.HandOff(pr.body, pair)
		if h.Final != nil {
			m.pdEarlyExit.WithLabelValues(name).Inc()
			r.route += " early-exit"
			r.relayEarly(P, pr, h.Final)
			return nil
		}
		switch {
		case h.OutOfBand:
			// Said, not silent: nothing went through the gateway
			// (vLLM P2P-NCCL).
			r.route += " kv-out-of-band"
		case h.Params == nil:
			r.route += " " + h.Missing + " recompute"
		}
	}
	if h.OutOfBand {
		m.pdKVParams.WithLabelValues(name, "out_of_band").Inc()
	} else {
		outcome := "found"
		if h.Params == nil {
			outcome = "missing"
		}
		m.pdKVParams.WithLabelValues(name, outcome).Inc()
	}
	dBody, err := r.pd.proto.DecodeBody(r.body, pair, h)
	if err != nil {
		return legBodyErr(err)
	}
	return r.decodeLeg(D, dBody)
}

// serveConcurrent drives the concurrent shape: both legs at once, joined by
// the adapter's rendezvous fields; the decode answers the client. A
// prefill that provably never got the request, before any decode byte,
// gets one retry with a fresh pair.
func (r *pdRequest) serveConcurrent() error {
	var exclude *upstream.Endpoint
	var lastErr error
	for attempt := 0; ; attempt++ {
		P, D, err := r.pick(exclude)
		if err != nil {
			if lastErr != nil {
				return lastErr // no other prefill to retry on: report the real failure
			}
			return err
		}
		err, retry := r.concurrentPair(P, D)
		if retry && attempt == 0 {
			r.s.metrics.retries.WithLabelValues(r.rt.rule.Name).Inc()
			exclude, lastErr = P, err
			continue
		}
		return err
	}
}

// concurrentPair runs one (prefill, decode) attempt. retry reports a
// prefill dial failure before any decode byte reached the client.
//
// Whichever leg finishes first decides: a prefill failure is the
// prefill's; a decode that fails (connection error, or an error status)
// is the decode's own answer, relayed at once (status and body verbatim),
// and the prefill leg, which would otherwise wait for a decode that never
// joins, is cancelled and not charged.
// pdSettleGrace bounds how long a concurrent pair whose decode failed first
// waits for its prefill's answer, which may explain the failure (a rejected
// or unreachable prefill). Short against the client's wait, so the decode's
// own failure still reaches the client promptly.
const pdSettleGrace = 300 * time.Millisecond

func (r *pdRequest) concurrentPair(P, D *upstream.Endpoint) (err error, retry bool) {
	name := r.rt.rule.Name
	m := r.s.metrics
	pair := r.pair(P, D)
	r.legID = r.pd.proto.LegRequestID(pair)
	pBody, err := r.pd.proto.PrefillBody(r.body, pair)
	if err != nil {
		return legBodyErr(err), false
	}
	dBody, err := r.pd.proto.DecodeBody(r.body, pair, engines.HandOff{})
	if err != nil {
		return legBodyErr(err), false
	}
	r.route = r.pd.label + " prefill=" + P.ID + " (" + r.prefillHow + ") nonce=" + strconv.FormatUint(pair.Nonce, 10)

	legsCtx, cancelLegs := context.WithCancel(r.s.ctx)
	prefillCtx, cancelPrefill := context.WithCancel(legsCtx)
	defer cancelPrefill()
	prefillDone := make(chan legResult, 1)
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		prefillDone <- r.bufferedLeg(prefillCtx, P, pBody, r.rt.rule.Timeouts.Prefill.Std())
	}()
	dl := r.startDecode(legsCtx, D, dBody)
	var pr legResult
	select {
	case pr = <-prefillDone:
	case <-dl.headers:
		if dl.err != nil || dl.resp.StatusCode >= 400 {
			// The decode failed first. It may have failed because of the
			// prefill (a rejected or unreachable prefill never joins the
			// bootstrap rendezvous), so the prefill gets a short, bounded
			// chance to say so: its rejection is relayed, and a dead
			// prefill is retried with a fresh pair, as when it answers
			// first. Otherwise the decode failed on its own: the prefill
			// can only wait for it now. Cancel it (a cancelled leg charges
			// no breaker) and answer with the decode's failure.
			settle := time.NewTimer(pdSettleGrace)
			select {
			case pr = <-prefillDone:
				settle.Stop()
				if pr.err != nil && isDialErr(pr.err) || pr.err == nil && pr.status >= 400 && pr.status < 500 {
					break // the prefill's own failure explains the decode's
				}
				wg.Wait()
				status := "success"
				if pr.err != nil || pr.status >= 400 {
					status = "error"
				}
				m.pdRequests.WithLabelValues(name, "prefill", status).Inc()
				r.route += " decode-failed"
				return r.finishDecode(dl, cancelLegs), false
			case <-settle.C:
				cancelPrefill()
				wg.Wait()
				m.pdRequests.WithLabelValues(name, "prefill", "cancelled").Inc()
				r.route += " decode-failed"
				return r.finishDecode(dl, cancelLegs), false
			}
		} else {
			// The decode answered first; its bytes wait until the
			// prefill's status is known, so a prefill rejection can still
			// be relayed.
			pr = <-prefillDone
		}
	}
	m.pdPrefillDuration.WithLabelValues(name).Observe(pr.dur.Seconds())
	fail := func(e error) (error, bool) {
		cancelLegs()
		dl.abandon()
		wg.Wait()
		return e, false
	}
	switch {
	case pr.err != nil && isDialErr(pr.err) && !dl.sentAny():
		m.pdRequests.WithLabelValues(name, "prefill", "error").Inc()
		_, _ = fail(nil)
		return r.prefillErr(P, pr.err), true
	case pr.err != nil:
		m.pdRequests.WithLabelValues(name, "prefill", pdStatus(r.prefillErr(P, pr.err))).Inc()
		return fail(r.prefillErr(P, pr.err))
	case pr.status >= 400 && pr.status < 500:
		m.pdRequests.WithLabelValues(name, "prefill", "error").Inc()
		_, _ = fail(nil)
		r.route += " prefill-rejected"
		r.relayVerbatim(P, pr)
		return nil, false
	case pr.status >= 500:
		m.pdRequests.WithLabelValues(name, "prefill", "error").Inc()
		return fail(fmt.Errorf("%w: prefill endpoint %s answered %d before the decode produced output", ErrPDPrefillFailed, P.ID, pr.status))
	}
	m.pdRequests.WithLabelValues(name, "prefill", "success").Inc()
	r.kvCheck(P, pr.body)
	wg.Wait()
	return r.finishDecode(dl, cancelLegs), false
}

// relayEarly answers with a finished prefill (context) answer: JSON as is,
// or for a streaming client one SSE event carrying it, then [DONE].
func (r *pdRequest) relayEarly(P *upstream.Endpoint, cr legResult, body []byte) {
	r.ctx.Response.Header.Set("X-Llmgw-Endpoint", P.ID)
	r.ctx.Response.Header.Set("X-Llmgw-Route", r.route)
	r.ctx.SetStatusCode(cr.status)
	if r.stream {
		r.ctx.SetContentType("text/event-stream")
		out := make([]byte, 0, len(body)+32)
		out = append(out, "data: "...)
		out = append(out, body...)
		out = append(out, "\n\ndata: [DONE]\n\n"...)
		r.ctx.SetBody(out)
	} else {
		r.ctx.SetContentType("application/json")
		r.ctx.SetBody(body)
	}
	r.s.metrics.requests.WithLabelValues(r.rt.rule.Name, P.ID, statusLabel(cr.status)).Inc()
	r.s.metrics.pdRequests.WithLabelValues(r.rt.rule.Name, "complete", "success").Inc()
}

// decodeLeg sends the decode (generation) leg and relays it.
func (r *pdRequest) decodeLeg(D *upstream.Endpoint, body []byte) error {
	ctx, cancel := context.WithCancel(r.s.ctx)
	dl := r.startDecode(ctx, D, body)
	return r.finishDecode(dl, cancel)
}

// decodeLegState is a decode leg in flight: its response headers arrive on
// headers; bytes are relayed only by finishDecode.
type decodeLegState struct {
	r       *pdRequest
	ep      *upstream.Endpoint
	release func()
	headers chan struct{}
	resp    *http.Response
	err     error
	timer   *time.Timer
	cancel  context.CancelFunc
	t0      time.Time
	mu      sync.Mutex
	sent    bool
	done    chan struct{}
}

func (r *pdRequest) startDecode(parent context.Context, D *upstream.Endpoint, body []byte) *decodeLegState {
	ctx, cancel := context.WithCancel(parent)
	dl := &decodeLegState{r: r, ep: D, release: D.Acquire(), headers: make(chan struct{}), cancel: cancel, t0: time.Now(), done: make(chan struct{})}
	// The first-byte bound, then (reset per read) the idle bound.
	dl.timer = time.AfterFunc(r.rt.rule.Timeouts.FirstByte.Std(), cancel)
	go func() {
		defer close(dl.done)
		dl.resp, dl.err = r.sendLeg(ctx, D, body)
		close(dl.headers)
	}()
	return dl
}

func (dl *decodeLegState) sentAny() bool {
	dl.mu.Lock()
	defer dl.mu.Unlock()
	return dl.sent
}

// abandon cancels the decode leg and frees it.
func (dl *decodeLegState) abandon() {
	dl.cancel()
	<-dl.done
	dl.timer.Stop()
	if dl.resp != nil {
		dl.resp.Body.Close()
	}
	dl.release()
}

// finishDecode waits for the decode's headers and relays its body to the
// client; cancelAll ends every leg of the request when the relay ends.
func (r *pdRequest) finishDecode(dl *decodeLegState, cancelAll context.CancelFunc) error {
	name := r.rt.rule.Name
	m := r.s.metrics
	<-dl.done
	if dl.err != nil {
		timedOut := !dl.timer.Stop() // the timer fired: first-byte timeout
		dl.release()
		cancelAll()
		m.pdRequests.WithLabelValues(name, "decode", "error").Inc()
		if timedOut || isCtxTimeout(dl.err) {
			return fmt.Errorf("%w: decode endpoint %s (%s) sent nothing within %s", ErrPDDecodeTimeout, dl.ep.ID, dl.ep.Addr, r.rt.rule.Timeouts.FirstByte.Std())
		}
		return fmt.Errorf("%w: decode endpoint %s (%s): %v", ErrPDDecodeDied, dl.ep.ID, dl.ep.Addr, dl.err)
	}
	ttfb := time.Since(dl.t0)
	m.pdDecodeTTFT.WithLabelValues(name).Observe(ttfb.Seconds())
	idle := r.rt.rule.Timeouts.Idle.Std()
	dl.timer.Reset(idle)
	resp := dl.resp
	copyHeaders(r.ctx, resp.Header)
	r.ctx.SetStatusCode(resp.StatusCode)
	r.ctx.Response.Header.Set("X-Llmgw-Endpoint", dl.ep.ID)
	r.ctx.Response.Header.Set("X-Llmgw-Route", r.route)
	sse := strings.HasPrefix(resp.Header.Get("Content-Type"), "text/event-stream")
	finish := func(code int, err error) {
		dl.timer.Stop()
		resp.Body.Close()
		dl.release()
		cancelAll()
		status := "success"
		switch {
		case err != nil:
			status = pdStatus(err)
		case code >= 400:
			status = "error"
		}
		m.pdRequests.WithLabelValues(name, "decode", status).Inc()
		m.pdRequests.WithLabelValues(name, "complete", status).Inc()
		r.rt.obs.observe(dl.ep.Index, dl.ep.ID, code, time.Since(r.start), time.Since(dl.t0), ttfb)
	}
	if !sse {
		data, err := io.ReadAll(io.LimitReader(resp.Body, 64<<20))
		if err != nil {
			finish(fasthttp.StatusBadGateway, err)
			if b := dl.ep.Breaker(); b != nil {
				b.RecordConnFailure()
			}
			r.ctx.Response.ResetBody()
			r.ctx.Response.Header.Del("X-Llmgw-Endpoint")
			return fmt.Errorf("%w: decode endpoint %s: reading its answer: %v", ErrPDDecodeDied, dl.ep.ID, err)
		}
		r.ctx.SetBody(data)
		finish(resp.StatusCode, nil)
		return nil
	}
	r.ctx.SetBodyStreamWriter(func(w *bufio.Writer) {
		bp := relayBufPool.Get().(*[]byte)
		buf := *bp
		defer relayBufPool.Put(bp)
		var tail [len("data: [DONE]")]byte
		sawDone, clientGone := false, false
		var upErr error
		for {
			n, err := resp.Body.Read(buf)
			if n > 0 {
				dl.timer.Reset(idle)
				dl.mu.Lock()
				dl.sent = true
				dl.mu.Unlock()
				if !sawDone {
					sawDone = containsAcross(tail[:], buf[:n], doneMarker)
				}
				if _, werr := w.Write(buf[:n]); werr != nil || w.Flush() != nil {
					clientGone = true
					break
				}
			}
			if err != nil {
				if err != io.EOF {
					upErr = err
				}
				break
			}
		}
		stalled := !dl.timer.Stop() && upErr != nil
		var ferr error
		switch {
		case clientGone:
			m.clientCancels.WithLabelValues(name).Inc()
		case upErr != nil:
			ferr = fmt.Errorf("%w: decode endpoint %s: %v", ErrPDDecodeDied, dl.ep.ID, upErr)
			if stalled {
				ferr = fmt.Errorf("%w: decode endpoint %s sent nothing for %s", ErrPDDecodeStalled, dl.ep.ID, idle)
			}
			if b := dl.ep.Breaker(); b != nil {
				b.RecordConnFailure()
			}
			if !sawDone {
				_, _ = w.Write(sseErrorEvent(ferr))
				_ = w.Flush()
			}
			m.streamErrors.WithLabelValues(name, dl.ep.ID).Inc()
		}
		finish(resp.StatusCode, ferr)
	})
	return nil
}
