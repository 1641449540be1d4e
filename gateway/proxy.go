package gateway

import (
	"bufio"
	"bytes"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"sync"
	"time"

	"github.com/valyala/fasthttp"
	"github.com/valyala/fastjson"

	"github.com/llmgw/llmgw/gateway/openai"
	"github.com/llmgw/llmgw/gateway/policy"
	"github.com/llmgw/llmgw/gateway/upstream"
)

var (
	pathChat        = []byte("/v1/chat/completions")
	pathCompletions = []byte("/v1/completions")
	pathModels      = []byte("/v1/models")

	hdrRequestID  = []byte("X-Request-Id")
	ctEventStream = []byte("text/event-stream")
	doneMarker    = []byte("data: [DONE]")

	// hopHeaders are connection-scoped (RFC 9110 §7.6.1) and never forwarded.
	hopHeaders = []string{"Connection", "Keep-Alive", "Proxy-Authenticate", "Proxy-Authorization", "Proxy-Connection", "TE", "Trailer", "Transfer-Encoding", "Upgrade"}
)

// reqState is the per-request scratch space, pooled so that the request path
// does not allocate for parsing or policy input.
type reqState struct {
	parser fastjson.Parser
	oreq   openai.Request
	preq   policy.Request
	id     [32]byte
	kv     kvScratch
	kvc    kvChoice
}

var statePool = sync.Pool{New: func() any { return new(reqState) }}

var relayBufPool = sync.Pool{New: func() any { b := make([]byte, 32<<10); return &b }}

// dataReadBufferSize is the data plane's per-connection read buffer, which
// is also the largest request header block it accepts (431 beyond).
const dataReadBufferSize = 16 << 10

func (s *Server) newDataServer(key string) *fasthttp.Server {
	return &fasthttp.Server{
		Handler:            func(ctx *fasthttp.RequestCtx) { s.serveData(ctx, key) },
		Name:               "llmgw",
		MaxRequestBodySize: s.cfg.MaxBodyBytes,
		// ReadTimeout bounds reading one whole request (headers and body):
		// a client that trickles bytes (slowloris) is cut off.
		ReadTimeout:           30 * time.Second,
		IdleTimeout:           120 * time.Second,
		ReadBufferSize:        dataReadBufferSize, // also the request header size limit
		CloseOnShutdown:       true,
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
		s.servePassthrough(ctx, key)
	}
}

func (s *Server) routes(key string) *listenRoutes {
	return s.table.Load().byListen[key]
}

