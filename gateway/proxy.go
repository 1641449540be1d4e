package gateway

import (
	"bytes"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"slices"
	"strconv"
	"sync"
	"time"

	"github.com/valyala/fasthttp"
	"github.com/valyala/fastjson"

	"github.com/llmgw/llmgw/gateway/openai"
	"github.com/llmgw/llmgw/gateway/policy"
	"github.com/llmgw/llmgw/gateway/upstream"
	"github.com/llmgw/llmgw/internal/peerwatch"
)

var (
	pathChat        = []byte("/v1/chat/completions")
	pathCompletions = []byte("/v1/completions")
	pathModels      = []byte("/v1/models")

	hdrRequestID     = []byte("X-Request-Id")
	hdrHost          = []byte("Host")
	hdrContentLength = []byte("Content-Length")
	ctEventStream    = []byte("text/event-stream")
	doneMarker       = []byte("data: [DONE]")

	// hopHeaders are connection-scoped (RFC 9110 §7.6.1) and never
	// forwarded, in either direction (isHopHeader).
	hopHeaders = []string{"Connection", "Keep-Alive", "Proxy-Authenticate", "Proxy-Authorization", "Proxy-Connection", "TE", "Trailer", "Transfer-Encoding", "Upgrade"}
)

// reqState is the per-request scratch space, pooled so that the request path
// does not allocate for parsing or policy input.
type reqState struct {
	parser   fastjson.Parser
	oreq     openai.Request
	preq     policy.Request
	id       [32]byte
	clientID []byte // the client's X-Request-Id, copied
	kv       kvScratch
	kvc      kvChoice
	upHead   []byte // the worker's request head (appendUpstreamHead)
}

var statePool = sync.Pool{New: func() any { return new(reqState) }}

// relayBufPool holds the P/D relay's copy buffers (pd.go).
var relayBufPool = sync.Pool{New: func() any { b := make([]byte, 32<<10); return &b }}

// clientWatchDelay is how long a request waits on its worker before the
// client's connection is watched for a disconnect (peerwatch.WatchAfter):
// an answer within it costs no watch (a goroutine, a peek and three
// deadline changes), and a client that leaves is noticed at most this much
// later, against generations that take far longer (the engine computes at
// most 50 ms more for a client that left). 50 ms rather than 5: every
// watch that starts, and every firing of the one timer the deferred watches
// share (at most once per delay while requests are in flight), wakes
// another thread of the runtime. Measured at one request in flight
// (2026-12-01, three alternating rounds, perf stat on the serve process;
// BENCHMARKS.md, "Client-disconnect watch after 50 ms"): futex calls per
// request 0.19-0.22 -> 0.02-0.03 in front of the fixed backend, 0.45-0.55
// -> 0.09-0.12 in front of the stalling llama.cpp persona, context
// switches per request 2.16-2.18 -> 1.98-2.00 and 2.54-2.62 -> 2.11-2.15.
const clientWatchDelay = 50 * time.Millisecond

// dataReadBufferSize is the data plane's per-connection read buffer, which
// is also the largest request header block it accepts (431 beyond).
const dataReadBufferSize = 16 << 10

func (s *Server) newDataServer(key string) *fasthttp.Server {
	return &fasthttp.Server{
		Handler: func(ctx *fasthttp.RequestCtx) {
			s.serveData(ctx, key)
			if s.draining.Load() {
				// Drain: the client's next request goes elsewhere.
				ctx.SetConnectionClose()
			}
		},
		Name:               "llmgw",
		MaxRequestBodySize: s.cfg.MaxBodyBytes,
		// ReadTimeout bounds reading one whole request (headers and body):
		// a client that trickles bytes (slowloris) is cut off.
		ReadTimeout: 30 * time.Second,
		// No Server.WriteTimeout: it would bound a whole response, and so
		// cut long streams. relay sets a write deadline per response
		// (ctx.SetWriteDeadline, which fasthttp clears afterwards) and a
		// streamed body moves it with every chunk (relayBody).
		IdleTimeout:           120 * time.Second,
		ReadBufferSize:        dataReadBufferSize, // also the request header size limit
		CloseOnShutdown:       true,
		ReduceMemoryUsage:     s.cfg.ReleaseIdleBuffers,
		NoDefaultServerHeader: true,
		NoDefaultContentType:  true,
		Logger:                discardLogger{},
		ErrorHandler: func(ctx *fasthttp.RequestCtx, err error) {
			var small *fasthttp.ErrSmallBuffer
			var ne net.Error
			switch {
			case errors.Is(err, fasthttp.ErrBodyTooLarge):
				writeError(ctx, fmt.Errorf("%w: the limit is %d bytes", ErrBodyTooLarge, s.cfg.MaxBodyBytes))
				s.metrics.rejected.WithLabelValues("body_too_large").Inc()
			case errors.As(err, &small):
				writeError(ctx, fmt.Errorf("%w: the limit is %d bytes", ErrHeaderTooLarge, dataReadBufferSize))
				s.metrics.rejected.WithLabelValues("header_too_large").Inc()
			case errors.As(err, &ne) && ne.Timeout():
				// ReadTimeout passed: a client that trickles its request
				// (slowloris), or a connection that never sent a byte (an
				// HTTP client's spare pooled connection). 408 is what
				// clients expect on such a connection: Go's transport, for
				// one, closes it quietly and retries instead of taking the
				// answer as the response to its next request.
				writeError(ctx, fmt.Errorf("%w: %v", ErrRequestTimeout, err))
				s.metrics.rejected.WithLabelValues("read_timeout").Inc()
			default:
				writeError(ctx, fmt.Errorf("%w: %v", ErrBadRequest, err))
				s.metrics.rejected.WithLabelValues("malformed_http").Inc()
			}
		},
	}
}

