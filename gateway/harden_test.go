package gateway

import (
	"bufio"
	"bytes"
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/valyala/fasthttp"

	"github.com/llmgw/llmgw/internal/wait"
)

// scripted is a worker written by hand on raw TCP, for what no engine does
// politely: cut a body, stall after the headers, never answer. Each
// connection's first request is read with net/http's parser and handed to
// script, which owns the connection from there.
type hardScripted struct {
	ln   net.Listener
	wg   sync.WaitGroup
	mu   sync.Mutex
	reqs []*http.Request
	seen chan *http.Request
}

func newHardScripted(t *testing.T, script func(c net.Conn, req *http.Request)) *hardScripted {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	b := &hardScripted{ln: ln, seen: make(chan *http.Request, 64)}
	b.wg.Add(1)
	go func() {
		defer b.wg.Done()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			b.wg.Add(1)
			go func() {
				defer b.wg.Done()
				defer c.Close()
				req, err := http.ReadRequest(bufio.NewReader(c))
				if err != nil {
					return
				}
				body, _ := io.ReadAll(req.Body)
				req.Body = io.NopCloser(bytes.NewReader(body))
				b.mu.Lock()
				b.reqs = append(b.reqs, req)
				b.mu.Unlock()
				select {
				case b.seen <- req:
				default:
				}
				script(c, req)
			}()
		}
	}()
	t.Cleanup(func() { ln.Close(); b.wg.Wait() })
	return b
}

func (b *hardScripted) port() int { return b.ln.Addr().(*net.TCPAddr).Port }

func hardScriptedRule(name, model, extra string, b *hardScripted) string {
	return fmt.Sprintf("name: %s\nmodel_name: %q\nprobe: {disabled: true}\n%sendpoints:\n  - {id: w1, endpointIP: 127.0.0.1, targetPort: %d}\n", name, model, extra, b.port())
}

// rawRequest sends one request on a fresh connection and returns the
// response as net/http parses it, and the body read to its end (or to the
// error that stopped it).
func rawRequest(t *testing.T, addr, head, body string) (*http.Response, []byte, error) {
	t.Helper()
	conn, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	_ = conn.SetDeadline(time.Now().Add(20 * time.Second))
	if _, err := fmt.Fprintf(conn, "%sContent-Length: %d\r\n\r\n%s", head, len(body), body); err != nil {
		t.Fatal(err)
	}
	resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
	if err != nil {
		t.Fatalf("reading the response: %v", err)
	}
	data, rerr := io.ReadAll(resp.Body)
	return resp, data, rerr
}

const hardStreamChat = `{"model":"m1","stream":true,"messages":[{"role":"user","content":"x"}]}`

