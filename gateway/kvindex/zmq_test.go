package kvindex

import (
	"bytes"
	"errors"
	"testing"
	"time"

	"github.com/llmgw/llmgw/engines"
	"github.com/llmgw/llmgw/engines/kvevents"
	"github.com/llmgw/llmgw/internal/wait"
)

const testBS = 4 // tokens per block in the synthetic streams

// zmqEnv is a real kvevents publisher feeding an Ingester for endpoint 1 of
// a two-endpoint Index, over TCP on 127.0.0.1.
type zmqEnv struct {
	t        *testing.T
	enc      kvevents.Encoding
	pub      *kvevents.Publisher
	endpoint string
	replay   string
	x        *Index
	g        *Ingester
}

const zep = 1 // the endpoint under test; endpoint 0 must stay untouched

var baseKeys = []uint64{101, 102, 103}

func newZMQEnv(t *testing.T, enc kvevents.Encoding) *zmqEnv {
	t.Helper()
	pub := startPub(t, "tcp://127.0.0.1:0", "tcp://127.0.0.1:0")
	e := &zmqEnv{t: t, enc: enc, pub: pub, endpoint: tcpOf(pub.Addr()), replay: tcpOf(pub.ReplayAddr())}
	e.x = New(2, 1000)
	g, err := NewIngester(IngestConfig{
		Engine: engines.VLLM, Endpoint: zep,
		ZMQ: []string{e.endpoint}, Replay: []string{e.replay},
		BlockSize: testBS, MinBackoff: 10 * time.Millisecond, MaxBackoff: 100 * time.Millisecond,
	}, e.x)
	if err != nil {
		t.Fatalf("NewIngester: %v", err)
	}
	e.g = g
	runIngester(t, g)
	// ZeroMQ drops what is published before the subscription reaches the
	// publisher; publish the base blocks until they arrive.
	e.pumpUntil("base blocks indexed", func() bool { return holdsAll(e.x, zep, baseKeys...) }, stored(testBS, baseKeys...))
	if st := g.State(); st.Resyncs != 0 || !st.Connected {
		t.Fatalf("after warm-up: got %+v, want connected and no resync", st)
	}
	return e
}

func (e *zmqEnv) publish(evs ...kvevents.Event) {
	e.t.Helper()
	e.publishRaw(encode(e.t, e.enc, evs...))
}

func (e *zmqEnv) publishRaw(payload []byte) {
	e.t.Helper()
	if _, err := e.pub.Publish(payload); err != nil {
		e.t.Fatalf("Publish: %v", err)
	}
}

// pumpUntil publishes evs at every poll (wait.Poll) until cond holds (for subscriptions
// that may not be live yet).
func (e *zmqEnv) pumpUntil(what string, cond func() bool, evs ...kvevents.Event) {
	e.t.Helper()
	payload := encode(e.t, e.enc, evs...)
	wait.For(e.t, waitLimit, what, func() bool {
		if cond() {
			return true
		}
		_, _ = e.pub.Publish(payload)
		return false
	})
}

// sync publishes a marker block and waits for it: every batch published
// before it has then been applied.
func (e *zmqEnv) sync(marker uint64) {
	e.t.Helper()
	e.publish(stored(testBS, marker))
	wait.For(e.t, waitLimit, "marker block", func() bool { return e.x.Contains(zep, marker) })
}

