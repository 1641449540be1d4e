package sim

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"strings"
	"sync"
	"time"

	"github.com/valyala/fasthttp"

	"github.com/llmgw/llmgw/engines"
	"github.com/llmgw/llmgw/internal/peerwatch"
)

// handle routes one HTTP request. Routes common to every persona live under
// /_sim/; the rest are the persona's own.
func (s *Sim) handle(ctx *fasthttp.RequestCtx) {
	path := string(ctx.Path())
	if strings.HasPrefix(path, "/_sim/") {
		s.handleSim(ctx, path)
		return
	}
	switch s.cfg.Engine {
	case engines.VLLM:
		s.routeVLLM(ctx, path)
	case engines.SGLang:
		s.routeSGLang(ctx, path)
	case engines.TRTLLM:
		s.routeTRT(ctx, path)
	case engines.LlamaCpp:
		s.routeLlama(ctx, path)
	}
}

// handleSim serves the simulator's own control endpoints:
//
//	GET    /_sim/receipts  receipts, oldest first (JSON array)
//	DELETE /_sim/receipts  forget all receipts
//	GET    /_sim/faults    current Faults
//	POST   /_sim/faults    apply a partial Faults (plus "restart_publisher"
//	                       and "reset" actions); answers the new state
//	POST   /_sim/reset_cache  empty the prefix cache (emits AllBlocksCleared)
//	GET    /_sim/addrs     the bound Addrs
func (s *Sim) handleSim(ctx *fasthttp.RequestCtx, path string) {
	ctx.SetContentType("application/json")
	switch {
	case path == "/_sim/receipts" && ctx.IsGet():
		b, err := json.Marshal(s.receipts.snapshot())
		if err != nil {
			ctx.Error(err.Error(), fasthttp.StatusInternalServerError)
			return
		}
		ctx.SetBody(b)
	case path == "/_sim/receipts" && ctx.IsDelete():
		s.receipts.reset()
		ctx.SetBodyString(`{"ok":true}`)
	case path == "/_sim/faults" && ctx.IsGet():
		ctx.SetBody(marshalFaults(s.faults.get()))
	case path == "/_sim/faults" && ctx.IsPost():
		var p faultPatch
		dec := json.NewDecoder(strings.NewReader(string(ctx.PostBody())))
		dec.DisallowUnknownFields()
		if err := dec.Decode(&p); err != nil {
			ctx.SetStatusCode(fasthttp.StatusBadRequest)
			ctx.SetBody(mustJSON(map[string]string{"error": "sim: faults: " + err.Error()}))
			return
		}
		f := s.faults.apply(p)
		if p.RestartPublisher {
			if err := s.restartPublisher(); err != nil {
				ctx.SetStatusCode(fasthttp.StatusInternalServerError)
				ctx.SetBody(mustJSON(map[string]string{"error": err.Error()}))
				return
			}
		}
		ctx.SetBody(marshalFaults(f))
	case path == "/_sim/reset_cache" && ctx.IsPost():
		s.resetCache()
		ctx.SetBodyString(`{"ok":true}`)
	case path == "/_sim/addrs" && ctx.IsGet():
		ctx.SetBody(mustJSON(s.addrs))
	default:
		ctx.SetStatusCode(fasthttp.StatusNotFound)
		ctx.SetBodyString(`{"error":"sim: unknown control endpoint"}`)
	}
}

// restartPublisher simulates an engine restart as seen by KV-event
// subscribers: the publisher stops, the cache empties (no events, as a dead
// process sends none) and a new publisher starts on the same ports with its
// sequence back at 0 and an empty replay buffer.
func (s *Sim) restartPublisher() error {
	for _, r := range s.ranks {
		r.cache.clear()
	}
	if s.trt != nil {
		s.trt.restart()
		return nil
	}
	if s.ranks[0].events == nil {
		return errors.New("sim: restart publisher: this sim has no KV event publisher")
	}
	for _, r := range s.ranks {
		if err := r.events.restart(s.ctx); err != nil {
			return err
		}
	}
	return nil
}

func mustJSON(v any) []byte {
	b, err := json.Marshal(v)
	if err != nil {
		return []byte(`{"error":"sim: marshal"}`)
	}
	return b
}

// interestingHeaders copies the headers receipts keep.
func interestingHeaders(ctx *fasthttp.RequestCtx) map[string]string {
	var h map[string]string
	for k, v := range ctx.Request.Header.All() {
		name := string(k)
		lower := strings.ToLower(name)
		var val string
		switch {
		case strings.HasPrefix(lower, "x-"), lower == "traceparent":
			val = string(v)
		case lower == "authorization":
			val = "present"
		default:
			continue
		}
		if h == nil {
			h = make(map[string]string, 4)
		}
		h[name] = val
	}
	return h
}

