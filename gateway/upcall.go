package gateway

import (
	"errors"
	"io"
	"net"
	"sync"
	"time"

	"github.com/valyala/fasthttp"
)

// errClientGone: the client closed its connection before the answer was
// delivered; the worker's request was cancelled (its connection closed).
var errClientGone = errors.New("gateway: the client closed the connection")

// upstreamCall is one request to a worker. It knows the worker connection
// the request went out on, so that a client that leaves can close it: with
// HTTP/1.1 closing the connection is how an engine learns that a request
// is abandoned (vLLM and SGLang abort the request when its connection
// drops). roundTrip attaches the connection once it has one.
type upstreamCall struct {
	// head is the worker's request head without its ending blank line
	// (appendUpstreamHead), with at least upHeadEnd bytes of spare
	// capacity; reqBody its body (none when bodyless).
	head, reqBody []byte
	bodyless      bool // GET or HEAD: no body, no Content-Length
	isHead        bool // HEAD: the answer has no body whatever its head says

	mu        sync.Mutex
	conn      net.Conn
	cancelled bool
	// body is the response body stream once headers arrived (nil for a
	// response without a body). The caller owns it and must Close it.
	body      *upstreamBody
	bodyStore upstreamBody // body's memory: one allocation per call
}

// attach records conn as the call's connection; false when the call was
// already cancelled (the caller then closes conn).
func (c *upstreamCall) attach(conn net.Conn) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.cancelled {
		return false
	}
	c.conn = conn
	return true
}

func (c *upstreamCall) detach() {
	c.mu.Lock()
	c.conn = nil
	c.mu.Unlock()
}

// cancel closes the call's connection, at once or as soon as it has one.
func (c *upstreamCall) cancel() {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.cancelled = true
	if c.conn != nil {
		_ = c.conn.Close()
	}
}

func (c *upstreamCall) isCancelled() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.cancelled
}

var (
	crlf            = []byte("\r\n")
	connCloseHeader = []byte("Connection: close\r\n")
)

// upHeadEnd is the most roundTrip appends to a request head: Connection:
// close and the blank line.
const upHeadEnd = len("Connection: close\r\n") + len("\r\n")

