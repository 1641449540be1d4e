package kvindex

import (
	"slices"
	"testing"
	"time"

	"github.com/llmgw/llmgw/engines"
	"github.com/llmgw/llmgw/engines/kvevents"
	"github.com/llmgw/llmgw/engines/kvhash"
)

// checkConsistent verifies the Index invariants every apply path must keep:
// Blocks equals the number of distinct keys listed, and each listed key is
// found both by Contains and by Match.
func checkConsistent(t *testing.T, x *Index, ep int) []uint64 {
	t.Helper()
	keys := x.Keys(ep, 0)
	if got := x.Blocks(ep); got != len(keys) {
		t.Fatalf("Blocks: got %d, want %d (listed keys)", got, len(keys))
	}
	sorted := slices.Clone(keys)
	slices.Sort(sorted)
	if len(slices.Compact(sorted)) != len(keys) {
		t.Fatalf("Keys lists duplicates: %v", keys)
	}
	out := make([]int, x.Endpoints())
	for _, k := range keys {
		if !x.Contains(ep, k) {
			t.Fatalf("listed key %d not contained", k)
		}
		x.Match([]uint64{k}, out)
		if out[ep] != 1 {
			t.Fatalf("Match([%d]): got %d, want 1", k, out[ep])
		}
	}
	return keys
}

// FuzzHandleBatch feeds arbitrary payloads and sequence numbers through the
// ZMQ application path after a valid batch: it must never panic, a batch
// that does not decode must leave the endpoint empty (cleared, nothing
// applied), and the Index must stay consistent.
func FuzzHandleBatch(f *testing.F) {
	seedEvents := []kvevents.Event{stored(4, 1, 2, 3), removed(2), cleared(), stored(4, 1<<63, 7)}
	for _, enc := range []kvevents.Encoding{kvevents.ArrayV011, kvevents.ArrayLate, kvevents.Map, kvevents.ArraySGLang} {
		f.Add(uint64(1), encode(f, enc, seedEvents...))
		f.Add(uint64(1), encode(f, enc, seedEvents[0]))
	}
	f.Add(uint64(5), []byte{0x93, 0xcb})
	f.Add(uint64(0), []byte{})
	f.Add(uint64(1<<63), []byte{0x90})
	f.Add(uint64(1), []byte{0x92, 0xcb, 0, 0, 0, 0, 0, 0, 0, 0, 0x91, 0x91, 0xa0})
	base := encode(f, kvevents.Map, stored(4, 100, 101))
	f.Fuzz(func(t *testing.T, seq uint64, payload []byte) {
		x := New(2, 64)
		g, err := NewIngester(IngestConfig{Engine: engines.VLLM, Endpoint: 1, ZMQ: []string{"tcp://127.0.0.1:1"}, BlockSize: 4}, x)
		if err != nil {
			t.Fatalf("NewIngester: %v", err)
		}
		g.handleBatch(0, 0, base)
		g.handleBatch(0, seq, payload)
		var b kvevents.Batch
		_, decErr := kvevents.DecodeBatch(payload, &b)
		st := g.State()
		if decErr != nil {
			if st.Malformed != 1 || x.Blocks(1) != 0 {
				t.Fatalf("undecodable batch: got malformed %d, blocks %d; want 1 and 0", st.Malformed, x.Blocks(1))
			}
		} else if seq <= 1<<63-1 && st.Malformed != 0 {
			t.Fatalf("decodable batch counted malformed")
		}
		checkConsistent(t, x, 1)
		if x.Blocks(0) != 0 {
			t.Fatalf("endpoint 0 touched")
		}
	})
}

// FuzzTRTBody feeds arbitrary /kv_cache_events bodies to the TRT application
// path after a valid drain: no panic, a consistent Index, and every indexed
// key still reachable through the chain map (otherwise a later removal could
// not find it and the block would stay forever).
func FuzzTRTBody(f *testing.F) {
	const bs = 4
	a, b := seqTokens(1, bs), seqTokens(11, bs)
	ka := trtBlock(0, a)
	kb := trtBlock(ka.BlockHash.Value, b)
	body := func(evs ...kvevents.TRTEvent) []byte {
		for i := range evs {
			evs[i].WindowSize = 4096
		}
		out, err := kvevents.MarshalTRTEvents(evs)
		if err != nil {
			f.Fatalf("MarshalTRTEvents: %v", err)
		}
		return out
	}
	f.Add(body(kvevents.TRTEvent{EventID: 2, Data: kvevents.TRTEventData{Type: kvevents.TRTStored, ParentHash: &ka.BlockHash, Blocks: []kvevents.TRTStoredBlock{kb}}}))
	f.Add(body(kvevents.TRTEvent{EventID: 2, Data: kvevents.TRTEventData{Type: kvevents.TRTRemoved, BlockHashes: []kvevents.TRTHash{ka.BlockHash}}}))
	f.Add(body(kvevents.TRTEvent{EventID: 0, Data: kvevents.TRTEventData{Type: kvevents.TRTCreated, NumBlocksPerCacheLevel: []int64{1}}}))
	f.Add([]byte(`[{"event_id":9,"data":{"type":"stored","parent_hash":null,"blocks":[{"type":"stored_block","block_hash":"ab","tokens":[],"cache_level":0,"priority":0}]},"window_size":1}]`))
	f.Add([]byte(`[{"event_id":18446744073709551615,"data":{"type":"removed","block_hashes":[1]},"window_size":4096}]`))
	f.Add([]byte(`{`))
	start := body(
		kvevents.TRTEvent{EventID: 0, Data: kvevents.TRTEventData{Type: kvevents.TRTCreated, NumBlocksPerCacheLevel: []int64{8}}},
		kvevents.TRTEvent{EventID: 1, Data: kvevents.TRTEventData{Type: kvevents.TRTStored, Blocks: []kvevents.TRTStoredBlock{ka}}},
	)
	f.Fuzz(func(t *testing.T, payload []byte) {
		x := New(1, 16)
		g, err := NewIngester(IngestConfig{Engine: engines.TRTLLM, HTTPBase: "http://127.0.0.1:1", BlockSize: bs, MaxChain: 8, MaxResponseBytes: 1 << 16}, x)
		if err != nil {
			t.Fatalf("NewIngester: %v", err)
		}
		g.applyTRTBody(start)
		g.applyTRTBody(payload)
		keys := checkConsistent(t, x, 0)
		g.mu.Lock()
		defer g.mu.Unlock()
		inChain := map[uint64]bool{}
		for _, e := range g.trt.chain {
			inChain[e.key] = true
		}
		for _, k := range keys {
			if !inChain[k] {
				t.Fatalf("indexed key %d has no chain entry", k)
			}
		}
		if len(g.trt.chain) > 8 {
			t.Fatalf("chain map holds %d entries, cap 8", len(g.trt.chain))
		}
	})
}

