package gateway

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"os"
	"time"

	"github.com/llmgw/llmgw/engines"
	"github.com/llmgw/llmgw/internal/rawio"
)

// Upstream connections and what a failure on one proves.
//
// The gateway sends each request to a worker at most once. It may send it
// again, on the same or another endpoint, only when the failure proves that
// no worker can have read it:
//
//   - the connection could not be made (refused, connect timeout, DNS, TLS
//     handshake): a *DialError;
//   - a pooled connection was found dead before anything was written to it
//     (the worker closed or reset it while idle, sent unsolicited bytes, or
//     sat idle past the engine's keep-alive timeout): errStaleConn;
//   - writing the request failed, so the worker never had all of it: a
//     *sendError.
//
// Any other failure happened after the whole request was written; the
// worker may have executed it, so it is relayed as an error, never retried.

// errStaleConn: a pooled connection was dead before the request was written
// to it. Nothing was sent.
var errStaleConn = errors.New("pooled connection closed by the worker while idle")

// errConnRetired: a pooled connection has carried the engine's request
// limit; the engine closes it after that many. Nothing was sent.
var errConnRetired = errors.New("pooled connection at the engine's request limit")

// sendError: writing the request to the worker failed part-way or entirely,
// so the worker cannot have read all of it. reused says whether the
// connection had carried an earlier request.
type sendError struct {
	reused bool
	err    error
}

func (e *sendError) Error() string { return "writing the request: " + e.err.Error() }
func (e *sendError) Unwrap() error { return e.err }

// connOpts is how the gateway treats connections to one endpoint; it follows
// the engine's ConnPolicy (engines.Adapter.Conn).
type connOpts struct {
	// connect bounds the TCP connect and the TLS handshake.
	connect time.Duration
	// idle bounds the silence between response reads once bytes flow.
	idle time.Duration
	// maxIdle: a pooled connection idle longer than this is dead (the
	// engine closes it); it is checked before each reuse, not only by the
	// pool's cleaner.
	maxIdle time.Duration
	// maxRequests: a connection that has carried this many requests is not
	// reused (0: no limit).
	maxRequests int
	// quickAck: after writing each request, before reading its answer,
	// take the connection out of delayed-ACK mode (rawio.QuickAck) so the
	// engine's answer is not held by Nagle's algorithm waiting for our ACK
	// of its head (ConnPolicy.ReusedConnStall).
	quickAck bool
	tls      *tls.Config
}

// poolIdle is the pool's idle limit for an engine that closes idle
// connections after t: a fifth below t (4 s for 5 s), so that the gateway
// drops a connection well before the engine can close it under a request in
// flight. Zero t (not known) keeps the gateway's own 90 s.
func poolIdle(t time.Duration) time.Duration {
	if t <= 0 {
		return 90 * time.Second
	}
	return t - t/5
}

// keptConns is how many kept-alive connections the gateway holds to one
// endpoint of an engine whose server serves only ServingConns connections
// at once (llama-server: one per HTTP thread, each held for as long as its
// connection stays open, idle or not): half of them, at least one. The
// rest of the server's threads stay free for whoever else connects (the
// gateway's probes, a metrics scraper, other gateway replicas); a request
// that finds all kept connections busy goes on a one-shot connection
// (Connection: close), which holds a thread only while it is answered.
// Zero: no limit (the engine states none).
func keptConns(p engines.ConnPolicy) int {
	if p.ServingConns <= 0 {
		return 0
	}
	return max(1, p.ServingConns/2)
}

// keptIdle is the pool's idle limit for an engine that serves a limited
// number of connections: an idle kept connection holds one of the server's
// few threads, so it is dropped after a second of idleness, well before
// the engine's own keep-alive timeout (5 s for llama.cpp); under load the
// connections are reused at once and never reach it.
const keptIdle = time.Second

