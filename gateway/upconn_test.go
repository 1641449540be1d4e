package gateway

import (
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/valyala/fasthttp"

	"github.com/llmgw/llmgw/gateway/upstream"
	"github.com/llmgw/llmgw/internal/wait"
)

const streamChat = `{"model":"m1","stream":true,"messages":[{"role":"user","content":"hi"}]}`

// TestEngineLikeUpstreamNoErrors is the acceptance run: back-to-back
// streams, then requests after the upstream closed its idle connections (as
// the engine does at its keep-alive timeout), to an upstream that behaves
// like the rule's engine: llama.cpp closes after every SSE answer while
// advertising keep-alive; vLLM's uvicorn keeps the connection. Every
// request succeeds, each is executed exactly once, and the breaker (set to
// open on the first charged failure) never opens. On both, pooled
// connections are kept, found dead before reuse after the idle close, and
// reused for back-to-back plain answers. The goroutine plane finds them
// dead by its peek before a reuse (a redial); the loop plane when the
// close arrives, while they idle (no redial needed).
func TestEngineLikeUpstreamNoErrors(t *testing.T) {
	for _, tc := range []struct {
		engine   string
		upstream func(c net.Conn, req *http.Request, body []byte, n int64) bool
	}{
		{engine: "llamacpp", upstream: llamaLike},
		{engine: "vllm", upstream: uvicornLike},
	} {
		t.Run(tc.engine, func(t *testing.T) {
			up := newScripted(t, tc.upstream)
			s := startGateway(t, "", nil)
			mustApply(t, s, scriptedRule("r", "m1", "kvEngineType: "+tc.engine+"\ncb: {failures: 1, origin_5xx: 1}", up))
			ep := s.rules["r"].eps[0]
			c := newClient(t)
			url := "http://" + s.Addr() + "/v1/chat/completions"
			sent := 0
			check := func(what string, resp *http.Response, body string) {
				t.Helper()
				sent++
				if resp.StatusCode != 200 || strings.Contains(body, `"error"`) {
					t.Fatalf("%s: status %d body %q", what, resp.StatusCode, body)
				}
				if st := ep.Breaker().State(); st != upstream.Closed {
					t.Fatalf("%s: breaker %s", what, st)
				}
			}
			for i := range 50 {
				resp, body := post(t, c, url, streamChat)
				if !strings.HasSuffix(body, "data: [DONE]\n\n") {
					t.Fatalf("stream %d: body %q", i, body)
				}
				check(fmt.Sprintf("stream %d", i), resp, body)
			}
			for i := range 20 {
				resp, body := post(t, c, url, chatBody)
				check(fmt.Sprintf("request %d before idle", i), resp, body)
				up.expireIdle() // the engine's keep-alive timeout passes
				resp, body = post(t, c, url, chatBody)
				check(fmt.Sprintf("request %d after idle", i), resp, body)
			}
			if got := up.requests.Load(); got != int64(sent) {
				t.Errorf("upstream executed %d requests for %d sent", got, sent)
			}
			if n := s.metricValue(t, "llmgw_breaker_transitions_total", "r"); n != 0 {
				t.Errorf("%v breaker transitions", n)
			}
			if redials := s.metricValue(t, "llmgw_upstream_redials_total", "r"); redials == 0 && s.plane() == PlaneGoroutine {
				t.Error("no redials: the connections the upstream closed while idle were never found dead")
			}
			before := up.dials.Load()
			for i := range 10 {
				resp, body := post(t, c, url, chatBody)
				check(fmt.Sprintf("back-to-back request %d", i), resp, body)
			}
			if d := up.dials.Load() - before; d > 1 {
				t.Errorf("%d new connections for 10 back-to-back plain requests; want the kept one reused", d)
			}
		})
	}
}

