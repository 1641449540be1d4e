//go:build linux

package gateway

import (
	"bytes"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"strconv"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/valyala/fasthttp"

	"github.com/llmgw/llmgw/gateway/upstream"
	"github.com/llmgw/llmgw/internal/evloop"
	"github.com/llmgw/llmgw/internal/h1"
	"github.com/llmgw/llmgw/internal/rawio"
)

// The loop plane's request: forward and relay (proxy.go) as a state
// machine driven by the loop's events. The contracts are forward's and
// relay's:
//
//   - a request is sent to a worker at most once: again (once) only when
//     the failure proves no worker read it (upstreamFailure, notSent); a
//     write that failed on a reused connection is redialed once on the same
//     endpoint without charging it (reusedNotSent);
//   - a small answer of known length is read whole before any byte goes
//     to the client, so its failure is still a clean 502; every other
//     answer streams, with no size cap, and one that breaks after bytes
//     went out is never delivered as complete (an SSE stream ends with an
//     error event, any other answer is cut by closing the connection);
//   - the same metrics, breaker records, decision log and headers.

type relayMode uint8

const (
	relayNone     relayMode = iota // no answer head yet
	relayBuffered                  // a small body of known length, read whole first
	relayStreamed                  // everything else, relayed as it arrives
)

// loopReq is one request on the loop plane, from its rule to its last
// answer byte. It lives on its loop's free list.
type loopReq struct {
	pl   *planeLoop
	c    *cliConn
	req  h1.Request // its head, parsed in place in c.buf
	body []byte     // in c.buf: stable while the request is in flight
	st   *reqState
	rt   *ruleRuntime

	reqLen   int
	stream   bool
	bodyless bool
	isHead   bool
	id       []byte

	// start, upStart: loop times (evloop.Loop.Tick) the request was whole
	// and last sent to a worker.
	start, upStart int64
	attempt        int
	redialed       bool
	ep             *upstream.Endpoint
	acquired       bool
	route          string
	spill          int
	pool           *loopPool
	u              *upLConn
	lastErr        error

	// The answer.
	ans       h1.Response // its head, parsed in place in u.buf[ansAt:]
	ansAt     int
	status    int
	mode      relayMode
	bodyStart int // in u.buf
	cl        int // the worker's Content-Length; -1 chunked, -2 until close
	left      int // body bytes still to come (cl >= 0)
	chunked   h1.Chunked
	chunkIn   bool // the worker's body is chunked
	chunkOut  bool // the client's is
	sse       bool
	sseEvents bool
	sawDone   bool
	tail      [len("data: [DONE]")]byte
	headOut   bool // the client's response head went out
	waiting   bool // the client's socket is full: the worker is not read meanwhile
	budget    int64
	ttfb      time.Duration
	upErr     error
	noReuse   bool // the worker's connection must not carry another request
	// observed: the answer's outcome is recorded (observe), before the
	// client can see its end, as on the goroutine plane, whose relay
	// records before fasthttp writes the last bytes.
	observed bool
}

// dropState gives st back and reports the hand-over reason (route's way
// out).
func (r *loopReq) dropState(rt *ruleRuntime, reason string) (*ruleRuntime, string) {
	r.pl.putState(r.st)
	r.st = nil
	return rt, reason
}

// putReq returns r to the loop's free list.
func (pl *planeLoop) putReq(r *loopReq) {
	if r.st != nil {
		pl.putState(r.st)
	}
	r.st, r.c, r.rt, r.ep, r.pool, r.u, r.lastErr, r.upErr = nil, nil, nil, nil, nil, nil, nil, nil
	r.body, r.id = nil, nil
	r.acquired, r.headOut, r.waiting, r.noReuse, r.redialed, r.observed = false, false, false, false, false, false
	r.mode, r.budget, r.attempt = relayNone, 0, 0
	pl.reqFree = append(pl.reqFree, r)
}

// begin starts forwarding r, routed to rt, for client c.
func (r *loopReq) begin(c *cliConn, rt *ruleRuntime) {
	r.c, r.rt = c, rt
	// The request's time: when the loop's wait that brought its last
	// bytes ended.
	r.start = r.pl.l.Now()
	m := string(r.req.Method)
	r.isHead = m == fasthttp.MethodHead
	r.bodyless = r.isHead || m == fasthttp.MethodGet // upstreamBodyless
	r.id = requestIDOf(r.req.Peek(hdrRequestID), r.st)
	r.pick()
}

// The loop plane's request as a requestView (readCompletion).

func (r *loopReq) isHTTP11() bool            { return true }
func (r *loopReq) protocol() []byte          { return []byte("HTTP/1.1") }
func (r *loopReq) header(name []byte) []byte { return r.req.Peek(name) }

// cookie reads a cookie as fasthttp's request header does (rules that bind
// sessions by a cookie are few; this path may allocate).
func (r *loopReq) cookie(name []byte) []byte {
	var h fasthttp.RequestHeader
	for _, f := range r.req.Fields {
		if bytes.EqualFold(f.Name, strCookie) {
			h.AddBytesKV(strCookie, f.Value)
		}
	}
	return h.CookieBytes(name)
}

// queryArg reads a query argument as fasthttp does (rules that bind
// sessions by a query argument are few; this path may allocate).
func (r *loopReq) queryArg(name []byte) []byte {
	_, q, ok := bytes.Cut(r.req.Target, []byte("?"))
	if !ok {
		return nil
	}
	var a fasthttp.Args
	a.ParseBytes(q)
	if v := a.PeekBytes(name); v != nil {
		return append([]byte(nil), v...)
	}
	return nil
}