// dialUpstream connects to addr and wraps the connection so that a dead
// pooled connection is found before a request is written to it. Every
// failure is a *DialError: nothing reached the worker.
func dialUpstream(addr string, o *connOpts) (net.Conn, error) {
	// No TCP keep-alive probes: a pooled connection idles at most maxIdle
	// (4 s for the engines known), well under the first probe (15 s), and
	// a stream's silence is bounded by the idle timeout; the probes'
	// socket options would only cost every new connection four system
	// calls.
	c, err := dialTCP(addr, o.connect)
	if err != nil {
		return nil, &DialError{Addr: addr, Err: err}
	}
	uc := &upConn{Conn: c, o: o, canSendFirst: rawio.CanSendFirst(c)}
	if o.tls == nil {
		return uc, nil
	}
	cfg := o.tls
	if cfg.ServerName == "" && !cfg.InsecureSkipVerify {
		host, _, _ := net.SplitHostPort(addr)
		cfg = cfg.Clone()
		cfg.ServerName = host
	}
	// The handshake is done here, below the HTTP client, so that its
	// failure is a dial failure (nothing sent); fasthttp does not repeat
	// it for a connection that already has Handshake.
	tc := tls.Client(uc, cfg)
	ctx, cancel := context.WithTimeout(context.Background(), o.connect)
	defer cancel()
	if err := tc.HandshakeContext(ctx); err != nil {
		_ = c.Close()
		return nil, &DialError{Addr: addr, Err: fmt.Errorf("TLS handshake: %w", err)}
	}
	// The handshake is not a request: the first HTTP request is the
	// connection's first.
	uc.requests, uc.reading = 0, false
	return tc, nil
}

// dialTCP connects to addr within timeout. A numeric address is dialed by
// rawio (its reads and writes stay out of the scheduler's syscall state, see
// internal/rawio); a name is resolved and dialed by package net, its
// connection wrapped the same way.
func dialTCP(addr string, timeout time.Duration) (net.Conn, error) {
	ctx, cancel := context.Background(), context.CancelFunc(func() {})
	if timeout > 0 {
		ctx, cancel = context.WithTimeout(ctx, timeout)
	}
	defer cancel()
	if c, ok, err := rawio.DialTCP(ctx, addr); ok {
		return c, err
	}
	c, err := (&net.Dialer{KeepAlive: -1}).DialContext(ctx, "tcp", addr)
	if err != nil {
		return nil, err
	}
	return rawio.Wrap(c), nil
}

// upConn is one upstream TCP connection (below TLS, when there is TLS).
//
// HTTP/1.1 without pipelining alternates: a request is written, then its
// response read. So the first Write after a Read starts a new request on a
// reused connection; before letting it through, upConn checks that the
// connection is still usable (alive, not idle past maxIdle, under
// maxRequests) and otherwise fails the Write with errStaleConn, writing
// nothing. sendFirst is the same start of a request for roundTrip on a
// rawio connection, its send and peek made by the answer's first Read.
//
// It also bounds the silence between reads: fasthttp sets the first-byte
// deadline (HostClient.ReadTimeout) before it reads a response; once bytes
// flow, a read fails only when idle has passed since the last bytes, so a
// long stream is bounded by its gaps, not its total length. The deadline is
// not re-armed on every read: the idle deadline is armed when the next
// Read begins after bytes came (a small answer read at once never needs
// it), and when it expires while bytes came meanwhile it is moved to the
// last bytes plus idle and the read goes on.
type upConn struct {
	net.Conn
	o        *connOpts
	requests int       // requests started on this connection
	reading  bool      // the last operation was a Read
	lastRead time.Time // end of the last response read (last Read with bytes)
	// idlePending: bytes came under the first-byte deadline; the next Read
	// arms the idle deadline. idleArmed: the socket's read deadline is an
	// idle deadline (lastRead at arming + idle).
	idlePending, idleArmed bool
	// canSendFirst: the connection is rawio's, so sendFirst works.
	// sentFirst: the next Read sends the request (and asks for quick
	// ACKs) before it waits. sendErr: that send failed.
	canSendFirst, sentFirst bool
	sendErr                 error
}