type discardLogger struct{}

func (discardLogger) Printf(string, ...any) {}

// serveData is the data-plane handler of the listener key.
func (s *Server) serveData(ctx *fasthttp.RequestCtx, key string) {
	path := ctx.Path()
	switch {
	case bytes.Equal(path, pathChat):
		s.serveCompletion(ctx, key, openai.Chat)
	case bytes.Equal(path, pathCompletions):
		s.serveCompletion(ctx, key, openai.Completion)
	case bytes.Equal(path, pathModels):
		s.serveModels(ctx, key)
	default:
		switch r, ok := modelRoutes[string(path)]; {
		case !ok:
			s.servePassthrough(ctx, key)
		case r.form:
			s.serveForm(ctx, key)
		default:
			s.serveCompletion(ctx, key, r.kind)
		}
	}
}

func (s *Server) routes(key string) *listenRoutes {
	return s.table.Load().byListen[key]
}

func (s *Server) serveModels(ctx *fasthttp.RequestCtx, key string) {
	if !ctx.IsGet() {
		writeError(ctx, fmt.Errorf("%w: %s %s; use GET", ErrMethodNotAllowed, ctx.Method(), ctx.Path()))
		ctx.Response.Header.Set("Allow", "GET") // after writeError, which resets the response
		return
	}
	var models []string
	if lr := s.routes(key); lr != nil {
		models = lr.models
	}
	buf := make([]byte, 0, 64+64*len(models))
	buf = append(buf, `{"object":"list","data":[`...)
	for i, m := range models {
		if i > 0 {
			buf = append(buf, ',')
		}
		buf = append(buf, `{"id":`...)
		buf = appendJSONString(buf, m)
		buf = append(buf, `,"object":"model","owned_by":"llmgw"}`...)
	}
	buf = append(buf, "]}"...)
	ctx.SetContentType("application/json")
	ctx.SetBody(buf)
}

// serveCompletion routes one completion request by its model.
func (s *Server) serveCompletion(ctx *fasthttp.RequestCtx, key string, kind openai.Kind) {
	start := time.Now()
	if !ctx.IsPost() {
		writeError(ctx, fmt.Errorf("%w: %s %s; this route takes POST requests", ErrMethodNotAllowed, ctx.Method(), ctx.Path()))
		ctx.Response.Header.Set("Allow", "POST")
		s.metrics.rejected.WithLabelValues("method").Inc()
		return
	}
	st := statePool.Get().(*reqState)
	defer statePool.Put(st)
	if s.cfg.LogPayloads {
		// Payloads may hold personal data: logged only when the operator
		// asked for it (--log-payloads), and only at debug level.
		s.log.Debug("request payload", "path", string(ctx.Path()), "body", string(ctx.PostBody()))
	}
	rt, v, reject, err := s.readCompletion(key, kind, viewOf(ctx), ctx.PostBody(), st)
	if err != nil {
		writeError(ctx, err)
		s.metrics.rejected.WithLabelValues(reject).Inc()
		return
	}
	if kind != openai.Chat && kind != openai.Completion {
		// The P/D hand-off and the KV-exact tokenizer know chat and
		// completion bodies only. Embeddings, rerank, score and tokenize
		// are not generation; a Responses body is, but its prompt is
		// rendered by the engine from items the gateway does not
		// tokenize. The rule's policy picks, by the content key where
		// there is one (see docs/data-plane.md).
		s.forward(ctx, rt, st, st.oreq.Stream, start, nil)
		return
	}
	if rt.pd != nil {
		s.servePD(ctx, rt, st, v, kind, st.oreq.Stream, start)
		return
	}
	var kvc *kvChoice
	if rt.kv != nil {
		st.kvc = rt.kv.route(ctx, &st.kv, v, kind, nil)
		kvc = &st.kvc
		s.metrics.kvObserve(rt.rule.Name, rt.kv, kvc)
	}
	s.forward(ctx, rt, st, st.oreq.Stream, start, kvc)
}

// readCompletion reads a JSON request on a model-routed path (chat,
// completions and the other routes of modelRoutes) up to its rule: it
// decodes the body, finds the rule serving its model on listener key and
// fills st's policy input (content key, conversation, session). Both data
// planes route with it. It has no side effect beyond st: a non-nil error
// is the client's answer (writeError), and reject names its
// llmgw_rejected_requests_total reason.
func (s *Server) readCompletion(key string, kind openai.Kind, h requestView, body []byte, st *reqState) (rt *ruleRuntime, v *fastjson.Value, reject string, err error) {
	decode := openai.Decode
	if kind != openai.Chat && kind != openai.Completion {
		// A body without a model goes to the default rule, as every such
		// request did before these routes were routed by model.
		decode = openai.DecodeOptional
	}
	v, model, err := decode(&st.parser, body)
	if err != nil {
		return nil, nil, "invalid_body", err
	}
	if rt, err = s.lookupRule(key, model); err != nil {
		return nil, nil, "unknown_model", err
	}
	prefix := rt.prefix
	if !rt.reads.Key {
		prefix = 0 // nothing reads the content key: hash none of the content
	}
	if err := openai.Extract(v, model, kind, prefix, &st.oreq); err != nil {
		return nil, nil, "invalid_body", err
	}
	if st.oreq.Stream && !h.isHTTP11() {
		return nil, nil, "stream_http10", fmt.Errorf("%w: \"stream\": true over %s; an HTTP/1.0 answer of unknown length could only end by closing the connection, which cannot be told from a cut stream (use HTTP/1.1)", ErrStreamNeedsHTTP11, h.protocol())
	}
	st.preq = policy.Request{KeyHash: st.oreq.KeyHash, HasKey: st.oreq.HasKey}
	// The rest only where it is read (ruleRuntime.reads).
	if rt.reads.Conv {
		st.preq.ConvHash, st.preq.HasConv = rt.conversationHash(h)
	}
	if rt.reads.Session {
		st.preq.Session = rt.sessionValue(h, st.oreq.User)
	}
	return rt, v, "", nil
}