var strCookie = []byte("Cookie")

// pick chooses an endpoint by the rule's policy and sends r to it.
func (r *loopReq) pick() {
	rt := r.rt
	d, err := rt.picker.Pick(&r.st.preq)
	if err != nil {
		if r.lastErr == nil {
			r.lastErr = fmt.Errorf("%w: rule %q has no endpoint that is healthy, closed-breaker and not draining", ErrNoEndpoint, rt.rule.Name)
			r.pl.s.metrics.requests.WithLabelValues(rt.rule.Name, "", "503").Inc()
		}
		r.answerError(r.lastErr)
		return
	}
	r.ep, r.route, r.spill = d.Endpoint, d.Reason.String(), d.Spill
	r.ep.Acquire()
	r.acquired = true
	r.st.upHead = appendUpstreamFields(r.st.upHead[:0], r.c.buf, &r.req, r.ep.Addr, r.id, len(r.body), r.bodyless)
	r.pool = r.pl.pool(rt, r.ep.Index)
	r.redialed = false
	r.upStart = r.pl.l.Tick()
	r.send(r.pool.get(r))
}

// send sends r on u (one-shot connections say Connection: close).
func (r *loopReq) send(u *upLConn) {
	r.u = u
	head := r.st.upHead
	if u.oneShot {
		head = append(head, connCloseHeader...)
	}
	head = append(head, crlf...)
	var body []byte
	if !r.bodyless {
		body = r.body
	}
	if len(body) <= smallWrite {
		// One write: the body joins the head in its buffer's spare room.
		head = append(head, body...)
		body = nil
	}
	r.st.upHead = head[:len(r.st.upHead)] // the ending and body live in spare capacity
	u.start(r, head, body)
}

// release ends r's count on its endpoint (once).
func (r *loopReq) release() {
	if r.acquired {
		r.acquired = false
		r.ep.Release()
	}
}

// sendFailed handles a failure before the worker's answer began (the
// connection is closed already).
func (r *loopReq) sendFailed(err error) {
	s, rt, ep := r.pl.s, r.rt, r.ep
	r.u = nil
	if reusedNotSent(err) && !r.redialed {
		// The worker closed this kept connection before the request was
		// written: nothing was sent, the worker is not to blame.
		r.redialed = true
		s.metrics.redials.WithLabelValues(rt.rule.Name, ep.ID).Inc()
		r.send(r.pool.get(r))
		return
	}
	r.release()
	clientErr, retry := s.upstreamFailure(rt, ep, err)
	s.log.Warn("upstream failed", "rule", rt.rule.Name, "endpoint", ep.ID, "attempt", r.attempt+1, "retried", retry && r.attempt == 0, "err", logErrText(err))
	if retry && r.attempt == 0 {
		s.metrics.retries.WithLabelValues(rt.rule.Name).Inc()
		r.st.preq.Exclude = ep
		r.attempt++
		r.lastErr = clientErr
		r.pick()
		return
	}
	r.answerError(clientErr)
}

// answerError answers the gateway's own error and ends r.
func (r *loopReq) answerError(err error) {
	// The endpoint's count ends before the client can see the answer (as
	// on the goroutine plane, whose relay releases before it writes).
	r.release()
	c := r.c
	c.closeAfter = c.closeAfter || r.pl.p.winding()
	head, body := r.pl.errorAnswer(err, r.id, c.closeAfter)
	if !c.send(head, body) {
		return // the client left: clientGone ended r
	}
	r.end()
}

// end returns r and moves its client on.
func (r *loopReq) end() {
	c := r.c
	r.release()
	if r.budget > 0 {
		r.pl.s.budget.release(r.budget)
		r.budget = 0
	}
	r.pl.putReq(r)
	c.answered()
}

// clientGone: the client left (or stopped reading) while r was in
// flight; the worker's request is cancelled by closing its connection.
// The client connection closes right after.
func (r *loopReq) clientGone() {
	s, rt, ep := r.pl.s, r.rt, r.ep
	if u := r.u; u != nil {
		r.u = nil
		u.close()
	}
	if !r.observed { // else the answer was whole and recorded; only its last write failed
		s.metrics.clientCancels.WithLabelValues(rt.rule.Name).Inc()
		switch {
		case ep != nil && r.headOut:
			// As relayBody.finish: the answer began, its status counts.
			now := r.pl.l.Tick()
			r.observe(time.Duration(now-r.start), time.Duration(now-r.upStart))
		case ep != nil:
			s.metrics.requests.WithLabelValues(rt.rule.Name, ep.ID, "499").Inc()
		}
	}
	r.release()
	if r.budget > 0 {
		s.budget.release(r.budget)
		r.budget = 0
	}
	c := r.c
	c.req = nil
	r.pl.putReq(r)
}

