package sim

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"net"
	"runtime"
	"strconv"
	"sync"
	"time"

	"github.com/valyala/fasthttp"

	"github.com/llmgw/llmgw/engines/llamacpp"
)

// llamaTransport is llama-server's connection behaviour, read from the
// llama.cpp adapter's ConnPolicy (engines/llamacpp; measured in its
// testdata/transport.json):
//
//   - every answer advertises "Keep-Alive: timeout=5, max=100" (not counted
//     down), or "Connection: close" when the request asked for it or on the
//     100th answer of a connection, which is then closed;
//   - the connection is closed right after every SSE answer (after the
//     final 0-length chunk), although it advertised keep-alive;
//   - an idle keep-alive connection, and a connection that never sent a
//     byte, is closed (FIN, no answer) after the idle timeout; a connection
//     with a partial request is not;
//   - only as many connections as llama-server has HTTP threads are served
//     at once (llamacpp.HTTPThreads of the persona's slots and this host's
//     CPUs, as llama-server would size its pool here: 4 for two slots on two
//     CPUs; without a concurrency limit, the adapter's ServingConns): a
//     further one is accepted by the kernel (listen backlog) but waits
//     until a served one closes;
//   - with the Nagle stall on, the socket keeps Nagle's algorithm on (no
//     TCP_NODELAY, cpp-httplib's default) and a non-streamed answer's head
//     and body go out as two writes (cpp-httplib's write_response_core), so
//     the kernel holds the body until the client acknowledges the head: on
//     a reused connection whose client delays its ACKs, ~40 ms
//     (llamacpp.ReusedConnStall), and not at all for a client that ACKs at
//     once (TCP_QUICKACK) — the same mechanism as llama-server's, not a
//     timer.
type llamaTransport struct {
	policy   llamaConnPolicy
	idle     time.Duration
	nagle    bool          // the Nagle stall: Nagle on, head and body written apart
	serving  chan struct{} // one token per served connection
	stopping <-chan struct{}
}

// llamaConnPolicy is the part of the adapter's ConnPolicy the persona
// enforces with settings; its CloseAfterStream holds by construction:
// llamaStream writes every stream on the hijacked connection, which is
// closed after it.
type llamaConnPolicy struct {
	maxRequests  int
	servingConns int
}

func newLlamaTransport(ctx context.Context, cfg Config) *llamaTransport {
	p := llamacpp.Adapter{}.Conn()
	t := &llamaTransport{
		policy: llamaConnPolicy{
			maxRequests:  p.MaxRequestsPerConn,
			servingConns: p.ServingConns,
		},
		idle:     p.IdleTimeout,
		stopping: ctx.Done(),
	}
	if cfg.IdleTimeout > 0 {
		t.idle = cfg.IdleTimeout
	}
	t.nagle = cfg.NagleStall
	if p.ServingConns > 0 {
		// A persona with slots (-np) sizes its pool as llama-server would
		// on this host; one with unbounded concurrency has no -np and
		// serves the adapter's figure, the captured launch's.
		if cfg.MaxConcurrency > 0 {
			t.policy.servingConns = llamacpp.HTTPThreads(cfg.MaxConcurrency, runtime.NumCPU())
		}
		t.serving = make(chan struct{}, t.policy.servingConns)
	}
	return t
}

// configure sets the fasthttp options that carry the policy: the idle
// timeout after an answer, the request limit per connection, and no Date
// header (llama-server sends none).
func (t *llamaTransport) configure(srv *fasthttp.Server) {
	srv.IdleTimeout = t.idle
	srv.MaxRequestsPerConn = t.policy.maxRequests
	srv.NoDefaultDate = true
}

// listener wraps ln so that at most ServingConns connections are served at
// once and a connection that sends nothing is closed after the idle time.
func (t *llamaTransport) listener(ln net.Listener) net.Listener {
	return &llamaListener{Listener: ln, t: t}
}

type llamaListener struct {
	net.Listener
	t *llamaTransport
}

// Accept takes a serving slot before it accepts, so a connection beyond the
// limit stays in the kernel's accept queue, connected but unanswered, as
// with llama-server's busy HTTP thread pool.
func (l *llamaListener) Accept() (net.Conn, error) {
	if l.t.serving != nil {
		select {
		case l.t.serving <- struct{}{}:
		case <-l.t.stopping:
			return nil, net.ErrClosed
		}
	}
	c, err := l.Listener.Accept()
	if err != nil {
		l.release()
		return nil, err
	}
	if l.t.nagle {
		if err := setNagle(c); err != nil {
			_ = c.Close()
			l.release()
			return nil, err
		}
	}
	lc := &llamaConn{Conn: c, release: l.release}
	// A connection that never sends a byte is closed after the idle time,
	// silently (fasthttp's own first-request timeout would answer 408).
	// The timer's func must not read lc.silent: it may run before the
	// assignment below is visible to it.
	lc.silent = time.AfterFunc(l.t.idle, func() { _ = lc.close() })
	return lc, nil
}

func (l *llamaListener) release() {
	if l.t.serving != nil {
		<-l.t.serving
	}
}

type llamaConn struct {
	net.Conn
	release   func()
	silent    *time.Timer
	firstRead sync.Once
	closeOnce sync.Once
	closeErr  error
}

func (c *llamaConn) Read(p []byte) (int, error) {
	n, err := c.Conn.Read(p)
	if n > 0 {
		c.firstRead.Do(func() { c.silent.Stop() })
	}
	return n, err
}

func (c *llamaConn) Close() error {
	c.silent.Stop()
	return c.close()
}

