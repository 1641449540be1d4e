//go:build linux

package gateway

import (
	"bytes"
	"context"
	"fmt"
	"net"
	"net/netip"
	"os"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/valyala/fasthttp"

	"github.com/llmgw/llmgw/gateway/policy"
	"github.com/llmgw/llmgw/internal/evloop"
	"github.com/llmgw/llmgw/internal/h1"
	"github.com/llmgw/llmgw/internal/rawio"
)

// loopPlaneSupported: this build has event loops.
const loopPlaneSupported = true

// loopPlane serves one data listener with event loops (plane.go says
// what it serves and what it hands over). Each loop accepts from the
// shared listening socket, and each connection stays on the loop that
// accepted it, with the worker connections its requests use: no state is
// shared between loops but the gateway's own (rules, endpoints, breakers,
// metrics), which is safe for concurrent use.
type loopPlane struct {
	s     *Server
	key   string
	lfd   int
	addr  net.Addr
	loops []*planeLoop
	hand  *handoffListener
	acc   acceptStatus
	wg    sync.WaitGroup // the loops' Run goroutines

	closing   atomic.Bool
	conns     atomic.Int64 // client connections open on the loops
	drained   chan struct{}
	drainOnce sync.Once
	closeOnce sync.Once
}

// startLoopPlane binds addr and starts the loops; hand is where
// connections go that the loop plane does not serve.
func (s *Server) startLoopPlane(key, addr string) (*loopPlane, error) {
	lfd, bound, err := rawio.ListenFD(addr)
	if err != nil {
		return nil, fmt.Errorf("gateway: listen %s: %w", addr, err)
	}
	p := &loopPlane{s: s, key: key, lfd: lfd, addr: bound, drained: make(chan struct{})}
	p.hand = newHandoffListener(bound)
	p.acc.addr = bound.String()
	p.acc.log = s.log
	n := s.cfg.Loops
	if n <= 0 {
		n = defaultLoops()
	}
	for i := 0; i < n; i++ {
		l, err := evloop.New(evloop.Options{NoBatching: s.cfg.NoIOURing})
		if err != nil {
			p.abort()
			return nil, fmt.Errorf("gateway: event loop: %w", err)
		}
		pl := newPlaneLoop(p, l)
		if err := l.Add(lfd, &pl.lh, evloop.In|evloop.Exclusive); err != nil {
			l.Close()
			p.abort()
			return nil, fmt.Errorf("gateway: event loop: %w", err)
		}
		pl.listening = true
		p.loops = append(p.loops, pl)
	}
	if l := p.loops[0].l; l.Batching() {
		s.log.Info("loop plane: requests to workers submitted together through io_uring", "addr", p.acc.addr, "loops", len(p.loops))
	} else {
		s.log.Info("loop plane: a write(2) per request to a worker", "addr", p.acc.addr, "loops", len(p.loops), "why", l.SendsError())
	}
	for _, pl := range p.loops {
		p.wg.Add(1)
		go func() {
			defer p.wg.Done()
			if err := pl.l.Run(); err != nil {
				s.log.Error("event loop stopped", "addr", p.acc.addr, "err", err)
			}
		}()
	}
	return p, nil
}

// abort undoes a start that failed before any loop ran.
func (p *loopPlane) abort() {
	for _, pl := range p.loops {
		pl.l.Close()
	}
	rawio.Close(p.lfd)
	p.hand.Close()
}

// close stops the plane: no new connections; idle ones are closed, the
// answers in flight finish (with Connection: close) until ctx ends, and
// then everything is closed and the loops stop. It returns when they
// have. Idempotent.
func (p *loopPlane) close(ctx context.Context) {
	p.closeOnce.Do(func() {
		p.closing.Store(true)
		// Once every loop has stopped watching the listening socket it is
		// closed, so that a connection attempt from now on is refused at
		// once instead of waiting in the backlog for the answers in
		// flight (as the goroutine plane's listener does).
		left := atomic.Int32{}
		left.Store(int32(len(p.loops)))
		unwatched := make(chan struct{})
		for _, pl := range p.loops {
			if !pl.l.Post(func() {
				pl.beginClose()
				if left.Add(-1) == 0 {
					close(unwatched)
				}
			}) && left.Add(-1) == 0 {
				close(unwatched)
			}
		}
		lfdOpen := true
		select {
		case <-unwatched:
			rawio.Close(p.lfd)
			lfdOpen = false
		case <-ctx.Done():
		}
		if p.conns.Load() == 0 {
			p.drainOnce.Do(func() { close(p.drained) })
		}
		select {
		case <-p.drained:
		case <-ctx.Done():
		}
		for _, pl := range p.loops {
			pl.l.Post(pl.closeAll)
			pl.l.Stop()
		}
		p.wg.Wait()
		for _, pl := range p.loops {
			pl.l.Close()
		}
		if lfdOpen {
			rawio.Close(p.lfd)
		}
		p.hand.Close()
	})
}

