//go:build linux

package gateway

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/valyala/fasthttp"

	"github.com/llmgw/llmgw/internal/wait"
)

// loopGateway starts a gateway on the loop plane (whatever the suite's
// LLMGW_TEST_DATA_PLANE says: these tests are about it) with one rule over
// b.
func loopGateway(t *testing.T, b *backend, extra string) *Server {
	t.Helper()
	s := startGateway(t, "", func(c *Config) { c.DataPlane = PlaneLoop })
	mustApply(t, s, ruleYAML("r", "m1", extra, b))
	return s
}

func loopRequest(body string, extraHeaders ...string) string {
	return fmt.Sprintf("POST /v1/chat/completions HTTP/1.1\r\nHost: gw\r\nContent-Type: application/json\r\n%sContent-Length: %d\r\n\r\n%s",
		strings.Join(extraHeaders, ""), len(body), body)
}

func dialGW(t *testing.T, s *Server) (net.Conn, *bufio.Reader) {
	t.Helper()
	c, err := net.Dial("tcp", s.Addr())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	_ = c.SetDeadline(time.Now().Add(20 * time.Second))
	return c, bufio.NewReader(c)
}

func readAnswer(t *testing.T, br *bufio.Reader) (*http.Response, string) {
	t.Helper()
	resp, err := http.ReadResponse(br, nil)
	if err != nil {
		t.Fatal(err)
	}
	b, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	if err != nil {
		t.Fatal(err)
	}
	return resp, string(b)
}

// TestLoopPlaneServesAndHandsOver: the loop plane answers plain requests
// itself (no hand-over counted), answers pipelined and trickled requests
// in order, and hands a connection to the goroutine plane at the first
// request it does not serve, with the reason counted; that request and the
// connection's later ones are answered there, unconsumed bytes included.
func TestLoopPlaneServesAndHandsOver(t *testing.T) {
	var hits atomic.Int64
	b := newBackend(t, "w", func(ctx *fasthttp.RequestCtx) {
		n := hits.Add(1)
		ctx.SetContentType("application/json")
		fmt.Fprintf(ctx, `{"n":%d,"proto":%q}`, n, ctx.Request.Header.Protocol())
	})
	s := loopGateway(t, b, "")
	handoffs := func() float64 { return s.metricValue(t, "llmgw_loop_handoffs_total") }

	t.Run("pipelined", func(t *testing.T) {
		c, br := dialGW(t, s)
		io.WriteString(c, loopRequest(chatBody)+loopRequest(chatBody)+loopRequest(chatBody))
		for i := range 3 {
			resp, body := readAnswer(t, br)
			if resp.StatusCode != 200 || resp.Header.Get("X-Llmgw-Endpoint") != "w1" || !strings.Contains(body, `"n":`) {
				t.Fatalf("answer %d: %d %q", i, resp.StatusCode, body)
			}
		}
		if n := handoffs(); n != 0 {
			t.Fatalf("%v hand-overs for plain requests", n)
		}
	})

	t.Run("trickled", func(t *testing.T) {
		c, br := dialGW(t, s)
		req := loopRequest(chatBody)
		for i := range len(req) {
			if _, err := c.Write([]byte{req[i]}); err != nil {
				t.Fatal(err)
			}
		}
		if resp, body := readAnswer(t, br); resp.StatusCode != 200 {
			t.Fatalf("trickled request: %d %q", resp.StatusCode, body)
		}
		if n := handoffs(); n != 0 {
			t.Fatalf("%v hand-overs", n)
		}
	})

	cases := []struct {
		name, reason string
		request      string
		status       int
		closes       bool // the goroutine plane closes the connection after this answer
	}{
		{name: "HTTP/1.0", reason: "http10", request: strings.Replace(loopRequest(chatBody), "HTTP/1.1", "HTTP/1.0", 1), status: 200, closes: true},
		{name: "chunked body", reason: "chunked_body", request: "POST /v1/chat/completions HTTP/1.1\r\nHost: gw\r\nTransfer-Encoding: chunked\r\n\r\n" +
			fmt.Sprintf("%x\r\n%s\r\n0\r\n\r\n", len(chatBody), chatBody), status: 200},
		{name: "bad JSON", reason: "rejected", request: loopRequest(`{"model":`), status: 400},
		{name: "unknown model", reason: "rejected", request: loopRequest(`{"model":"nope","messages":[{"role":"user","content":"x"}]}`), status: 404},
		{name: "models", reason: "route", request: "GET /v1/models HTTP/1.1\r\nHost: gw\r\n\r\n", status: 200},
		{name: "encoded path", reason: "uri", request: strings.Replace(loopRequest(chatBody), "/v1/chat/completions", "/v1/chat/%63ompletions", 1), status: 200},
		{name: "no Host", reason: "malformed", request: strings.Replace(loopRequest(chatBody), "Host: gw\r\n", "", 1), status: 400, closes: true},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			before := s.metricValue(t, "llmgw_loop_handoffs_total", tc.reason)
			c, br := dialGW(t, s)
			// The request the loop plane does not serve, and a plain one
			// right behind it in the same write: both answered, in order,
			// by the goroutine plane.
			io.WriteString(c, tc.request+loopRequest(chatBody))
			resp, body := readAnswer(t, br)
			if resp.StatusCode != tc.status {
				t.Fatalf("status %d body %q, want %d", resp.StatusCode, body, tc.status)
			}
			if !tc.closes {
				if resp, body := readAnswer(t, br); resp.StatusCode != 200 || !strings.Contains(body, `"n":`) {
					t.Fatalf("the request after the hand-over: %d %q", resp.StatusCode, body)
				}
			}
			if got := s.metricValue(t, "llmgw_loop_handoffs_total", tc.reason) - before; got != 1 {
				t.Fatalf("%v hand-overs counted for %q, want 1", got, tc.reason)
			}
		})
	}
}

