package kvindex

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"slices"
	"testing"
	"time"

	"github.com/llmgw/llmgw/engines"
	"github.com/llmgw/llmgw/engines/kvhash"
	"github.com/llmgw/llmgw/engines/sim"
	"github.com/llmgw/llmgw/internal/wait"
)

// httpClient returns a client whose connections are closed when the test
// ends (goleak would otherwise see their reader goroutines).
func httpClient(t *testing.T) *http.Client {
	t.Helper()
	tr := &http.Transport{}
	t.Cleanup(tr.CloseIdleConnections)
	return &http.Client{Transport: tr, Timeout: waitLimit}
}

func postJSON(t *testing.T, c *http.Client, url string, body any, out any) {
	t.Helper()
	b, err := json.Marshal(body)
	if err != nil {
		t.Fatalf("marshal: %v", err)
	}
	resp, err := c.Post(url, "application/json", bytes.NewReader(b))
	if err != nil {
		t.Fatalf("POST %s: %v", url, err)
	}
	defer resp.Body.Close()
	raw, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatalf("POST %s: read: %v", url, err)
	}
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("POST %s: status %d: %s", url, resp.StatusCode, raw)
	}
	if out != nil {
		if err := json.Unmarshal(raw, out); err != nil {
			t.Fatalf("POST %s: decode %s: %v", url, raw, err)
		}
	}
}

func startSim(t *testing.T, cfg sim.Config) *sim.Sim {
	t.Helper()
	s, err := sim.Start(context.Background(), cfg)
	if err != nil {
		t.Fatalf("sim.Start: %v", err)
	}
	t.Cleanup(func() {
		if err := s.Close(); err != nil {
			t.Errorf("sim Close: %v", err)
		}
	})
	return s
}

type chatMsg struct {
	Role    string `json:"role"`
	Content string `json:"content"`
}

// chatTokens asks the vLLM persona's /tokenize for the prompt tokens of a
// chat, as the engine will see them.
func chatTokens(t *testing.T, c *http.Client, base string, msgs []chatMsg) []uint32 {
	t.Helper()
	var tok struct {
		Tokens []uint32 `json:"tokens"`
	}
	postJSON(t, c, base+"/tokenize", map[string]any{"messages": msgs}, &tok)
	return tok.Tokens
}

func chat(t *testing.T, c *http.Client, base string, msgs []chatMsg) {
	t.Helper()
	postJSON(t, c, base+"/v1/chat/completions", map[string]any{"model": "Qwen/Qwen3-0.6B", "messages": msgs, "max_tokens": 4}, nil)
}

// conversation builds a chat whose very first block depends on topic: the
// engine announces a block only when it first caches it, so a block shared
// with an earlier prompt would never be announced again after a clear.
func conversation(topic string) []chatMsg {
	return []chatMsg{
		{"system", topic + ": you are a careful assistant who answers questions about it in detail."},
		{"user", fmt.Sprintf("Please explain, step by step and with examples, how %s works, why it matters, and what its most common failure modes are in production systems.", topic)},
	}
}