// winding reports whether answers end their connections: the plane is
// closing, or the server drains (Server.Drain).
func (p *loopPlane) winding() bool { return p.closing.Load() || p.s.draining.Load() }

// connClosed counts a client connection gone from the loops.
func (p *loopPlane) connClosed() {
	if p.conns.Add(-1) == 0 && p.closing.Load() {
		p.drainOnce.Do(func() { close(p.drained) })
	}
}

// planeLoop is one event loop of a plane with its connections and its
// scratch space (used on its goroutine only).
type planeLoop struct {
	p  *loopPlane
	s  *Server
	l  *evloop.Loop
	lh listenHandler

	listening bool
	backoff   time.Duration
	retry     evloop.Timer // re-arms accepting after a failure

	clients map[*cliConn]struct{}
	pools   map[clientKey]*loopPool
	poolsOf map[*ruleRuntime][]*loopPool // pools by rule and endpoint Index
	reqFree []*loopReq
	// Spare buffers and request states (a loop's own: no sync.Pool, which
	// would allocate a slice header per Put).
	readBufs, upBufs spares[[]byte]
	states           spares[*reqState]
	trim             evloop.Timer // trims the spares

	iov    [rawio.MaxIovec]syscall.Iovec
	head   []byte   // the client's response head being written
	conn   [][]byte // Connection values (clientHead's scratch)
	date   []byte   // the Date field line (dateLine)
	dateAt int64    // the loop time of the second date names
}

func newPlaneLoop(p *loopPlane, l *evloop.Loop) *planeLoop {
	pl := &planeLoop{p: p, s: p.s, l: l, clients: map[*cliConn]struct{}{}, pools: map[clientKey]*loopPool{}, poolsOf: map[*ruleRuntime][]*loopPool{}}
	pl.lh.pl = pl
	pl.retry.Init(retryAccept{pl})
	pl.trim.Init(trimSpares{pl})
	pl.l.Arm(&pl.trim, pl.l.At(spareTrimPeriod))
	return pl
}

// spareTrimPeriod is how often a loop gives back the spare buffers it did
// not need.
const spareTrimPeriod = 10 * time.Second

type trimSpares struct{ pl *planeLoop }

func (t trimSpares) Expired() {
	pl := t.pl
	pl.readBufs.trim()
	pl.upBufs.trim()
	pl.states.trim()
	pl.l.Arm(&pl.trim, pl.l.At(spareTrimPeriod))
}

type listenHandler struct{ pl *planeLoop }

// Ready accepts what the listening socket holds (at most a batch, so one
// busy listener does not starve the loop's connections).
func (h *listenHandler) Ready(uint32) { h.pl.accept() }

type retryAccept struct{ pl *planeLoop }

func (r retryAccept) Expired() {
	pl := r.pl
	if pl.p.closing.Load() || pl.listening {
		return
	}
	if err := pl.l.Add(pl.p.lfd, &pl.lh, evloop.In|evloop.Exclusive); err != nil {
		pl.s.log.Error("data listener cannot watch its socket again", "addr", pl.p.acc.addr, "err", err)
		pl.l.Arm(&pl.retry, pl.l.At(acceptBackoffMax))
		return
	}
	pl.listening = true
	pl.accept()
}

const acceptBatch = 64