// TestClientFault500KeepsEndpoint: llama-server answers 500 for n>1; eight
// such answers are relayed verbatim and the endpoint stays available.
func TestClientFault500KeepsEndpoint(t *testing.T) {
	up := newScripted(t, llamaLike)
	s := startGateway(t, "", nil)
	mustApply(t, s, scriptedRule("r", "m1", "kvEngineType: llamacpp", up))
	c := newClient(t)
	url := "http://" + s.Addr() + "/v1/chat/completions"
	for i := range 8 {
		resp, body := post(t, c, url, `{"model":"m1","n":2,"messages":[{"role":"user","content":"hi"}]}`)
		if resp.StatusCode != 500 || !strings.Contains(body, "Only one completion choice is allowed") {
			t.Fatalf("n:2 request %d: status %d body %q; want the engine's 500 relayed", i, resp.StatusCode, body)
		}
	}
	if st := s.rules["r"].eps[0].Breaker().State(); st != upstream.Closed {
		t.Fatalf("breaker %s after client-fault 500s", st)
	}
	if resp, body := post(t, c, url, chatBody); resp.StatusCode != 200 {
		t.Fatalf("after eight n:2 requests: status %d body %q", resp.StatusCode, body)
	}
	if n := s.metricValue(t, "llmgw_upstream_client_fault_5xx_total", "r"); n != 8 {
		t.Errorf("client-fault 5xx counted %v, want 8", n)
	}
}

// brokenAnswers are workers that read the whole request (so may have
// executed it) and then answer badly. secret marks bytes that must never
// reach the client.
const secret = "SECRET-UPSTREAM-BYTES"

var brokenAnswers = []struct {
	name   string
	script func(c net.Conn)
	stream bool
}{
	{name: "close mid-body", script: func(c net.Conn) {
		io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n{\"id\":\"")
	}},
	{name: "answer then reset", script: func(c net.Conn) {
		io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n{\"id\":\"")
		c.(*net.TCPConn).SetLinger(0) // close with RST
	}},
	{name: "reset mid-stream", stream: true, script: func(c net.Conn) {
		ev := "data: {\"n\":1}\n\n"
		fmt.Fprintf(c, "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n%x\r\n%s\r\n", len(ev), ev)
		c.(*net.TCPConn).SetLinger(0)
	}},
	{name: "oversize header", script: func(c net.Conn) {
		io.WriteString(c, "HTTP/1.1 200 OK\r\nX-Leak: "+strings.Repeat(secret, 400)+"\r\nContent-Length: 2\r\n\r\n{}")
	}},
	{name: "malformed status line", script: func(c net.Conn) {
		io.WriteString(c, "HTTP/1.1 two hundred "+secret+"\r\nContent-Length: 2\r\n\r\n{}")
	}},
	{name: "bad chunking", script: func(c net.Conn) {
		io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\nzz"+secret+"\r\n")
	}},
	{name: "close without answering", script: func(net.Conn) {}},
}

// TestBrokenAnswerExecutedOnce: a worker that read the request and then
// failed is never sent the request again, nor is any other worker; the
// client sees the failure, in the gateway's words only.
func TestBrokenAnswerExecutedOnce(t *testing.T) {
	for _, tc := range brokenAnswers {
		t.Run(tc.name, func(t *testing.T) {
			script := func(c net.Conn, _ *http.Request, _ []byte, _ int64) bool {
				tc.script(c)
				return false
			}
			a, b := newScripted(t, script), newScripted(t, script)
			s := startGateway(t, "", nil)
			mustApply(t, s, scriptedRule("r", "m1", "", a, b))
			body := chatBody
			if tc.stream {
				body = streamChat
			}
			resp, got := post(t, newClient(t), "http://"+s.Addr()+"/v1/chat/completions", body)
			if n := a.requests.Load() + b.requests.Load(); n != 1 {
				t.Errorf("the request was executed %d times; want once", n)
			}
			failed := resp.StatusCode == 502 || resp.StatusCode == 504
			if tc.stream {
				failed = resp.StatusCode == 200 && strings.Contains(got, `"error":{`)
			}
			if !failed || !strings.Contains(got, "backend") {
				t.Errorf("client got status %d body %q; want the failure", resp.StatusCode, got)
			}
			if strings.Contains(got, secret) || strings.Contains(got, "two hundred") {
				t.Errorf("client body carries upstream bytes: %q", got)
			}
		})
	}
}

