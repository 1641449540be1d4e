package gateway

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/valyala/fasthttp"

	"github.com/llmgw/llmgw/internal/wait"
)

func TestRoutingByModel(t *testing.T) {
	a := newBackend(t, "a", nil)
	b := newBackend(t, "b", nil)
	d := newBackend(t, "def", nil)
	s := startGateway(t, "", nil)
	mustApply(t, s, ruleYAML("ra", "model-a", "", a))
	mustApply(t, s, ruleYAML("rb", "model-b", "", b))
	c := newClient(t)
	base := "http://" + s.Addr()

	cases := []struct {
		name, model, wantID string
		wantStatus          int
	}{
		{"model a", "model-a", "a", 200},
		{"model b", "model-b", "b", 200},
		{"unknown model without default rule", "nope", "", 404},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			resp, body := post(t, c, base+"/v1/chat/completions", fmt.Sprintf(`{"model":%q,"messages":[{"role":"user","content":"x"}]}`, tc.model))
			if resp.StatusCode != tc.wantStatus {
				t.Fatalf("status = %d; want %d (body %s)", resp.StatusCode, tc.wantStatus, body)
			}
			if tc.wantID != "" && !strings.Contains(body, `"id":"`+tc.wantID+`"`) {
				t.Errorf("body = %s; want it served by %s", body, tc.wantID)
			}
			if tc.wantStatus == 404 {
				var e apiError
				if err := json.Unmarshal([]byte(body), &e); err != nil || e.Error.Code != "model_not_found" {
					t.Errorf("404 body = %s; want OpenAI error with code model_not_found", body)
				}
			}
		})
	}

	// With a default rule, an unknown model goes there.
	mustApply(t, s, ruleYAML("rdef", "", "", d))
	resp, body := post(t, c, base+"/v1/completions", `{"model":"nope","prompt":"x"}`)
	if resp.StatusCode != 200 || !strings.Contains(body, `"id":"def"`) {
		t.Fatalf("unknown model with default rule: %d %s; want 200 from def", resp.StatusCode, body)
	}

	// /v1/models lists the named models.
	r, err := c.Get(base + "/v1/models")
	if err != nil {
		t.Fatal(err)
	}
	data, _ := io.ReadAll(r.Body)
	r.Body.Close()
	if !strings.Contains(string(data), `"id":"model-a"`) || !strings.Contains(string(data), `"id":"model-b"`) {
		t.Errorf("/v1/models = %s; want model-a and model-b", data)
	}
}

func TestDedicatedListener(t *testing.T) {
	a := newBackend(t, "a", nil)
	s := startGateway(t, "", nil)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	mustApply(t, s, ruleYAML("own", "m1", "listen: "+addr, a))
	c := newClient(t)
	resp, body := post(t, c, "http://"+addr+"/v1/chat/completions", chatBody)
	if resp.StatusCode != 200 {
		t.Fatalf("dedicated listener: %d %s", resp.StatusCode, body)
	}
	// The shared listener does not serve that rule's model.
	resp, _ = post(t, c, "http://"+s.Addr()+"/v1/chat/completions", chatBody)
	if resp.StatusCode != 404 {
		t.Errorf("shared listener served a dedicated rule's model: %d", resp.StatusCode)
	}
	if got := s.RuleAddr("own"); got != addr {
		t.Errorf("RuleAddr = %q; want %q", got, addr)
	}
}