func (pl *planeLoop) accept() {
	for range acceptBatch {
		fd, remote, e := rawio.Accept(pl.p.lfd)
		if e == syscall.EAGAIN {
			return
		}
		if e != 0 {
			pl.acceptFailed(os.NewSyscallError("accept4", e))
			return
		}
		if pl.p.acc.failing.Swap(false) {
			pl.s.log.Info("data listener accepting again", "addr", pl.p.acc.addr)
		}
		pl.backoff = 0
		if pl.p.closing.Load() {
			rawio.Close(fd)
			continue
		}
		c := &cliConn{pl: pl, fd: fd, remote: remote}
		c.timer.Init(c)
		if err := pl.l.Add(fd, c, evloop.In|evloop.Out|evloop.RdHup|evloop.Edge); err != nil {
			rawio.Close(fd)
			pl.acceptFailed(err)
			return
		}
		pl.clients[c] = struct{}{}
		pl.p.conns.Add(1)
		// The first request must arrive whole within the read timeout of
		// the connection's start, as on the goroutine plane (fasthttp's
		// ReadTimeout on a new connection).
		pl.l.Arm(&c.timer, pl.l.At(dataReadTimeout))
	}
}

// acceptFailed backs off: the listening socket leaves this loop until a
// timer puts it back (a level-triggered socket that cannot be accepted
// from would wake the loop at once, forever).
func (pl *planeLoop) acceptFailed(err error) {
	reason, _ := acceptErrorReason(err)
	pl.s.metrics.acceptErrors.WithLabelValues(pl.p.acc.addr, reason).Inc()
	pl.p.acc.note(err)
	if pl.listening {
		if derr := pl.l.Del(pl.p.lfd); derr != nil {
			pl.s.log.Error("data listener cannot pause accepting", "addr", pl.p.acc.addr, "err", derr)
		}
		pl.listening = false
	}
	pl.backoff = min(max(2*pl.backoff, acceptBackoffMin), acceptBackoffMax)
	pl.l.Arm(&pl.retry, pl.l.At(pl.backoff))
}

// beginClose starts the plane's shutdown on this loop: no more accepting,
// idle connections closed, busy ones closed once their answer is out.
func (pl *planeLoop) beginClose() {
	pl.l.Disarm(&pl.retry)
	if pl.listening {
		_ = pl.l.Del(pl.p.lfd)
		pl.listening = false
	}
	for c := range pl.clients {
		if c.req == nil && len(c.out) == 0 {
			c.close()
		} else {
			c.closeAfter = true
		}
	}
}

// closeAll closes every connection of the loop (the shutdown's deadline
// passed, or nothing is left).
func (pl *planeLoop) closeAll() {
	for c := range pl.clients {
		c.abandon()
	}
	for _, pool := range pl.pools {
		pool.closeIdle()
	}
}

// getReq returns a request from the loop's free list.
func (pl *planeLoop) getReq() *loopReq {
	if n := len(pl.reqFree); n > 0 {
		r := pl.reqFree[n-1]
		pl.reqFree = pl.reqFree[:n-1]
		return r
	}
	return &loopReq{pl: pl}
}

// Timeouts of the goroutine plane's fasthttp server (newDataServer), which
// the loop plane keeps too.
const (
	dataReadTimeout = 30 * time.Second
	dataIdleTimeout = 120 * time.Second
)

// cliConn is one client connection on a loop.
//
// It reads one request at a time: while a request is in flight (req) or
// its answer is still being written (out), bytes that arrive stay in the
// socket (rdPending remembers the edge) and are read once the answer is
// out. Its timer is the read timeout while a request is being read, the
// idle timeout between requests, and the write timeout while out holds
// bytes the socket has not taken.
type cliConn struct {
	pl     *planeLoop
	fd     int
	remote netip.AddrPort
	timer  evloop.Timer

	buf       []byte // read buffer; nil while idle and empty
	n         int    // bytes in buf
	served    int    // answers written
	rdPending bool   // the socket may hold unread bytes
	idleWait  bool   // the timer is the idle timeout (nothing of a request read yet)

	req        *loopReq // the request in flight
	consumed   int      // bytes of buf that request took (head and body)
	out        []byte   // answer bytes the socket has not taken yet
	closeAfter bool     // close once the current answer is out
	closed     bool
}