// newReceipt starts the receipt of an inference request and settles its
// request id (the client's X-Request-Id, or a generated one); the id is
// echoed in the X-Request-Id response header, as vLLM does with
// --enable-request-id-headers.
func (s *Sim) newReceipt(ctx *fasthttp.RequestCtx) Receipt {
	rid := string(ctx.Request.Header.Peek("X-Request-Id"))
	if rid == "" {
		rid = s.nextRequestID()
	}
	ctx.Response.Header.Set("X-Request-Id", rid)
	return Receipt{
		Time:      s.cfg.Clock(),
		Path:      string(ctx.Path()),
		RequestID: rid,
		Headers:   interestingHeaders(ctx),
		Role:      s.cfg.Role,
		MaxTokens: -1,
	}
}

// reqError is an error with the HTTP status the persona answers it with.
type reqError struct {
	status     int
	validation bool // TRT-LLM answers validation errors in its short shape
	err        error
	// msg, when set, is the engine's own wording sent to the client instead
	// of err's text (engine messages end with a period, Go errors do not).
	msg string
}

func (e *reqError) Error() string { return e.err.Error() }
func (e *reqError) Unwrap() error { return e.err }

// engineBadRequest is a 400 whose client-facing text is the engine's own
// sentence.
func engineBadRequest(format string, a ...any) *reqError {
	msg := fmt.Sprintf(format, a...)
	return &reqError{status: fasthttp.StatusBadRequest, validation: true, err: fmt.Errorf("%w: %s", errBadRequest, strings.TrimSuffix(msg, ".")), msg: msg}
}

// text is what the client sees.
func (e *reqError) text(s *Sim) string {
	if e.msg != "" {
		return e.msg
	}
	return s.messageFor(e.err)
}

func badRequest(err error) *reqError {
	return &reqError{status: fasthttp.StatusBadRequest, validation: true, err: err}
}

// serveGen serves one inference request of any API family.
func (s *Sim) serveGen(ctx *fasthttp.RequestCtx, api apiKind) {
	rec := s.newReceipt(ctx)
	if s.cfg.Engine == engines.LlamaCpp && s.loading() {
		s.writeError(ctx, &rec, fasthttp.StatusServiceUnavailable, "Loading model", false)
		return
	}
	req, err := parseGenRequest(ctx.PostBody())
	if err != nil {
		s.writeError(ctx, &rec, fasthttp.StatusBadRequest, s.messageFor(err), true)
		return
	}
	rec.Model, rec.Nonce, rec.Stream, rec.MaxTokens = req.Model, req.nonce(), req.stream(), req.maxTokens()
	job, rerr := s.buildJob(ctx, api, req, &rec)
	if rerr != nil {
		s.writeError(ctx, &rec, rerr.status, rerr.text(s), rerr.validation)
		return
	}
	if s.faults.shouldFail() {
		s.writeError(ctx, &job.rec, fasthttp.StatusInternalServerError, "sim: injected fault (error_rate)", false)
		return
	}
	crashAfter := s.faults.crashAfter()
	if crashAfter > 0 && !job.stream {
		job.rec.Crashed = true
		s.receipts.add(job.rec)
		ctx.HijackSetNoResponse(true)
		ctx.Hijack(func(net.Conn) {}) // fasthttp closes the connection after this returns
		return
	}
	release, queued, err := s.admit()
	if err != nil {
		s.writeError(ctx, &job.rec, fasthttp.StatusServiceUnavailable, err.Error(), false)
		return
	}
	if rerr := s.beforePrefill(job); rerr != nil {
		release()
		s.writeError(ctx, &job.rec, rerr.status, rerr.text(s), false)
		return
	}
	out := s.prefill(job)
	out.queued = queued
	s.generate(job, out)
	if rerr := s.afterPrefill(job, out); rerr != nil {
		release()
		s.writeError(ctx, &job.rec, rerr.status, rerr.text(s), false)
		return
	}
	job.rec.PromptTokens, job.rec.CachedTokens, job.rec.CompletionTokens = out.promptTokens, out.cachedTokens, out.completionTokens
	job.rec.PrefillCostUS, job.rec.QueuedUS = out.prefillCost.Microseconds(), queued.Microseconds()
	job.rec.FinishReason = out.finish
	job.rec.Status = fasthttp.StatusOK

	if !job.stream {
		// The answer is written only at the end, so fasthttp does not read
		// the connection meanwhile: a watch notices a client that leaves.
		gone := make(chan struct{})
		var goneOnce sync.Once
		w := peerwatch.Watch(ctx.Conn(), func() { goneOnce.Do(func() { close(gone) }) })
		ok := s.sleepUnless(s.cfg.DecodePerToken, gone)
		if ok {
			s.metrics.observeTTFT(time.Since(out.start) + queued)
			ok = s.sleepUnless(time.Duration(max(out.completionTokens-1, 0))*s.cfg.DecodePerToken, gone)
		}
		w.Stop()
		if !ok && isClosed(gone) {
			release()
			s.metrics.finished("abort")
			job.rec.FinishReason, job.rec.Cancelled, job.rec.CancelledAt = "abort", true, s.cfg.Clock()
			s.receipts.add(job.rec)
			ctx.SetConnectionClose()
			return
		}
		body := s.renderFull(job, out)
		release()
		s.metrics.finished(out.finish)
		ctx.SetStatusCode(fasthttp.StatusOK)
		ctx.SetContentType("application/json")
		ctx.SetBody(body)
		s.receipts.add(job.rec)
		return
	}
	chunks := s.renderChunks(job, out)
	if n := s.faults.errorAfter(); n > 0 && n < len(chunks) {
		chunks = s.midStreamError(job, chunks[:n:n])
		job.rec.Error = midStreamErrorMessage
		out.finish = "abort"
	}
	if crashAfter > 0 {
		s.crashStream(ctx, job, out, chunks, crashAfter, release)
		return
	}
	ctx.SetStatusCode(fasthttp.StatusOK)
	ctx.SetContentType("text/event-stream; charset=utf-8")
	ctx.Response.Header.Set("Cache-Control", "no-cache")
	s.wg.Add(1)
	ctx.SetBodyStreamWriter(func(w *bufio.Writer) {
		defer s.wg.Done()
		defer release()
		if n := s.streamChunks(w, out, chunks, -1); n < len(chunks) && s.ctx.Err() == nil {
			// The write failed: the client left mid-stream.
			out.finish = "abort"
			job.rec.FinishReason, job.rec.Cancelled, job.rec.CancelledAt = "abort", true, s.cfg.Clock()
		}
		s.metrics.finished(out.finish)
		s.receipts.add(job.rec)
	})
}