// answerHead handles the worker's answer head, parsed into r.resp; its
// body (if any) starts at u.buf[bodyStart:].
func (r *loopReq) answerHead(bodyStart int) {
	s, rt, ep, u := r.pl.s, r.rt, r.ep, r.u
	now := r.pl.l.Tick()
	r.ttfb = time.Duration(now - r.upStart)
	r.status = r.ans.Status
	r.bodyStart = bodyStart
	s.decisions.addAt(r.pl.l.Wall(now).UnixNano(), rt.rule.Name, "", ep.ID, r.route, r.id, r.spill, nil, ep.ID)
	if r.isHead || r.status == fasthttp.StatusNoContent || r.status == fasthttp.StatusNotModified || r.status < 200 {
		// No body: HEAD, 204, 304 (1xx but 100 never comes here). Its
		// length headers are the worker's.
		s.recordAnswer(rt, ep, r.status, nil)
		r.release() // before the client can see the answer
		r.clientHead(false, 0)
		r.observe(time.Duration(now-r.start), r.ttfb)
		if !r.c.send(r.pl.head) {
			return
		}
		r.noReuse = r.noReuse || u.n > bodyStart
		r.finishUpstream(true)
		r.end()
		return
	}
	r.sse = bytes.HasPrefix(r.ans.ContentType, ctEventStream)
	if rt.conn.CloseAfterStream && r.sse {
		// prepareAnswer: the engine closes the connection after every
		// stream.
		r.noReuse = true
	}
	r.cl = int(r.ans.ContentLength)
	if r.ans.Close {
		r.noReuse = true
	}
	if !r.sse && r.cl >= 0 && r.cl <= maxBufferedBody {
		// A body that fits the connection's read buffer holds no memory
		// beyond it; a longer one gets a buffer of its own, charged to the
		// budget.
		need := bodyStart + r.cl
		if need <= len(u.buf) || s.budget.acquire(int64(r.cl)) {
			if need > len(u.buf) {
				r.budget = int64(r.cl)
				u.grow(need)
			}
			r.mode = relayBuffered
			r.onBody()
			return
		}
		s.metrics.budgetExceeded.WithLabelValues("streamed").Inc()
	}
	r.mode = relayStreamed
	r.chunkIn = r.cl == -1
	r.chunkOut = r.cl < 0
	r.left = r.cl
	r.chunked = h1.Chunked{}
	r.sseEvents = r.sse && r.cl < 0
	r.sawDone = false
	r.tail = [len(r.tail)]byte{}
	u.off = bodyStart
	if r.cl == 0 {
		r.streamDone()
		return
	}
	if r.sse {
		// An SSE client sees the status and headers when the worker sent
		// them, not with the first event.
		s.recordAnswer(rt, ep, r.status, nil)
		r.clientHead(true, r.cl)
		r.headOut = true
		if !r.c.send(r.pl.head) {
			return // the client left: abandon ended r
		}
		r.wait()
	}
	r.onBody()
}

// clientHead builds the client's response head into pl.head: the worker's
// status and fields (filtered as copyAnswerHeaders filters them: no
// connection-scoped field, no X-Request-Id of the worker's, no length),
// the gateway's fields, and, with setLength, the body's framing (cl < 0:
// chunked); without, the worker's Content-Length where the status allows
// one (HEAD, 304). Date is the gateway's, as on the goroutine plane
// (fasthttp's server writes its own): one Date, whatever the worker sent.
func (r *loopReq) clientHead(setLength bool, cl int) {
	c := r.c
	c.closeAfter = c.closeAfter || r.pl.p.winding()
	b := appendStatusLine(r.pl.head[:0], r.status)
	b = append(b, r.pl.dateLine()...)
	b = appendField(b, hdrRequestID, r.id)
	conn := connectionValues(r.ans.Fields, r.pl.conn[:0])
	r.pl.conn = conn[:0]
	b = appendKept(b, r.u.buf[r.ansAt:], r.ans.Fields, conn, dropToClient)
	b = appendFieldString(b, "X-Llmgw-Endpoint", r.ep.ID)
	b = appendFieldString(b, "X-Llmgw-Route", r.route)
	switch {
	case setLength && cl >= 0:
		b = append(b, "Content-Length: "...)
		b = strconv.AppendInt(b, int64(cl), 10)
		b = append(b, '\r', '\n')
	case setLength:
		b = append(b, "Transfer-Encoding: chunked\r\n"...)
	case r.status >= 200 && r.status != fasthttp.StatusNoContent:
		if v := r.ans.Peek(strContentLength); v != nil {
			b = appendField(b, strContentLength, v)
		}
	}
	if c.closeAfter {
		b = append(b, "Connection: close\r\n"...)
	}
	r.pl.head = append(b, '\r', '\n')
}

// onBody relays what the worker's connection holds of the body.
func (r *loopReq) onBody() {
	u := r.u
	switch r.mode {
	case relayBuffered:
		end := r.bodyStart + r.cl
		if u.n < end {
			return
		}
		r.noReuse = r.noReuse || u.n > end
		r.bufferedDone(u.buf[r.bodyStart:end])
	case relayStreamed:
		r.stream1()
	}
}

// bufferedDone relays a small body read whole.
func (r *loopReq) bufferedDone(body []byte) {
	s, rt, ep := r.pl.s, r.rt, r.ep
	s.recordAnswer(rt, ep, r.status, body)
	r.release() // before the client can see the answer
	// The loop's time of the read that completed the body.
	done := r.pl.l.Now()
	r.clientHead(true, len(body))
	if s.cfg.LogPayloads {
		s.log.Debug("response payload", "rule", rt.rule.Name, "endpoint", ep.ID, "status", r.status, "body", string(body))
	}
	r.observe(time.Duration(max(0, done-r.start)), time.Duration(max(0, done-r.upStart)))
	ok := false
	if len(body) <= smallWrite {
		// One write: head and body in one buffer.
		r.pl.head = append(r.pl.head, body...)
		ok = r.c.send(r.pl.head)
	} else {
		ok = r.c.send(r.pl.head, body)
	}
	if !ok {
		return
	}
	r.finishUpstream(true)
	r.end()
}

