package llamacpp_test

import (
	"encoding/json"
	"runtime"
	"testing"
	"time"

	"github.com/llmgw/llmgw/engines/llamacpp"
	"github.com/llmgw/llmgw/engines/sim"
)

// TestNagleStall: with the option on, a non-streamed answer on a reused
// connection of a client that delays its ACKs (this raw client: Go's
// defaults) arrives in two parts, the body at least the kernel's minimum
// delayed-ACK time after the request (TCP_DELACK_MIN, 40 ms on Linux; the
// real server's 41.5–47.9 ms, llamacpp.ReusedConnStall), with the head
// complete before it. The bound is a floor the stall cannot undercut, so a
// slow machine cannot fail it.
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
		if got := r.bodyAt.Sub(sent); got < delayedACKMin {
			t.Errorf("%s on a reused connection: body after %v, want >= %v (delayed-ACK stall)", path, got, delayedACKMin)
		}
		if !r.headAt.Before(r.bodyAt) {
			t.Errorf("%s: head not received before the body", path)
		}
	}
}

// delayedACKMin is Linux's TCP_DELACK_MIN (HZ/25: 40 ms), less one tick of
// the coarsest kernel clock (HZ=100) for the timer's rounding.
const delayedACKMin = 30 * time.Millisecond

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
// threads are served at once (4 for the captured -np 2 on 2 CPUs; a
// persona without slots serves the adapter's figure); one more is accepted
// by the kernel but answered only when one of them closes (here by the
// idle timeout), while the last one that fits is answered at once
// (transport.json http_threads).
func TestServingConnLimit(t *testing.T) {
	if got := llamacpp.HTTPThreads(2, 2); got != 4 {
		t.Fatalf("HTTPThreads(2, 2) = %d, want the captured 4", got)
	}
	for _, tc := range []struct {
		name  string
		slots int
		limit int
	}{
		{"two_slots", 2, llamacpp.HTTPThreads(2, runtime.NumCPU())},
		{"unbounded", 0, llamacpp.Adapter{}.Conn().ServingConns},
	} {
		t.Run(tc.name+"/last_served", func(t *testing.T) {
			s := startSim(t, sim.Config{MaxConcurrency: tc.slots})
			var held []*rawConn
			for i := 0; i < tc.limit-1; i++ {
				c := dial(t, s.Addrs().HTTP)
				if r := c.roundTrip("GET", "/health", nil, ""); r.status != 200 {
					t.Fatalf("conn %d: %d", i, r.status)
				}
				held = append(held, c)
			}
			if r := dial(t, s.Addrs().HTTP).roundTrip("GET", "/health", nil, ""); r.status != 200 {
				t.Fatalf("connection %d: %d", tc.limit, r.status)
			}
			// The default idle timeout is 5 s: none of the others was
			// closed to make room.
			for i, c := range held {
				if err := c.waitEOF(10 * time.Millisecond); err == nil {
					t.Errorf("conn %d was closed before connection %d was served", i, tc.limit)
				}
			}
		})
		t.Run(tc.name+"/one_more_waits", func(t *testing.T) {
			s := startSim(t, sim.Config{MaxConcurrency: tc.slots, IdleTimeout: 300 * time.Millisecond})
			var held []*rawConn
			for i := 0; i < tc.limit; i++ {
				c := dial(t, s.Addrs().HTTP)
				if r := c.roundTrip("GET", "/health", nil, ""); r.status != 200 {
					t.Fatalf("conn %d: %d", i, r.status)
				}
				held = append(held, c)
			}
			extra := dial(t, s.Addrs().HTTP) // the kernel accepts it
			if r := extra.roundTrip("GET", "/health", nil, ""); r.status != 200 {
				t.Fatalf("connection %d: %d", tc.limit+1, r.status)
			}
			closed := 0
			for _, c := range held {
				if c.waitEOF(time.Second) == nil {
					closed++
				}
			}
			if closed == 0 {
				t.Fatalf("connection %d was answered while %d others were being served", tc.limit+1, tc.limit)
			}
		})
	}
}

// TestSlotsFailOnNoSlot: /slots?fail_on_no_slot=1 answers 503 when every
// slot is busy (checked against the same build: the body below is its
// answer) and 200 while one is idle (case slots_fail_on_no_slot).
func TestSlotsFailOnNoSlot(t *testing.T) {
	s := startSim(t, sim.Config{MaxConcurrency: 1, EnableSlots: true, DecodePerToken: 2 * time.Millisecond})
	c := dial(t, s.Addrs().HTTP)
	if r := c.roundTrip("GET", "/slots?fail_on_no_slot=1", nil, ""); r.status != 200 {
		t.Fatalf("idle: %d %s", r.status, r.body)
	}
	stop := startBusy(t, s)
	defer stop()
	r := c.roundTrip("GET", "/slots?fail_on_no_slot=1", nil, "")
	const want = `{"error":{"code":503,"message":"no slot available","type":"unavailable_error"}}`
	if r.status != 503 || string(r.body) != want {
		t.Fatalf("busy: %d %s, want 503 %s", r.status, r.body, want)
	}
}