// TestIngestSimVLLM runs the vLLM persona in both event encodings: a chat
// request fills the Index with exactly the keys kvhash computes for the
// prompt's tokens, and the sim's faults (sequence gap, publisher restart)
// clear the inventory.
func TestIngestSimVLLM(t *testing.T) {
	for _, enc := range []string{sim.EncodingMap, sim.EncodingArray} {
		t.Run(enc, func(t *testing.T) {
			s := startSim(t, sim.Config{Engine: engines.VLLM, EventEncoding: enc, HashSeed: "0"})
			base := "http://" + s.Addrs().HTTP
			c := httpClient(t)
			x := New(1, 10000)
			g, err := NewIngester(IngestConfig{
				Engine: engines.VLLM, ZMQ: []string{s.Addrs().Events}, Replay: []string{s.Addrs().Replay},
				BlockSize: 16, MinBackoff: 10 * time.Millisecond, MaxBackoff: 100 * time.Millisecond,
			}, x)
			if err != nil {
				t.Fatalf("NewIngester: %v", err)
			}
			runIngester(t, g)
			h, err := kvhash.New(kvhash.SHA256CBOR, 16, "0")
			if err != nil {
				t.Fatalf("kvhash.New: %v", err)
			}

			// Warm-up requests until one batch has arrived: ZeroMQ loses what
			// is published before the subscription is live.
			warm := 0
			wait.For(t, waitLimit, "first event batch", func() bool {
				if g.State().Batches > 0 {
					return true
				}
				warm++
				chat(t, c, base, conversation(fmt.Sprintf("warm-up topic %d", warm)))
				return false
			})

			msgs := conversation("prefix caching in large language model inference servers")
			tokens := chatTokens(t, c, base, msgs)
			want := h.BlockKeys(nil, tokens)
			if len(want) < 3 {
				t.Fatalf("prompt has %d full blocks, want at least 3 for a meaningful check", len(want))
			}
			before := x.Keys(0, 0)
			chat(t, c, base, msgs)
			wait.For(t, waitLimit, "prompt blocks indexed", func() bool { return holdsAll(x, 0, want...) })
			var added []uint64
			for _, k := range x.Keys(0, 0) {
				if !slices.Contains(before, k) {
					added = append(added, k)
				}
			}
			slices.Sort(added)
			wantSorted := slices.Sorted(slices.Values(want))
			if !slices.Equal(added, wantSorted) {
				t.Errorf("new keys: got %v, want exactly the prompt's %v", added, wantSorted)
			}
			out := make([]int, 1)
			x.Match(append(slices.Clone(want), 12345), out)
			if out[0] != len(want) {
				t.Errorf("Match: got %d, want %d", out[0], len(want))
			}

			// The sim's receipts show the same prompt length.
			rs := s.Receipts()
			if got := rs[len(rs)-1].PromptTokens; got != len(tokens) {
				t.Errorf("receipt prompt tokens: got %d, want %d (from /tokenize)", got, len(tokens))
			}

			// An unrecoverable sequence gap clears, then the next request
			// rebuilds.
			postJSON(t, c, base+"/_sim/faults", map[string]any{"seq_gap": 5}, nil)
			msgs2 := conversation("sequence gaps")
			want2 := h.BlockKeys(nil, chatTokens(t, c, base, msgs2))
			chat(t, c, base, msgs2)
			wait.For(t, waitLimit, "blocks after the gap", func() bool { return holdsAll(x, 0, want2...) })
			if !holdsNone(x, 0, want...) {
				t.Error("blocks from before the gap survived it")
			}
			if st := g.State(); st.LastResyncReason != ReasonGap {
				t.Errorf("after gap: reason %q, want %q", st.LastResyncReason, ReasonGap)
			}

			// A publisher restart (sequence back to 0) clears and rebuilds.
			// Push the stream's position past what the restarted publisher
			// will reach first.
			for i := range 30 {
				chat(t, c, base, conversation(fmt.Sprintf("filler %d", i)))
			}
			wait.For(t, waitLimit, "filler batches", func() bool { return g.State().LastSeq >= 25 })
			postJSON(t, c, base+"/_sim/faults", map[string]any{"restart_publisher": true}, nil)
			// Fresh prompts until the new publisher's first batch arrives
			// (the subscriber reconnects; earlier batches may be lost).
			n := 0
			wait.For(t, waitLimit, "a batch from the restarted publisher", func() bool {
				if g.State().Resyncs == 2 {
					return true
				}
				n++
				chat(t, c, base, conversation(fmt.Sprintf("after restart %d", n)))
				return false
			})
			msgs3 := conversation("publisher restarts")
			want3 := h.BlockKeys(nil, chatTokens(t, c, base, msgs3))
			chat(t, c, base, msgs3)
			wait.For(t, waitLimit, "blocks after the restart", func() bool { return holdsAll(x, 0, want3...) })
			if !holdsNone(x, 0, want2...) {
				t.Error("blocks from before the restart survived it")
			}
			if st := g.State(); (st.LastResyncReason != ReasonRestart && st.LastResyncReason != ReasonRegress) || st.Resyncs != 2 {
				t.Errorf("after restart: got %d resyncs (%q), want 2 (%q or %q)", st.Resyncs, st.LastResyncReason, ReasonRestart, ReasonRegress)
			}
		})
	}
}