// smallWrite is the largest body copied next to its head so that both go
// in one write(2) instead of a writev(2) of two buffers.
const smallWrite = 16 << 10

var (
	chunkEnd  = []byte("\r\n")
	lastChunk = []byte("0\r\n\r\n")
)

// stream1 relays the body bytes u holds, until they are gone, the body
// ends, or the client's socket is full.
func (r *loopReq) stream1() {
	u := r.u
	for u.off < u.n && !r.waiting {
		var data []byte
		ended := false
		switch {
		case r.chunkIn:
			d, n, err := r.chunked.Next(u.buf[u.off:u.n])
			u.off += n
			if err != nil {
				r.bodyFailed(err)
				return
			}
			data, ended = d, r.chunked.Done()
			if ended && u.off < u.n {
				r.noReuse = true // bytes after the body: nobody asked for them
			}
		case r.cl >= 0:
			n := min(r.left, u.n-u.off)
			data = u.buf[u.off : u.off+n]
			u.off += n
			r.left -= n
			ended = r.left == 0
			if ended && u.off < u.n {
				r.noReuse = true
			}
		default: // until the worker closes
			data = u.buf[u.off:u.n]
			u.off = u.n
		}
		if len(data) > 0 && !r.relay(data) {
			return
		}
		if ended {
			r.streamDone()
			return
		}
	}
	if u.off == u.n {
		u.off = u.keep()
		u.n = u.off
	}
}

// relay sends one run of body bytes to the client; false when the client
// is gone.
func (r *loopReq) relay(data []byte) bool {
	c := r.c
	if r.sse && !r.sawDone {
		r.sawDone = containsAcross(r.tail[:], data, doneMarker)
	}
	// One writev: [head,] [chunk size,] data[, CRLF].
	var parts [rawio.MaxIovec][]byte
	k := 0
	if !r.headOut {
		// A streamed body's first bytes came: the head goes with them.
		r.pl.s.recordAnswer(r.rt, r.ep, r.status, nil)
		r.clientHead(true, r.cl)
		r.headOut = true
		parts[k] = r.pl.head
		k++
	}
	var size [20]byte
	if r.chunkOut {
		parts[k] = appendChunkSize(size[:0], len(data))
		k++
	}
	parts[k] = data
	k++
	if r.chunkOut {
		parts[k] = chunkEnd
		k++
	}
	if !c.send(parts[:k]...) {
		return false
	}
	r.wait()
	return true
}

// wait notes whether the client's socket is full (bytes wait in its out):
// the worker is then not read until it drains, and its idle timeout stops
// counting (the worker is not silent, the gateway is not reading; the
// client's write timeout bounds the wait). clientDrained restarts it.
func (r *loopReq) wait() {
	r.waiting = len(r.c.out) > 0
	if r.waiting {
		r.pl.l.Disarm(&r.u.timer)
	}
}

func appendChunkSize(dst []byte, n int) []byte {
	dst = strconv.AppendUint(dst, uint64(n), 16)
	return append(dst, '\r', '\n')
}

// streamDone ends a streamed answer that arrived whole.
func (r *loopReq) streamDone() {
	c := r.c
	if !r.headOut {
		// An empty body (chunked with no data): head and end together.
		r.pl.s.recordAnswer(r.rt, r.ep, r.status, nil)
		r.clientHead(true, r.cl)
		r.headOut = true
		if !c.send(r.pl.head) {
			return
		}
	}
	r.release() // before the client can see the end
	r.recordStream()
	if r.chunkOut && !c.send(lastChunk) {
		return
	}
	r.finishUpstream(r.cl != -2)
	r.end()
}

// recordStream records a streamed answer's outcome (before the client can
// see its end).
func (r *loopReq) recordStream() {
	s, rt, ep := r.pl.s, r.rt, r.ep
	if r.upErr != nil {
		if b := ep.Breaker(); b != nil {
			b.RecordConnFailure()
		}
		s.metrics.streamErrors.WithLabelValues(rt.rule.Name, ep.ID).Inc()
		s.log.Warn("upstream body failed after the response began", "rule", rt.rule.Name, "endpoint", ep.ID, "sse", r.sse, "err", r.upErr)
	}
	now := r.pl.l.Tick()
	r.observe(time.Duration(now-r.start), time.Duration(now-r.upStart))
}

// observe records r's answer (status and times) once: before the client
// can see its end, or when the client left mid-answer (clientGone).
func (r *loopReq) observe(total, upstream time.Duration) {
	r.observed = true
	r.rt.obs.observe(r.ep.Index, r.ep.ID, r.status, total, upstream, r.ttfb)
}

// bodyFailed handles a worker's body that broke (closed, reset, bad
// framing, stalled past the idle timeout) after its head.
func (r *loopReq) bodyFailed(err error) {
	s, rt, ep, c := r.pl.s, r.rt, r.ep, r.c
	if u := r.u; u != nil {
		r.u = nil
		u.close()
	}
	werr := s.bodyError(rt, ep, err)
	if !r.headOut {
		// Nothing went to the client yet: a clean error (relayFailed).
		if b := ep.Breaker(); b != nil {
			b.RecordConnFailure()
		}
		s.log.Warn("upstream body failed before the answer began", "rule", rt.rule.Name, "endpoint", ep.ID, "err", logErrText(err))
		st, _, _ := statusFor(werr)
		s.metrics.requests.WithLabelValues(rt.rule.Name, ep.ID, statusLabel(st)).Inc()
		r.answerError(werr)
		return
	}
	r.upErr = err
	r.release() // before the client can see the end
	r.recordStream()
	switch {
	case r.sseEvents && !r.sawDone:
		// A stream that breaks ends with an error event, which SSE
		// clients read as the stream's failure.
		ev := sseErrorEvent(werr)
		var size [20]byte
		if !c.send(appendChunkSize(size[:0], len(ev)), ev, chunkEnd, lastChunk) {
			return
		}
	case r.sseEvents:
		// [DONE] was relayed: the answer was whole.
		if !c.send(lastChunk) {
			return
		}
	default:
		// Cut: the client sees a body short of its length or without its
		// last chunk, never a complete one.
		c.closeAfter = true
		c.out = c.out[:0]
		r.end()
		c.close()
		return
	}
	r.end()
}