// TestNotReachedRetriedElsewhere: a failure that proves no worker read the
// request (refused connect, connect timeout) is retried on another endpoint.
func TestNotReachedRetriedElsewhere(t *testing.T) {
	for _, tc := range []struct {
		name  string
		dead  func(t *testing.T) int // port of the unreachable first endpoint
		extra string
	}{
		{name: "connect refused", dead: refusedPort},
		{name: "connect timeout", dead: blackholePort, extra: "timeouts: {connect: 150ms}"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			port := tc.dead(t)
			ok := newScripted(t, llamaLike)
			s := startGateway(t, "", nil)
			y := fmt.Sprintf("name: r\nmodel_name: m1\nprobe: {disabled: true}\nsel: 4\n%s\nendpoints:\n  - {id: w1, endpointIP: 127.0.0.1, targetPort: %d}\n  - {id: w2, endpointIP: 127.0.0.1, targetPort: %d}\n", tc.extra, port, ok.port())
			mustApply(t, s, y)
			c := newClient(t)
			for i := range 4 {
				resp, body := post(t, c, "http://"+s.Addr()+"/v1/chat/completions", chatBody)
				if resp.StatusCode != 200 || resp.Header.Get("X-Llmgw-Endpoint") != "w2" {
					t.Fatalf("request %d: status %d endpoint %q body %q; want a retry on w2", i, resp.StatusCode, resp.Header.Get("X-Llmgw-Endpoint"), body)
				}
			}
			if n := s.metricValue(t, "llmgw_upstream_failures_total", "w1", "not_sent"); n < 1 {
				t.Errorf("w1 not_sent failures = %v", n)
			}
		})
	}
}

// refusedPort is a loopback port nobody listens on.
func refusedPort(t *testing.T) int {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := ln.Addr().(*net.TCPAddr).Port
	ln.Close()
	return p
}

func TestStatusForDialBeforeTimeout(t *testing.T) {
	timeout := &net.OpError{Op: "dial", Net: "tcp", Err: timeoutErr{}}
	for _, tc := range []struct {
		name     string
		err      error
		status   int
		code     string
		notSent  bool
		redialOK bool
	}{
		{"connect timeout", &DialError{Addr: "a", Err: timeout}, 502, "backend_unreachable", true, false},
		{"first-byte timeout", timeout, 504, "backend_timeout", false, false},
		{"stale pooled conn", fmt.Errorf("x: %w", errStaleConn), 502, "backend_failed", true, true},
		{"write failed on reused", &sendError{reused: true, err: io.ErrClosedPipe}, 502, "backend_failed", true, true},
		{"write failed on fresh", &sendError{err: io.ErrClosedPipe}, 502, "backend_failed", true, false},
		{"closed after send", io.EOF, 502, "backend_failed", false, false},
		{"no free connection", fasthttp.ErrNoFreeConns, 502, "backend_failed", true, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			st, _, code := statusFor(tc.err)
			if st != tc.status || code != tc.code {
				t.Errorf("statusFor = %d %s, want %d %s", st, code, tc.status, tc.code)
			}
			if notSent(tc.err) != tc.notSent || reusedNotSent(tc.err) != tc.redialOK {
				t.Errorf("notSent %v reusedNotSent %v", notSent(tc.err), reusedNotSent(tc.err))
			}
		})
	}
}

type timeoutErr struct{}

func (timeoutErr) Error() string   { return "i/o timeout" }
func (timeoutErr) Timeout() bool   { return true }
func (timeoutErr) Temporary() bool { return true }

// TestUpConnRefusesDeadReuse: a kept-alive connection is not reused once
// the peer closed it, once it idled past the limit, or at the request limit;
// nothing is written in those cases.
func TestUpConnRefusesDeadReuse(t *testing.T) {
	for _, tc := range []struct {
		name string
		o    connOpts
		kill bool
		want error
	}{
		{name: "alive", o: connOpts{maxIdle: time.Hour}},
		{name: "peer closed", o: connOpts{maxIdle: time.Hour}, kill: true, want: errStaleConn},
		{name: "idle past limit", o: connOpts{maxIdle: time.Nanosecond}, want: errStaleConn},
		{name: "request limit", o: connOpts{maxIdle: time.Hour, maxRequests: 1}, want: errConnRetired},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ln, err := net.Listen("tcp", "127.0.0.1:0")
			if err != nil {
				t.Fatal(err)
			}
			defer ln.Close()
			raw, err := net.Dial("tcp", ln.Addr().String())
			if err != nil {
				t.Fatal(err)
			}
			peer, err := ln.Accept()
			if err != nil {
				t.Fatal(err)
			}
			defer peer.Close()
			c := &upConn{Conn: raw, o: &tc.o}
			defer c.Close()
			// One request and its answer.
			if _, err := c.Write([]byte("req1")); err != nil {
				t.Fatal(err)
			}
			buf := make([]byte, 4)
			if _, err := io.ReadFull(peer, buf); err != nil {
				t.Fatal(err)
			}
			peer.Write([]byte("ans1"))
			if _, err := io.ReadFull(c, buf); err != nil {
				t.Fatal(err)
			}
			if tc.kill {
				peer.Close()
				wait.For(t, 5*time.Second, "the FIN to arrive", func() bool { return !peerOpen(raw) })
			}
			_, err = c.Write([]byte("req2"))
			if !errors.Is(err, tc.want) || (tc.want == nil && err != nil) {
				t.Fatalf("second request: %v, want %v", err, tc.want)
			}
		})
	}
}