// Ready handles the socket's readiness.
func (c *cliConn) Ready(ev uint32) {
	if c.closed {
		return
	}
	if ev&(evloop.RdHup|evloop.Hup|evloop.Err) != 0 {
		// The client closed (or reset) its side. A request in flight is
		// cancelled: closing the worker's connection is how engines learn
		// a request was abandoned.
		c.abandon()
		return
	}
	if ev&evloop.Out != 0 && len(c.out) > 0 {
		if !c.flush() {
			return
		}
	}
	if ev&evloop.In != 0 {
		c.rdPending = true
		if c.req == nil && len(c.out) == 0 {
			c.readRequest()
		}
	}
}

// Expired: the read, idle or write timeout passed.
func (c *cliConn) Expired() {
	if c.closed {
		return
	}
	if c.req != nil || len(c.out) > 0 {
		// A client that does not read its answer: give up on it (and on
		// the worker's request, when one is still running).
		c.abandon()
		return
	}
	if c.idleWait {
		c.close() // a keep-alive connection that stayed idle: no answer
		return
	}
	// The request did not arrive whole in time (a slow client, or a
	// connection that never sent a byte): 408, as fasthttp answers it.
	c.pl.s.metrics.rejected.WithLabelValues("read_timeout").Inc()
	c.closeAfter = true
	c.writeError(fmt.Errorf("%w: no whole request within %v", ErrRequestTimeout, dataReadTimeout), nil)
}

// readRequest reads what the socket holds and serves the request once it
// is whole.
func (c *cliConn) readRequest() {
	for c.rdPending && !c.closed {
		if c.buf == nil {
			c.buf = c.pl.getReadBuf()
		}
		if c.n == len(c.buf) {
			// Full: only a body can be longer than the buffer (a head
			// that long is handed over, parseRequest); it was grown to
			// its size.
			break
		}
		space := len(c.buf) - c.n
		m, e := rawio.Read(c.fd, c.buf[c.n:])
		if e == syscall.EAGAIN {
			c.rdPending = false
			break
		}
		if e != 0 || m == 0 {
			// Reset, or the client's FIN: a request cut short is dropped
			// with its connection (the goroutine plane answers none either).
			c.close()
			return
		}
		if c.n == 0 && c.idleWait {
			// The next request's first byte: from here it has the read
			// timeout to arrive whole.
			c.idleWait = false
			c.pl.l.Arm(&c.timer, c.pl.l.At(dataReadTimeout))
		}
		c.n += m
		c.rdPending = m == space
		if c.parseRequest() {
			return
		}
	}
}

// parseRequest serves the request at the start of buf when it is whole:
// true when it took the connection somewhere (a request in flight, a
// hand-over, a close), false to read on.
func (c *cliConn) parseRequest() bool {
	pl := c.pl
	hl := h1.HeadEnd(c.buf[:c.n])
	if hl == 0 {
		if c.n >= dataReadBufferSize {
			c.handoff("too_large") // 431 from the goroutine plane
			return true
		}
		return false
	}
	r := pl.getReq()
	if err := h1.ParseRequest(c.buf[:hl], &r.req); err != nil {
		// Not plain HTTP/1.1 as the loop plane reads it: the goroutine
		// plane reads it from its first byte (and answers what fasthttp
		// refuses).
		pl.putReq(r)
		reason := "malformed"
		if line, _, _ := bytes.Cut(c.buf[:hl], crlf); bytes.HasSuffix(line, []byte(" HTTP/1.0")) {
			reason = "http10"
		}
		c.handoff(reason)
		return true
	}
	reason := ""
	switch cl := r.req.ContentLength; {
	case r.req.TransferEncoding:
		reason = "chunked_body"
	case r.req.Expect:
		reason = "expect"
	case cl > int64(pl.s.cfg.MaxBodyBytes):
		reason = "too_large"
	}
	if reason != "" {
		pl.putReq(r)
		c.handoff(reason)
		return true
	}
	total := hl + int(max(r.req.ContentLength, 0))
	if c.n < total {
		if len(c.buf) < total {
			nb := make([]byte, total)
			copy(nb, c.buf[:c.n])
			c.pl.putReadBuf(c.buf)
			c.buf = nb
		}
		pl.putReq(r)
		return false
	}
	r.body = c.buf[hl:total]
	r.reqLen = total
	return c.serve(r)
}