// clientDrained: the client's socket took every byte; relaying goes on.
func (r *loopReq) clientDrained() {
	if !r.waiting || r.u == nil {
		return
	}
	r.waiting = false
	r.u.arm(r.u.pool.o.idle)
	r.stream1()
	if r.u != nil && !r.waiting && r.u.rdPending {
		r.u.read()
	}
}

// finishUpstream gives up the worker's connection once its answer is
// read: back to the pool when it can carry another request (whole answer,
// keep-alive, no stray bytes), else closed.
func (r *loopReq) finishUpstream(whole bool) {
	u := r.u
	if u == nil {
		return
	}
	r.u = nil
	u.req = nil
	if !whole || r.noReuse || u.oneShot {
		u.close()
		return
	}
	u.idle()
}

// loopPool is one loop's connections to one endpoint address with one
// connection policy (hostClient's key): the idle ones, most recent last.
type loopPool struct {
	pl   *planeLoop
	key  clientKey
	ap   netip.AddrPort
	o    connOpts
	kept *keptCount // nil: no limit (the engine states none)
	idle []*upLConn
}

// keptCount counts the kept connections to one endpoint over every loop,
// for engines that serve a limited number (keptConns).
type keptCount struct {
	n   atomic.Int32
	max int32
}

func (k *keptCount) take() bool {
	for {
		n := k.n.Load()
		if n >= k.max {
			return false
		}
		if k.n.CompareAndSwap(n, n+1) {
			return true
		}
	}
}

// loopKey is the pool key of rt's endpoint i: the goroutine plane's
// hostClient key (rules alike share pools, an edit keeps warm ones).
func loopKey(rt *ruleRuntime, i int) clientKey {
	t := rt.rule.Timeouts
	return clientKey{addr: rt.eps[i].Addr, connect: t.Connect.Std(), firstByte: t.FirstByte.Std(), idle: t.Idle.Std(), conn: rt.conn}
}

// pool returns the loop's pool for rt's endpoint i.
func (pl *planeLoop) pool(rt *ruleRuntime, i int) *loopPool {
	ps := pl.poolsOf[rt]
	if ps == nil {
		if len(pl.poolsOf) > 4096 {
			// Rules come and go; the cache is rebuilt rather than kept
			// holding runtimes that no longer serve.
			clear(pl.poolsOf)
		}
		ps = make([]*loopPool, len(rt.eps))
		pl.poolsOf[rt] = ps
	}
	if p := ps[i]; p != nil {
		return p
	}
	ps[i] = pl.poolFor(rt, i)
	return ps[i]
}

// poolFor finds or makes the loop's pool for rt's endpoint i by its key.
func (pl *planeLoop) poolFor(rt *ruleRuntime, i int) *loopPool {
	ap := rt.loopEPs[i]
	key := loopKey(rt, i)
	if p := pl.pools[key]; p != nil {
		return p
	}
	p := &loopPool{pl: pl, key: key, ap: ap}
	p.o = connOpts{connect: key.connect, idle: key.idle, maxIdle: poolIdle(rt.conn.IdleTimeout), maxRequests: rt.conn.MaxRequestsPerConn, quickAck: rt.conn.ReusedConnStall}
	if n := keptConns(rt.conn); n > 0 {
		p.kept = pl.s.keptCount(key, n)
		p.o.maxIdle = min(p.o.maxIdle, keptIdle)
	}
	pl.pools[key] = p
	return p
}

// keptCount is the shared count of kept connections for key.
func (s *Server) keptCount(key clientKey, max int) *keptCount {
	s.clientsMu.Lock()
	defer s.clientsMu.Unlock()
	if s.kept == nil {
		s.kept = map[clientKey]*keptCount{}
	}
	k := s.kept[key]
	if k == nil {
		k = &keptCount{max: int32(max)}
		s.kept[key] = k
	}
	return k
}

// get returns a connection for one request: the most recent idle one still
// within the engine's limits, else a new kept connection, else (all kept
// connections busy, for an engine with few serving threads) a one-shot
// one.
func (p *loopPool) get(r *loopReq) *upLConn {
	now := p.pl.l.Now()
	for len(p.idle) > 0 {
		u := p.idle[len(p.idle)-1]
		p.idle = p.idle[:len(p.idle)-1]
		u.pooled = false
		if p.o.maxRequests > 0 && u.requests >= p.o.maxRequests {
			u.close()
			continue
		}
		if p.o.maxIdle > 0 && now-u.lastUsed > int64(p.o.maxIdle) {
			u.close()
			continue
		}
		return u
	}
	oneShot := false
	if p.kept != nil && !p.kept.take() {
		oneShot = true
		p.pl.s.metrics.oneShots.WithLabelValues(r.rt.rule.Name, r.ep.ID).Inc()
	}
	return p.dial(oneShot)
}