// TestBrokenOrLargeBodiesAreNeverDeliveredAsComplete: a worker body that
// breaks after the headers reaches the client as a failure (a cut
// connection for a streamed body, a 502 for a buffered one, an error event
// for SSE), and a large body (over fasthttp's old 64 MiB buffering cap)
// arrives whole. Before the fix a cut chunked body ended with a proper
// terminating chunk and a 200 MB body was cut to 64 MiB with a matching
// Content-Length.
func TestBrokenOrLargeBodiesAreNeverDeliveredAsComplete(t *testing.T) {
	const big = 70 << 20
	cases := []struct {
		name   string
		body   string // the client's request
		script func(c net.Conn)
		// want: the client's view
		status   int
		wantErr  bool // reading the body fails (cut connection)
		wantLen  int  // body length when whole (-1: not checked)
		contains string
	}{
		{
			name: "chunked JSON cut mid-way", body: hardStreamChat,
			script: func(c net.Conn) {
				fmt.Fprintf(c, "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n")
				fmt.Fprintf(c, "a\r\n{\"id\":\"x\",\r\n")
			},
			status: 200, wantErr: true, wantLen: -1,
		},
		{
			name: "large Content-Length body cut mid-way", body: chatBody,
			script: func(c net.Conn) {
				fmt.Fprintf(c, "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n", 4<<20)
				_, _ = c.Write(bytes.Repeat([]byte(" "), 1<<20))
			},
			status: 200, wantErr: true, wantLen: -1,
		},
		{
			name: "small Content-Length body cut mid-way", body: chatBody,
			script: func(c net.Conn) {
				fmt.Fprintf(c, "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n{\"id\":")
			},
			status: 502, wantLen: -1, contains: "backend_failed",
		},
		{
			name: "SSE cut before [DONE]", body: hardStreamChat,
			script: func(c net.Conn) {
				fmt.Fprintf(c, "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n")
				ev := "data: {\"n\":1}\n\n"
				fmt.Fprintf(c, "%x\r\n%s\r\n", len(ev), ev)
			},
			status: 200, wantLen: -1, contains: `"error":{`,
		},
		{
			name: "stream request answered by a 70 MiB JSON body", body: hardStreamChat,
			script: func(c net.Conn) {
				fmt.Fprintf(c, "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n", big)
				chunk := bytes.Repeat([]byte("x"), 1<<20)
				for range big >> 20 {
					if _, err := c.Write(chunk); err != nil {
						return
					}
				}
			},
			status: 200, wantLen: big,
		},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			b := newHardScripted(t, func(c net.Conn, _ *http.Request) { tc.script(c) })
			s := startGateway(t, "", nil)
			mustApply(t, s, hardScriptedRule("r", "m1", "", b))
			resp, data, err := rawRequest(t, s.Addr(), "POST /v1/chat/completions HTTP/1.1\r\nHost: gw\r\n", tc.body)
			if resp.StatusCode != tc.status {
				t.Fatalf("status = %d; want %d (%.200s)", resp.StatusCode, tc.status, data)
			}
			if tc.wantErr {
				if err == nil {
					t.Fatalf("the cut body (%d bytes) read as complete; want a read error", len(data))
				}
				if !errors.Is(err, io.ErrUnexpectedEOF) && !strings.Contains(err.Error(), "connection reset") {
					t.Logf("read error: %v", err)
				}
			} else if err != nil {
				t.Fatalf("reading the body: %v", err)
			}
			if tc.wantLen >= 0 && len(data) != tc.wantLen {
				t.Errorf("body is %d bytes; want %d", len(data), tc.wantLen)
			}
			if tc.contains != "" && !bytes.Contains(data, []byte(tc.contains)) {
				t.Errorf("body %.300q does not contain %q", data, tc.contains)
			}
		})
	}
}

// TestLongStreamOutlivesTheWriteTimeout: the write timeout bounds a stall
// in the client's reading, not a stream's length: a stream that runs longer
// than it, to a client that reads, is delivered whole.
//
// The worker sends an event only after the client has read the one before
// (lockstep, so the client is never the slow side) and ends the stream
// once it has run for twice the write timeout.
func TestLongStreamOutlivesTheWriteTimeout(t *testing.T) {
	const writeTimeout = 200 * time.Millisecond
	var read atomic.Int64 // events the client has read
	sent := make(chan int, 1)
	b := newHardScripted(t, func(c net.Conn, _ *http.Request) {
		fmt.Fprintf(c, "HTTP/1.1 200 OK\r\nConnection: close\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n")
		start := time.Now()
		n := 0
		for ; time.Since(start) <= 2*writeTimeout; n++ {
			ev := fmt.Sprintf("data: {\"n\":%d}\n\n", n)
			fmt.Fprintf(c, "%x\r\n%s\r\n", len(ev), ev)
			want := int64(n + 1)
			if _, err := wait.Until(10*time.Second, func() error {
				if read.Load() >= want {
					return nil
				}
				return errors.New("the client has not read the event yet")
			}); err != nil {
				break // the test fails on the missing [DONE]
			}
		}
		sent <- n
		ev := "data: [DONE]\n\n"
		fmt.Fprintf(c, "%x\r\n%s\r\n0\r\n\r\n", len(ev), ev)
	})
	s := startGateway(t, "", func(c *Config) { c.WriteTimeout = writeTimeout })
	mustApply(t, s, hardScriptedRule("r", "m1", "", b))
	conn, err := net.Dial("tcp", s.Addr())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	_ = conn.SetDeadline(time.Now().Add(20 * time.Second))
	fmt.Fprintf(conn, "POST /v1/chat/completions HTTP/1.1\r\nHost: gw\r\nContent-Length: %d\r\n\r\n%s", len(hardStreamChat), hardStreamChat)
	resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
	if err != nil || resp.StatusCode != 200 {
		t.Fatalf("response: %v %v", resp, err)
	}
	defer resp.Body.Close()
	events := bufio.NewScanner(resp.Body)
	var got []string
	for events.Scan() {
		if line := events.Text(); strings.HasPrefix(line, "data: ") {
			got = append(got, line)
			read.Add(1)
		}
	}
	if err := events.Err(); err != nil {
		t.Fatalf("after %d events: %v", len(got), err)
	}
	n := <-sent
	if len(got) != n+1 || got[len(got)-1] != "data: [DONE]" || got[n-1] != fmt.Sprintf(`data: {"n":%d}`, n-1) {
		t.Fatalf("got %d events ending %q; want the worker's %d and [DONE]", len(got), got[max(0, len(got)-2):], n)
	}
}