// TestSlotChoice: a new prompt goes to the slot used least recently (the
// never-used one first), a repeated prompt back to the slot that holds it,
// and /slots reports each slot's last task (checked against the same
// build; cases slots_enabled_*).
func TestSlotChoice(t *testing.T) {
	s := startSim(t, sim.Config{MaxConcurrency: 2, EnableSlots: true})
	c := dial(t, s.Addrs().HTTP)
	complete := func(prompt string) int {
		t.Helper()
		r := c.roundTrip("POST", "/completion", jsonCT, `{"prompt":"`+prompt+`","n_predict":4}`)
		var res struct {
			IDSlot int `json:"id_slot"`
		}
		if err := json.Unmarshal(r.body, &res); err != nil || r.status != 200 {
			t.Fatalf("%s: %d %s", prompt, r.status, r.body)
		}
		return res.IDSlot
	}
	first := complete("the quick brown fox jumps over the lazy dog")
	second := complete("an entirely different prompt about the sea")
	if first == second {
		t.Fatalf("a new prompt went to slot %d, which the first task used; want the never-used slot", second)
	}
	if again := complete("the quick brown fox jumps over the lazy dog"); again != first {
		t.Errorf("the repeated prompt went to slot %d, want %d which holds it", again, first)
	}
	var slots []struct {
		ID     int   `json:"id"`
		IDTask int64 `json:"id_task"`
		Params struct {
			NPredict int `json:"n_predict"`
		} `json:"params"`
		NextToken struct {
			HasNext  bool `json:"has_next_token"`
			NRemain  int  `json:"n_remain"`
			NDecoded int  `json:"n_decoded"`
		} `json:"next_token"`
	}
	if r := c.roundTrip("GET", "/slots", nil, ""); json.Unmarshal(r.body, &slots) != nil || len(slots) != 2 {
		t.Fatalf("/slots: %d %s", r.status, r.body)
	}
	for _, sl := range slots {
		if sl.IDTask < 0 || sl.Params.NPredict != 4 || sl.NextToken.HasNext || sl.NextToken.NDecoded+sl.NextToken.NRemain != 4 {
			t.Errorf("slot %d after its task: %+v", sl.ID, sl)
		}
	}
}

// TestLoadingEveryPath: while the model loads every path answers 503 —
// "/" and ".html" paths with the loading page, every other one, known or
// not, with the JSON error — except the CORS preflight, which is answered
// before the server state is checked (transport.json, cases *_loading;
// server.cpp pre-routing handler).
func TestLoadingEveryPath(t *testing.T) {
	s := startSim(t, sim.Config{LoadingFor: time.Hour, EnableMetrics: true, EnableSlots: true})
	const loading = `{"error":{"code":503,"message":"Loading model","type":"unavailable_error"}}`
	for _, tc := range []struct {
		method, path, body string
		status             int
		ct                 string
	}{
		{"GET", "/health", "", 503, "application/json; charset=utf-8"},
		{"GET", "/v1/models", "", 503, "application/json; charset=utf-8"},
		{"GET", "/props", "", 503, "application/json; charset=utf-8"},
		{"GET", "/slots", "", 503, "application/json; charset=utf-8"},
		{"GET", "/metrics", "", 503, "application/json; charset=utf-8"},
		{"POST", "/v1/chat/completions", `{"messages":[{"role":"user","content":"hi"}]}`, 503, "application/json; charset=utf-8"},
		{"POST", "/v1/completions", `{"prompt":"hi"}`, 503, "application/json; charset=utf-8"},
		{"POST", "/completion", `{"prompt":"hi"}`, 503, "application/json; charset=utf-8"},
		{"POST", "/tokenize", `{"content":"hi"}`, 503, "application/json; charset=utf-8"},
		{"POST", "/v1/chat/completions", `not json`, 503, "application/json; charset=utf-8"},
		{"GET", "/v1/nope", "", 503, "application/json; charset=utf-8"},
		{"DELETE", "/health", "", 503, "application/json; charset=utf-8"},
		{"GET", "/", "", 503, "text/html; charset=utf-8"},
		{"GET", "/index.html", "", 503, "text/html; charset=utf-8"},
		{"OPTIONS", "/v1/chat/completions", "", 200, "text/html"},
	} {
		t.Run(tc.method+tc.path, func(t *testing.T) {
			r := dial(t, s.Addrs().HTTP).roundTrip(tc.method, tc.path, jsonCT, tc.body)
			ct, _ := r.get("Content-Type")
			if r.status != tc.status || ct != tc.ct {
				t.Fatalf("%d %q, want %d %q", r.status, ct, tc.status, tc.ct)
			}
			if tc.ct == "application/json; charset=utf-8" && string(r.body) != loading {
				t.Errorf("body %s, want %s", r.body, loading)
			}
		})
	}
}