// serve routes a whole request: the loop plane forwards it, or hands the
// connection over. It reports true (the connection is taken care of).
func (c *cliConn) serve(r *loopReq) bool {
	rt, reason := c.route(r)
	if rt == nil {
		c.pl.putReq(r)
		c.handoff(reason)
		return true
	}
	c.pl.l.Cancel(&c.timer)
	c.req = r
	c.consumed = r.reqLen
	c.closeAfter = c.closeAfter || r.req.Close
	r.begin(c, rt)
	return true
}

// plainPath is the path of an origin-form target that fasthttp's URI
// normalisation leaves as it is (no percent-encoding, no dot segments, no
// empty segment, no fragment), so both planes route it alike; ok false
// for any other target.
func plainPath(target []byte) (path []byte, ok bool) {
	path = target
	if i := bytes.IndexByte(target, '?'); i >= 0 {
		path = target[:i]
	}
	if len(path) == 0 || path[0] != '/' || bytes.ContainsAny(path, "%#\\") ||
		bytes.Contains(path, []byte("//")) || bytes.Contains(path, []byte("/.")) {
		return nil, false
	}
	return path, true
}

// route finds the rule of a whole request, as serveData and
// serveCompletion would (readCompletion): nil with the hand-over reason
// when the loop plane does not serve it.
func (c *cliConn) route(r *loopReq) (*ruleRuntime, string) {
	pl := c.pl
	s := pl.s
	path, ok := plainPath(r.req.Target)
	if !ok {
		return nil, "uri"
	}
	kind, routed := completionKind(path)
	r.st = pl.getState()
	var rt *ruleRuntime
	switch {
	case routed:
		if string(r.req.Method) != fasthttp.MethodPost {
			return r.dropState(nil, "route")
		}
		var err error
		if rt, _, _, err = s.readCompletion(pl.p.key, kind, r, r.body, r.st); err != nil {
			return r.dropState(nil, "rejected")
		}
		r.stream = r.st.oreq.Stream
	case bytes.Equal(path, pathModels):
		return r.dropState(nil, "route")
	default:
		if _, ok := modelRoutes[string(path)]; ok {
			return r.dropState(nil, "route") // the audio forms (JSON routes are routed above)
		}
		lr := s.routes(pl.p.key)
		if lr == nil || lr.def == nil {
			return r.dropState(nil, "route")
		}
		rt = lr.def
		r.st.preq = policy.Request{}
		r.stream = false
	}
	if rt.loopEPs == nil {
		return r.dropState(nil, "rule")
	}
	if s.cfg.LogPayloads && routed {
		s.log.Debug("request payload", "path", string(path), "body", string(r.body))
	}
	return rt, ""
}

// handoff gives the connection, with every byte read from it and not yet
// answered, to the goroutine plane.
func (c *cliConn) handoff(reason string) {
	pl := c.pl
	pl.s.metrics.loopHandoffs.WithLabelValues(reason).Inc()
	if pl.p.closing.Load() {
		c.close()
		return
	}
	pre := append([]byte(nil), c.buf[:c.n]...)
	if err := pl.l.Del(c.fd); err != nil {
		pl.s.log.Warn("loop plane cannot hand a connection over", "err", err)
		c.close()
		return
	}
	c.forget()
	conn, err := rawio.ConnFromFD(c.fd, c.remote)
	if err != nil {
		pl.s.log.Warn("loop plane cannot hand a connection over", "err", err)
		return // ConnFromFD closed the descriptor
	}
	pl.p.hand.give(&prefixConn{Conn: conn, pre: pre})
}

// answered ends the request in flight once its answer is handed to the
// socket (some bytes may wait in out): the next request is read when out
// is empty.
func (c *cliConn) answered() {
	c.req = nil
	c.served++
	if c.closed {
		return
	}
	// The request's bytes leave the buffer; a pipelined next request
	// moves to its start.
	if r := c.consumed; r > 0 {
		c.consumed = 0
		c.n = copy(c.buf, c.buf[r:c.n])
	}
	if len(c.out) > 0 {
		return // flush continues when the socket takes them
	}
	c.next()
}