func TestIngestZMQ(t *testing.T) {
	cases := []struct {
		name string
		run  func(t *testing.T, e *zmqEnv)
		// wantResyncs and wantReason check State after run; altReason is
		// also accepted (a restart is seen either by the subscriber's
		// replay check on reconnect or as a sequence regression, depending
		// on when the subscription notices the old socket is gone).
		wantResyncs uint64
		wantReason  string
		altReason   string
	}{
		{
			name: "stored_then_matched_as_prefix",
			run: func(t *testing.T, e *zmqEnv) {
				e.publish(stored(testBS, 104, 105))
				wait.For(t, waitLimit, "new blocks", func() bool { return holdsAll(e.x, zep, 104, 105) })
				out := make([]int, 2)
				e.x.Match([]uint64{101, 102, 103, 104, 105, 106}, out)
				if out[zep] != 5 || out[0] != 0 {
					t.Errorf("Match: got %v, want [0 5]", out)
				}
			},
		},
		{
			name: "removed",
			run: func(t *testing.T, e *zmqEnv) {
				e.publish(removed(102))
				wait.For(t, waitLimit, "removal", func() bool { return !e.x.Contains(zep, 102) })
				out := make([]int, 2)
				e.x.Match(baseKeys, out)
				if out[zep] != 1 {
					t.Errorf("Match after removing the middle block: got %d, want 1", out[zep])
				}
			},
		},
		{
			name: "all_blocks_cleared",
			run: func(t *testing.T, e *zmqEnv) {
				e.publish(cleared())
				wait.For(t, waitLimit, "clear", func() bool { return e.x.Blocks(zep) == 0 })
			},
			wantResyncs: 1, wantReason: ReasonCleared,
		},
		{
			name: "unrecoverable_gap_clears",
			run: func(t *testing.T, e *zmqEnv) {
				// Sequence numbers lost inside the engine: replay cannot
				// restore them.
				e.pub.SkipSeq(3)
				e.publish(stored(testBS, 200))
				wait.For(t, waitLimit, "block after the gap", func() bool { return e.x.Contains(zep, 200) })
				if !holdsNone(e.x, zep, baseKeys...) {
					t.Error("blocks from before the gap survived it")
				}
			},
			wantResyncs: 1, wantReason: ReasonGap,
		},
		{
			name: "gap_filled_by_replay_keeps",
			run: func(t *testing.T, e *zmqEnv) {
				// A batch lost on the wire but kept for replay: the
				// subscriber fetches it before delivering the next one.
				if _, err := e.pub.PublishDropped(encode(t, e.enc, removed(103))); err != nil {
					t.Fatalf("PublishDropped: %v", err)
				}
				e.publish(stored(testBS, 200))
				wait.For(t, waitLimit, "block after the repaired gap", func() bool { return e.x.Contains(zep, 200) })
				if e.x.Contains(zep, 103) || !holdsAll(e.x, zep, 101, 102) {
					t.Errorf("after replay: got keys %v, want 101, 102, 200", e.x.Keys(zep, 0))
				}
			},
		},
		{
			name: "malformed_dropped_and_cleared",
			run: func(t *testing.T, e *zmqEnv) {
				e.publishRaw([]byte{0x93, 0xc1, 0x00})
				wait.For(t, waitLimit, "malformed count", func() bool { return e.g.State().Malformed == 1 })
				e.sync(300)
				if !holdsNone(e.x, zep, baseKeys...) {
					t.Error("inventory kept across a lost batch")
				}
			},
			wantResyncs: 1, wantReason: ReasonMalformed,
		},
		{
			name: "bad_event_rejects_whole_batch",
			run: func(t *testing.T, e *zmqEnv) {
				// A store followed by an event of an unknown type: nothing of
				// the batch may be applied.
				p := encode(t, e.enc, stored(testBS, 400), cleared())
				p = bytes.Replace(p, []byte("AllBlocksCleared"), []byte("AllBlocksClearex"), 1)
				e.publishRaw(p)
				wait.For(t, waitLimit, "malformed count", func() bool { return e.g.State().Malformed == 1 })
				e.sync(401)
				if e.x.Contains(zep, 400) {
					t.Error("half of a rejected batch was applied")
				}
			},
			wantResyncs: 1, wantReason: ReasonMalformed,
		},
		{
			name: "other_media_and_sizes_skipped",
			run: func(t *testing.T, e *zmqEnv) {
				cpu := "CPU"
				ev := stored(testBS, 500)
				ev.Medium = &cpu
				rm := removed(101)
				rm.Medium = &cpu
				partial := stored(testBS/2, 501)
				e.publish(ev, rm, partial)
				e.sync(502)
				if e.x.Contains(zep, 500) || e.x.Contains(zep, 501) || !e.x.Contains(zep, 101) {
					t.Errorf("got keys %v, want the CPU-tier events and the partial page ignored", e.x.Keys(zep, 0))
				}
				if got := e.g.State().Skipped; got != 3 {
					t.Errorf("Skipped: got %d, want 3", got)
				}
			},
		},
		{
			name: "publisher_restart_clears_and_rebuilds",
			run: func(t *testing.T, e *zmqEnv) {
				// Move the stream well past what the new publisher will
				// send, so that its restarted sequence is a regression.
				for range 100 {
					e.publish(stored(testBS, baseKeys...))
				}
				wait.For(t, waitLimit, "seq 100", func() bool { return e.g.State().LastSeq >= 100 })
				if err := e.pub.Close(); err != nil {
					t.Fatalf("Close: %v", err)
				}
				e.pub = startPub(t, e.endpoint, e.replay)
				e.pumpUntil("rebuilt inventory", func() bool { return e.x.Contains(zep, 600) }, stored(testBS, 600))
				if !holdsNone(e.x, zep, baseKeys...) {
					t.Errorf("got keys %v, want the old publisher's blocks gone", e.x.Keys(zep, 0))
				}
				if st := e.g.State(); st.LastSeq >= 100 {
					t.Errorf("LastSeq: got %d, want the new publisher's", st.LastSeq)
				}
			},
			wantResyncs: 1, wantReason: ReasonRestart, altReason: ReasonRegress,
		},
		{
			name: "restart_that_caught_up_clears",
			run: func(t *testing.T, e *zmqEnv) {
				// The new publisher races past the old sequence number before
				// the subscriber reconnects: sequence numbers alone look
				// continuous, but the replay buffer no longer holds the
				// last applied batch.
				last := e.g.State().LastSeq
				if err := e.pub.Close(); err != nil {
					t.Fatalf("Close: %v", err)
				}
				e.pub = startPub(t, e.endpoint, e.replay)
				for i := range last + 5 {
					e.publish(stored(testBS, uint64(700+i)))
				}
				e.pumpUntil("rebuilt inventory", func() bool { return e.x.Contains(zep, 800) }, stored(testBS, 800))
				if !holdsNone(e.x, zep, baseKeys...) {
					t.Errorf("got keys %v, want the old publisher's blocks gone", e.x.Keys(zep, 0))
				}
			},
			wantResyncs: 1, wantReason: ReasonRestart, altReason: ReasonRegress,
		},
	}
	for _, enc := range []kvevents.Encoding{kvevents.Map, kvevents.ArrayV011} {
		for _, tc := range cases {
			t.Run(enc.String()+"/"+tc.name, func(t *testing.T) {
				e := newZMQEnv(t, enc)
				tc.run(t, e)
				st := e.g.State()
				reasonOK := st.LastResyncReason == tc.wantReason || tc.altReason != "" && st.LastResyncReason == tc.altReason
				if st.Resyncs != tc.wantResyncs || !reasonOK {
					t.Errorf("resyncs: got %d (%q), want %d (%q)", st.Resyncs, st.LastResyncReason, tc.wantResyncs, tc.wantReason)
				}
				if n := e.x.Blocks(0); n != 0 {
					t.Errorf("endpoint 0 got %d blocks, want 0", n)
				}
			})
		}
	}
}