func TestBadInputRejectedBeforeBackend(t *testing.T) {
	a := newBackend(t, "a", nil)
	s := startGateway(t, "", func(c *Config) { c.MaxBodyBytes = 1024 })
	mustApply(t, s, ruleYAML("r", "m1", "", a))
	c := newClient(t)
	base := "http://" + s.Addr()
	big := `{"model":"m1","messages":[{"role":"user","content":"` + strings.Repeat("x", 2048) + `"}]}`
	cases := []struct {
		name, method, path, body string
		status                   int
		code                     string
	}{
		{"malformed json", "POST", "/v1/chat/completions", `{"model":`, 400, "invalid_request"},
		{"missing model", "POST", "/v1/chat/completions", `{"messages":[{"role":"user","content":"x"}]}`, 400, "invalid_request"},
		{"wrong type", "POST", "/v1/chat/completions", `{"model":"m1","stream":"yes","messages":[{"role":"user","content":"x"}]}`, 400, "invalid_request"},
		{"messages missing", "POST", "/v1/chat/completions", `{"model":"m1"}`, 400, "invalid_request"},
		{"prompt wrong type", "POST", "/v1/completions", `{"model":"m1","prompt":{}}`, 400, "invalid_request"},
		{"duplicate model", "POST", "/v1/chat/completions", `{"model":"m1","model":"zz","messages":[{"role":"user","content":"x"}]}`, 400, "invalid_request"},
		{"duplicate stream", "POST", "/v1/chat/completions", `{"model":"m1","stream":false,"stream":true,"messages":[{"role":"user","content":"x"}]}`, 400, "invalid_request"},
		{"duplicate prompt", "POST", "/v1/completions", `{"model":"m1","prompt":"a","prompt":"b"}`, 400, "invalid_request"},
		{"unknown model", "POST", "/v1/chat/completions", `{"model":"zz","messages":[{"role":"user","content":"x"}]}`, 404, "model_not_found"},
		{"oversize body", "POST", "/v1/chat/completions", big, 413, "request_too_large"},
		{"GET on completions", "GET", "/v1/chat/completions", "", 405, "method_not_allowed"},
		{"other path without default rule", "GET", "/version", "", 404, "not_found"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			// A rejection must not wait for anything (a backend, a
			// timeout): the deadline only detects such a hang.
			ctx, cancel := context.WithTimeout(t.Context(), 5*time.Second)
			defer cancel()
			req, _ := http.NewRequestWithContext(ctx, tc.method, base+tc.path, strings.NewReader(tc.body))
			resp, err := c.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			data, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if resp.StatusCode != tc.status {
				t.Fatalf("status = %d; want %d (%s)", resp.StatusCode, tc.status, data)
			}
			var e apiError
			if err := json.Unmarshal(data, &e); err != nil || e.Error.Code != tc.code || e.Error.Message == "" {
				t.Errorf("body = %s; want an OpenAI error with code %q", data, tc.code)
			}
		})
	}
	if n := a.hits.Load(); n != 0 {
		t.Errorf("backend received %d rejected requests; want 0", n)
	}
}

func TestRequestIDAndRouteHeaders(t *testing.T) {
	a := newBackend(t, "a", nil)
	s := startGateway(t, "", nil)
	mustApply(t, s, ruleYAML("r", "m1", "sel: 0", a))
	c := newClient(t)
	url := "http://" + s.Addr() + "/v1/chat/completions"

	resp, _ := post(t, c, url, chatBody, "X-Request-Id", "client-id-1")
	if got := a.lastHeader("X-Request-Id"); got != "client-id-1" {
		t.Errorf("backend saw X-Request-Id %q; want the client's", got)
	}
	if got := resp.Header.Values("X-Request-Id"); len(got) != 1 || got[0] != "client-id-1" {
		t.Errorf("response X-Request-Id %q; want the client's", got)
	}
	if got := resp.Header.Get("X-Llmgw-Endpoint"); got != "w1" {
		t.Errorf("X-Llmgw-Endpoint = %q; want w1", got)
	}
	if got := resp.Header.Get("X-Llmgw-Route"); got != "rr" {
		t.Errorf("X-Llmgw-Route = %q; want rr", got)
	}

	resp, _ = post(t, c, url, chatBody)
	gen := a.lastHeader("X-Request-Id")
	if !regexp.MustCompile(`^[0-9a-f]{32}$`).MatchString(gen) {
		t.Errorf("generated X-Request-Id %q; want 32 hex characters", gen)
	}
	if resp.Header.Get("X-Request-Id") != gen {
		t.Errorf("response id %q differs from the one sent upstream %q", resp.Header.Get("X-Request-Id"), gen)
	}
	// The decisions API records it.
	found := false
	for _, d := range s.decisions.list("r", time.Time{}) {
		if d.RequestID == gen && d.Endpoint == "w1" && d.Reason == "rr" {
			found = true
		}
	}
	if !found {
		t.Errorf("decision for %s not recorded", gen)
	}
}

// sseBackend streams events; the second waits until release is closed,
// so the test can prove the first one reached the client alone. It then
// writes events 2..199 and [DONE], or, when endless, writes until a write
// fails (only the client side going away ends it). gone gets the write
// error, or nil after [DONE].
func sseBackend(t *testing.T, release <-chan struct{}, gone chan<- error, endless bool) *backend {
	return newBackend(t, "sse", func(ctx *fasthttp.RequestCtx) {
		ctx.SetContentType("text/event-stream")
		ctx.SetBodyStreamWriter(func(w *bufio.Writer) {
			fmt.Fprintf(w, "data: {\"n\":1}\n\n")
			if err := w.Flush(); err != nil {
				gone <- err
				return
			}
			<-release
			for i := 2; endless || i < 200; i++ {
				fmt.Fprintf(w, "data: {\"n\":%d}\n\n", i)
				if err := w.Flush(); err != nil {
					gone <- err
					return
				}
			}
			fmt.Fprintf(w, "data: [DONE]\n\n")
			_ = w.Flush()
			gone <- nil
		})
	})
}