func (c *upConn) Read(p []byte) (int, error) {
	if c.sentFirst {
		// This read sends the request first (and takes the connection out
		// of delayed-ACK mode right after, when asked).
		c.sentFirst = false
		n, err := c.read(p)
		var se *rawio.SendError
		switch {
		case errors.Is(err, rawio.ErrNotIdle):
			// The peek before a reuse: found dead while idle, nothing sent.
			c.sendErr = errStaleConn
			return 0, c.sendErr
		case errors.As(err, &se):
			c.sendErr = &sendError{reused: c.requests > 1, err: se.Err}
			return 0, c.sendErr
		}
		return n, err
	}
	if c.o.quickAck && !c.reading && c.requests > 0 {
		// The first read of an answer. A failure means the socket is
		// unusable; the read below reports that.
		_ = rawio.QuickAck(c.Conn)
	}
	return c.read(p)
}

func (c *upConn) read(p []byte) (int, error) {
	if c.idlePending {
		c.idlePending, c.idleArmed = false, true
		_ = c.Conn.SetReadDeadline(c.lastRead.Add(c.o.idle))
	}
	for {
		n, err := c.Conn.Read(p)
		if n > 0 {
			c.reading = true
			c.lastRead = time.Now()
			if c.o.idle > 0 && !c.idleArmed {
				c.idlePending = true
			}
			return n, err
		}
		if err != nil && c.idleArmed && errors.Is(err, os.ErrDeadlineExceeded) {
			if due := c.lastRead.Add(c.o.idle); time.Now().Before(due) {
				// Bytes came after the deadline was armed: the silence
				// is shorter than idle.
				_ = c.Conn.SetReadDeadline(due)
				continue
			}
		}
		return n, err
	}
}

// SetReadDeadline is a new deadline from above (fasthttp's first-byte
// timeout, TLS): it replaces the idle deadline.
func (c *upConn) SetReadDeadline(t time.Time) error {
	c.idlePending, c.idleArmed = false, false
	return c.Conn.SetReadDeadline(t)
}

// SetDeadline: as SetReadDeadline, for both directions.
func (c *upConn) SetDeadline(t time.Time) error {
	c.idlePending, c.idleArmed = false, false
	return c.Conn.SetDeadline(t)
}

func (c *upConn) Write(p []byte) (int, error) {
	if c.reading || c.requests == 0 {
		if c.requests > 0 {
			if err := c.usable(); err != nil {
				return 0, err
			}
		}
		c.reading = false
		c.requests++
	}
	n, err := c.Conn.Write(p)
	if err != nil {
		return n, &sendError{reused: c.requests > 1, err: err}
	}
	return n, nil
}

// sendFirst starts a request as Write does (the same checks before a
// reused connection carries another) but leaves head and body for the next
// Read to send, in one writev(2) right before it waits for the answer
// (rawio.SendFirst): the read that would find nothing yet is saved. On a
// reused connection the peek that finds it dead runs inside that same
// Read, after its wait is armed (so nothing the worker sends after it can
// be missed); a dead one fails the Read with errStaleConn, nothing sent. It reports false, doing nothing, when the connection cannot
// (not rawio's). A failure to send is that Read's error (errStaleConn or a
// *sendError); since fasthttp reports any error before an answer's first
// byte as io.EOF, sendFailed gives it back.
func (c *upConn) sendFirst(head, body []byte) (bool, error) {
	if !c.canSendFirst {
		return false, nil
	}
	reused := c.requests > 0
	if reused {
		if err := c.underLimits(); err != nil {
			return true, err
		}
	}
	c.reading = false
	c.requests++
	c.sendErr = nil
	c.sentFirst = rawio.SendFirst(c.Conn, head, body, c.o.quickAck, reused)
	return true, nil
}

// sendFailed is the failure of the last request sendFirst left, or nil.
func (c *upConn) sendFailed() error { return c.sendErr }

// usable reports why a kept-alive connection must not carry another
// request, or nil.
func (c *upConn) usable() error {
	if err := c.underLimits(); err != nil {
		return err
	}
	if !peerOpen(c.Conn) {
		return errStaleConn
	}
	return nil
}

// underLimits is usable without the peek: the engine's request limit and
// idle timeout.
func (c *upConn) underLimits() error {
	if c.o.maxRequests > 0 && c.requests >= c.o.maxRequests {
		return errConnRetired
	}
	if c.o.maxIdle > 0 && time.Since(c.lastRead) > c.o.maxIdle {
		return fmt.Errorf("%w (idle past %v)", errStaleConn, c.o.maxIdle)
	}
	return nil
}