// TestWriteDeadlineDoesNotOutliveItsResponse: the per-response write
// deadline is cleared after the response, so on a keep-alive connection a
// later answer that takes longer than the write timeout is still written.
//
// The slow answer waits until the deadline the first response armed (before
// it was written, so no later than its arrival plus the write timeout) has
// certainly passed.
func TestWriteDeadlineDoesNotOutliveItsResponse(t *testing.T) {
	const writeTimeout = 200 * time.Millisecond
	var firstAt atomic.Int64 // when the client had the first answer, UnixNano
	a := newBackend(t, "slow", func(ctx *fasthttp.RequestCtx) {
		if string(ctx.Request.Header.Peek("X-Slow")) != "" {
			stale := time.Unix(0, firstAt.Load()).Add(writeTimeout + 50*time.Millisecond)
			if _, err := wait.Until(10*time.Second, func() error {
				if time.Now().After(stale) {
					return nil
				}
				return errors.New("the first response's write deadline has not passed yet")
			}); err != nil {
				ctx.Error(err.Error(), fasthttp.StatusInternalServerError)
				return
			}
		}
		ctx.SetContentType("application/json")
		ctx.SetBodyString(`{"ok":true}`)
	})
	s := startGateway(t, "", func(c *Config) { c.WriteTimeout = writeTimeout })
	mustApply(t, s, ruleYAML("r", "m1", "", a))
	conn, err := net.Dial("tcp", s.Addr())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	br := bufio.NewReader(conn)
	for i, slow := range []bool{false, true} {
		hdr := ""
		if slow {
			hdr = "X-Slow: 1\r\n"
		}
		_ = conn.SetDeadline(time.Now().Add(10 * time.Second))
		fmt.Fprintf(conn, "POST /v1/chat/completions HTTP/1.1\r\nHost: gw\r\n%sContent-Length: %d\r\n\r\n%s", hdr, len(chatBody), chatBody)
		resp, err := http.ReadResponse(br, nil)
		if err != nil {
			t.Fatalf("request %d on the kept-alive connection: %v", i+1, err)
		}
		body, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		if err != nil || resp.StatusCode != 200 || string(body) != `{"ok":true}` {
			t.Fatalf("request %d: status %d err %v body %q", i+1, resp.StatusCode, err, body)
		}
		if !slow {
			firstAt.Store(time.Now().UnixNano())
		}
	}
}

