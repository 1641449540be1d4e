package gateway

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/llmgw/llmgw/internal/wait"
)

// TestDrainThenShutdown (issue 42): the graceful stop. Drain turns
// /readyz 503 at once while the data plane goes on serving: a connection
// opened after it is served, its answer saying Connection: close. Shutdown
// then refuses new connections, lets a stream that was in flight all
// along finish whole, and returns before its deadline. It holds on either data plane (make test
// runs the suite on both).
func TestDrainThenShutdown(t *testing.T) {
	release := make(chan struct{})
	gone := make(chan error, 1)
	b := sseBackend(t, release, gone, false)
	var releaseOnce sync.Once
	unblock := func() { releaseOnce.Do(func() { close(release) }) }
	t.Cleanup(unblock) // runs before the backend's close, which waits for the stream
	s := startGateway(t, "", nil)
	mustApply(t, s, ruleYAML("r", "m1", "probe: {disabled: true}", b))
	mustApply(t, s, ruleYAML("plain", "m2", "probe: {disabled: true}", newBackend(t, "plain", nil)))
	if code, body := getReady(t, s, ""); code != 200 {
		t.Fatalf("/readyz before Drain = %d %v", code, body)
	}

	// A stream in flight, past its first event.
	dataAddr := s.Addr()
	conn, err := net.Dial("tcp", dataAddr)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	body := `{"model":"m1","stream":true,"messages":[{"role":"user","content":"x"}]}`
	fmt.Fprintf(conn, "POST /v1/chat/completions HTTP/1.1\r\nHost: gw\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s", len(body), body)
	_ = conn.SetReadDeadline(time.Now().Add(20 * time.Second))
	resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
	if err != nil {
		t.Fatal(err)
	}
	events := bufio.NewReader(resp.Body)
	if line, err := events.ReadString('\n'); err != nil || line != "data: {\"n\":1}\n" {
		t.Fatalf("first event %q, %v", line, err)
	}

	s.Drain()
	if code, body := getReady(t, s, ""); code != 503 || body["draining"] != true {
		t.Errorf("/readyz right after Drain = %d %v; want 503 draining", code, body)
	}
	// A connection opened while draining is served, and told to close.
	for i := range 2 {
		c := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{}}
		r, text := post(t, c, "http://"+s.Addr()+"/v1/chat/completions", `{"model":"m2","messages":[{"role":"user","content":"hi"}]}`)
		c.CloseIdleConnections()
		if r.StatusCode != 200 || !r.Close {
			t.Errorf("request %d while draining = %d (Connection: close %v) %s; want 200, closed", i, r.StatusCode, r.Close, text)
		}
	}

	done := make(chan error, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		done <- s.Shutdown(ctx)
	}()
	// Shutdown has begun once the admin listener refuses.
	wait.For(t, 10*time.Second, "the admin listener closed", func() bool {
		c, err := net.Dial("tcp", s.AdminAddr())
		if err == nil {
			c.Close()
		}
		return err != nil
	})
	// The data listener no longer accepts: a new connection is refused,
	// not left waiting.
	wait.For(t, 10*time.Second, "the data listener refusing connections", func() bool {
		c, err := net.Dial("tcp", dataAddr)
		if err == nil {
			c.Close()
		}
		return err != nil
	})
	select {
	case err := <-done:
		t.Fatalf("Shutdown returned (%v) with a stream in flight", err)
	default:
	}
	unblock()
	rest, err := io.ReadAll(events)
	if err != nil {
		t.Fatalf("the in-flight stream after Shutdown began: %v", err)
	}
	if !strings.HasSuffix(string(rest), "data: [DONE]\n\n") || !strings.Contains(string(rest), `{"n":199}`) {
		t.Errorf("the in-flight stream was cut: tail %q", string(rest)[max(0, len(rest)-80):])
	}
	select {
	case err := <-done:
		if err != nil {
			t.Errorf("Shutdown: %v; want nil (nothing cut)", err)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("Shutdown did not return after the stream ended")
	}
	if err := <-gone; err != nil {
		t.Errorf("backend: %v", err)
	}
}
