package sim

import (
	"bufio"
	"context"
	"io"
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
//     CPUs, the adapter's ServingConns): a further one is accepted by the
//     kernel (listen backlog) but waits until a served one closes;
//   - with the Nagle stall on, a non-streamed answer on a reused connection
//     has its head written at once and its body llamacpp.ReusedConnStall
//     later.
type llamaTransport struct {
	policy   llamaConnPolicy
	idle     time.Duration
	stall    time.Duration // 0: off
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
	if cfg.NagleStall {
		t.stall = llamacpp.ReusedConnStall
	}
	if p.ServingConns > 0 {
		t.policy.servingConns = llamacpp.HTTPThreads(max(cfg.MaxConcurrency, 1), runtime.NumCPU())
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
	lc := &llamaConn{Conn: c, release: l.release}
	// A connection that never sends a byte is closed after the idle time,
	// silently (fasthttp's own first-request timeout would answer 408).
	lc.silent = time.AfterFunc(l.t.idle, func() { _ = lc.Close() })
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
	c.closeOnce.Do(func() {
		c.silent.Stop()
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
	if t.stall > 0 && ctx.ConnRequestNum() > 1 {
		body := append([]byte(nil), ctx.Response.Body()...)
		ctx.Response.SetBodyStream(&stalledBody{body: body, delay: t.stall, stop: t.stopping}, len(body))
		ctx.Response.ImmediateHeaderFlush = true
	}
}

// stalledBody yields body only after delay: the response head, flushed
// first, leaves at once and the body follows, as llama-server's two writes
// do on a reused connection (Nagle's algorithm holds the second write until
// the client's delayed ACK). Measured on the real server: streamed answers
// on a reused connection are not delayed, so only fixed-length bodies use it.
type stalledBody struct {
	body    []byte
	delay   time.Duration
	stop    <-chan struct{}
	started bool
}

func (b *stalledBody) Read(p []byte) (int, error) {
	if !b.started {
		b.started = true
		t := time.NewTimer(b.delay)
		select {
		case <-t.C:
		case <-b.stop:
			t.Stop()
		}
	}
	if len(b.body) == 0 {
		return 0, io.EOF
	}
	n := copy(p, b.body)
	b.body = b.body[n:]
	return n, nil
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