// roundTrip sends call on a connection from hc's pool and reads the
// answer's head into resp; the body is always streamed, as call.body, which
// returns the connection to the pool only when it was read to its end.
// oneShot asks for a connection of its own and says Connection: close.
//
// It is fasthttp's transport round trip (v1.78.0 client.go,
// transport.RoundTrip: acquire a connection, write the request under
// hc.WriteTimeout, read the response header under hc.ReadTimeout, io.EOF
// before the first byte reported as fasthttp.ErrConnectionClosed as
// HostClient.Do does) without HostClient.Do's fasthttp.Request: the head is
// written as appendUpstreamHead built it, with the body. On the gateway's
// own plain TCP connections (upConn over rawio) head and body go out in
// one writev(2) made by the answer's first read, right before it waits
// (upConn.sendFirst; on a reused connection the dead-connection peek runs
// there too); on others (TLS) they go through the connection's buffer, so
// a small request is one write either way. HostClient.Do's retries are not
// wanted (the gateway decides, see upConn) and its User-Agent default is
// off.
func roundTrip(hc *fasthttp.HostClient, call *upstreamCall, resp *fasthttp.Response, oneShot bool) error {
	resp.Reset()
	// A worker's answer without Content-Type has none for the client
	// either (fasthttp would report text/plain).
	resp.Header.SetNoDefaultContentType(true)
	cc, err := hc.AcquireConn(0, oneShot)
	if err != nil {
		return err
	}
	conn := cc.Conn()
	if !call.attach(conn) {
		hc.CloseConn(cc)
		return errClientGone
	}
	fail := func(err error) error {
		call.detach()
		hc.CloseConn(cc)
		if call.isCancelled() {
			return errClientGone
		}
		if err == io.EOF {
			return fasthttp.ErrConnectionClosed
		}
		return err
	}
	// No resp.ParseNetConn: nothing reads the answer's addresses, and a
	// dialed connection's local address costs a getsockname(2) when asked.
	now := time.Now()
	var wd time.Time
	if hc.WriteTimeout > 0 {
		wd = now.Add(hc.WriteTimeout)
	}
	if err := conn.SetWriteDeadline(wd); err != nil {
		return fail(err)
	}
	// The head's end (and Connection: close) goes into head's spare
	// capacity: call.head itself is unchanged, so a second round trip of
	// the same call builds the same bytes.
	head := call.head
	if oneShot {
		head = append(head, connCloseHeader...)
	}
	head = append(head, crlf...)
	var body []byte
	if !call.bodyless {
		body = call.reqBody
	}
	uc, _ := conn.(*upConn)
	sent := false
	if uc != nil {
		// On rawio's plain TCP connections the request goes out with the
		// first read of the answer (upConn.sendFirst): no read finds
		// nothing before the wait.
		sent, err = uc.sendFirst(head, body)
		if err != nil {
			return fail(err)
		}
	}
	if !sent {
		bw := hc.AcquireWriter(conn)
		_, err = bw.Write(head)
		if err == nil {
			_, err = bw.Write(body)
		}
		if err == nil {
			err = bw.Flush()
		}
		hc.ReleaseWriter(bw)
		if err != nil {
			if ne, ok := err.(interface{ Timeout() bool }); ok && ne.Timeout() {
				err = fasthttp.ErrTimeout
			}
			return fail(err)
		}
	}
	var rd time.Time
	if hc.ReadTimeout > 0 {
		// From before the write: a few microseconds earlier than the
		// request's end, against a first-byte timeout of seconds.
		rd = now.Add(hc.ReadTimeout)
	}
	if err := conn.SetReadDeadline(rd); err != nil {
		return fail(err)
	}
	if call.isHead {
		resp.SkipBody = true
	}
	if hc.DisableHeaderNamesNormalizing {
		resp.Header.DisableNormalizing()
	}
	resp.StreamBody = true
	br := hc.AcquireReader(conn)
	if err := resp.ReadLimitBody(br, 0); err != nil {
		hc.ReleaseReader(br)
		if uc != nil {
			if serr := uc.sendFailed(); serr != nil {
				// fasthttp reports it as io.EOF: the request was not
				// (all) sent.
				err = serr
			}
		}
		return fail(err)
	}
	b := &call.bodyStore
	*b = upstreamBody{resp: resp, call: call, keep: !oneShot && !resp.ConnectionClose(),
		done: func(reuse bool) {
			hc.ReleaseReader(br)
			if reuse {
				hc.ReleaseConn(cc)
			} else {
				hc.CloseConn(cc)
			}
		}}
	b.r = resp.BodyStream()
	if b.r == nil {
		b.eof = true
		b.Close()
		return nil
	}
	call.body = b
	return nil
}

// upstreamBody is a worker's response body being read. Close must be
// called once; it returns the connection to the pool when the body was read
// to its end on a keep-alive connection, and closes it otherwise (which is
// what cancels the worker's request when the reader gave up early).
type upstreamBody struct {
	resp *fasthttp.Response
	done func(reuse bool) // releases the reader and the connection
	call *upstreamCall
	r    io.Reader
	keep bool
	eof  bool
	once sync.Once
}

func (b *upstreamBody) Read(p []byte) (int, error) {
	if b.eof {
		return 0, io.EOF
	}
	n, err := b.r.Read(p)
	if err == io.EOF {
		b.eof = true
	}
	return n, err
}

// Close releases the body and its connection.
func (b *upstreamBody) Close() {
	b.once.Do(func() {
		_ = b.resp.CloseBodyStream()
		b.call.detach()
		b.done(b.eof && b.keep && !b.resp.ConnectionClose() && !b.call.isCancelled())
	})
}