// TestLoopPlaneBackpressure: an answer longer than the socket buffers,
// to a client that reads slowly, arrives whole (the loop stops reading the
// worker while the client's socket is full, and goes on when it drains).
func TestLoopPlaneBackpressure(t *testing.T) {
	const size = 8 << 20
	big := bytes.Repeat([]byte("0123456789abcdef"), size/16)
	b := newBackend(t, "w", func(ctx *fasthttp.RequestCtx) {
		ctx.SetContentType("application/octet-stream")
		ctx.SetBody(big)
	})
	s := loopGateway(t, b, "")
	c, br := dialGW(t, s)
	io.WriteString(c, loopRequest(chatBody))
	resp, err := http.ReadResponse(br, nil)
	if err != nil {
		t.Fatal(err)
	}
	if resp.ContentLength != size {
		t.Fatalf("Content-Length %d, want %d", resp.ContentLength, size)
	}
	got := make([]byte, 0, size)
	buf := make([]byte, 4096)
	for len(got) < size {
		// Small reads: the gateway's writes to this client fill its
		// socket again and again.
		n, err := resp.Body.Read(buf)
		got = append(got, buf[:n]...)
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatalf("after %d bytes: %v", len(got), err)
		}
	}
	if !bytes.Equal(got, big) {
		t.Fatalf("body of %d bytes differs from the worker's", len(got))
	}
}

// TestLoopPlaneShutdownFinishesInFlight: Close lets an answer in flight
// finish (with Connection: close) and closes idle connections.
func TestLoopPlaneShutdownFinishesInFlight(t *testing.T) {
	release := make(chan struct{})
	started := make(chan struct{}, 1)
	b := newBackend(t, "w", func(ctx *fasthttp.RequestCtx) {
		started <- struct{}{}
		<-release
		ctx.SetContentType("application/json")
		ctx.SetBodyString(`{"late":true}`)
	})
	s := startGateway(t, "", func(c *Config) { c.DataPlane = PlaneLoop })
	mustApply(t, s, ruleYAML("r", "m1", "probe: {disabled: true}", b))
	busy, busyR := dialGW(t, s)
	io.WriteString(busy, loopRequest(chatBody))
	<-started
	idle, _ := dialGW(t, s)
	closed := make(chan struct{})
	go func() {
		s.Close()
		close(closed)
	}()
	// The idle connection is closed (EOF), the busy one is not yet.
	if _, err := idle.Read(make([]byte, 1)); err != io.EOF {
		t.Fatalf("idle connection read: %v, want EOF", err)
	}
	close(release)
	resp, body := readAnswer(t, busyR)
	if resp.StatusCode != 200 || body != `{"late":true}` || !resp.Close {
		t.Fatalf("in-flight answer: %d %q close=%v", resp.StatusCode, body, resp.Close)
	}
	select {
	case <-closed:
	case <-time.After(10 * time.Second):
		t.Fatal("Close did not return after the in-flight answer")
	}
}