// closeIdle closes every idle connection of the pool.
func (p *loopPool) closeIdle() {
	for _, u := range p.idle {
		u.pooled = false
		u.close()
	}
	p.idle = p.idle[:0]
}

// dial opens a connection (its handshake may still be going on; start
// waits for it).
func (p *loopPool) dial(oneShot bool) *upLConn {
	u := &upLConn{pl: p.pl, pool: p, fd: -1, oneShot: oneShot, kept: p.kept != nil && !oneShot}
	u.timer.Init(u)
	fd, inProgress, err := rawio.Connect(p.ap)
	if err != nil {
		u.dialErr = &DialError{Addr: p.key.addr, Err: &net.OpError{Op: "dial", Net: "tcp", Addr: net.TCPAddrFromAddrPort(p.ap), Err: err}}
		return u
	}
	u.fd = fd
	if err := p.pl.l.Add(fd, u, evloop.In|evloop.Out|evloop.RdHup|evloop.Edge); err != nil {
		rawio.Close(fd)
		u.fd = -1
		u.dialErr = &DialError{Addr: p.key.addr, Err: err}
		return u
	}
	u.connecting = inProgress
	return u
}

// upLConn is one connection to a worker on a loop.
type upLConn struct {
	pl    *planeLoop
	pool  *loopPool
	fd    int
	timer evloop.Timer

	oneShot    bool // Connection: close; never pooled
	kept       bool // counted in pool.kept
	connecting bool // the handshake goes on
	dialErr    error
	pooled     bool // in pool.idle
	closed     bool

	req *loopReq
	gen uint32 // requests started on it, as a generation: a callback
	// that ended the request and started another on u is seen by the
	// caller that made it (read, write)
	requests int   // requests started on it
	lastUsed int64 // loop time its last answer ended

	// Sending: the request's parts and how far they went; a batched send
	// (evloop.Loop.Send) is queued or in flight while queued.
	parts    [2][]byte
	sent     int
	sending  bool
	queued   bool
	sendID   evloop.SendID
	waitRoom bool // a batched send found no room: the next one waits for Out
	// Reading: buf[off:n] is what is read and not yet relayed.
	buf       []byte
	off, n    int
	headDone  bool
	rdPending bool
	// hup: the worker closed or reset its side. Edge-triggered readiness
	// reports that once, maybe with the last bytes: a short read then
	// does not mean the socket is drained (the FIN is still to be read).
	hup bool
}

// start sends r's request (head and body) on u.
func (u *upLConn) start(r *loopReq, head, body []byte) {
	u.req = r
	u.requests++
	u.gen++
	u.parts = [2][]byte{head, body}
	u.sent, u.sending, u.headDone, u.off, u.n = 0, true, false, 0, 0
	if u.dialErr != nil {
		err := u.dialErr
		u.close()
		r.sendFailed(err)
		return
	}
	if u.connecting {
		u.arm(u.pool.o.connect)
		return
	}
	u.write()
}

// arm sets u's deadline d from now; d 0 means none.
func (u *upLConn) arm(d time.Duration) {
	if d <= 0 {
		u.pl.l.Disarm(&u.timer)
		return
	}
	u.pl.l.Arm(&u.timer, u.pl.l.At(d))
}

// Ready handles the socket's readiness.
func (u *upLConn) Ready(ev uint32) {
	if u.closed {
		return
	}
	if u.req == nil {
		// Idle in the pool: the worker closed it, reset it or sent bytes
		// nobody asked for, and it carries nothing any more. Writability
		// alone says nothing: edge-triggered readiness reports it again
		// whenever the worker acknowledges bytes sent earlier, which may
		// come after the answer was read.
		if ev&(evloop.In|evloop.RdHup|evloop.Hup|evloop.Err) != 0 {
			u.close()
		}
		return
	}
	if u.connecting {
		if ev&(evloop.Out|evloop.Err|evloop.Hup) == 0 {
			return
		}
		done, err := rawio.ConnectResult(u.fd)
		if !done {
			return
		}
		u.connecting = false
		u.pl.l.Disarm(&u.timer)
		if err != nil {
			u.fail(&DialError{Addr: u.pool.key.addr, Err: &net.OpError{Op: "dial", Net: "tcp", Addr: net.TCPAddrFromAddrPort(u.pool.ap), Err: err}})
			return
		}
		u.write()
		return
	}
	if ev&(evloop.RdHup|evloop.Hup|evloop.Err) != 0 {
		u.hup = true
	}
	if u.sending {
		u.rdPending = u.rdPending || ev&(evloop.In|evloop.RdHup|evloop.Hup|evloop.Err) != 0
		if ev&(evloop.Out|evloop.Err|evloop.Hup) != 0 {
			u.waitRoom = false
			u.write() // reads what came meanwhile once the request is out
		}
		return
	}
	if ev&(evloop.In|evloop.RdHup|evloop.Hup|evloop.Err) != 0 {
		u.rdPending = true
		if !u.req.waiting {
			u.read()
		}
	}
}