// servePassthrough relays any other path to the listener's default rule.
func (s *Server) servePassthrough(ctx *fasthttp.RequestCtx, key string) {
	start := time.Now()
	lr := s.routes(key)
	if lr == nil || lr.def == nil {
		writeError(ctx, fmt.Errorf("%w: %s %s (this listener has no default rule for other paths)", ErrNotFound, ctx.Method(), ctx.Path()))
		return
	}
	st := statePool.Get().(*reqState)
	defer statePool.Put(st)
	st.preq = policy.Request{}
	s.forward(ctx, lr.def, st, false, start, nil)
}

// requestID returns the client's X-Request-Id, or a fresh 32-hex-char id.
func requestID(ctx *fasthttp.RequestCtx, st *reqState) []byte {
	return requestIDOf(ctx.Request.Header.PeekBytes(hdrRequestID), st)
}

// requestIDOf is requestID for the value v of a request's X-Request-Id
// (nil when it has none).
func requestIDOf(v []byte, st *reqState) []byte {
	if len(v) > 0 && len(v) <= 256 && printable(v) {
		// Copied: forward deletes the header before setting it again, and
		// v points into the header's storage.
		st.clientID = append(st.clientID[:0], v...)
		return st.clientID
	}
	newRequestID(&st.id)
	return st.id[:]
}

// newRequestID fills id with 32 random hex characters.
func newRequestID(id *[32]byte) {
	var raw [16]byte
	a, b := rand.Uint64(), rand.Uint64()
	for i := 0; i < 8; i++ {
		raw[i], raw[8+i] = byte(a>>(8*i)), byte(b>>(8*i))
	}
	hex.Encode(id[:], raw[:])
}

func printable(b []byte) bool {
	for _, c := range b {
		if c < 0x21 || c > 0x7e {
			return false
		}
	}
	return true
}

// forward sends the request to an endpoint chosen by rt's policy and relays
// the answer. A request is executed at most once: it is sent again only
// when the failure proves no worker read it (see upconn.go). A pooled
// connection found dead before the request was written is redialed once on
// the same endpoint, not charged to it; a failure to connect (or to write
// the request) is retried once on another endpoint; anything after the
// whole request was written is relayed as an error.
//
// kvc, when non-nil, is the KV-exact decision: its endpoint (if any) is
// tried first, and the response feeds the hash-parity self-check.
func (s *Server) forward(ctx *fasthttp.RequestCtx, rt *ruleRuntime, st *reqState, stream bool, start time.Time, kvc *kvChoice) {
	id := requestID(ctx, st)
	// Del first: Set replaces only the first of repeated headers, and the
	// worker must see exactly one id.
	ctx.Request.Header.DelBytes(hdrRequestID)
	ctx.Request.Header.SetBytesKV(hdrRequestID, id)
	ctx.Response.Header.SetBytesKV(hdrRequestID, id)
	var lastErr error
	for attempt := 0; attempt < 2; attempt++ {
		var d policy.Decision
		var err error
		route := ""
		if attempt == 0 && kvc != nil && kvc.ep != nil {
			d, route = policy.Decision{Endpoint: kvc.ep}, kvc.routeLabel()
		} else {
			d, err = rt.picker.Pick(&st.preq)
			if err == nil {
				route = d.Reason.String()
				if kvc != nil {
					route = "kv-exact miss=" + kvc.reason + " " + route
					if kvc.ep != nil { // the KV choice failed: this is the retry
						route = "kv-exact retry " + d.Reason.String()
					}
				}
			}
		}
		if err != nil {
			if lastErr == nil {
				lastErr = fmt.Errorf("%w: rule %q has no endpoint that is healthy, closed-breaker and not draining", ErrNoEndpoint, rt.rule.Name)
				s.metrics.requests.WithLabelValues(rt.rule.Name, "", "503").Inc()
			}
			break
		}
		ep := d.Endpoint
		release := ep.Acquire()
		// The worker's request is written from the client's (no copy into
		// a second fasthttp.Request); its head is built again per attempt,
		// for the endpoint's Host.
		call := &upstreamCall{reqBody: ctx.PostBody(), bodyless: upstreamBodyless(&ctx.Request.Header), isHead: ctx.Request.Header.IsHead()}
		st.upHead = appendUpstreamHead(st.upHead[:0], &ctx.Request.Header, upstreamURI(&ctx.Request.Header, ctx.URI()), ep.Addr, len(call.reqBody), call.bodyless)
		// roundTrip ends the head in its spare capacity.
		st.upHead = slices.Grow(st.upHead, upHeadEnd)
		call.head = st.upHead
		resp := fasthttp.AcquireResponse()
		// The watch cancels the call when the client closes while waiting.
		watch := peerwatch.WatchAfter(ctx.Conn(), call.cancel, clientWatchDelay)
		upStart := time.Now()
		hc := rt.clients[ep.Index]
		err = s.sendUpstream(rt, hc, ep, call, resp)
		if reusedNotSent(err) && !call.isCancelled() {
			// The worker closed this pooled connection (or it hit the
			// engine's limits) before the request was written: nothing was
			// sent, the worker is not to blame. Pooled connections older
			// than this one are at least as likely dead.
			if errors.Is(err, errStaleConn) {
				hc.CloseIdleConnections()
			}
			s.metrics.redials.WithLabelValues(rt.rule.Name, ep.ID).Inc()
			err = s.sendUpstream(rt, hc, ep, call, resp)
		}
		if err != nil && call.isCancelled() {
			watch.Stop()
			release()
			fasthttp.ReleaseResponse(resp)
			s.clientLeft(ctx, rt, ep)
			return
		}
		if err == nil {
			s.prepareAnswer(rt, resp)
		}
		if err != nil {
			watch.Stop()
			release()
			fasthttp.ReleaseResponse(resp)
			retry := false
			lastErr, retry = s.upstreamFailure(rt, ep, err)
			s.log.Warn("upstream failed", "rule", rt.rule.Name, "endpoint", ep.ID, "attempt", attempt+1, "retried", retry && attempt == 0, "err", logErrText(err))
			if retry && attempt == 0 {
				s.metrics.retries.WithLabelValues(rt.rule.Name).Inc()
				st.preq.Exclude = ep
				continue
			}
			break
		}
		s.decisions.add(rt.rule.Name, ep.ID, route, id, d.Spill, kvc, ep.ID)
		var obs *kvObservation
		if kvc != nil {
			obs = &kvObservation{predicted: 0}
			if kvc.ep == ep {
				obs.predicted = kvc.predicted
			}
		}
		s.relay(ctx, rt, ep, route, resp, call.body, watch, release, start, upStart, obs)
		return
	}
	writeError(ctx, lastErr)
}