// TestLoopPlaneClientGoneCancels: a client that closes while its request
// waits on the worker: the worker's connection is closed (engines abort
// the request), the endpoint's count returns to 0, 499 is counted.
func TestLoopPlaneClientGoneCancels(t *testing.T) {
	gone, got := make(chan struct{}), make(chan struct{})
	b := newBackend(t, "w", func(ctx *fasthttp.RequestCtx) {
		close(got)
		ctx.HijackSetNoResponse(true)
		ctx.Hijack(func(c net.Conn) {
			// Wait for the gateway to drop the connection.
			_, _ = c.Read(make([]byte, 1))
			close(gone)
		})
	})
	s := loopGateway(t, b, "probe: {disabled: true}")
	c, _ := dialGW(t, s)
	io.WriteString(c, loopRequest(chatBody))
	rt := s.rules["r"]
	// The worker has the request (in flight alone is too early: the
	// request may not have left the gateway, and then the worker never
	// sees a connection to drop).
	select {
	case <-got:
	case <-time.After(10 * time.Second):
		t.Fatal("the worker never got the request")
	}
	if n := rt.inFlight(); n != 1 {
		t.Fatalf("%d requests in flight", n)
	}
	c.Close()
	select {
	case <-gone:
	case <-time.After(10 * time.Second):
		t.Fatal("the worker's connection stayed open after the client left")
	}
	wait.For(t, 10*time.Second, "in-flight back to 0", func() bool { return rt.inFlight() == 0 })
	wait.For(t, 10*time.Second, "a 499 counted", func() bool { return s.metricValue(t, "llmgw_requests_total", "r", "499") == 1 })
}

// TestPlanesAnswerAlike sends the same requests through a gateway on each
// plane and compares what a client sees: status, body, one Date, and the
// gateway's and worker's headers (field names compared canonically: the
// loop plane forwards them as sent, the goroutine plane normalises their
// case).
func TestPlanesAnswerAlike(t *testing.T) {
	b := newBackend(t, "w", func(ctx *fasthttp.RequestCtx) {
		switch string(ctx.Path()) {
		case "/stream":
			ctx.SetContentType("text/event-stream")
			ctx.SetBodyStreamWriter(func(w *bufio.Writer) {
				io.WriteString(w, "data: {\"a\":1}\n\n")
				w.Flush()
				io.WriteString(w, "data: [DONE]\n\n")
			})
		case "/empty":
			ctx.SetStatusCode(204)
		default:
			ctx.Response.Header.Set("X-Worker", "yes")
			ctx.Response.Header.Set("Connection", "keep-alive, X-Hop")
			ctx.Response.Header.Set("X-Hop", "dropped")
			ctx.SetContentType("application/json")
			fmt.Fprintf(ctx, `{"path":%q}`, ctx.Path())
		}
	})
	requests := []struct {
		method, path, body string
	}{
		{"POST", "/v1/chat/completions", chatBody},
		{"POST", "/stream", chatBody},
		{"GET", "/empty", ""},
		{"POST", "/v1/embeddings", `{"model":"m1","input":"x"}`},
		{"HEAD", "/v1/other", ""},
	}
	type seen struct {
		status int
		body   string
		hdr    http.Header
	}
	answers := map[string][]seen{}
	for _, plane := range []string{PlaneLoop, PlaneGoroutine} {
		s := startGateway(t, "", func(c *Config) { c.DataPlane = plane })
		mustApply(t, s, ruleYAML("r", "", "probe: {disabled: true}", b))
		c := newClient(t)
		for _, rq := range requests {
			req, err := http.NewRequestWithContext(context.Background(), rq.method, "http://"+s.Addr()+rq.path, strings.NewReader(rq.body))
			if err != nil {
				t.Fatal(err)
			}
			req.Header.Set("X-Request-Id", "fixed-id")
			resp, err := c.Do(req)
			if err != nil {
				t.Fatalf("%s %s %s: %v", plane, rq.method, rq.path, err)
			}
			body, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			// One Date (the worker sends one too: a proxy forwards a
			// message with exactly one, RFC 9110 §6.6.1, §5.3).
			if d := resp.Header.Values("Date"); len(d) != 1 {
				t.Errorf("%s %s %s: Date %q", plane, rq.method, rq.path, d)
			}
			h := resp.Header.Clone()
			h.Del("Date")
			answers[plane] = append(answers[plane], seen{resp.StatusCode, string(body), h})
		}
		if n := s.metricValue(t, "llmgw_loop_handoffs_total"); plane == PlaneLoop && n != 0 {
			t.Fatalf("%v hand-overs on the loop plane", n)
		}
	}
	for i, rq := range requests {
		l, g := answers[PlaneLoop][i], answers[PlaneGoroutine][i]
		if l.status != g.status || l.body != g.body {
			t.Errorf("%s %s: loop %d %q, goroutine %d %q", rq.method, rq.path, l.status, l.body, g.status, g.body)
		}
		for _, k := range []string{"X-Request-Id", "X-Llmgw-Endpoint", "X-Llmgw-Route", "X-Worker", "X-Hop", "Content-Type", "Content-Length", "Transfer-Encoding", "Connection"} {
			if lv, gv := l.hdr.Values(k), g.hdr.Values(k); strings.Join(lv, ",") != strings.Join(gv, ",") {
				t.Errorf("%s %s: %s loop %q, goroutine %q", rq.method, rq.path, k, lv, gv)
			}
		}
	}
}