// Expired: connect, send, first-byte, body-idle or pool-idle timeout.
func (u *upLConn) Expired() {
	if u.closed {
		return
	}
	r := u.req
	switch {
	case r == nil:
		u.close() // idle past the engine's keep-alive
	case u.connecting:
		u.fail(&DialError{Addr: u.pool.key.addr, Err: &net.OpError{Op: "dial", Net: "tcp", Addr: net.TCPAddrFromAddrPort(u.pool.ap), Err: os.ErrDeadlineExceeded}})
	case u.sending:
		u.fail(&sendError{reused: u.requests > 1, err: os.ErrDeadlineExceeded})
	case !u.headDone:
		u.fail(fasthttp.ErrTimeout)
	default:
		r.u = nil
		u.close()
		r.bodyFailed(os.ErrDeadlineExceeded)
	}
}

// fail closes u and reports a failure before the answer's head to its
// request.
func (u *upLConn) fail(err error) {
	r := u.req
	r.u = nil
	u.close()
	r.sendFailed(err)
}

// sendTimeout bounds writing a request (the goroutine plane's
// HostClient.WriteTimeout).
const sendTimeout = 30 * time.Second

// write writes what is left of the request: through the loop's batched
// sends when it has them (Sent goes on), else write(2) by write(2).
func (u *upLConn) write() {
	if u.pl.l.Batching() {
		if u.queued || u.waitRoom || !u.sending {
			return
		}
		rest := u.rest()
		u.queued = true
		u.sendID = u.pl.l.Send(u.fd, rest[0], rest[1], u)
		// The first-byte timeout counts from the send (submitted when
		// this loop turn ends, microseconds from now).
		u.arm(u.pool.key.firstByte)
		return
	}
	for u.sent < len(u.parts[0])+len(u.parts[1]) {
		rest := u.rest()
		k := 1
		if len(rest[1]) > 0 {
			k = 2
		}
		n, e := rawio.Writev(u.fd, rest[:k], &u.pl.iov)
		switch e {
		case 0:
			u.sent += n
			continue
		case syscall.EAGAIN:
			if !u.timer.Armed() {
				u.arm(sendTimeout)
			}
			return
		}
		u.fail(&sendError{reused: u.requests > 1, err: os.NewSyscallError("writev", e)})
		return
	}
	u.written()
}

// rest is what is left to send of the request's parts.
func (u *upLConn) rest() [2][]byte {
	var rest [2][]byte
	k, skip := 0, u.sent
	for _, p := range u.parts {
		if skip >= len(p) {
			skip -= len(p)
			continue
		}
		rest[k] = p[skip:]
		skip = 0
		k++
	}
	return rest
}

// written: the whole request went out.
func (u *upLConn) written() {
	u.sending = false
	if u.pool.o.quickAck && !u.oneShot {
		// ReusedConnStall: the engine's answer must not wait for our
		// delayed ACK of its head (set after the send: sending puts the
		// socket back in delayed-ACK mode). A failure means the socket is
		// unusable; the read reports that.
		_ = rawio.QuickAckFD(u.fd)
	}
	// The first-byte timeout (the goroutine plane's HostClient.ReadTimeout,
	// armed there a few microseconds earlier, before the write).
	u.arm(u.pool.key.firstByte)
	if u.rdPending {
		u.read()
	}
}

// Sent is a batched send's end (evloop.Sender).
func (u *upLConn) Sent(n int, errno syscall.Errno) {
	u.queued = false
	if u.closed || !u.sending {
		return // given up meanwhile (close shut the socket down)
	}
	switch {
	case errno == syscall.EAGAIN:
		// No room: the next send waits for the socket to take bytes,
		// under the send timeout.
		u.waitRoom = true
		u.arm(sendTimeout)
		return
	case errno != 0:
		u.fail(&sendError{reused: u.requests > 1, err: os.NewSyscallError("send", errno)})
		return
	}
	u.sent += n
	if u.sent < len(u.parts[0])+len(u.parts[1]) {
		u.write()
		return
	}
	u.written()
}

// readBufSizeUp is a worker connection's read buffer: an answer head
// (maxUpstreamHead) and a small body; a buffered body that does not fit
// gets a buffer of its size (grow).
const readBufSizeUp = 16 << 10

// read reads what the socket holds and passes it on: the answer's head,
// then its body.
func (u *upLConn) read() {
	gen := u.gen
	for u.rdPending && !u.closed && u.gen == gen && u.req != nil && !u.req.waiting {
		if u.buf == nil {
			u.buf = u.pl.getUpBuf()
		}
		if u.n == len(u.buf) {
			if keep := u.keep(); u.off > keep {
				u.n = keep + copy(u.buf[keep:], u.buf[u.off:u.n])
				u.off = keep
			} else if !u.headDone {
				u.fail(errAnswerHeadTooLarge)
				return
			} else {
				return // a buffered body's buffer is full: it is whole
			}
		}
		space := len(u.buf) - u.n
		m, e := rawio.Read(u.fd, u.buf[u.n:])
		if e == syscall.EAGAIN {
			u.rdPending = false
			return
		}
		if e != 0 {
			u.broke(os.NewSyscallError("read", e))
			return
		}
		if m == 0 {
			u.eof()
			return
		}
		u.n += m
		u.rdPending = m == space || u.hup
		if !u.headDone {
			u.parseHead()
			continue
		}
		// Bytes came: the idle timeout bounds the silence to the next.
		u.arm(u.pool.o.idle)
		u.req.onBody()
	}
}

// keep is where buf's reusable room starts: the answer's head stays in
// place until the client's head is built from it (its fields point into
// buf), so before that only the bytes after it move.
func (u *upLConn) keep() int {
	if r := u.req; u.headDone && r != nil && !r.headOut {
		return r.bodyStart
	}
	return 0
}