func TestSSERelayedEventByEvent(t *testing.T) {
	release := make(chan struct{})
	gone := make(chan error, 1)
	b := sseBackend(t, release, gone, false)
	s := startGateway(t, "", nil)
	mustApply(t, s, ruleYAML("r", "m1", "", b))
	conn, err := net.Dial("tcp", s.Addr())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	body := `{"model":"m1","stream":true,"messages":[{"role":"user","content":"x"}]}`
	fmt.Fprintf(conn, "POST /v1/chat/completions HTTP/1.1\r\nHost: gw\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s", len(body), body)
	_ = conn.SetReadDeadline(time.Now().Add(10 * time.Second))
	br := bufio.NewReader(conn)
	resp, err := http.ReadResponse(br, nil)
	if err != nil {
		t.Fatal(err)
	}
	if ct := resp.Header.Get("Content-Type"); ct != "text/event-stream" {
		t.Fatalf("content type %q", ct)
	}
	events := bufio.NewReader(resp.Body)
	line, err := events.ReadString('\n')
	if err != nil {
		t.Fatalf("reading first event while the backend holds the second: %v", err)
	}
	if line != "data: {\"n\":1}\n" {
		t.Fatalf("first line %q", line)
	}
	close(release)
	rest, err := io.ReadAll(events)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasSuffix(string(rest), "data: [DONE]\n\n") || !strings.Contains(string(rest), `{"n":199}`) {
		t.Errorf("stream tail %q", string(rest)[max(0, len(rest)-80):])
	}
	if err := <-gone; err != nil {
		t.Errorf("backend saw %v", err)
	}
}

func TestClientDisconnectCancelsUpstream(t *testing.T) {
	release := make(chan struct{})
	gone := make(chan error, 1)
	// An endless stream: only the cancel can end it (the old 200-event
	// stream raced the cancel against its own 400 ms of pacing).
	b := sseBackend(t, release, gone, true)
	s := startGateway(t, "", nil)
	mustApply(t, s, ruleYAML("r", "m1", "", b))
	conn, err := net.Dial("tcp", s.Addr())
	if err != nil {
		t.Fatal(err)
	}
	body := `{"model":"m1","stream":true,"messages":[{"role":"user","content":"x"}]}`
	fmt.Fprintf(conn, "POST /v1/chat/completions HTTP/1.1\r\nHost: gw\r\nContent-Length: %d\r\n\r\n%s", len(body), body)
	_ = conn.SetReadDeadline(time.Now().Add(10 * time.Second))
	br := bufio.NewReader(conn)
	if _, err := http.ReadResponse(br, nil); err != nil {
		t.Fatal(err)
	}
	if _, err := br.ReadString('\n'); err != nil {
		t.Fatal(err)
	}
	conn.Close() // the client walks away after the first event
	close(release)
	select {
	case err := <-gone:
		if err == nil {
			t.Fatal("backend finished an endless stream")
		}
	case <-time.After(10 * time.Second):
		t.Fatal("backend never noticed the client disconnect")
	}
	rt := s.rules["r"]
	wait.For(t, 5*time.Second, "in-flight to drop to 0", func() bool { return rt.inFlight() == 0 })
}

func TestUpstreamDeathMidStreamEndsWithErrorEvent(t *testing.T) {
	b := newBackend(t, "dies", func(ctx *fasthttp.RequestCtx) {
		ctx.SetContentType("text/event-stream")
		ctx.HijackSetNoResponse(true)
		ctx.Hijack(func(c net.Conn) {
			fmt.Fprintf(c, "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n")
			ev := "data: {\"n\":1}\n\n"
			fmt.Fprintf(c, "%x\r\n%s\r\n", len(ev), ev)
			c.Close() // dies without the terminating chunk
		})
	})
	s := startGateway(t, "", nil)
	mustApply(t, s, ruleYAML("r", "m1", "", b))
	c := newClient(t)
	resp, body := post(t, c, "http://"+s.Addr()+"/v1/chat/completions", `{"model":"m1","stream":true,"messages":[{"role":"user","content":"x"}]}`)
	if resp.StatusCode != 200 {
		t.Fatalf("status %d", resp.StatusCode)
	}
	if !strings.HasPrefix(body, "data: {\"n\":1}\n\n") || !strings.Contains(body, `"error":{`) || !strings.HasSuffix(body, "data: [DONE]\n\n") {
		t.Errorf("stream = %q; want the first event, an error event and [DONE]", body)
	}
}