// TestIngestSGLangRanksMerge feeds two DP-rank streams into one endpoint:
// the inventory is their union, and a clear on one rank clears both.
func TestIngestSGLangRanksMerge(t *testing.T) {
	p0 := startPub(t, "tcp://127.0.0.1:0", "tcp://127.0.0.1:0")
	p1 := startPub(t, "tcp://127.0.0.1:0", "")
	x := New(1, 100)
	g, err := NewIngester(IngestConfig{
		Engine: engines.SGLang, Endpoint: 0,
		ZMQ:    []string{tcpOf(p0.Addr()), tcpOf(p1.Addr())},
		Replay: []string{tcpOf(p0.ReplayAddr()), ""},
	}, x)
	if err != nil {
		t.Fatalf("NewIngester: %v", err)
	}
	runIngester(t, g)
	pump := func(p *kvevents.Publisher, what string, cond func() bool, evs ...kvevents.Event) {
		payload := encode(t, kvevents.ArraySGLang, evs...)
		wait.For(t, waitLimit, what, func() bool {
			if cond() {
				return true
			}
			_, _ = p.Publish(payload)
			return false
		})
	}
	pump(p0, "rank 0 blocks", func() bool { return holdsAll(x, 0, 1, 2) }, stored(testBS, 1, 2))
	// SGLang publishes hashes as signed int64; the index compares bit patterns.
	neg := uint64(1) << 63
	pump(p1, "rank 1 blocks", func() bool { return holdsAll(x, 0, 3, neg) }, stored(testBS, 3, neg))
	if got := x.Blocks(0); got != 4 {
		t.Errorf("union: got %d blocks, want 4", got)
	}
	if st := g.State(); !st.Connected || len(st.Streams) != 2 {
		t.Errorf("state: got %+v, want two connected streams", st)
	}
	if _, err := p1.Publish(encode(t, kvevents.ArraySGLang, cleared())); err != nil {
		t.Fatalf("Publish: %v", err)
	}
	wait.For(t, waitLimit, "union cleared", func() bool { return x.Blocks(0) == 0 })
	if st := g.State(); st.LastResyncReason != ReasonCleared {
		t.Errorf("reason: got %q, want %q", st.LastResyncReason, ReasonCleared)
	}
}