// TestSSEHeadersBeforeTheFirstEvent: a streaming client gets the status
// and headers when the worker sends them, before the first event (a
// worker's prefill can take seconds).
func TestSSEHeadersBeforeTheFirstEvent(t *testing.T) {
	sawHeaders := make(chan struct{})
	b := newHardScripted(t, func(c net.Conn, _ *http.Request) {
		fmt.Fprintf(c, "HTTP/1.1 200 OK\r\nConnection: close\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n")
		select {
		case <-sawHeaders:
		case <-time.After(10 * time.Second):
		}
		ev := "data: [DONE]\n\n"
		fmt.Fprintf(c, "%x\r\n%s\r\n0\r\n\r\n", len(ev), ev)
	})
	s := startGateway(t, "", nil)
	mustApply(t, s, hardScriptedRule("r", "m1", "", b))
	conn, err := net.Dial("tcp", s.Addr())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	fmt.Fprintf(conn, "POST /v1/chat/completions HTTP/1.1\r\nHost: gw\r\nContent-Length: %d\r\n\r\n%s", len(hardStreamChat), hardStreamChat)
	_ = conn.SetReadDeadline(time.Now().Add(5 * time.Second))
	resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
	if err != nil {
		t.Fatalf("no response headers while the worker holds its first event: %v", err)
	}
	close(sawHeaders)
	body, err := io.ReadAll(resp.Body)
	if err != nil || string(body) != "data: [DONE]\n\n" {
		t.Fatalf("body %q err %v", body, err)
	}
}

// TestHeadersThenStallNamesTheIdleTimeout: a worker that sends its headers
// and then nothing fails by the idle timeout, and the error says so (it
// used to blame the first-byte timeout).
func TestHeadersThenStallNamesTheIdleTimeout(t *testing.T) {
	hold := make(chan struct{})
	defer close(hold)
	b := newHardScripted(t, func(c net.Conn, _ *http.Request) {
		fmt.Fprintf(c, "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 50\r\n\r\n")
		<-hold
	})
	s := startGateway(t, "", nil)
	mustApply(t, s, hardScriptedRule("r", "m1", "timeouts: {first_byte: 10s, idle: 300ms}\n", b))
	resp, body := post(t, newClient(t), "http://"+s.Addr()+"/v1/chat/completions", chatBody)
	if resp.StatusCode != 504 || !strings.Contains(body, "idle timeout") || strings.Contains(body, "first-byte") {
		t.Fatalf("status %d body %s; want 504 naming the idle timeout", resp.StatusCode, body)
	}
}

// TestRequestHeadersToTheWorker: what the worker receives.
func TestRequestHeadersToTheWorker(t *testing.T) {
	b := newHardScripted(t, func(c net.Conn, _ *http.Request) {
		fmt.Fprintf(c, "HTTP/1.1 200 OK\r\nConnection: close\r\nContent-Type: application/json\r\nContent-Length: 2\r\n\r\n{}")
	})
	s := startGateway(t, "", nil)
	mustApply(t, s, hardScriptedRule("r", "m1", "", b))
	wantHost := fmt.Sprintf("127.0.0.1:%d", b.port())
	cases := []struct {
		name  string
		head  string
		check func(t *testing.T, r *http.Request)
	}{
		{
			name: "absolute-form URI does not set the Host",
			head: "POST http://evil.example/v1/chat/completions HTTP/1.1\r\nHost: evil.example\r\nContent-Type: application/json\r\n",
			check: func(t *testing.T, r *http.Request) {
				if r.Host != wantHost || r.RequestURI != "/v1/chat/completions" {
					t.Errorf("worker got Host %q URI %q; want %q and origin form", r.Host, r.RequestURI, wantHost)
				}
			},
		},
		{
			name: "headers named in Connection are not forwarded",
			head: "POST /v1/chat/completions HTTP/1.1\r\nHost: gw\r\nConnection: keep-alive, X-Secret\r\nX-Secret: s3cret\r\nX-Kept: yes\r\n",
			check: func(t *testing.T, r *http.Request) {
				if v := r.Header.Get("X-Secret"); v != "" {
					t.Errorf("worker got X-Secret %q; a header named in Connection is hop-by-hop", v)
				}
				if r.Header.Get("X-Kept") != "yes" {
					t.Error("an end-to-end header was dropped")
				}
			},
		},
		{
			name: "two X-Request-Id headers reach the worker as one",
			head: "POST /v1/chat/completions HTTP/1.1\r\nHost: gw\r\nX-Request-Id: first\r\nX-Request-Id: second\r\n",
			check: func(t *testing.T, r *http.Request) {
				if ids := r.Header.Values("X-Request-Id"); len(ids) != 1 || ids[0] != "first" {
					t.Errorf("worker got X-Request-Id %q; want exactly [first]", ids)
				}
			},
		},
		{
			name: "no Content-Type is invented",
			head: "POST /v1/chat/completions HTTP/1.1\r\nHost: gw\r\n",
			check: func(t *testing.T, r *http.Request) {
				if ct, ok := r.Header["Content-Type"]; ok {
					t.Errorf("worker got Content-Type %q; the client sent none", ct)
				}
			},
		},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			resp, data, err := rawRequest(t, s.Addr(), tc.head, chatBody)
			if err != nil || resp.StatusCode != 200 {
				t.Fatalf("status %d err %v body %s", resp.StatusCode, err, data)
			}
			select {
			case r := <-b.seen:
				tc.check(t, r)
			case <-time.After(10 * time.Second):
				t.Fatal("the worker saw no request")
			}
		})
	}
}