// TestAnswerHeadsSurviveSplitReads: a worker's answer head that arrives in
// a read of its own, or whose body ends with the connection before any
// byte, reaches the client intact on both planes (the loop plane builds
// the client's head from the worker's bytes when the first body byte
// comes, so the head's bytes must stay where they are until then).
func TestAnswerHeadsSurviveSplitReads(t *testing.T) {
	const head = "HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nX-Worker: kept-%s\r\n%s\r\n"
	// Longer than the head: bytes written over it would show.
	long := strings.Repeat("0123456789", 40)
	cases := []struct {
		name      string
		framing   string // the head's length field, if any
		body      string // written after the gateway has the head
		rest      string // written right after body
		closeWith bool   // the worker closes after body (an answer until close)
		want      string
	}{
		{name: "until close, empty", closeWith: true, want: ""},
		{name: "until close, body later", body: long, closeWith: true, want: long},
		{name: "chunked, body later", framing: "Transfer-Encoding: chunked\r\n", body: fmt.Sprintf("%x\r\n%s\r\n0\r\n\r\n", len(long), long), want: long},
		{name: "chunked, size line first", framing: "Transfer-Encoding: chunked\r\n", body: fmt.Sprintf("%x\r\n", len(long)), rest: long + "\r\n0\r\n\r\n", want: long},
		{name: "length, body later", framing: fmt.Sprintf("Content-Length: %d\r\n", len(long)), body: long, want: long},
	}
	for _, plane := range []string{PlaneLoop, PlaneGoroutine} {
		for _, tc := range cases {
			t.Run(plane+"/"+tc.name, func(t *testing.T) {
				proceed := make(chan struct{})
				b := newHardScripted(t, func(c net.Conn, req *http.Request) {
					fmt.Fprintf(c, head, strings.ReplaceAll(tc.name, " ", ""), tc.framing)
					<-proceed
					io.WriteString(c, tc.body)
					io.WriteString(c, tc.rest)
					if !tc.closeWith {
						// Keep the connection until the gateway is done.
						_, _ = c.Read(make([]byte, 1))
					}
				})
				s := startGateway(t, "", func(c *Config) { c.DataPlane = plane })
				mustApply(t, s, hardScriptedRule("r", "m1", "", b))
				done := make(chan struct{})
				var resp *http.Response
				var got string
				var err error
				go func() {
					defer close(done)
					var rb []byte
					resp, err = newClient(t).Post("http://"+s.Addr()+"/v1/chat/completions", "application/json", strings.NewReader(chatBody))
					if err == nil {
						rb, err = io.ReadAll(resp.Body)
						resp.Body.Close()
						got = string(rb)
					}
				}()
				// The worker's head is in the gateway (its decision is
				// logged when the head is parsed, on the loop plane) before
				// the rest is written.
				wait.For(t, 10*time.Second, "the gateway to read the answer head", func() bool { return len(s.decisions.list("r", time.Time{})) == 1 })
				close(proceed)
				<-done
				if err != nil {
					t.Fatal(err)
				}
				if resp.StatusCode != 200 || got != tc.want {
					t.Fatalf("got %d %q, want 200 %q", resp.StatusCode, got, tc.want)
				}
				if w, want := resp.Header.Get("X-Worker"), "kept-"+strings.ReplaceAll(tc.name, " ", ""); w != want {
					t.Fatalf("X-Worker %q, want %q (header: %v)", w, want, resp.Header)
				}
				if ct := resp.Header.Get("Content-Type"); ct != "text/plain" {
					t.Fatalf("Content-Type %q", ct)
				}
				// The gateway serves on.
				if n := s.metricValue(t, "llmgw_requests_total", "r", "w1", "200"); n != 1 {
					t.Fatalf("%v answers of 200 counted", n)
				}
			})
		}
	}
}

