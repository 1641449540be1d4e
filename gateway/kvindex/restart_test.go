package kvindex

import (
	"fmt"
	"testing"
	"time"

	"github.com/llmgw/llmgw/engines"
	"github.com/llmgw/llmgw/engines/kvhash"
	"github.com/llmgw/llmgw/engines/sim"
	"github.com/llmgw/llmgw/internal/wait"
)

// TestRestartClearsWithoutNewBatch: a publisher restart is known from the
// replay buffer as soon as the subscriber reconnects; the inventory must be
// cleared then, not at the restarted engine's first batch, which may come
// much later (an idle engine publishes nothing) while its old blocks would
// take KV-exact routing.
func TestRestartClearsWithoutNewBatch(t *testing.T) {
	s := startSim(t, sim.Config{Engine: engines.VLLM, HashSeed: "0"})
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
	warm := 0
	wait.For(t, waitLimit, "first event batch", func() bool {
		if g.State().Batches > 0 {
			return true
		}
		warm++
		chat(t, c, base, conversation(fmt.Sprintf("warm-up topic %d", warm)))
		return false
	})
	msgs := conversation("inventories after an engine restart")
	want := h.BlockKeys(nil, chatTokens(t, c, base, msgs))
	chat(t, c, base, msgs)
	wait.For(t, waitLimit, "prompt blocks indexed", func() bool { return holdsAll(x, 0, want...) })
	before := g.State().Resyncs

	postJSON(t, c, base+"/_sim/faults", map[string]any{"restart_publisher": true}, nil)
	// No request after the restart: nothing is published.
	wait.For(t, waitLimit, "the restart noticed without a new batch", func() bool {
		g.CheckRestarts()
		return g.State().Resyncs > before
	})
	if !holdsNone(x, 0, want...) {
		t.Errorf("blocks from before the restart are still indexed")
	}
	if st := g.State(); st.LastResyncReason != ReasonRestart || st.Resyncs != before+1 {
		t.Errorf("after the restart: %d resyncs (%q); want %d (%q)", st.Resyncs, st.LastResyncReason, before+1, ReasonRestart)
	}
	// The restarted engine's first batch does not clear a second time, and
	// what it stores is indexed.
	msgs2 := conversation("the first prompt after the restart")
	want2 := h.BlockKeys(nil, chatTokens(t, c, base, msgs2))
	chat(t, c, base, msgs2)
	wait.For(t, waitLimit, "blocks after the restart", func() bool { return holdsAll(x, 0, want2...) })
	if st := g.State(); st.Resyncs != before+1 {
		t.Errorf("the first batch after the restart cleared again: %d resyncs; want %d", st.Resyncs, before+1)
	}
}
