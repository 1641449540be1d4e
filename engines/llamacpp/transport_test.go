package llamacpp_test

import (
	"runtime"
	"testing"
	"time"

	"github.com/llmgw/llmgw/engines/llamacpp"
	"github.com/llmgw/llmgw/engines/sim"
)

// TestNagleStall: with the option on, a non-streamed answer on a reused
// connection comes no earlier than llamacpp.ReusedConnStall after its
// request (the server writes the body that long after the head), and its
// head is complete before its body.
func TestNagleStall(t *testing.T) {
	s := startSim(t, sim.Config{NagleStall: true})
	c := dial(t, s.Addrs().HTTP)
	first := c.roundTrip("GET", "/health", nil, "")
	if first.status != 200 {
		t.Fatalf("first /health: %d", first.status)
	}
	for _, path := range []string{"/health", "/v1/models"} {
		sent := time.Now()
		r := c.roundTrip("GET", path, nil, "")
		if r.status != 200 {
			t.Fatalf("%s: %d", path, r.status)
		}
		if got := r.bodyAt.Sub(sent); got < llamacpp.ReusedConnStall {
			t.Errorf("%s on a reused connection: body after %v, want >= %v", path, got, llamacpp.ReusedConnStall)
		}
		if !r.headAt.Before(r.bodyAt) {
			t.Errorf("%s: head not received before the body", path)
		}
	}
}

const chatStream = `{"messages":[{"role":"user","content":"Hello, how are you?"}],"max_tokens":4,"stream":true}`

var jsonCT = map[string]string{"Content-Type": "application/json"}

// TestCloseAfterStream: the connection ends right after every SSE answer
// (transport.json close_after_sse_response), with or without "Connection:
// close" in the request, though the answer advertised keep-alive; a JSON
// answer, errors included, keeps the connection
// (close_after_json_response).
func TestCloseAfterStream(t *testing.T) {
	s := startSim(t, sim.Config{})
	for _, tc := range []struct {
		name       string
		method     string
		path       string
		headers    map[string]string
		body       string
		wantStatus int
		closes     bool
	}{
		{"sse", "POST", "/v1/chat/completions", jsonCT, chatStream, 200, true},
		{"sse_connection_close", "POST", "/v1/chat/completions", map[string]string{"Content-Type": "application/json", "Connection": "close"}, chatStream, 200, true},
		{"native_sse", "POST", "/completion", jsonCT, `{"prompt":"hi","n_predict":2,"stream":true}`, 200, true},
		{"json_chat", "POST", "/v1/chat/completions", jsonCT, `{"messages":[{"role":"user","content":"hi"}],"max_tokens":2}`, 200, false},
		{"json_500_n2", "POST", "/v1/chat/completions", jsonCT, `{"messages":[{"role":"user","content":"hi"}],"n":2,"stream":true}`, 500, false},
		{"json_404", "GET", "/v1/nope", nil, "", 404, false},
		{"health_connection_close", "GET", "/health", map[string]string{"Connection": "close"}, "", 200, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := dial(t, s.Addrs().HTTP)
			r := c.roundTrip(tc.method, tc.path, tc.headers, tc.body)
			if r.status != tc.wantStatus {
				t.Fatalf("status %d, want %d: %s", r.status, tc.wantStatus, r.body)
			}
			if !tc.closes {
				if r2 := c.roundTrip("GET", "/health", nil, ""); r2.status != 200 {
					t.Fatalf("second request on the connection: %d", r2.status)
				}
				return
			}
			if err := c.waitEOF(10 * time.Second); err != nil {
				t.Fatalf("after the answer: %v", err)
			}
		})
	}
}

// TestMaxRequestsPerConn: answers 1..99 advertise "Keep-Alive: timeout=5,
// max=100" (not counted down); the 100th carries "Connection: close" and
// the connection ends (transport.json max_requests_per_connection).
func TestMaxRequestsPerConn(t *testing.T) {
	s := startSim(t, sim.Config{})
	c := dial(t, s.Addrs().HTTP)
	for i := 1; i <= llamacpp.MaxRequestsPerConn; i++ {
		r := c.roundTrip("GET", "/health", nil, "")
		ka, hasKA := r.get("Keep-Alive")
		conn, hasConn := r.get("Connection")
		if i < llamacpp.MaxRequestsPerConn {
			if ka != "timeout=5, max=100" || hasConn {
				t.Fatalf("answer %d: Keep-Alive %q, Connection %q", i, ka, conn)
			}
			continue
		}
		if hasKA || conn != "close" {
			t.Fatalf("answer %d: Keep-Alive %q, Connection %q, want only Connection: close", i, ka, conn)
		}
	}
	if err := c.waitEOF(10 * time.Second); err != nil {
		t.Fatalf("after answer %d: %v", llamacpp.MaxRequestsPerConn, err)
	}
}