// TestAnswerRecordedBeforeItsEnd: by the time a client has read an
// answer to its end, the answer is in the metrics (its status, a broken
// stream's error): both planes record before the last bytes go out, so a
// client, a test or a scraper never reads a count behind what it saw.
func TestAnswerRecordedBeforeItsEnd(t *testing.T) {
	cases := []struct {
		name, path string
		script     string // the worker's whole answer; it closes after
		metric     string
		labels     []string
	}{
		{"buffered", "/v1/chat/completions", "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 2\r\n\r\n{}",
			"llmgw_requests_total", []string{"r", "w1", "200"}},
		{"no body", "/v1/other", "HTTP/1.1 204 No Content\r\n\r\n",
			"llmgw_requests_total", []string{"r", "w1", "204"}},
		{"chunked, whole", "/v1/other", "HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nok\r\n0\r\n\r\n",
			"llmgw_requests_total", []string{"r", "w1", "200"}},
		{"stream, whole", "/v1/chat/completions", "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n" +
			"e\r\ndata: [DONE]\n\n\r\n0\r\n\r\n", "llmgw_requests_total", []string{"r", "w1", "200"}},
		{"stream, broken", "/v1/chat/completions", "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n" +
			"c\r\ndata: {}\n\n\r\n", "llmgw_stream_errors_total", []string{"r", "w1"}},
	}
	for _, plane := range []string{PlaneLoop, PlaneGoroutine} {
		for _, tc := range cases {
			t.Run(plane+"/"+tc.name, func(t *testing.T) {
				b := newHardScripted(t, func(c net.Conn, req *http.Request) {
					io.WriteString(c, tc.script)
				})
				s := startGateway(t, "", func(c *Config) { c.DataPlane = plane })
				mustApply(t, s, hardScriptedRule("r", "", "", b))
				resp, err := newClient(t).Post("http://"+s.Addr()+tc.path, "application/json", strings.NewReader(chatBody))
				if err != nil {
					t.Fatal(err)
				}
				_, _ = io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				// No waiting: the count is there when the answer ended.
				if n := s.metricValue(t, tc.metric, tc.labels...); n != 1 {
					t.Fatalf("%s%v = %v right after the answer ended, want 1", tc.metric, tc.labels, n)
				}
			})
		}
	}
}

// TestLoopPlaneSlowClientStopsTheWorkersIdleClock: while a client's socket
// is full the loop plane does not read the worker, so the worker's idle
// timeout (its silence) must not run: a slow reader would otherwise have
// its stream cut and the worker charged with a failure. Checked on the
// loop's own state (through Post), then the whole answer arrives.
func TestLoopPlaneSlowClientStopsTheWorkersIdleClock(t *testing.T) {
	const size = 8 << 20
	big := bytes.Repeat([]byte("0123456789abcdef"), size/16)
	b := newBackend(t, "w", func(ctx *fasthttp.RequestCtx) {
		ctx.SetContentType("text/event-stream")
		ctx.SetBodyStreamWriter(func(w *bufio.Writer) {
			for i := 0; i < len(big); i += 64 << 10 {
				w.Write(big[i : i+64<<10])
				w.Flush()
			}
		})
	})
	s := loopGateway(t, b, "")
	c, br := dialGW(t, s)
	io.WriteString(c, loopRequest(chatBody))
	// The client reads nothing until the request waits on it.
	lp := s.listeners[""].loop
	type seen struct{ waiting, armed bool }
	state := func() seen {
		ch := make(chan seen, len(lp.loops))
		for _, pl := range lp.loops {
			if !pl.l.Post(func() {
				var v seen
				for cc := range pl.clients {
					if r := cc.req; r != nil && r.waiting && r.u != nil {
						v = seen{true, r.u.timer.Armed()}
					}
				}
				ch <- v
			}) {
				t.Fatal("a loop stopped")
			}
		}
		var v seen
		for range lp.loops {
			if x := <-ch; x.waiting {
				v = x
			}
		}
		return v
	}
	var v seen
	wait.For(t, 10*time.Second, "the request to wait on its client", func() bool { v = state(); return v.waiting })
	if v.armed {
		t.Fatal("the worker's idle timeout runs while the gateway does not read it")
	}
	resp, got := readAnswer(t, br)
	if resp.StatusCode != 200 || len(got) != size || got != string(big) {
		t.Fatalf("status %d, %d bytes", resp.StatusCode, len(got))
	}
	if n := s.metricValue(t, "llmgw_stream_errors_total", "r", "w"); n != 0 {
		t.Fatalf("%v stream errors", n)
	}
}