// close closes the connection once and frees its serving slot.
func (c *llamaConn) close() error {
	c.closeOnce.Do(func() {
		c.closeErr = c.Conn.Close()
		c.release()
	})
	return c.closeErr
}

// llamaKeepAlive is the Keep-Alive header llama-server advertises on every
// answer it does not close, derived from the policy it enforces.
func (t *llamaTransport) keepAlive() string {
	return "timeout=" + strconv.Itoa(int(t.idle/time.Second)) + ", max=" + strconv.Itoa(t.policy.maxRequests)
}

// finish applies the transport policy to the answer the persona built.
func (t *llamaTransport) finish(ctx *fasthttp.RequestCtx) {
	if ctx.Hijacked() {
		return // a stream (or a crash fault) writes its own head
	}
	h := &ctx.Response.Header
	// llama-server's header set: no request id, no Cache-Control, and its
	// own Content-Types.
	h.Del("X-Request-Id")
	h.Del("Cache-Control")
	switch string(h.ContentType()) {
	case "application/json":
		h.SetContentType("application/json; charset=utf-8")
	case "text/event-stream; charset=utf-8":
		h.SetContentType("text/event-stream")
	}
	closing := t.closing(ctx)
	if !closing {
		// The advertised timeout is whole seconds, as llama-server prints
		// it; a shortened test idle time still advertises what it enforces.
		h.Set("Keep-Alive", t.keepAlive())
	}
	// llama-server echoes the request's Origin, and sends the header empty
	// when there is none.
	h.SetBytesV("Access-Control-Allow-Origin", ctx.Request.Header.Peek("Origin"))
	if ctx.IsHead() {
		h.Set("Accept-Ranges", "bytes") // cpp-httplib's HEAD answer
	}
	if t.nagle {
		// Head and body in two writes: the head is flushed on its own,
		// then the body is copied from the stream.
		body := append([]byte(nil), ctx.Response.Body()...)
		ctx.Response.SetBodyStream(bytes.NewReader(body), len(body))
		ctx.Response.ImmediateHeaderFlush = true
	}
}

// setNagle turns Nagle's algorithm back on for an accepted connection (Go
// sets TCP_NODELAY on every TCP connection; cpp-httplib, and so
// llama-server, leaves it off: CPPHTTPLIB_TCP_NODELAY defaults to false and
// server.cpp does not change it).
func setNagle(c net.Conn) error {
	tc, ok := c.(*net.TCPConn)
	if !ok {
		return fmt.Errorf("sim: the Nagle stall needs a TCP connection, got %T", c)
	}
	if err := tc.SetNoDelay(false); err != nil {
		return fmt.Errorf("sim: turning Nagle on: %w", err)
	}
	return nil
}

// llamaStream writes a streamed answer the way llama-server does: its
// header set in its order, one HTTP chunk per SSE event, the final
// 0-length chunk, and then the connection is closed (the hijacked
// connection is closed when this handler returns), whatever the
// Keep-Alive header said.
func (s *Sim) llamaStream(ctx *fasthttp.RequestCtx, job *genJob, out *genOutcome, chunks []sseChunk, release func()) {
	head := s.llama.streamHead(ctx)
	// The slot is free before the final event is sent, as llama-server
	// releases it before it sends the final result: a /slots or /metrics
	// read after the stream sees it idle.
	tokens := len(chunks)
	for tokens > 0 && !chunks[tokens-1].token {
		tokens--
	}
	ctx.HijackSetNoResponse(true)
	s.wg.Add(1)
	ctx.Hijack(func(c net.Conn) {
		defer s.wg.Done()
		released := false
		free := func() {
			if !released {
				released = true
				release()
			}
		}
		defer free()
		bw := bufio.NewWriter(c)
		if _, err := bw.Write(head); err != nil {
			return
		}
		// One Write per event, so one chunk per event.
		w := bufio.NewWriterSize(&chunkedWriter{w: bw}, 1)
		n := s.streamChunks(w, out, chunks[:tokens], -1)
		if n == tokens {
			free()
			n += s.streamChunks(w, out, chunks[tokens:], -1)
		}
		if n != len(chunks) {
			out.finish = "abort"
		}
		// Accounted before the terminator, so a client that read the
		// whole answer finds its receipt.
		s.metrics.finished(out.finish)
		s.receipts.add(job.rec)
		if n == len(chunks) {
			_, _ = bw.WriteString("0\r\n\r\n")
			_ = bw.Flush()
		}
	})
}

// streamHead is the head of a streamed answer, in llama-server's header
// order (cases chat_stream, chat_stream_connection_close).
func (t *llamaTransport) streamHead(ctx *fasthttp.RequestCtx) []byte {
	head := []byte("HTTP/1.1 200 OK\r\n")
	if t.closing(ctx) {
		head = append(head, "Connection: close\r\n"...)
	} else {
		head = append(head, "Keep-Alive: "+t.keepAlive()+"\r\n"...)
	}
	head = append(head, "Content-Type: text/event-stream\r\nServer: llama.cpp\r\nTransfer-Encoding: chunked\r\nAccess-Control-Allow-Origin: "...)
	head = append(head, ctx.Request.Header.Peek("Origin")...)
	return append(head, "\r\n\r\n"...)
}

// closing reports whether this answer ends the connection: the request
// asked for it, or it is the last one the connection may carry.
func (t *llamaTransport) closing(ctx *fasthttp.RequestCtx) bool {
	return ctx.Request.Header.ConnectionClose() ||
		(t.policy.maxRequests > 0 && ctx.ConnRequestNum() >= uint64(t.policy.maxRequests))
}