// sendUpstream sends call to ep on a kept connection from hc; when the
// engine's kept connections are all busy (fasthttp.ErrNoFreeConns: nothing
// was sent), on a one-shot connection instead (keptConns).
func (s *Server) sendUpstream(rt *ruleRuntime, hc *fasthttp.HostClient, ep *upstream.Endpoint, call *upstreamCall, resp *fasthttp.Response) error {
	err := roundTrip(hc, call, resp, false)
	if rt.oneShot != nil && errors.Is(err, fasthttp.ErrNoFreeConns) {
		s.metrics.oneShots.WithLabelValues(rt.rule.Name, ep.ID).Inc()
		err = roundTrip(rt.oneShot[ep.Index], call, resp, true)
	}
	return err
}

// upstreamFailure charges and describes a failed send to ep, and says
// whether the request may go to another endpoint: only when nothing can
// have reached a worker. The client-facing error carries no upstream bytes
// (fasthttp's errors quote the worker's headers).
func (s *Server) upstreamFailure(rt *ruleRuntime, ep *upstream.Endpoint, err error) (clientErr error, retry bool) {
	name := rt.rule.Name
	b := ep.Breaker()
	switch {
	case errors.Is(err, fasthttp.ErrNoFreeConns):
		// The gateway's own connection limit to this endpoint: nothing
		// was sent, and the worker did not fail.
		s.metrics.upstreamFailures.WithLabelValues(name, ep.ID, "not_sent").Inc()
		s.metrics.requests.WithLabelValues(name, ep.ID, "502").Inc()
		return fmt.Errorf("%w: endpoint %s (%s): the gateway's connection limit to it is reached", ErrUpstreamUnreachable, ep.ID, ep.Addr), true
	case reusedNotSent(err):
		// The redial met a dead pooled connection again: still nothing
		// sent, and still not the worker's failure to connect.
		s.metrics.upstreamFailures.WithLabelValues(name, ep.ID, "not_sent").Inc()
		s.metrics.requests.WithLabelValues(name, ep.ID, "502").Inc()
		return fmt.Errorf("%w: endpoint %s (%s) closed its pooled connections before the request could be sent", ErrUpstreamUnreachable, ep.ID, ep.Addr), true
	case notSent(err):
		if b != nil {
			b.RecordConnFailure()
		}
		s.metrics.upstreamFailures.WithLabelValues(name, ep.ID, "not_sent").Inc()
		s.metrics.requests.WithLabelValues(name, ep.ID, "502").Inc()
		return fmt.Errorf("%w: endpoint %s (%s): %s", ErrUpstreamUnreachable, ep.ID, ep.Addr, notSentText(err)), true
	}
	if b != nil {
		b.RecordConnFailure()
	}
	s.metrics.upstreamFailures.WithLabelValues(name, ep.ID, "after_send").Inc()
	if isTimeout(err) {
		s.metrics.requests.WithLabelValues(name, ep.ID, "504").Inc()
		return fmt.Errorf("%w: endpoint %s (%s) sent no response within the first-byte timeout; not retried: the worker may be executing it", ErrUpstreamTimeout, ep.ID, ep.Addr), false
	}
	s.metrics.requests.WithLabelValues(name, ep.ID, "502").Inc()
	return fmt.Errorf("%w: endpoint %s (%s) %s; not retried: the worker may have executed it", ErrUpstreamFailed, ep.ID, ep.Addr, afterSendText(err)), false
}

// prepareAnswer readies a worker's answer for relay: a streamed SSE answer
// from an engine that closes the connection after every stream marks the
// connection for closing, so it is never pooled (upstreamBody.Close honours
// the mark).
func (s *Server) prepareAnswer(rt *ruleRuntime, resp *fasthttp.Response) {
	if rt.conn.CloseAfterStream && bytes.HasPrefix(resp.Header.ContentType(), ctEventStream) {
		resp.SetConnectionClose()
	}
}