// TestUpConnIdleDeadline: the idle bound holds between reads without a
// deadline change per read. An idle deadline that expires while bytes came
// since it was armed is moved on and the read continues; one that expires
// after a whole idle of silence fails the read.
func TestUpConnIdleDeadline(t *testing.T) {
	const idle = time.Hour
	cases := []struct {
		name     string
		lastRead time.Time // when the last bytes came, as the expired deadline finds it
		wantErr  bool
	}{
		{"bytes came since the deadline was armed", time.Now(), false},
		{"silent for longer than idle", time.Now().Add(-2 * idle), true},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			ln, err := net.Listen("tcp", "127.0.0.1:0")
			if err != nil {
				t.Fatal(err)
			}
			defer ln.Close()
			raw, err := net.Dial("tcp", ln.Addr().String())
			if err != nil {
				t.Fatal(err)
			}
			peer, err := ln.Accept()
			if err != nil {
				t.Fatal(err)
			}
			defer peer.Close()
			c := &upConn{Conn: raw, o: &connOpts{idle: idle}}
			defer c.Close()
			if _, err := peer.Write([]byte("ab")); err != nil {
				t.Fatal(err)
			}
			var b [1]byte
			if n, err := c.Read(b[:]); n != 1 || err != nil {
				t.Fatalf("first read: %d, %v", n, err)
			}
			if !c.idlePending || c.idleArmed {
				t.Fatalf("after the first bytes: pending %v armed %v; want the idle deadline pending, not armed", c.idlePending, c.idleArmed)
			}
			if n, err := c.Read(b[:]); n != 1 || err != nil || !c.idleArmed {
				t.Fatalf("second read: %d, %v, armed %v; want a byte and the idle deadline armed", n, err, c.idleArmed)
			}
			// The armed idle deadline has passed (set in the past here);
			// what decides is when the last bytes came.
			if err := c.Conn.SetReadDeadline(time.Unix(1, 0)); err != nil {
				t.Fatal(err)
			}
			c.lastRead = tc.lastRead
			if _, err := peer.Write([]byte("c")); err != nil {
				t.Fatal(err)
			}
			n, err := c.Read(b[:])
			if tc.wantErr {
				if !errors.Is(err, os.ErrDeadlineExceeded) {
					t.Fatalf("read after a silence past idle: %d, %v; want the deadline error", n, err)
				}
				return
			}
			if n != 1 || err != nil || b[0] != 'c' {
				t.Fatalf("read after an expired deadline with recent bytes: %d %q, %v; want the byte", n, b[:n], err)
			}
			// A deadline from above (the next request's first-byte
			// timeout) replaces the idle one.
			if err := c.SetReadDeadline(time.Now().Add(time.Minute)); err != nil || c.idleArmed || c.idlePending {
				t.Fatalf("SetReadDeadline: %v, armed %v pending %v; want the idle deadline dropped", err, c.idleArmed, c.idlePending)
			}
		})
	}
}

