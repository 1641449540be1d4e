package gateway

import (
	"bytes"
	"io"
	"sync"
	"sync/atomic"
	"time"

	"github.com/valyala/fasthttp"

	"github.com/llmgw/llmgw/gateway/upstream"
)

// bufferBudget bounds the bytes of response bodies held in memory at once.
type bufferBudget struct {
	limit int64
	used  atomic.Int64
}

// acquire charges n bytes; false (nothing charged) when that would pass
// the limit.
func (b *bufferBudget) acquire(n int64) bool {
	for {
		u := b.used.Load()
		if u+n > b.limit {
			return false
		}
		if b.used.CompareAndSwap(u, u+n) {
			return true
		}
	}
}

func (b *bufferBudget) release(n int64) { b.used.Add(-n) }

// heldBody is a buffered body as the client's response stream; fasthttp
// closes it once written, which gives its bytes back to the budget and its
// buffer back to the pool.
type heldBody struct {
	bytes.Reader
	buf    []byte
	budget *bufferBudget
	n      int64
}

// smallBodies pools heldBodies with buffers of up to smallBodyCap bytes,
// the size of most non-streamed completions.
const smallBodyCap = 64 << 10

var smallBodies = sync.Pool{New: func() any { return &heldBody{buf: make([]byte, 0, smallBodyCap)} }}

// newHeldBody returns a heldBody with a buffer of length n.
func newHeldBody(n int) *heldBody {
	if n <= smallBodyCap {
		h := smallBodies.Get().(*heldBody)
		h.buf = h.buf[:n]
		return h
	}
	return &heldBody{buf: make([]byte, n)}
}

// hold makes the buffer's first len(buf) bytes the body, charged n bytes.
func (h *heldBody) hold(budget *bufferBudget, n int64) *heldBody {
	h.Reader.Reset(h.buf)
	h.budget, h.n = budget, n
	return h
}

// Close gives the charge back (fasthttp calls it once, after writing).
func (h *heldBody) Close() error {
	if h.budget != nil {
		h.budget.release(h.n)
	}
	h.budget, h.n = nil, 0
	if cap(h.buf) == smallBodyCap {
		h.Reader.Reset(nil)
		smallBodies.Put(h)
	}
	return nil
}

// relayBody is a worker's body as the client's response stream: fasthttp
// reads it on the connection's goroutine and writes each read as it comes
// (a chunk, flushed, when the length is unknown). Each read that yields
// bytes moves the client connection's write deadline WriteTimeout ahead,
// so a client that stops reading fails the write after WriteTimeout and the
// worker's connection is closed. fasthttp calls CloseWithError once, with
// the write error if the client could not be written.
type relayBody struct {
	s       *Server
	rt      *ruleRuntime
	ep      *upstream.Endpoint
	resp    *fasthttp.Response
	body    *upstreamBody
	release func()
	// ctx is the request being answered: the body is read while fasthttp
	// writes its response, when ctx is still live.
	ctx *fasthttp.RequestCtx
	wt  time.Duration

	start, upStart time.Time
	ttfb           time.Duration
	status         int
	obs            *kvObservation

	sse       bool // text/event-stream: [DONE] is tracked
	sseEvents bool // an SSE stream of unknown length: it may end with an error event
	sawDone   bool
	tail      [len("data: [DONE]")]byte
	pending   []byte // the error event still to send
	next      error  // returned by the next Read (io.EOF or the failure)
	upErr     error  // the worker's body broke
	once      sync.Once
}

func (r *relayBody) Read(p []byte) (int, error) {
	if len(r.pending) > 0 {
		n := copy(p, r.pending)
		r.pending = r.pending[n:]
		r.extend()
		return n, nil
	}
	if r.next != nil {
		return 0, r.next
	}
	n, err := r.body.Read(p)
	if n > 0 {
		if r.sse && !r.sawDone {
			r.sawDone = containsAcross(r.tail[:], p[:n], doneMarker)
		}
		if r.obs != nil {
			r.obs.scan.write(p[:n])
		}
		r.extend()
	}
	if err == nil {
		return n, nil
	}
	// Bytes and an error together: the bytes now, the error next (fasthttp's
	// chunked writer writes the bytes and reads again, ignoring the error).
	if err == io.EOF {
		r.next = io.EOF
	} else {
		r.upErr = err
		werr := r.s.bodyError(r.rt, r.ep, err)
		switch {
		case r.body.call.isCancelled():
			r.next = errClientGone // the client is gone: nothing to tell it
		case r.sseEvents && !r.sawDone:
			// As DESIGN: a stream that breaks ends with an error event,
			// which SSE clients read as the stream's failure.
			r.pending = sseErrorEvent(werr)
			r.next = io.EOF
		case r.sseEvents:
			r.next = io.EOF // [DONE] was relayed: the answer was whole
		default:
			// Abort: fasthttp stops writing and closes the connection,
			// so the client sees a cut body, never a complete one.
			r.next = werr
		}
	}
	if n > 0 {
		return n, nil
	}
	return r.Read(p)
}

// extend moves the client connection's write deadline.
func (r *relayBody) extend() {
	_ = r.ctx.SetWriteDeadline(time.Now().Add(r.wt))
}

// CloseWithError ends the relay: it closes the worker's body (which
// cancels the worker's request unless it was read to its end), releases the
// endpoint and records the outcome.
func (r *relayBody) CloseWithError(werr error) error {
	r.once.Do(func() { r.finish(werr) })
	return nil
}

func (r *relayBody) finish(werr error) {
	// A body read that failed because the watch cancelled the call (the
	// client left just as the stream began) is the client's doing too.
	clientGone := werr != nil && r.upErr == nil || r.body.call.isCancelled()
	r.body.Close()
	upDur := time.Since(r.upStart)
	r.release()
	fasthttp.ReleaseResponse(r.resp)
	m, ruleName, ep := r.s.metrics, r.rt.rule.Name, r.ep
	switch {
	case clientGone:
		m.clientCancels.WithLabelValues(ruleName).Inc()
		r.s.log.Debug("client left before the answer was delivered; worker request cancelled", "rule", ruleName, "endpoint", ep.ID, "err", werr)
	case r.upErr != nil:
		if b := ep.Breaker(); b != nil {
			b.RecordConnFailure()
		}
		m.streamErrors.WithLabelValues(ruleName, ep.ID).Inc()
		r.s.log.Warn("upstream body failed after the response began", "rule", ruleName, "endpoint", ep.ID, "sse", r.sse, "err", r.upErr)
	}
	if r.obs != nil && !clientGone && r.upErr == nil {
		r.s.kvSelfCheck(r.rt, r.obs)
	}
	r.rt.obs.observe(ep.Index, ep.ID, r.status, time.Since(r.start), upDur, r.ttfb)
}

var _ fasthttp.ReadCloserWithError = (*relayBody)(nil)