func TestNewIngesterRejects(t *testing.T) {
	x := New(2, 10)
	cases := []struct {
		name string
		cfg  IngestConfig
	}{
		{"unknown_engine", IngestConfig{Engine: "llamacpp", ZMQ: []string{"tcp://127.0.0.1:1"}}},
		{"endpoint_out_of_range", IngestConfig{Engine: engines.VLLM, Endpoint: 2, ZMQ: []string{"tcp://127.0.0.1:1"}}},
		{"negative_endpoint", IngestConfig{Engine: engines.VLLM, Endpoint: -1, ZMQ: []string{"tcp://127.0.0.1:1"}}},
		{"no_zmq", IngestConfig{Engine: engines.SGLang}},
		{"zmq_without_transport", IngestConfig{Engine: engines.VLLM, ZMQ: []string{"127.0.0.1:5557"}}},
		{"replay_count_mismatch", IngestConfig{Engine: engines.SGLang, ZMQ: []string{"tcp://a:1", "tcp://a:2"}, Replay: []string{"tcp://a:3"}}},
		{"trt_without_block_size", IngestConfig{Engine: engines.TRTLLM, HTTPBase: "http://127.0.0.1:1"}},
		{"trt_bad_url", IngestConfig{Engine: engines.TRTLLM, HTTPBase: "127.0.0.1:1", BlockSize: 16}},
		{"trt_ftp_url", IngestConfig{Engine: engines.TRTLLM, HTTPBase: "ftp://127.0.0.1:1", BlockSize: 16}},
		{"negative_block_size", IngestConfig{Engine: engines.VLLM, BlockSize: -1, ZMQ: []string{"tcp://127.0.0.1:1"}}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			if _, err := NewIngester(tc.cfg, x); !errors.Is(err, ErrConfig) {
				t.Errorf("NewIngester: got %v, want ErrConfig", err)
			}
		})
	}
	if _, err := NewIngester(IngestConfig{Engine: engines.VLLM, ZMQ: []string{"tcp://127.0.0.1:1"}}, nil); !errors.Is(err, ErrConfig) {
		t.Errorf("nil index: got %v, want ErrConfig", err)
	}
}
