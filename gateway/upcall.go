package gateway

import (
	"errors"
	"io"
	"net"
	"sync"
	"time"
	"unsafe"

	"github.com/valyala/fasthttp"
)

// errClientGone: the client closed its connection before the answer was
// delivered; the worker's request was cancelled (its connection closed).
var errClientGone = errors.New("gateway: the client closed the connection")

// upstreamCall is one request to a worker. It knows the worker connection
// the request went out on, so that a client that leaves can close it: with
// HTTP/1.1 closing the connection is how an engine learns that a request
// is abandoned (vLLM and SGLang abort the request when its connection
// drops). fasthttp's HostClient.Do takes no context, so the connection is
// learnt in cancelTransport.RoundTrip, the one place that holds both the
// request and the connection.
type upstreamCall struct {
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

// upstreamCalls maps a request being sent (by its *fasthttp.Request, unique
// while Do runs) to its call.
var upstreamCalls callMap

// callMap is a map from request to call, sharded by the request's address
// so that concurrent requests rarely share a lock; unlike sync.Map it does
// not allocate per entry.
type callMap struct {
	shards [64]struct {
		mu sync.Mutex
		m  map[*fasthttp.Request]*upstreamCall
		_  [48]byte // one shard per 64-byte cache line
	}
}

func (m *callMap) shard(req *fasthttp.Request) int {
	return int(uintptr(unsafe.Pointer(req))>>6) & (len(m.shards) - 1)
}

func (m *callMap) put(req *fasthttp.Request, c *upstreamCall) {
	sh := &m.shards[m.shard(req)]
	sh.mu.Lock()
	if sh.m == nil {
		sh.m = map[*fasthttp.Request]*upstreamCall{}
	}
	sh.m[req] = c
	sh.mu.Unlock()
}

func (m *callMap) get(req *fasthttp.Request) *upstreamCall {
	sh := &m.shards[m.shard(req)]
	sh.mu.Lock()
	c := sh.m[req]
	sh.mu.Unlock()
	return c
}

func (m *callMap) del(req *fasthttp.Request) {
	sh := &m.shards[m.shard(req)]
	sh.mu.Lock()
	delete(sh.m, req)
	sh.mu.Unlock()
}

// cancelTransport is fasthttp's HostClient round trip (fasthttp v1.78.0
// client.go, transport.RoundTrip: acquire a connection, write the request
// under WriteTimeout, read the response header under ReadTimeout) with two
// differences for requests registered in upstreamCalls: the connection is
// attached to the call, and the body is always streamed to the caller as
// an upstreamBody, which returns the connection to the pool only when the
// body was read to its end. Unregistered requests take fasthttp's own
// transport.
type cancelTransport struct{}

func (cancelTransport) RoundTrip(hc *fasthttp.HostClient, req *fasthttp.Request, resp *fasthttp.Response) (retry bool, err error) {
	call := upstreamCalls.get(req)
	if call == nil {
		return fasthttp.DefaultTransport.RoundTrip(hc, req, resp)
	}
	cc, err := hc.AcquireConn(0, req.ConnectionClose())
	if err != nil {
		return false, err
	}
	conn := cc.Conn()
	if !call.attach(conn) {
		hc.CloseConn(cc)
		return false, errClientGone
	}
	fail := func(err error) (bool, error) {
		call.detach()
		hc.CloseConn(cc)
		if call.isCancelled() {
			return false, errClientGone
		}
		return true, err
	}
	resp.ParseNetConn(conn)
	var wd time.Time
	if hc.WriteTimeout > 0 {
		wd = time.Now().Add(hc.WriteTimeout)
	}
	if err := conn.SetWriteDeadline(wd); err != nil {
		return fail(err)
	}
	bw := hc.AcquireWriter(conn)
	err = req.Write(bw)
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
	var rd time.Time
	if hc.ReadTimeout > 0 {
		rd = time.Now().Add(hc.ReadTimeout)
	}
	if err := conn.SetReadDeadline(rd); err != nil {
		return fail(err)
	}
	if req.Header.IsHead() {
		resp.SkipBody = true
	}
	if hc.DisableHeaderNamesNormalizing {
		resp.Header.DisableNormalizing()
	}
	resp.StreamBody = true
	br := hc.AcquireReader(conn)
	if err := resp.ReadLimitBody(br, 0); err != nil {
		hc.ReleaseReader(br)
		return fail(err)
	}
	b := &call.bodyStore
	*b = upstreamBody{resp: resp, call: call, keep: !req.ConnectionClose() && !resp.ConnectionClose(),
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
		return false, nil
	}
	call.body = b
	return false, nil
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