// next starts on the connection's next request, or closes it.
func (c *cliConn) next() {
	if c.closeAfter {
		c.close()
		return
	}
	if c.n == 0 {
		if c.buf != nil && cap(c.buf) == readBufSize {
			c.pl.putReadBuf(c.buf)
		}
		c.buf = nil
	}
	c.idleWait = c.n == 0
	if c.idleWait {
		c.pl.l.Arm(&c.timer, c.pl.l.At(dataIdleTimeout))
	} else {
		c.pl.l.Arm(&c.timer, c.pl.l.At(dataReadTimeout))
	}
	if c.n > 0 && c.parseRequest() {
		return
	}
	c.readRequest()
}

// send writes parts to the client: what the socket takes at once, and the
// rest into out (written as the socket takes it, under the write
// timeout). It reports false when the connection failed (closed).
func (c *cliConn) send(parts ...[]byte) bool {
	if c.closed {
		return false
	}
	if len(c.out) > 0 {
		for _, p := range parts {
			c.out = append(c.out, p...)
		}
		return true
	}
	n, e := rawio.Writev(c.fd, parts, &c.pl.iov)
	if e != 0 && e != syscall.EAGAIN {
		c.abandon()
		return false
	}
	for _, p := range parts {
		if n >= len(p) {
			n -= len(p)
			continue
		}
		c.out = append(c.out, p[n:]...)
		n = 0
	}
	if len(c.out) > 0 {
		c.pl.l.Arm(&c.timer, c.pl.l.At(c.pl.s.cfg.WriteTimeout))
	}
	return true
}

// flush writes what out holds; true when it is empty afterwards.
func (c *cliConn) flush() bool {
	n, e := rawio.Writev(c.fd, [][]byte{c.out}, &c.pl.iov)
	if e == syscall.EAGAIN {
		return false
	}
	if e != 0 {
		c.abandon()
		return false
	}
	if n < len(c.out) {
		c.out = c.out[:copy(c.out, c.out[n:])]
		// Bytes went: the write timeout bounds a stall, not the answer.
		c.pl.l.Arm(&c.timer, c.pl.l.At(c.pl.s.cfg.WriteTimeout))
		return false
	}
	c.out = c.out[:0]
	if cap(c.out) > 64<<10 {
		c.out = nil
	}
	c.pl.l.Disarm(&c.timer)
	if r := c.req; r != nil {
		r.clientDrained()
		return !c.closed
	}
	c.next()
	return !c.closed
}

// writeError answers the gateway's own error err (no request in flight
// from here: the caller has released it). id is the request's id; nil
// makes one.
func (c *cliConn) writeError(err error, id []byte) {
	var fresh [32]byte
	if id == nil {
		newRequestID(&fresh)
		id = fresh[:]
	}
	head, body := c.pl.errorAnswer(err, id, c.closeAfter)
	if c.send(head, body) && len(c.out) == 0 && c.req == nil {
		c.served++
		c.next()
	}
}

// abandon closes the connection and gives up the request in flight, if
// any (the client left, or stopped reading).
func (c *cliConn) abandon() {
	if c.closed {
		return
	}
	if r := c.req; r != nil {
		r.clientGone()
	}
	c.close()
}

// close closes the connection (raw close(2): no scheduler wake-up).
func (c *cliConn) close() {
	if c.closed {
		return
	}
	if r := c.req; r != nil {
		// Only abandon closes with a request in flight.
		r.clientGone()
	}
	c.forget()
	rawio.Close(c.fd)
}

// forget takes the connection off the loop (its descriptor is closed or
// handed over by the caller).
func (c *cliConn) forget() {
	c.closed = true
	pl := c.pl
	pl.l.Forget(c.fd)
	pl.l.Disarm(&c.timer)
	delete(pl.clients, c)
	if c.buf != nil && cap(c.buf) == readBufSize {
		c.pl.putReadBuf(c.buf)
	}
	c.buf, c.out = nil, nil
	pl.p.connClosed()
}

// readBufSize is a client connection's read buffer: a whole head
// (dataReadBufferSize) and a small body; a longer body gets a buffer of
// its own size.
const readBufSize = dataReadBufferSize + 16<<10

func (pl *planeLoop) getReadBuf() []byte {
	if b, ok := pl.readBufs.get(); ok {
		return b
	}
	return make([]byte, readBufSize)
}

func (pl *planeLoop) putReadBuf(b []byte) {
	if cap(b) == readBufSize {
		pl.readBufs.put(b[:readBufSize])
	}
}