// recordAnswer tells ep's breaker what the worker's answer says about its
// health, as the engine's adapter classifies it: a client error (even a
// 5xx, like llama.cpp's 500 for malformed JSON) never counts toward
// origin-5xx demotion.
//
// body is the answer's body when relay buffered it (every small body of
// known length, so an engine's JSON error answers), else nil: a streamed
// answer is classified by its status alone.
func (s *Server) recordAnswer(rt *ruleRuntime, ep *upstream.Endpoint, status int, body []byte) {
	b := ep.Breaker()
	if b == nil {
		return
	}
	switch f := rt.engine.Classify(status, body); {
	case f.Healthy():
		b.RecordSuccess()
	case f.ClientsFault():
		if status >= 500 {
			s.metrics.clientFault5xx.WithLabelValues(rt.rule.Name, ep.ID).Inc()
		}
		b.RecordClientError()
	default:
		if b.RecordOrigin5xx() {
			s.log.Warn("endpoint demoted after consecutive 5xx answers", "rule", rt.rule.Name, "endpoint", ep.ID)
		}
	}
}

func isTimeout(err error) bool {
	status, _, _ := statusFor(err)
	return status == fasthttp.StatusGatewayTimeout
}

// relay copies the worker's response to the client. It owns resp, body,
// watch and release.
//
// A small body of known length is buffered (within the global budget), so
// that a failure to read it is still a clean 502; every other body streams
// through as it arrives, with no size cap: an SSE stream event by event, a
// body of known length under its Content-Length, anything else chunked. A
// body that breaks after bytes went out is never delivered as complete: an
// SSE stream ends with an error event, any other body aborts the client
// connection (no terminating chunk, or fewer bytes than its length).
//
// obs, when non-nil, collects the engine-reported cached tokens for the
// KV-exact self-check.
func (s *Server) relay(ctx *fasthttp.RequestCtx, rt *ruleRuntime, ep *upstream.Endpoint, route string, resp *fasthttp.Response, body *upstreamBody, watch *peerwatch.Watcher, release func(), start, upStart time.Time, obs *kvObservation) {
	status := resp.StatusCode()
	ctx.Response.Header.SetStatusCode(status)
	copyAnswerHeaders(&ctx.Response.Header, &resp.Header)
	ctx.Response.Header.Set("X-Llmgw-Endpoint", ep.ID)
	ctx.Response.Header.Set("X-Llmgw-Route", route)

	// Bounds writing the header and a buffered body to a client that does
	// not read; a streamed body moves it on with every chunk.
	now := time.Now()
	_ = ctx.SetWriteDeadline(now.Add(s.cfg.WriteTimeout))
	ttfb := now.Sub(upStart)
	if body == nil { // no body: HEAD, 204, 304
		s.recordAnswer(rt, ep, status, nil)
		watch.Stop()
		release()
		fasthttp.ReleaseResponse(resp)
		rt.obs.observe(ep.Index, ep.ID, status, now.Sub(start), ttfb, ttfb)
		return
	}
	sse := bytes.HasPrefix(resp.Header.ContentType(), ctEventStream)
	cl := resp.Header.ContentLength() // -1 chunked, -2 until close
	// An HTTP/1.0 client has no chunked coding: a body of unknown length
	// must be buffered to be given a Content-Length.
	mustBuffer := cl < 0 && !ctx.Request.Header.IsHTTP11()
	if mustBuffer || !sse && cl >= 0 && cl <= maxBufferedBody {
		held, err := s.readBuffered(body, cl, mustBuffer)
		switch {
		case err == nil:
			buf := held.buf
			s.recordAnswer(rt, ep, status, buf)
			watch.Stop()
			done := time.Now()
			upDur := done.Sub(upStart)
			release()
			fasthttp.ReleaseResponse(resp)
			ctx.Response.SetBodyStream(held, len(buf))
			if s.cfg.LogPayloads {
				s.log.Debug("response payload", "rule", rt.rule.Name, "endpoint", ep.ID, "status", status, "body", string(buf))
			}
			if obs != nil {
				obs.scan.write(buf)
				s.kvSelfCheck(rt, obs)
			}
			rt.obs.observe(ep.Index, ep.ID, status, done.Sub(start), upDur, ttfb)
			return
		case errors.Is(err, errBudgetStream):
			// Over budget but streamable: relayed unbuffered below.
		default:
			s.relayFailed(ctx, rt, ep, resp, body, watch, release, err)
			return
		}
	}

	// A non-SSE body's first bytes are read here, before any byte of the
	// answer goes out: a body that breaks at once (bad chunking, a reset)
	// is still a clean 502, not a 200 cut short. SSE is not held back: its
	// first event may come much later than its headers.
	var head []byte
	var headErr error
	if !sse {
		bp := relayBufPool.Get().(*[]byte)
		defer relayBufPool.Put(bp)
		n, err := body.Read(*bp)
		switch {
		case n == 0 && err != nil && err != io.EOF:
			s.relayFailed(ctx, rt, ep, resp, body, watch, release, err)
			return
		case n > 0:
			head = append([]byte(nil), (*bp)[:n]...)
		}
		headErr = err
	}

	// Streamed: the body is read on fasthttp's connection goroutine as it
	// writes, after this handler returns. From here a client that leaves
	// shows as a failed write.
	s.recordAnswer(rt, ep, status, nil)
	watch.Stop()
	if cl < 0 {
		cl = -1
	}
	rb := &relayBody{s: s, rt: rt, ep: ep, resp: resp, body: body, release: release,
		ctx: ctx, wt: s.cfg.WriteTimeout, start: start, upStart: upStart, ttfb: ttfb,
		status: status, obs: obs, sse: sse, sseEvents: sse && cl < 0, pending: head, headErr: headErr}
	if obs != nil && len(head) > 0 {
		obs.scan.write(head)
	}
	// An SSE client sees the status and headers when the worker sent them,
	// not with the first event.
	ctx.Response.ImmediateHeaderFlush = sse
	ctx.Response.SetBodyStream(rb, cl)
}

