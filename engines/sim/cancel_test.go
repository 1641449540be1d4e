package sim

import (
	"bufio"
	"fmt"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/llmgw/llmgw/engines"
	"github.com/llmgw/llmgw/internal/wait"
)

// TestClientLeavingCancelsGeneration: a client that closes its connection
// stops the generation, as vLLM's with_cancellation does, and the receipt
// says cancelled: for a non-streaming request while the sim decodes (it
// writes nothing until the end), and for a stream when a write fails.
func TestClientLeavingCancelsGeneration(t *testing.T) {
	cases := []struct {
		name   string
		stream bool
	}{
		{"non-streaming", false},
		{"streaming", true},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			// 8..32 tokens at 200 ms each: at least 1.6 s of decoding.
			s := startSim(t, Config{Engine: engines.VLLM, KVEvents: KVEventsOff, DecodePerToken: 200 * time.Millisecond, Clock: time.Now})
			conn, err := net.Dial("tcp", s.Addrs().HTTP)
			if err != nil {
				t.Fatal(err)
			}
			body := fmt.Sprintf(`{"model":"Qwen/Qwen3-0.6B","stream":%t,"messages":[{"role":"user","content":"hi"}]}`, tc.stream)
			fmt.Fprintf(conn, "POST /v1/chat/completions HTTP/1.1\r\nHost: sim\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s", len(body), body)
			if tc.stream {
				// Wait for the first event, so the close comes mid-stream.
				_ = conn.SetReadDeadline(time.Now().Add(10 * time.Second))
				br := bufio.NewReader(conn)
				for {
					line, err := br.ReadString('\n')
					if err != nil {
						t.Fatal(err)
					}
					if strings.HasPrefix(line, "data: ") {
						break
					}
				}
			} else {
				wait.For(t, waitLimit, "the request to be decoding", func() bool { return s.running.Load() == 1 })
			}
			conn.Close()
			wait.For(t, waitLimit, "a cancelled receipt", func() bool {
				rs := s.Receipts()
				return len(rs) == 1 && rs[0].Cancelled
			})
			r := s.Receipts()[0]
			if r.FinishReason != "abort" || r.CancelledAt.IsZero() {
				t.Errorf("receipt finish %q cancelled_at %v; want abort and a time", r.FinishReason, r.CancelledAt)
			}
			wait.For(t, waitLimit, "the slot to be released", func() bool { return s.running.Load() == 0 })
		})
	}
}