// TestIdleClose: an idle kept-alive connection and a connection that never
// sent a byte are closed after the idle timeout (5 s by default,
// shortened here); one with a partial request is not (transport.json
// idle_close_seconds).
func TestIdleClose(t *testing.T) {
	s := startSim(t, sim.Config{MaxConcurrency: 2, IdleTimeout: 200 * time.Millisecond})
	used := dial(t, s.Addrs().HTTP)
	silent := dial(t, s.Addrs().HTTP)
	partial := dial(t, s.Addrs().HTTP)
	if _, err := partial.c.Write([]byte("GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\n")); err != nil {
		t.Fatal(err)
	}
	if r := used.roundTrip("GET", "/health", nil, ""); r.status != 200 {
		t.Fatalf("/health: %d", r.status)
	}
	for name, c := range map[string]*rawConn{"idle after an answer": used, "never used": silent} {
		if err := c.waitEOF(10 * time.Second); err != nil {
			t.Errorf("%s: %v", name, err)
		}
	}
	// Both above are closed, so the idle time has passed for the partial
	// one too; it must still be open and answer once its request is done.
	if err := partial.waitEOF(50 * time.Millisecond); err == nil {
		t.Fatal("connection with a partial request was closed")
	}
	if _, err := partial.c.Write([]byte("\r\n")); err != nil {
		t.Fatal(err)
	}
	if r, err := partial.read(); err != nil || r.status != 200 {
		t.Fatalf("completed partial request: %v %v", r, err)
	}
}

// TestServingConnLimit: as many connections as llama-server has HTTP
// threads are served at once (4 for the captured -np 2 on 2 CPUs); one
// more is accepted by the kernel but answered only when one of them
// closes (here by the idle timeout), while the last one that fits is
// answered at once (transport.json http_threads).
func TestServingConnLimit(t *testing.T) {
	if got := llamacpp.HTTPThreads(2, 2); got != 4 {
		t.Fatalf("HTTPThreads(2, 2) = %d, want the captured 4", got)
	}
	limit := llamacpp.HTTPThreads(2, runtime.NumCPU())
	t.Run("last_served", func(t *testing.T) {
		s := startSim(t, sim.Config{MaxConcurrency: 2})
		var held []*rawConn
		for i := 0; i < limit-1; i++ {
			c := dial(t, s.Addrs().HTTP)
			if r := c.roundTrip("GET", "/health", nil, ""); r.status != 200 {
				t.Fatalf("conn %d: %d", i, r.status)
			}
			held = append(held, c)
		}
		if r := dial(t, s.Addrs().HTTP).roundTrip("GET", "/health", nil, ""); r.status != 200 {
			t.Fatalf("connection %d: %d", limit, r.status)
		}
		// The default idle timeout is 5 s: none of the others was closed
		// to make room.
		for i, c := range held {
			if err := c.waitEOF(10 * time.Millisecond); err == nil {
				t.Errorf("conn %d was closed before connection %d was served", i, limit)
			}
		}
	})
	t.Run("one_more_waits", func(t *testing.T) {
		s := startSim(t, sim.Config{MaxConcurrency: 2, IdleTimeout: 300 * time.Millisecond})
		var held []*rawConn
		for i := 0; i < limit; i++ {
			c := dial(t, s.Addrs().HTTP)
			if r := c.roundTrip("GET", "/health", nil, ""); r.status != 200 {
				t.Fatalf("conn %d: %d", i, r.status)
			}
			held = append(held, c)
		}
		extra := dial(t, s.Addrs().HTTP) // the kernel accepts it
		if r := extra.roundTrip("GET", "/health", nil, ""); r.status != 200 {
			t.Fatalf("connection %d: %d", limit+1, r.status)
		}
		closed := 0
		for _, c := range held {
			if c.waitEOF(time.Second) == nil {
				closed++
			}
		}
		if closed == 0 {
			t.Fatalf("connection %d was answered while %d others were being served", limit+1, limit)
		}
	})
}