// maxBufferedBody is the largest body of known length relay buffers.
const maxBufferedBody = 1 << 20

// errBudgetStream: readBuffered found the budget spent for a body that can
// be streamed instead; nothing was read.
var errBudgetStream = errors.New("gateway: buffer budget spent; streaming")

// readBuffered reads body (of length cl, or unknown when cl < 0) into
// memory charged to the buffer budget; the heldBody gives the charge back
// once written. On error body is closed and nothing is charged.
func (s *Server) readBuffered(body *upstreamBody, cl int, mustBuffer bool) (*heldBody, error) {
	if cl >= 0 {
		if !s.budget.acquire(int64(cl)) {
			s.metrics.budgetExceeded.WithLabelValues("streamed").Inc()
			return nil, errBudgetStream
		}
		h := newHeldBody(cl)
		_, err := io.ReadFull(body, h.buf)
		if err == nil {
			// Read to the end so the connection can be pooled again.
			var one [1]byte
			if _, err = body.Read(one[:]); err == io.EOF {
				err = nil
			} else if err == nil {
				err = errors.New("body longer than its Content-Length")
			}
		}
		body.Close()
		h.hold(&s.budget, int64(cl))
		if err != nil {
			_ = h.Close()
			return nil, err
		}
		return h, nil
	}
	// Unknown length (mustBuffer): charge as it grows.
	h := &heldBody{}
	var held int64
	chunk := make([]byte, 32<<10)
	for {
		n, err := body.Read(chunk)
		if n > 0 {
			if !s.budget.acquire(int64(n)) {
				body.Close()
				s.budget.release(held)
				s.metrics.budgetExceeded.WithLabelValues("refused").Inc()
				return nil, fmt.Errorf("%w: an HTTP/1.0 client needs the whole answer buffered (no chunked coding) and the %d-byte budget is spent (--buffer-budget-bytes)", ErrBufferBudget, s.budget.limit)
			}
			held += int64(n)
			h.buf = append(h.buf, chunk[:n]...)
		}
		if err == io.EOF {
			body.Close()
			return h.hold(&s.budget, held), nil
		}
		if err != nil {
			body.Close()
			s.budget.release(held)
			return nil, err
		}
	}
}

// bodyError describes a failure to read a worker's body after its headers.
func (s *Server) bodyError(rt *ruleRuntime, ep *upstream.Endpoint, err error) error {
	if isTimeout(err) {
		return fmt.Errorf("%w: endpoint %s: the body stalled past the idle timeout (%v without a byte) after the response began", ErrUpstreamTimeout, ep.ID, rt.rule.Timeouts.Idle.Std())
	}
	// afterSendText: in the gateway's words, never the worker's bytes
	// (fasthttp's chunk errors quote them).
	return fmt.Errorf("%w: endpoint %s: the body broke after the response began: it %s", ErrUpstreamFailed, ep.ID, afterSendText(err))
}

// relayFailed answers a worker body that failed before any byte of the
// answer went to the client: 499 when the client left, 503 when the buffer
// budget is spent, else a 502/504 charged to the endpoint. It owns resp,
// body (closed by its reader on error), watch and release.
func (s *Server) relayFailed(ctx *fasthttp.RequestCtx, rt *ruleRuntime, ep *upstream.Endpoint, resp *fasthttp.Response, body *upstreamBody, watch *peerwatch.Watcher, release func(), err error) {
	watch.Stop()
	cancelled := body.call.isCancelled()
	body.Close() // idempotent: readBuffered closed it already on its errors
	release()
	fasthttp.ReleaseResponse(resp)
	switch {
	case cancelled:
		s.clientLeft(ctx, rt, ep)
	case errors.Is(err, ErrBufferBudget):
		writeError(ctx, err)
		s.metrics.requests.WithLabelValues(rt.rule.Name, ep.ID, "503").Inc()
	default:
		if b := ep.Breaker(); b != nil {
			b.RecordConnFailure()
		}
		s.log.Warn("upstream body failed before the answer began", "rule", rt.rule.Name, "endpoint", ep.ID, "err", logErrText(err))
		werr := s.bodyError(rt, ep, err)
		writeError(ctx, werr)
		st, _, _ := statusFor(werr)
		s.metrics.requests.WithLabelValues(rt.rule.Name, ep.ID, statusLabel(st)).Inc()
	}
}

// clientLeft answers a request whose client closed its connection while
// the worker was working on it; the worker's request is already cancelled.
func (s *Server) clientLeft(ctx *fasthttp.RequestCtx, rt *ruleRuntime, ep *upstream.Endpoint) {
	s.metrics.clientCancels.WithLabelValues(rt.rule.Name).Inc()
	s.metrics.requests.WithLabelValues(rt.rule.Name, ep.ID, "499").Inc()
	ctx.SetConnectionClose()
	writeError(ctx, errClientGone)
}

