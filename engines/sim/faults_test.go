package sim

import (
	"bufio"
	"encoding/json"
	"errors"
	"io"
	"net"
	"strings"
	"testing"

	"github.com/llmgw/llmgw/engines"
	"github.com/llmgw/llmgw/internal/wait"
)

func postFaults(t *testing.T, s *Sim, body string) Faults {
	t.Helper()
	res := do(t, client(t), "POST", "http://"+s.Addrs().HTTP+"/_sim/faults", body)
	if res.status != 200 {
		t.Fatalf("POST /_sim/faults %s: %d %s", body, res.status, res.body)
	}
	var f Faults
	if err := json.Unmarshal(res.body, &f); err != nil {
		t.Fatalf("decode faults: %v", err)
	}
	return f
}

func TestFaultHealth(t *testing.T) {
	tests := []struct {
		engine     engines.Kind
		path       string
		wantBody   string
		okBody     string
		failStatus int
	}{
		{engines.VLLM, "/health", "", "", 503},
		{engines.SGLang, "/health", "", "", 503},
		{engines.TRTLLM, "/health", "LLM is unavailable. Please check the server logs for more details.", "", 503},
		{engines.LlamaCpp, "/health", `{"error":{"code":503,"message":"Loading model","type":"unavailable_error"}}`, `{"status":"ok"}`, 503},
	}
	for _, tc := range tests {
		t.Run(string(tc.engine), func(t *testing.T) {
			s := startSim(t, Config{Engine: tc.engine, KVEvents: KVEventsOff})
			c := client(t)
			url := "http://" + s.Addrs().HTTP + tc.path
			if res := do(t, c, "GET", url, ""); res.status != 200 || string(res.body) != tc.okBody {
				t.Fatalf("healthy: got %d %q, want 200 %q", res.status, res.body, tc.okBody)
			}
			postFaults(t, s, `{"health_fail":true}`)
			res := do(t, c, "GET", url, "")
			if res.status != tc.failStatus || string(res.body) != tc.wantBody {
				t.Errorf("failing: got %d %q, want %d %q", res.status, res.body, tc.failStatus, tc.wantBody)
			}
			postFaults(t, s, `{"reset":true}`)
			if res := do(t, c, "GET", url, ""); res.status != 200 {
				t.Errorf("after reset: got %d", res.status)
			}
		})
	}
}

func TestFaultErrorRate(t *testing.T) {
	s := startSim(t, Config{Engine: engines.VLLM, KVEvents: KVEventsOff})
	c := client(t)
	postFaults(t, s, `{"error_rate":0.25}`)
	var fails int
	for i := 0; i < 20; i++ {
		res := do(t, c, "POST", "http://"+s.Addrs().HTTP+"/v1/completions", `{"prompt":"x","max_tokens":1}`)
		switch res.status {
		case 500:
			fails++
			want := `{"error":{"message":"sim: injected fault (error_rate)","type":"InternalServerError","param":null,"code":500}}`
			if string(res.body) != want {
				t.Errorf("500 body: got %s, want %s", res.body, want)
			}
		case 200:
		default:
			t.Errorf("unexpected status %d", res.status)
		}
	}
	if fails != 5 {
		t.Errorf("error_rate 0.25 over 20 requests: got %d failures, want 5", fails)
	}
}

func TestFaultBadPatch(t *testing.T) {
	s := startSim(t, Config{Engine: engines.VLLM, KVEvents: KVEventsOff})
	res := do(t, client(t), "POST", "http://"+s.Addrs().HTTP+"/_sim/faults", `{"no_such_fault":1}`)
	if res.status != 400 {
		t.Errorf("unknown fault field: got %d, want 400", res.status)
	}
}

// TestFaultCrashMidStream reads the raw stream: after the configured number
// of SSE events the server closes the connection without the terminating
// chunk, which an HTTP client sees as an unexpected EOF.
func TestFaultCrashMidStream(t *testing.T) {
	s := startSim(t, Config{Engine: engines.VLLM, KVEvents: KVEventsOff})
	postFaults(t, s, `{"crash_after_chunks":2}`)
	res := do(t, client(t), "POST", "http://"+s.Addrs().HTTP+"/v1/chat/completions", chatBody+`,"stream":true}`)
	if res.status != 200 {
		t.Fatalf("status %d", res.status)
	}
	if !errors.Is(res.err, io.ErrUnexpectedEOF) {
		t.Errorf("body error: got %v, want unexpected EOF", res.err)
	}
	if got := strings.Count(string(res.body), "data: "); got != 2 {
		t.Errorf("events before the crash: got %d, want 2 (%q)", got, res.body)
	}
	if strings.Contains(string(res.body), "[DONE]") {
		t.Errorf("crashed stream carried [DONE]")
	}
	wait.For(t, waitLimit, "receipt", func() bool { return len(s.Receipts()) == 1 })
	if r := s.Receipts()[0]; !r.Crashed {
		t.Errorf("receipt not marked crashed: %+v", r)
	}

	// A non-streaming request gets no response at all.
	conn, err := net.Dial("tcp", s.Addrs().HTTP)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	body := `{"prompt":"x"}`
	if _, err := io.WriteString(conn, "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 14\r\n\r\n"+body); err != nil {
		t.Fatal(err)
	}
	if line, err := bufio.NewReader(conn).ReadString('\n'); err != io.EOF || line != "" {
		t.Errorf("non-streaming crash: got %q, %v; want EOF before any byte", line, err)
	}
}

func TestFaultErrorMidStream(t *testing.T) {
	tests := []struct {
		engine engines.Kind
		want   string
	}{
		{engines.VLLM, `data: {"error":{"message":"sim: injected fault (error_after_chunks)","type":"InternalServerError","param":null,"code":500}}`},
		{engines.SGLang, `data: {"error":{"object":"error","message":"sim: injected fault (error_after_chunks)","type":"InternalServerError","param":null,"code":500}}`},
		{engines.LlamaCpp, `data: {"error":{"code":500,"message":"sim: injected fault (error_after_chunks)","type":"server_error"}}`},
	}
	for _, tc := range tests {
		t.Run(string(tc.engine), func(t *testing.T) {
			s := startSim(t, Config{Engine: tc.engine, KVEvents: KVEventsOff})
			postFaults(t, s, `{"error_after_chunks":2}`)
			res := do(t, client(t), "POST", "http://"+s.Addrs().HTTP+"/v1/chat/completions", chatBody+`,"stream":true}`)
			events := strings.Split(strings.TrimSuffix(string(res.body), "\n\n"), "\n\n")
			if res.status != 200 || res.err != nil || len(events) != 4 {
				t.Fatalf("got %d %v with %d events: %q", res.status, res.err, len(events), res.body)
			}
			if events[2] != tc.want || events[3] != "data: [DONE]" {
				t.Errorf("tail: got %q, %q; want %q then [DONE]", events[2], events[3], tc.want)
			}
		})
	}
}
