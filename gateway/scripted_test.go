package gateway

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/llmgw/llmgw/internal/wait"
)

// scripted is an upstream written on a raw net.Listener, for connection
// behaviours no polite HTTP server produces on demand: it reads each
// request with net/http's parser and answers with whatever bytes its
// script writes, then keeps the connection or drops it as the script says.
//
// Idle connections are closed on an event (expireIdle), the way a real
// engine closes them when its keep-alive timeout passes; tests never wait
// for a clock.
type scripted struct {
	t      testing.TB
	ln     net.Listener
	script func(c net.Conn, req *http.Request, body []byte, n int64) (keep bool)

	requests atomic.Int64 // requests read in full (what the worker executed)
	dials    atomic.Int64 // connections accepted
	mu       sync.Mutex
	idle     map[net.Conn]bool // connections waiting for their next request
	open     map[net.Conn]bool
	wg       sync.WaitGroup
}

func newScripted(t testing.TB, script func(c net.Conn, req *http.Request, body []byte, n int64) bool) *scripted {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	s := &scripted{t: t, ln: ln, script: script, idle: map[net.Conn]bool{}, open: map[net.Conn]bool{}}
	s.wg.Add(1)
	go s.accept()
	t.Cleanup(s.close)
	return s
}

func (s *scripted) port() int { return s.ln.Addr().(*net.TCPAddr).Port }

func (s *scripted) accept() {
	defer s.wg.Done()
	for {
		c, err := s.ln.Accept()
		if err != nil {
			return
		}
		s.dials.Add(1)
		s.mu.Lock()
		s.open[c] = true
		s.mu.Unlock()
		s.wg.Add(1)
		go s.serve(c)
	}
}

func (s *scripted) serve(c net.Conn) {
	defer s.wg.Done()
	defer func() {
		s.mu.Lock()
		delete(s.open, c)
		delete(s.idle, c)
		s.mu.Unlock()
		_ = c.Close()
	}()
	br := bufio.NewReader(c)
	for {
		s.setIdle(c, true)
		req, err := http.ReadRequest(br)
		if err != nil {
			return
		}
		s.setIdle(c, false)
		body, err := io.ReadAll(req.Body)
		if err != nil {
			return
		}
		n := s.requests.Add(1)
		if !s.script(c, req, body, n) || req.Close {
			return
		}
	}
}

func (s *scripted) setIdle(c net.Conn, idle bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if idle {
		s.idle[c] = true
	} else {
		delete(s.idle, c)
	}
}

// expireIdle closes every connection, as an engine does when its
// keep-alive timeout passes, once each has finished its answer and waits
// for the next request; it returns when they are gone.
func (s *scripted) expireIdle() {
	s.waitFor("every connection to finish its answer", func() bool { return len(s.idle) == len(s.open) })
	s.mu.Lock()
	for c := range s.idle {
		_ = c.Close()
	}
	s.mu.Unlock()
	s.waitFor("idle connections to close", func() bool { return len(s.idle) == 0 })
}

// waitFor polls cond (called with s.mu held) until it holds, for at most
// 5 s.
func (s *scripted) waitFor(what string, cond func() bool) {
	s.t.Helper()
	wait.For(s.t, 5*time.Second, "scripted upstream: "+what, func() bool {
		s.mu.Lock()
		defer s.mu.Unlock()
		return cond()
	})
}

func (s *scripted) close() {
	_ = s.ln.Close()
	s.mu.Lock()
	for c := range s.open {
		_ = c.Close()
	}
	s.mu.Unlock()
	s.wg.Wait()
}

// scriptedRule is ruleYAML for scripted upstreams.
func scriptedRule(name, model, extra string, ups ...*scripted) string {
	var sb strings.Builder
	fmt.Fprintf(&sb, "name: %s\nmodel_name: %q\nprobe: {disabled: true}\n%s\nendpoints:\n", name, model, extra)
	for i, u := range ups {
		fmt.Fprintf(&sb, "  - {id: w%d, endpointIP: 127.0.0.1, targetPort: %d}\n", i+1, u.port())
	}
	return sb.String()
}

// llamaLike answers as llama-server does on the wire (captures in
// engines/llamacpp/testdata): every answer advertises
// "Keep-Alive: timeout=5, max=100"; a streamed answer is chunked SSE, one
// chunk per event, and the connection is closed after its terminator; a
// JSON answer keeps the connection. A request with "n":2 gets llama-server's
// 500 for it.
func llamaLike(c net.Conn, req *http.Request, body []byte, n int64) bool {
	return engineLike(true)(c, req, body, n)
}

// uvicornLike is llamaLike without the close after SSE: vLLM, SGLang and
// TensorRT-LLM serve HTTP with uvicorn, which keeps a connection after a
// streamed answer and closes it only when idle (engines/<e> Conn).
func uvicornLike(c net.Conn, req *http.Request, body []byte, n int64) bool {
	return engineLike(false)(c, req, body, n)
}

func engineLike(closeAfterSSE bool) func(c net.Conn, req *http.Request, body []byte, n int64) bool {
	return func(c net.Conn, req *http.Request, body []byte, n int64) bool {
		return answerLike(c, body, n, closeAfterSSE)
	}
}

func answerLike(c net.Conn, body []byte, n int64, closeAfterSSE bool) bool {
	if strings.Contains(string(body), `"n":2`) {
		msg := `{"error":{"code":500,"message":"Only one completion choice is allowed","type":"server_error"}}`
		fmt.Fprintf(c, "HTTP/1.1 500 Internal Server Error\r\nKeep-Alive: timeout=5, max=100\r\nContent-Type: application/json; charset=utf-8\r\nServer: llama.cpp\r\nContent-Length: %d\r\n\r\n%s", len(msg), msg)
		return true
	}
	if strings.Contains(string(body), `"stream":true`) {
		var sb strings.Builder
		sb.WriteString("HTTP/1.1 200 OK\r\nKeep-Alive: timeout=5, max=100\r\nContent-Type: text/event-stream\r\nServer: llama.cpp\r\nTransfer-Encoding: chunked\r\n\r\n")
		for _, ev := range []string{
			`data: {"choices":[{"finish_reason":null,"index":0,"delta":{"content":"a"}}],"object":"chat.completion.chunk"}` + "\n\n",
			`data: {"choices":[{"finish_reason":"length","index":0,"delta":{}}],"object":"chat.completion.chunk","usage":{"completion_tokens":1,"prompt_tokens":3,"total_tokens":4}}` + "\n\n",
			"data: [DONE]\n\n",
		} {
			fmt.Fprintf(&sb, "%x\r\n%s\r\n", len(ev), ev)
		}
		sb.WriteString("0\r\n\r\n")
		_, _ = io.WriteString(c, sb.String())
		return !closeAfterSSE // llama-server: closed after every SSE answer, whatever Keep-Alive said
	}
	msg := `{"choices":[{"finish_reason":"length","index":0,"message":{"role":"assistant","content":"a"}}],"object":"chat.completion","id":"r` + strconv.FormatInt(n, 10) + `"}`
	fmt.Fprintf(c, "HTTP/1.1 200 OK\r\nKeep-Alive: timeout=5, max=100\r\nContent-Type: application/json; charset=utf-8\r\nServer: llama.cpp\r\nContent-Length: %d\r\n\r\n%s", len(msg), msg)
	return true
}