var (
	strClose         = []byte("close")
	strHost          = []byte("Host")
	strContentLength = []byte("Content-Length")
	strKeepAlive     = []byte("keep-alive")
)

// containsAcross reports whether marker occurs in the byte stream whose
// previous bytes end in tail and whose next bytes are b; it updates tail.
func containsAcross(tail, b, marker []byte) bool {
	found := bytes.Contains(b, marker)
	if !found {
		var join [64]byte
		j := append(join[:0], tail...)
		k := min(len(b), len(marker)-1)
		j = append(j, b[:k]...)
		found = bytes.Contains(j, marker)
	}
	if len(b) >= len(tail) {
		copy(tail, b[len(b)-len(tail):])
	} else {
		copy(tail, tail[len(b):])
		copy(tail[len(tail)-len(b):], b)
	}
	return found
}

func appendJSONString(dst []byte, s string) []byte {
	dst = append(dst, '"')
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch {
		case c == '"' || c == '\\':
			dst = append(dst, '\\', c)
		case c < 0x20:
			dst = append(dst, `\u00`...)
			dst = append(dst, "0123456789abcdef"[c>>4], "0123456789abcdef"[c&15])
		default:
			dst = append(dst, c)
		}
	}
	return append(dst, '"')
}

// completionKind says whether path is routed by a JSON body's model
// (chat, completions and the JSON routes of modelRoutes), and the body's
// shape.
func completionKind(path []byte) (openai.Kind, bool) {
	switch {
	case bytes.Equal(path, pathChat):
		return openai.Chat, true
	case bytes.Equal(path, pathCompletions):
		return openai.Completion, true
	}
	if r, ok := modelRoutes[string(path)]; ok && !r.form {
		return r.kind, true
	}
	return 0, false
}

// modelRoute is how a routed path's body names its model.
type modelRoute struct {
	kind openai.Kind // JSON body shape
	form bool        // multipart/form-data with a "model" field
}

// modelRoutes are the OpenAI-compatible paths, beside chat and completions,
// that are routed by the body's model; every other path passes through to
// the listener's default rule. Which engine serves which path is listed
// in docs/data-plane.md: the gateway forwards the path unchanged, and an
// engine that does not serve it answers its own 404, which is relayed.
var modelRoutes = map[string]modelRoute{
	"/v1/embeddings":           {kind: openai.Embedding},
	"/v1/responses":            {kind: openai.Responses},
	"/v1/rerank":               {kind: openai.ModelOnly},
	"/rerank":                  {kind: openai.ModelOnly},
	"/v2/rerank":               {kind: openai.ModelOnly},
	"/v1/score":                {kind: openai.ModelOnly},
	"/score":                   {kind: openai.ModelOnly},
	"/tokenize":                {kind: openai.ModelOnly},
	"/detokenize":              {kind: openai.ModelOnly},
	"/v1/tokenize":             {kind: openai.ModelOnly},
	"/v1/detokenize":           {kind: openai.ModelOnly},
	"/v1/audio/transcriptions": {form: true},
	"/v1/audio/translations":   {form: true},
}

// ruleFor finds the rule serving model on listener key (the default rule
// when no rule names it), or answers 404 unknown_model and returns nil.
func (s *Server) ruleFor(ctx *fasthttp.RequestCtx, key string, model []byte) *ruleRuntime {
	rt, err := s.lookupRule(key, model)
	if err != nil {
		writeError(ctx, err)
		s.metrics.rejected.WithLabelValues("unknown_model").Inc()
	}
	return rt
}

// lookupRule is ruleFor without the answer: the rule, or the error that
// answers the request.
func (s *Server) lookupRule(key string, model []byte) (*ruleRuntime, error) {
	lr := s.routes(key)
	var rt *ruleRuntime
	if lr != nil {
		if rt = lr.byModel[string(model)]; rt == nil {
			rt = lr.def
		}
	}
	switch {
	case rt != nil:
		return rt, nil
	case model == nil:
		return nil, fmt.Errorf("%w: the request names no model and this listener has no default rule (model_name \"\")", ErrUnknownModel)
	default:
		return nil, fmt.Errorf("%w: no rule serves model %q on this listener (GET /v1/models lists the served models)", ErrUnknownModel, model)
	}
}

// serveForm routes a multipart/form-data request (the audio routes) by its
// "model" field. The body is already in memory, bounded by the listener's
// body limit; only the model and stream values are copied out of it. A
// form without a model goes to the default rule (the engine then serves
// its own model). There is no content key: an audio file is no prompt
// prefix a worker caches.
func (s *Server) serveForm(ctx *fasthttp.RequestCtx, key string) {
	start := time.Now()
	if !ctx.IsPost() {
		writeError(ctx, fmt.Errorf("%w: %s %s; this route takes POST requests", ErrMethodNotAllowed, ctx.Method(), ctx.Path()))
		ctx.Response.Header.Set("Allow", "POST")
		s.metrics.rejected.WithLabelValues("method").Inc()
		return
	}
	f, err := openai.ParseForm(ctx.Request.Header.ContentType(), ctx.PostBody())
	if err != nil {
		writeError(ctx, err)
		s.metrics.rejected.WithLabelValues("invalid_body").Inc()
		return
	}
	rt := s.ruleFor(ctx, key, f.Model)
	if rt == nil {
		return
	}
	if f.Stream && !ctx.Request.Header.IsHTTP11() {
		writeError(ctx, fmt.Errorf("%w: \"stream\": true over %s; an HTTP/1.0 answer of unknown length could only end by closing the connection, which cannot be told from a cut stream (use HTTP/1.1)", ErrStreamNeedsHTTP11, ctx.Request.Header.Protocol()))
		s.metrics.rejected.WithLabelValues("stream_http10").Inc()
		return
	}
	st := statePool.Get().(*reqState)
	defer statePool.Put(st)
	st.preq = policy.Request{}
	st.preq.ConvHash, st.preq.HasConv = rt.conversationHash(viewOf(ctx))
	st.preq.Session = rt.sessionValue(viewOf(ctx), nil)
	s.forward(ctx, rt, st, f.Stream, start, nil)
}