// TestGatewayErrorsCarryARequestID: the gateway's own answers (no route,
// unknown model, no endpoint, unreachable worker, method) carry an
// X-Request-Id, the client's when it sent one.
func TestGatewayErrorsCarryARequestID(t *testing.T) {
	dead, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	deadPort := dead.Addr().(*net.TCPAddr).Port
	dead.Close()
	a := newBackend(t, "a", nil)
	s := startGateway(t, "", nil)
	mustApply(t, s, ruleYAML("r", "m1", "", a))
	mustApply(t, s, fmt.Sprintf("name: down\nmodel_name: m2\nprobe: {disabled: true}\nendpoints:\n  - {id: d1, endpointIP: 127.0.0.1, targetPort: %d}\n", deadPort))
	c := newClient(t)
	base := "http://" + s.Addr()
	cases := []struct {
		name, method, path, body, clientID string
		status                             int
	}{
		{"no route", "GET", "/version", "", "", 404},
		{"unknown model", "POST", "/v1/chat/completions", `{"model":"zz","messages":[{"role":"user","content":"x"}]}`, "cid-1", 404},
		{"unreachable worker", "POST", "/v1/chat/completions", `{"model":"m2","messages":[{"role":"user","content":"x"}]}`, "cid-2", 502},
		{"PATCH on chat", "PATCH", "/v1/chat/completions", chatBody, "", 405},
		{"OPTIONS on completions", "OPTIONS", "/v1/completions", "", "", 405},
		{"DELETE on models", "DELETE", "/v1/models", "", "", 405},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			req, _ := http.NewRequest(tc.method, base+tc.path, strings.NewReader(tc.body))
			if tc.clientID != "" {
				req.Header.Set("X-Request-Id", tc.clientID)
			}
			resp, err := c.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			data, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if resp.StatusCode != tc.status {
				t.Fatalf("status %d; want %d (%s)", resp.StatusCode, tc.status, data)
			}
			id := resp.Header.Get("X-Request-Id")
			if id == "" || (tc.clientID != "" && id != tc.clientID) {
				t.Errorf("X-Request-Id = %q; want %q (or a generated one)", id, tc.clientID)
			}
			var e apiError
			if json.Unmarshal(data, &e) != nil || e.Error.Code == "" {
				t.Errorf("body %s is not an OpenAI error", data)
			}
		})
	}
}