// BenchmarkIngest measures the ZMQ application path without sockets: msgpack
// decode plus Index update, for realistic batches (vLLM: 4 requests of 16 new
// blocks each plus 16 single-block evictions per batch; SGLang: one event per
// page), into an endpoint at its cap so that evictions run too.
func BenchmarkIngest(b *testing.B) {
	const bs = 16
	mk := func(enc kvevents.Encoding, perEvent int, round int) []byte {
		var evs []kvevents.Event
		key := uint64(round) << 20
		for r := range 64 / perEvent {
			hs := make([]uint64, perEvent)
			for i := range hs {
				key++
				hs[i] = key*0x9e3779b97f4a7c15 | 1
			}
			ev := stored(bs, hs...)
			ev.TokenIDs = seqTokens(r*1000+round, bs*perEvent)
			gpu := "GPU"
			ev.Medium = &gpu
			if enc == kvevents.Map {
				ev.ExtraKeys = kvevents.NilExtraKeys(perEvent)
			}
			evs = append(evs, ev)
		}
		for i := range 16 {
			evs = append(evs, removed((uint64(round-1)<<20+uint64(i)+1)*0x9e3779b97f4a7c15|1))
		}
		return encode(b, enc, evs...)
	}
	for _, tc := range []struct {
		name     string
		engine   engines.Kind
		enc      kvevents.Encoding
		perEvent int
	}{
		{"vllm_map_16blocks_per_event", engines.VLLM, kvevents.Map, 16},
		{"vllm_array_16blocks_per_event", engines.VLLM, kvevents.ArrayV011, 16},
		{"sglang_array_1block_per_event", engines.SGLang, kvevents.ArraySGLang, 1},
	} {
		b.Run(tc.name, func(b *testing.B) {
			payloads := make([][]byte, 64)
			for i := range payloads {
				payloads[i] = mk(tc.enc, tc.perEvent, i+1)
			}
			x := New(8, 100_000)
			g, err := NewIngester(IngestConfig{Engine: tc.engine, ZMQ: []string{"tcp://127.0.0.1:1"}, BlockSize: bs}, x)
			if err != nil {
				b.Fatalf("NewIngester: %v", err)
			}
			var seq uint64
			blocks := 0
			b.ReportAllocs()
			b.ResetTimer()
			for b.Loop() {
				g.handleBatch(0, seq, payloads[seq%uint64(len(payloads))])
				seq++
				blocks += 64 + 16
			}
			b.ReportMetric(float64(blocks)/b.Elapsed().Seconds(), "blocks/s")
			if st := g.State(); st.Malformed != 0 || st.Resyncs != 0 {
				b.Fatalf("state: %+v", st)
			}
		})
	}
}

// BenchmarkTRTApply measures the TRT application path (JSON decode, SGLang
// chain hashing, Index update) for drains of 8 stored runs of 8 blocks.
func BenchmarkTRTApply(b *testing.B) {
	const bs = 32
	h, _ := kvhash.New(kvhash.BlockHashTRTLLM, bs, "")
	var evs []kvevents.TRTEvent
	for r := range 8 {
		var blocks []kvevents.TRTStoredBlock
		var parent uint64
		for i := range 8 {
			blk := trtBlock(parent, seqTokens(r*10000+i*bs, bs))
			parent = blk.BlockHash.Value
			blocks = append(blocks, blk)
		}
		evs = append(evs, kvevents.TRTEvent{EventID: uint64(r), WindowSize: 4096, Data: kvevents.TRTEventData{Type: kvevents.TRTStored, Blocks: blocks}})
	}
	x := New(1, 100_000)
	g, err := NewIngester(IngestConfig{Engine: engines.TRTLLM, HTTPBase: "http://127.0.0.1:1", BlockSize: bs, Hasher: h}, x)
	if err != nil {
		b.Fatalf("NewIngester: %v", err)
	}
	id := uint64(0)
	blocks := 0
	b.ReportAllocs()
	var applying time.Duration
	for b.Loop() {
		for i := range evs {
			evs[i].EventID = id
			id++
		}
		body, err := kvevents.MarshalTRTEvents(evs)
		if err != nil {
			b.Fatal(err)
		}
		start := time.Now()
		g.applyTRTBody(body)
		applying += time.Since(start)
		blocks += 64
	}
	// Only the apply path counts (encoding the test bodies does not).
	b.ReportMetric(float64(blocks)/applying.Seconds(), "blocks/s")
	if st := g.State(); st.Resyncs != 0 || st.Dropped != 0 || x.Blocks(0) == 0 {
		b.Fatalf("state: %+v, blocks %d", st, x.Blocks(0))
	}
}