// parseHead parses the answer's head once buf holds it and hands it to
// the request.
func (u *upLConn) parseHead() {
	r := u.req
	for {
		hl := h1.HeadEnd(u.buf[u.off:u.n])
		if hl == 0 {
			if u.n-u.off >= maxUpstreamHead {
				u.fail(errAnswerHeadTooLarge)
			}
			return
		}
		if hl > maxUpstreamHead {
			u.fail(errAnswerHeadTooLarge)
			return
		}
		r.ansAt = u.off
		if err := h1.ParseResponse(u.buf[u.off:u.off+hl], &r.ans); err != nil {
			u.fail(err)
			return
		}
		if r.ans.Status == fasthttp.StatusContinue {
			// An interim answer: the final one follows (as fasthttp's
			// client reads it).
			u.off += hl
			continue
		}
		u.headDone = true
		// From here the idle timeout bounds each silence of the body.
		u.arm(u.pool.o.idle)
		bodyStart := u.off + hl
		u.off = bodyStart
		r.answerHead(bodyStart)
		return
	}
}

// eof handles the worker's FIN.
func (u *upLConn) eof() {
	r := u.req
	if !u.headDone {
		u.fail(fasthttp.ErrConnectionClosed)
		return
	}
	if r.mode == relayStreamed && r.cl == -2 {
		// A body that ends with the connection: its end (streamDone
		// closes u, after the client's head is built from u's buffer).
		r.streamDone()
		return
	}
	u.broke(io.ErrUnexpectedEOF)
}

// broke handles a read error (or a premature FIN) after the request went
// out.
func (u *upLConn) broke(err error) {
	r := u.req
	if !u.headDone {
		u.fail(err)
		return
	}
	r.u = nil
	u.close()
	r.bodyFailed(err)
}

// idle puts u back into its pool, under the engine's idle limit.
func (u *upLConn) idle() {
	if u.pl.p.closing.Load() {
		u.close()
		return
	}
	u.lastUsed = u.pl.l.Now()
	u.off, u.n, u.rdPending = 0, 0, false
	if u.buf != nil {
		u.pl.putUpBuf(u.buf)
		u.buf = nil
	}
	u.pooled = true
	u.pool.idle = append(u.pool.idle, u)
	if u.pool.o.maxIdle > 0 {
		u.pl.l.Arm(&u.timer, u.pl.l.At(u.pool.o.maxIdle))
	} else {
		u.pl.l.Disarm(&u.timer)
	}
}

// grow makes buf at least n bytes (a buffered body longer than the
// pool's buffers).
func (u *upLConn) grow(n int) {
	nb := make([]byte, n)
	copy(nb, u.buf[:u.n])
	u.pl.putUpBuf(u.buf)
	u.buf = nb
}

// close closes the connection (raw close(2), which resets a connection
// whose answer was not read to its end: an engine aborts that request).
func (u *upLConn) close() {
	if u.closed {
		return
	}
	u.closed = true
	if u.queued && !u.pl.l.CancelSend(u.sendID) {
		// The send is in the kernel's hands, holding the socket: shut it
		// down, so the send ends now and the worker sees the connection
		// go (close alone would wait for the send).
		_ = rawio.ShutdownRDWR(u.fd)
	}
	u.queued = false
	if u.pooled {
		for i, x := range u.pool.idle {
			if x == u {
				u.pool.idle = append(u.pool.idle[:i], u.pool.idle[i+1:]...)
				break
			}
		}
		u.pooled = false
	}
	u.pl.l.Disarm(&u.timer)
	if u.fd >= 0 {
		u.pl.l.Forget(u.fd)
		rawio.Close(u.fd)
		u.fd = -1
	}
	if u.kept {
		u.kept = false
		u.pool.kept.n.Add(-1)
	}
	if u.buf != nil {
		u.pl.putUpBuf(u.buf)
		u.buf = nil
	}
	u.req = nil
}

func (pl *planeLoop) getUpBuf() []byte {
	if b, ok := pl.upBufs.get(); ok {
		return b
	}
	return make([]byte, readBufSizeUp)
}

func (pl *planeLoop) putUpBuf(b []byte) {
	if cap(b) == readBufSizeUp {
		pl.upBufs.put(b[:readBufSizeUp])
	}
}

func (pl *planeLoop) getState() *reqState {
	if st, ok := pl.states.get(); ok {
		return st
	}
	return new(reqState)
}

func (pl *planeLoop) putState(st *reqState) { pl.states.put(st) }

// spares keeps a loop's spare buffers (or request states) for reuse,
// without a sync.Pool (which allocates per Put of a slice). It holds at
// most as many as the loop had in use at once, and trim gives back those
// nobody took in a whole period, so a burst's memory does not stay.
type spares[T any] struct {
	free []T
	low  int // the fewest free since the last trim
}

func (s *spares[T]) get() (T, bool) {
	var zero T
	n := len(s.free)
	if n == 0 {
		s.low = 0
		return zero, false
	}
	v := s.free[n-1]
	s.free[n-1] = zero
	s.free = s.free[:n-1]
	s.low = min(s.low, n-1)
	return v, true
}

func (s *spares[T]) put(v T) { s.free = append(s.free, v) }

// trim drops the spares unused since the last trim (the low-water mark).
func (s *spares[T]) trim() {
	var zero T
	keep := len(s.free) - s.low
	for i := keep; i < len(s.free); i++ {
		s.free[i] = zero
	}
	s.free = s.free[:keep]
	if cap(s.free) > 2*keep+16 {
		s.free = append([]T(nil), s.free...)
	}
	s.low = len(s.free)
}