// sleepUnless waits d unless the sim closes or gone closes first; it
// reports whether the full duration elapsed.
func (s *Sim) sleepUnless(d time.Duration, gone <-chan struct{}) bool {
	if d <= 0 {
		return s.ctx.Err() == nil && !isClosed(gone)
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-s.ctx.Done():
		return false
	case <-gone:
		return false
	}
}

func isClosed(c <-chan struct{}) bool {
	select {
	case <-c:
		return true
	default:
		return false
	}
}

// streamChunks writes chunks with the decode delay before each token chunk;
// it stops early after limit chunks (limit < 0: no limit) or when the client
// goes away. It reports how many chunks were written.
func (s *Sim) streamChunks(w *bufio.Writer, out *genOutcome, chunks []sseChunk, limit int) int {
	first := true
	for i, c := range chunks {
		if limit >= 0 && i >= limit {
			return i
		}
		if c.token {
			if !s.sleep(s.cfg.DecodePerToken) {
				return i
			}
			if first {
				first = false
				s.metrics.observeTTFT(time.Since(out.start) + out.queued)
			}
		}
		if _, err := w.Write(c.data); err != nil {
			return i
		}
		if err := w.Flush(); err != nil {
			return i
		}
	}
	return len(chunks)
}

// crashStream answers with a stream that dies after n chunks: the HTTP
// response is written by hand on the hijacked connection (chunked encoding)
// and the connection is closed without the terminating chunk.
func (s *Sim) crashStream(ctx *fasthttp.RequestCtx, job *genJob, out *genOutcome, chunks []sseChunk, n int, release func()) {
	job.rec.Crashed = true
	ctx.HijackSetNoResponse(true)
	s.wg.Add(1)
	ctx.Hijack(func(c net.Conn) {
		defer s.wg.Done()
		defer release()
		bw := bufio.NewWriter(c)
		fmt.Fprintf(bw, "HTTP/1.1 200 OK\r\nServer: %s\r\nContent-Type: text/event-stream; charset=utf-8\r\nX-Request-Id: %s\r\nTransfer-Encoding: chunked\r\n\r\n",
			serverName(s.cfg.Engine), job.requestID)
		cw := &chunkedWriter{w: bw}
		s.streamChunks(bufio.NewWriterSize(cw, 64), out, chunks, n)
		_ = bw.Flush()
		s.metrics.finished("abort")
		s.receipts.add(job.rec)
	})
}

// chunkedWriter frames each Write as one HTTP/1.1 chunk.
type chunkedWriter struct{ w *bufio.Writer }

func (c *chunkedWriter) Write(p []byte) (int, error) {
	if len(p) == 0 {
		return 0, nil
	}
	if _, err := fmt.Fprintf(c.w, "%x\r\n", len(p)); err != nil {
		return 0, err
	}
	if _, err := c.w.Write(p); err != nil {
		return 0, err
	}
	if _, err := c.w.WriteString("\r\n"); err != nil {
		return 0, err
	}
	return len(p), c.w.Flush()
}

// messageFor strips the internal classification prefix from err's text.
func (s *Sim) messageFor(err error) string {
	msg := err.Error()
	for _, p := range []string{errBadRequest.Error() + ": ", errUnknownModel.Error() + ": "} {
		msg = strings.TrimPrefix(msg, p)
	}
	return msg
}

func (s *Sim) loading() bool { return s.cfg.Clock().Before(s.ready) }