func (s *Server) serveModels(ctx *fasthttp.RequestCtx, key string) {
	if !ctx.IsGet() {
		ctx.Response.Header.Set("Allow", "GET")
		writeError(ctx, fmt.Errorf("%w: %s %s; use GET", ErrMethodNotAllowed, ctx.Method(), ctx.Path()))
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
		ctx.Response.Header.Set("Allow", "POST")
		writeError(ctx, fmt.Errorf("%w: %s %s; completions are POST requests", ErrMethodNotAllowed, ctx.Method(), ctx.Path()))
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
	v, model, err := openai.Decode(&st.parser, ctx.PostBody())
	if err != nil {
		writeError(ctx, err)
		s.metrics.rejected.WithLabelValues("invalid_body").Inc()
		return
	}
	lr := s.routes(key)
	var rt *ruleRuntime
	if lr != nil {
		if rt = lr.byModel[string(model)]; rt == nil {
			rt = lr.def
		}
	}
	if rt == nil {
		writeError(ctx, fmt.Errorf("%w: no rule serves model %q on this listener (GET /v1/models lists the served models)", ErrUnknownModel, model))
		s.metrics.rejected.WithLabelValues("unknown_model").Inc()
		return
	}
	if err := openai.Extract(v, model, kind, rt.prefix, &st.oreq); err != nil {
		writeError(ctx, err)
		s.metrics.rejected.WithLabelValues("invalid_body").Inc()
		return
	}
	st.preq = policy.Request{KeyHash: st.oreq.KeyHash, HasKey: st.oreq.HasKey}
	st.preq.ConvHash, st.preq.HasConv = rt.conversationHash(ctx)
	st.preq.Session = rt.sessionValue(ctx, st.oreq.User)
	if rt.pd != nil {
		s.servePD(ctx, rt, st, v, kind, st.oreq.Stream, start)
		return
	}
	var kvc *kvChoice
	if rt.kv != nil {
		st.kvc = rt.kv.route(ctx, &st.kv, v, kind, nil)
		kvc = &st.kvc
		s.metrics.kvObserve(rt.rule.Name, kvc)
	}
	s.forward(ctx, rt, st, st.oreq.Stream, start, kvc)
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
	if v := ctx.Request.Header.PeekBytes(hdrRequestID); len(v) > 0 && len(v) <= 256 && printable(v) {
		return v
	}
	var raw [16]byte
	a, b := rand.Uint64(), rand.Uint64()
	for i := 0; i < 8; i++ {
		raw[i], raw[8+i] = byte(a>>(8*i)), byte(b>>(8*i))
	}
	hex.Encode(st.id[:], raw[:])
	return st.id[:]
}

func printable(b []byte) bool {
	for _, c := range b {
		if c < 0x21 || c > 0x7e {
			return false
		}
	}
	return true
}

// forward sends the request to an endpoint chosen by rt's policy, retrying
// once on another endpoint when the first fails before any response byte,
// and relays the answer.
//
// kvc, when non-nil, is the KV-exact decision: its endpoint (if any) is
// tried first, and the response feeds the hash-parity self-check.
func (s *Server) forward(ctx *fasthttp.RequestCtx, rt *ruleRuntime, st *reqState, stream bool, start time.Time, kvc *kvChoice) {
	id := requestID(ctx, st)
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
		req := fasthttp.AcquireRequest()
		ctx.Request.Header.CopyTo(&req.Header)
		for _, h := range hopHeaders {
			req.Header.Del(h)
		}
		req.Header.SetHost(ep.Addr)
		if rt.tlsCfg != nil {
			req.URI().SetScheme("https")
		}
		req.SetBodyRaw(ctx.PostBody())
		resp := fasthttp.AcquireResponse()
		resp.StreamBody = stream
		upStart := time.Now()
		err = rt.clients[ep.Index].Do(req, resp)
		fasthttp.ReleaseRequest(req)
		if err != nil {
			release()
			fasthttp.ReleaseResponse(resp)
			timeout := isTimeout(err)
			if b := ep.Breaker(); b != nil {
				b.RecordConnFailure()
			}
			if timeout {
				lastErr = fmt.Errorf("%w: endpoint %s (%s) sent no response within the first-byte timeout: %v", ErrUpstreamTimeout, ep.ID, ep.Addr, err)
				s.metrics.requests.WithLabelValues(rt.rule.Name, ep.ID, "504").Inc()
				break
			}
			lastErr = fmt.Errorf("%w: endpoint %s (%s): %v", ErrUpstreamUnreachable, ep.ID, ep.Addr, err)
			s.metrics.requests.WithLabelValues(rt.rule.Name, ep.ID, "502").Inc()
			s.log.Warn("upstream failed before any response byte", "rule", rt.rule.Name, "endpoint", ep.ID, "attempt", attempt+1, "err", err)
			if attempt == 0 {
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
		s.relay(ctx, rt, ep, route, resp, release, start, upStart, obs)
		return
	}
	writeError(ctx, lastErr)
}

func isTimeout(err error) bool {
	status, _, _ := statusFor(err)
	return status == fasthttp.StatusGatewayTimeout
}

// relay copies the worker's response to the client: buffered for plain
// responses, event by event for streams. It owns resp and release.
//
// obs, when non-nil, collects the engine-reported cached tokens for the
// KV-exact self-check.
func (s *Server) relay(ctx *fasthttp.RequestCtx, rt *ruleRuntime, ep *upstream.Endpoint, route string, resp *fasthttp.Response, release func(), start, upStart time.Time, obs *kvObservation) {
	status := resp.StatusCode()
	if b := ep.Breaker(); b != nil {
		switch {
		case status >= 500:
			if b.RecordOrigin5xx() {
				s.log.Warn("endpoint demoted after consecutive 5xx answers", "rule", rt.rule.Name, "endpoint", ep.ID)
			}
		case status >= 400:
			b.RecordClientError()
		default:
			b.RecordSuccess()
		}
	}
	ctx.Response.Header.SetStatusCode(status)
	for k, v := range resp.Header.All() {
		// The gateway owns X-Request-Id (already set, the same value the
		// worker was sent); copying a worker's echo would duplicate it.
		if !bytes.EqualFold(k, hdrRequestID) {
			ctx.Response.Header.AddBytesKV(k, v)
		}
	}
	for _, h := range hopHeaders {
		ctx.Response.Header.Del(h)
	}
	ctx.Response.Header.SetContentTypeBytes(resp.Header.ContentType())
	ctx.Response.Header.Set("X-Llmgw-Endpoint", ep.ID)
	ctx.Response.Header.Set("X-Llmgw-Route", route)

	m := s.metrics
	stream := resp.BodyStream()
	sse := bytes.HasPrefix(resp.Header.ContentType(), ctEventStream)
	if stream == nil || (!sse && resp.Header.ContentLength() >= 0) {
		// Plain response: buffer it (it is bounded by MaxResponseBodySize).
		var body []byte
		var err error
		if stream != nil {
			body, err = io.ReadAll(io.LimitReader(stream, 64<<20))
			_ = resp.CloseBodyStream()
		} else {
			body = resp.Body()
		}
		upDur := time.Since(upStart)
		release()
		if err != nil {
			fasthttp.ReleaseResponse(resp)
			if b := ep.Breaker(); b != nil {
				b.RecordConnFailure()
			}
			writeError(ctx, fmt.Errorf("%w: endpoint %s: reading the response: %v", ErrUpstreamFailed, ep.ID, err))
			m.requests.WithLabelValues(rt.rule.Name, ep.ID, "502").Inc()
			return
		}
		ctx.Response.SetBody(body)
		if s.cfg.LogPayloads {
			s.log.Debug("response payload", "rule", rt.rule.Name, "endpoint", ep.ID, "status", status, "body", string(body))
		}
		if obs != nil {
			obs.scan.write(body)
			s.kvSelfCheck(rt, obs)
		}
		fasthttp.ReleaseResponse(resp)
		rt.obs.observe(ep.Index, ep.ID, status, time.Since(start), upDur, upDur)
		return
	}

	ttfb := time.Since(upStart)
	ruleName := rt.rule.Name
	ctx.SetBodyStreamWriter(func(w *bufio.Writer) {
		bp := relayBufPool.Get().(*[]byte)
		buf := *bp
		var upErr error
		clientGone, sawDone := false, false
		var tail [len("data: [DONE]")]byte
		for {
			n, err := stream.Read(buf)
			if n > 0 {
				if !sawDone {
					sawDone = containsAcross(tail[:], buf[:n], doneMarker)
				}
				if obs != nil {
					obs.scan.write(buf[:n])
				}
				if _, werr := w.Write(buf[:n]); werr != nil {
					clientGone = true
					break
				}
				if werr := w.Flush(); werr != nil {
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
		relayBufPool.Put(bp)
		// Closing a stream that was not read to its end closes the worker
		// connection: that is how a client disconnect cancels the request.
		_ = resp.CloseBodyStream()
		upDur := time.Since(upStart)
		release()
		fasthttp.ReleaseResponse(resp)
		code := status
		switch {
		case clientGone:
			m.clientCancels.WithLabelValues(ruleName).Inc()
		case upErr != nil:
			if b := ep.Breaker(); b != nil {
				b.RecordConnFailure()
			}
			werr := fmt.Errorf("%w: endpoint %s: stream broke after the response began: %v", ErrUpstreamFailed, ep.ID, upErr)
			if isTimeout(upErr) {
				werr = fmt.Errorf("%w: endpoint %s: stream idle past the idle timeout", ErrUpstreamTimeout, ep.ID)
			}
			if sse && !sawDone {
				_, _ = w.Write(sseErrorEvent(werr))
				_ = w.Flush()
			}
			m.streamErrors.WithLabelValues(ruleName, ep.ID).Inc()
			s.log.Warn("upstream stream failed", "rule", ruleName, "endpoint", ep.ID, "err", upErr)
		}
		if obs != nil && !clientGone && upErr == nil {
			s.kvSelfCheck(rt, obs)
		}
		rt.obs.observe(ep.Index, ep.ID, code, time.Since(start), upDur, ttfb)
	})
}

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