// TestHTTP10Clients: an HTTP/1.0 client never gets HTTP/1.1 chunked
// framing. A stream request is refused before any worker (its answer could
// only end by closing the connection, which cannot be told from a cut); a
// plain request whose worker answers chunked gets the body buffered, with a
// Content-Length.
func TestHTTP10Clients(t *testing.T) {
	b := newHardScripted(t, func(c net.Conn, _ *http.Request) {
		fmt.Fprintf(c, "HTTP/1.1 200 OK\r\nConnection: close\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n2\r\n{}\r\n0\r\n\r\n")
	})
	s := startGateway(t, "", nil)
	mustApply(t, s, hardScriptedRule("r", "m1", "", b))
	t.Run("stream refused", func(t *testing.T) {
		resp, data, _ := rawRequest(t, s.Addr(), "POST /v1/chat/completions HTTP/1.0\r\n", hardStreamChat)
		if resp.StatusCode != 400 || !strings.Contains(string(data), "stream_requires_http11") {
			t.Fatalf("status %d body %s; want 400 stream_requires_http11", resp.StatusCode, data)
		}
	})
	t.Run("chunked answer buffered", func(t *testing.T) {
		resp, data, err := rawRequest(t, s.Addr(), "POST /v1/chat/completions HTTP/1.0\r\n", chatBody)
		if err != nil || resp.StatusCode != 200 || string(data) != "{}" {
			t.Fatalf("status %d err %v body %q", resp.StatusCode, err, data)
		}
		if len(resp.TransferEncoding) != 0 || resp.ContentLength != 2 {
			t.Errorf("framing: Transfer-Encoding %v Content-Length %d; want none and 2", resp.TransferEncoding, resp.ContentLength)
		}
	})
	if n := len(b.reqs); n != 1 {
		t.Errorf("worker saw %d requests; want 1 (the refused stream must not reach it)", n)
	}
}

// TestBufferBudget: a body that does not fit the budget streams through
// when it can, and gets 503 buffer_budget_exhausted when the client needs
// it buffered (HTTP/1.0, unknown length).
func TestBufferBudget(t *testing.T) {
	payload := strings.Repeat("y", 64<<10)
	b := newHardScripted(t, func(c net.Conn, req *http.Request) {
		if req.Header.Get("X-Chunked") != "" {
			fmt.Fprintf(c, "HTTP/1.1 200 OK\r\nConnection: close\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n%x\r\n%s\r\n0\r\n\r\n", len(payload), payload)
			return
		}
		fmt.Fprintf(c, "HTTP/1.1 200 OK\r\nConnection: close\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s", len(payload), payload)
	})
	s := startGateway(t, "", func(c *Config) { c.BufferBudget = 16 << 10 })
	mustApply(t, s, hardScriptedRule("r", "m1", "", b))
	resp, data, err := rawRequest(t, s.Addr(), "POST /v1/chat/completions HTTP/1.1\r\nHost: gw\r\n", chatBody)
	if err != nil || resp.StatusCode != 200 || len(data) != len(payload) {
		t.Fatalf("over-budget body of known length: status %d err %v len %d; want it streamed whole", resp.StatusCode, err, len(data))
	}
	resp, data, _ = rawRequest(t, s.Addr(), "POST /v1/chat/completions HTTP/1.0\r\nX-Chunked: 1\r\n", chatBody)
	if resp.StatusCode != 503 || !strings.Contains(string(data), "buffer_budget_exhausted") {
		t.Fatalf("HTTP/1.0 over budget: status %d body %.200s; want 503 buffer_budget_exhausted", resp.StatusCode, data)
	}
	if got := s.metricValue(t, "llmgw_buffer_budget_exceeded_total", "streamed"); got != 1 {
		t.Errorf("budget streamed metric = %v; want 1", got)
	}
	if got := s.metricValue(t, "llmgw_buffer_budget_exceeded_total", "refused"); got != 1 {
		t.Errorf("budget refused metric = %v; want 1", got)
	}
	wait.For(t, 5*time.Second, "the budget to be given back", func() bool { return s.budget.used.Load() == 0 })
}