// TestUpConnSendFirst: a request left for the answer's read (sendFirst)
// goes out whole and the answer comes back; a failure to send it is a
// *sendError (the request did not reach the worker, so it may be sent
// again), kept for roundTrip because fasthttp reports any error before an
// answer's first byte as io.EOF; and a reused connection gets Write's
// checks first.
func TestUpConnSendFirst(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	dial := func(t *testing.T, o *connOpts) (*upConn, *net.TCPConn) {
		t.Helper()
		c, err := dialUpstream(ln.Addr().String(), o)
		if err != nil {
			t.Fatal(err)
		}
		peer, err := ln.Accept()
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close(); peer.Close() })
		uc, ok := c.(*upConn)
		if !ok || !uc.canSendFirst {
			t.Fatalf("dialUpstream gave %T (sendFirst %v), want an upConn over rawio", c, ok && uc.canSendFirst)
		}
		return uc, peer.(*net.TCPConn)
	}
	exchange := func(t *testing.T, uc *upConn, peer *net.TCPConn, head, body string) {
		t.Helper()
		if ok, err := uc.sendFirst([]byte(head), []byte(body)); !ok || err != nil {
			t.Fatalf("sendFirst = %v, %v", ok, err)
		}
		errc := make(chan error, 1)
		go func() {
			got := make([]byte, len(head)+len(body))
			_, err := io.ReadFull(peer, got)
			if err == nil && string(got) != head+body {
				err = fmt.Errorf("the worker got %q", got)
			}
			if err == nil {
				_, err = peer.Write([]byte("answer"))
			}
			errc <- err
		}()
		buf := make([]byte, 6)
		if _, err := io.ReadFull(uc, buf); err != nil || string(buf) != "answer" {
			t.Fatalf("answer %q, %v", buf, err)
		}
		if err := <-errc; err != nil {
			t.Fatal(err)
		}
	}
	t.Run("request and answer, twice", func(t *testing.T) {
		uc, peer := dial(t, &connOpts{maxIdle: time.Hour})
		exchange(t, uc, peer, "req1 head|", "body1")
		exchange(t, uc, peer, "req2 head|", "body2")
		if uc.requests != 2 || uc.sendFailed() != nil {
			t.Fatalf("requests %d, send failure %v; want 2, none", uc.requests, uc.sendFailed())
		}
	})
	t.Run("reset before the send", func(t *testing.T) {
		uc, peer := dial(t, &connOpts{maxIdle: time.Hour})
		if err := peer.SetLinger(0); err != nil {
			t.Fatal(err)
		}
		peer.Close()
		wait.For(t, 5*time.Second, "the reset to arrive", func() bool { return !peerOpen(uc.Conn) })
		if ok, err := uc.sendFirst([]byte("req"), nil); !ok || err != nil {
			t.Fatalf("sendFirst on a new connection = %v, %v (no checks before the first request)", ok, err)
		}
		_, err := uc.Read(make([]byte, 8))
		var se *sendError
		if !errors.As(err, &se) || se.reused || !notSent(err) {
			t.Fatalf("read: %v, want a *sendError of a new connection", err)
		}
		if got := uc.sendFailed(); got != err {
			t.Fatalf("sendFailed = %v, want the read's %v", got, err)
		}
	})
	t.Run("dead reused connection", func(t *testing.T) {
		uc, peer := dial(t, &connOpts{maxIdle: time.Hour})
		exchange(t, uc, peer, "req1|", "")
		// Half-closed: the worker can still read what reaches it.
		if err := peer.CloseWrite(); err != nil {
			t.Fatal(err)
		}
		wait.For(t, 5*time.Second, "the FIN to arrive", func() bool { return !peerOpen(uc.Conn) })
		// The peek runs in the read that sends.
		if ok, err := uc.sendFirst([]byte("req2"), nil); !ok || err != nil {
			t.Fatalf("sendFirst = %v, %v", ok, err)
		}
		_, err := uc.Read(make([]byte, 8))
		if !errors.Is(err, errStaleConn) || !reusedNotSent(err) || uc.sendFailed() != err {
			t.Fatalf("read on a dead reused connection: %v (kept: %v), want errStaleConn", err, uc.sendFailed())
		}
		// Nothing was sent: after the gateway's close the worker reads
		// nothing more.
		uc.Close()
		got, err := io.ReadAll(peer)
		if err != nil || string(got) != "" {
			t.Fatalf("the worker read %q, %v after its close", got, err)
		}
	})
	t.Run("limits before the send", func(t *testing.T) {
		uc, peer := dial(t, &connOpts{maxIdle: time.Hour, maxRequests: 1})
		exchange(t, uc, peer, "req1|", "")
		if ok, err := uc.sendFirst([]byte("req2"), nil); !ok || !errors.Is(err, errConnRetired) {
			t.Fatalf("sendFirst past the request limit = %v, %v; want errConnRetired", ok, err)
		}
	})
}