// upstreamBodyless says how the worker's request carries a body: GET and
// HEAD carry none (and no Content-Length), every other method its body
// with its length (0 included), as fasthttp's client writes them.
func upstreamBodyless(h *fasthttp.RequestHeader) (bodyless bool) {
	return h.IsGet() || h.IsHead()
}

// upstreamURI is the request target the worker gets: the client's, in
// origin form (an absolute-form target, POST http://host/v1/..., loses its
// scheme and authority; the Host header names the endpoint).
func upstreamURI(h *fasthttp.RequestHeader, parsed *fasthttp.URI) []byte {
	if uri := h.RequestURI(); len(uri) > 0 && uri[0] == '/' {
		return uri
	}
	return parsed.RequestURI()
}

// appendUpstreamHead appends to dst the head of the worker's request, up to
// but not including the blank line that ends it: the client's method and
// target uri, the gateway's own HTTP/1.1 (RFC 9110 §7.6.3: an intermediary
// sends its own version), Host: host, and the client's headers in h except
// the connection-scoped ones (isHopHeader, and every header h's Connection
// header names: RFC 9110 §7.6.1), its Host and its Content-Length: the
// length is that of the body the gateway sends, bodyLen, unless bodyless
// (GET, HEAD). It is one pass over the client's headers, each appended
// once; nothing is added to be deleted again.
func appendUpstreamHead(dst []byte, h *fasthttp.RequestHeader, uri []byte, host string, bodyLen int, bodyless bool) []byte {
	dst = append(dst, h.Method()...)
	dst = append(dst, ' ')
	dst = append(dst, uri...)
	dst = append(dst, " HTTP/1.1\r\nHost: "...)
	dst = append(dst, host...)
	dst = append(dst, '\r', '\n')
	conn := h.Peek(fasthttp.HeaderConnection)
	named := namesHeaders(conn)
	for k, v := range h.All() {
		if isHopHeader(k) || bytes.EqualFold(k, strHost) || bytes.EqualFold(k, strContentLength) || named && connectionNames(conn, k) {
			continue
		}
		dst = append(dst, k...)
		dst = append(dst, ':', ' ')
		dst = append(dst, v...)
		dst = append(dst, '\r', '\n')
	}
	if !bodyless {
		dst = append(dst, "Content-Length: "...)
		dst = strconv.AppendInt(dst, int64(bodyLen), 10)
		dst = append(dst, '\r', '\n')
	}
	return dst
}

// copyAnswerHeaders adds to dst, the client's response, the worker's
// headers in src except the connection-scoped ones (as appendUpstreamHead)
// and X-Request-Id: the gateway owns it (already set, the same value the
// worker was sent), and copying a worker's echo would duplicate it.
// Content-Type comes with the rest (none when the worker sent none).
// Nothing is added to be deleted again.
func copyAnswerHeaders(dst, src *fasthttp.ResponseHeader) {
	conn := src.Peek(fasthttp.HeaderConnection)
	named := namesHeaders(conn)
	for k, v := range src.All() {
		if isHopHeader(k) || bytes.EqualFold(k, hdrRequestID) || named && connectionNames(conn, k) {
			continue
		}
		dst.AddBytesKV(k, v)
	}
}

// hopByLen holds hopHeaders by length, so that isHopHeader compares a name
// with at most three of them.
var hopByLen = func() (t [20][][]byte) {
	for _, h := range hopHeaders {
		t[len(h)] = append(t[len(h)], []byte(h))
	}
	return t
}()

// isHopHeader reports whether k names a connection-scoped header of the
// fixed list (hopHeaders), in any case.
func isHopHeader(k []byte) bool {
	if len(k) >= len(hopByLen) {
		return false
	}
	for _, h := range hopByLen[len(k)] {
		if bytes.EqualFold(k, h) {
			return true
		}
	}
	return false
}

// namesHeaders reports whether a Connection header value names any header
// (a token other than close and keep-alive).
func namesHeaders(conn []byte) bool {
	found := false
	connectionTokens(conn, func([]byte) bool { found = true; return false })
	return found
}

// connectionNames reports whether the Connection header value conn names
// header k.
func connectionNames(conn, k []byte) bool {
	found := false
	connectionTokens(conn, func(tok []byte) bool {
		found = bytes.EqualFold(tok, k)
		return !found
	})
	return found
}

// connectionTokens calls f with each token of the Connection header value
// conn other than close and keep-alive, until f returns false.
func connectionTokens(conn []byte, f func(tok []byte) bool) {
	for rest := conn; len(rest) > 0; {
		tok := rest
		if i := bytes.IndexByte(rest, ','); i >= 0 {
			tok, rest = rest[:i], rest[i+1:]
		} else {
			rest = nil
		}
		tok = bytes.TrimSpace(tok)
		if len(tok) > 0 && !bytes.EqualFold(tok, strClose) && !bytes.EqualFold(tok, strKeepAlive) && !f(tok) {
			return
		}
	}
}