// TestClientLeavingCancelsTheWorker: a client that closes its connection
// while the worker has not answered yet (non-streaming: fasthttp does not
// read the connection then) gets the worker's connection closed; and a
// streaming client that stops reading is cut off by the write timeout,
// which closes the worker's connection too.
func TestClientLeavingCancelsTheWorker(t *testing.T) {
	t.Run("non-streaming client closes while waiting", func(t *testing.T) {
		closed := make(chan struct{})
		b := newHardScripted(t, func(c net.Conn, _ *http.Request) {
			// Never answers; waits for the gateway to close the connection.
			_, _ = io.Copy(io.Discard, c)
			close(closed)
		})
		s := startGateway(t, "", nil)
		mustApply(t, s, hardScriptedRule("r", "m1", "timeouts: {first_byte: 60s}\n", b))
		conn, err := net.Dial("tcp", s.Addr())
		if err != nil {
			t.Fatal(err)
		}
		fmt.Fprintf(conn, "POST /v1/chat/completions HTTP/1.1\r\nHost: gw\r\nContent-Length: %d\r\n\r\n%s", len(chatBody), chatBody)
		select {
		case <-b.seen:
		case <-time.After(10 * time.Second):
			t.Fatal("the worker saw no request")
		}
		conn.Close()
		select {
		case <-closed:
		case <-time.After(10 * time.Second):
			t.Fatal("the worker's connection stayed open after the client left")
		}
		wait.For(t, 5*time.Second, "the cancel to be counted", func() bool {
			return s.metricValue(t, "llmgw_client_cancels_total", "r") == 1
		})
		rt := s.rules["r"]
		wait.For(t, 5*time.Second, "in-flight to drop to 0", func() bool { return rt.inFlight() == 0 })
	})
	t.Run("TLS client closes while waiting", func(t *testing.T) {
		closed := make(chan struct{})
		b := newHardScripted(t, func(c net.Conn, _ *http.Request) {
			_, _ = io.Copy(io.Discard, c)
			close(closed)
		})
		certFile, keyFile, pool := selfSigned(t, t.TempDir())
		s := startGateway(t, "", func(c *Config) { c.TLSCert, c.TLSKey = certFile, keyFile })
		mustApply(t, s, hardScriptedRule("r", "m1", "timeouts: {first_byte: 60s}\n", b))
		conn, err := tls.Dial("tcp", s.Addr(), &tls.Config{RootCAs: pool})
		if err != nil {
			t.Fatal(err)
		}
		fmt.Fprintf(conn, "POST /v1/chat/completions HTTP/1.1\r\nHost: gw\r\nContent-Length: %d\r\n\r\n%s", len(chatBody), chatBody)
		select {
		case <-b.seen:
		case <-time.After(10 * time.Second):
			t.Fatal("the worker saw no request")
		}
		conn.Close() // close_notify (encrypted under TLS 1.3), then FIN
		select {
		case <-closed:
		case <-time.After(10 * time.Second):
			t.Fatal("the worker's connection stayed open after the TLS client left")
		}
	})
	t.Run("streaming client stops reading", func(t *testing.T) {
		workerGone := make(chan struct{})
		b := newHardScripted(t, func(c net.Conn, _ *http.Request) {
			defer close(workerGone)
			fmt.Fprintf(c, "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n")
			ev := "data: " + strings.Repeat("z", 4000) + "\n\n"
			frame := fmt.Sprintf("%x\r\n%s\r\n", len(ev), ev)
			for {
				_ = c.SetWriteDeadline(time.Now().Add(30 * time.Second))
				if _, err := io.WriteString(c, frame); err != nil {
					return
				}
			}
		})
		s := startGateway(t, "", func(c *Config) { c.WriteTimeout = 300 * time.Millisecond })
		mustApply(t, s, hardScriptedRule("r", "m1", "", b))
		d := net.Dialer{}
		conn, err := d.Dial("tcp", s.Addr())
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close()
		_ = conn.(*net.TCPConn).SetReadBuffer(4096)
		fmt.Fprintf(conn, "POST /v1/chat/completions HTTP/1.1\r\nHost: gw\r\nContent-Length: %d\r\n\r\n%s", len(hardStreamChat), hardStreamChat)
		// Read the first bytes, then never again.
		var first [512]byte
		_ = conn.SetReadDeadline(time.Now().Add(10 * time.Second))
		if _, err := conn.Read(first[:]); err != nil {
			t.Fatal(err)
		}
		stopped := time.Now()
		select {
		case <-workerGone:
			t.Logf("worker connection closed %v after the client stopped reading (write timeout 300ms; the rest fills socket buffers)", time.Since(stopped).Round(time.Millisecond))
		case <-time.After(20 * time.Second):
			t.Fatal("the worker kept streaming to a client that stopped reading")
		}
		wait.For(t, 5*time.Second, "the cancel to be counted", func() bool {
			return s.metricValue(t, "llmgw_client_cancels_total", "r") == 1
		})
	})
}
