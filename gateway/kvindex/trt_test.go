package kvindex

import (
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/llmgw/llmgw/engines"
	"github.com/llmgw/llmgw/engines/kvevents"
	"github.com/llmgw/llmgw/engines/kvhash"
	"github.com/llmgw/llmgw/engines/sim"
	"github.com/llmgw/llmgw/internal/wait"
)

func seqTokens(from, n int) []uint32 {
	out := make([]uint32, n)
	for i := range out {
		out[i] = uint32(from + i)
	}
	return out
}

func newTRTIngester(t *testing.T, x *Index, base string, bs int) *Ingester {
	t.Helper()
	g, err := NewIngester(IngestConfig{
		Engine: engines.TRTLLM, HTTPBase: base, BlockSize: bs,
		PollMin: time.Millisecond, PollMax: 5 * time.Millisecond,
		AdmissionRetry: 10 * time.Millisecond, AdmissionRecheck: 20 * time.Millisecond,
		HTTPClient: httpClient(t),
	}, x)
	if err != nil {
		t.Fatalf("NewIngester: %v", err)
	}
	return g
}

// TestIngestSimTRT polls the simulator's TensorRT-LLM persona: stored runs
// (from the root and chained from a cached parent) are indexed under the
// SGLang-chain routing keys kvhash computes for the prompt's tokens, removals
// are translated back through the engine hashes, and an engine restart
// ("created") clears.
func TestIngestSimTRT(t *testing.T) {
	const bs = 32
	s := startSim(t, sim.Config{Engine: engines.TRTLLM, BlockSize: bs})
	base := "http://" + s.Addrs().HTTP
	c := httpClient(t)
	x := New(1, 10000)
	g := newTRTIngester(t, x, base, bs)
	runIngester(t, g)
	wait.For(t, waitLimit, "admission", func() bool { return g.State().Admission == AdmissionAdmitted })
	h, err := kvhash.New(kvhash.BlockHashTRTLLM, bs, "")
	if err != nil {
		t.Fatalf("kvhash.New: %v", err)
	}
	complete := func(ids []uint32) {
		postJSON(t, c, base+"/v1/completions", map[string]any{"model": "Qwen/Qwen3-0.6B", "prompt": ids, "max_tokens": 2}, nil)
	}

	p1 := seqTokens(1000, 4*bs+5)
	want1 := h.BlockKeys(nil, p1)
	complete(p1)
	wait.For(t, waitLimit, "first prompt's blocks", func() bool { return holdsAll(x, 0, want1...) })
	if got := x.Blocks(0); got != len(want1) {
		t.Errorf("Blocks: got %d, want %d", got, len(want1))
	}

	// Shares two blocks with p1: the engine stores only the new blocks,
	// with parent_hash naming its own hash of block 2.
	p2 := append(slices.Clone(p1[:2*bs]), seqTokens(50000, 3*bs)...)
	want2 := h.BlockKeys(nil, p2)
	complete(p2)
	wait.For(t, waitLimit, "second prompt's blocks", func() bool { return holdsAll(x, 0, want2...) })
	out := make([]int, 1)
	x.Match(want2, out)
	if out[0] != len(want2) {
		t.Errorf("Match(second prompt): got %d, want %d", out[0], len(want2))
	}
	if got, want := x.Blocks(0), len(want1)+len(want2)-2; got != want {
		t.Errorf("Blocks: got %d, want %d", got, want)
	}

	// reset_cache makes TRT report every block removed.
	postJSON(t, c, base+"/_sim/reset_cache", map[string]any{}, nil)
	wait.For(t, waitLimit, "removals", func() bool { return x.Blocks(0) == 0 })
	if st := g.State(); st.Resyncs != 0 || st.Dropped != 0 {
		t.Errorf("before restart: got %+v, want no resync and nothing dropped", st)
	}

	complete(p1)
	wait.For(t, waitLimit, "blocks before restart", func() bool { return holdsAll(x, 0, want1...) })
	postJSON(t, c, base+"/_sim/faults", map[string]any{"restart_publisher": true}, nil)
	wait.For(t, waitLimit, "restart seen", func() bool { return g.State().Resyncs == 1 })
	if got := x.Blocks(0); got != 0 {
		t.Errorf("after restart: got %d blocks, want 0", got)
	}
	if st := g.State(); st.LastResyncReason != ReasonCreated {
		t.Errorf("reason: got %q, want %q", st.LastResyncReason, ReasonCreated)
	}
	// Admission is asked again after a restart, then indexing resumes.
	complete(p2)
	wait.For(t, waitLimit, "blocks after restart", func() bool { return holdsAll(x, 0, want2...) })
	if st := g.State(); st.Admission != AdmissionAdmitted || !st.Connected {
		t.Errorf("state: got %+v, want admitted and connected", st)
	}
}

func TestIngestSimTRTAdmissionRefused(t *testing.T) {
	s := startSim(t, sim.Config{Engine: engines.TRTLLM, BlockSize: 32})
	base := "http://" + s.Addrs().HTTP
	g := newTRTIngester(t, New(1, 100), base, 16)
	runIngester(t, g)
	want := "refused: tokens_per_block 32 != kvBlockSize 16"
	wait.For(t, waitLimit, "refusal", func() bool { return g.State().Admission == want })
	// Re-checks keep refusing, and nothing was drained: the engine's first
	// event is still queued for whoever is admitted.
	polls := 0
	wait.For(t, waitLimit, "several re-checks", func() bool { polls++; return polls > 5 })
	if got := g.State().Admission; got != want {
		t.Errorf("admission: got %q, want %q", got, want)
	}
	c := httpClient(t)
	resp, err := c.Post(base+"/kv_cache_events", "application/json", nil)
	if err != nil {
		t.Fatalf("POST /kv_cache_events: %v", err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if !strings.Contains(string(body), `"created"`) {
		t.Errorf("queued events: got %s, want the undrained created event", body)
	}
}

func TestTRTSoleConsumer(t *testing.T) {
	s := startSim(t, sim.Config{Engine: engines.TRTLLM, BlockSize: 32})
	base := "http://" + s.Addrs().HTTP
	x := New(2, 100)
	early := newTRTIngester(t, x, base, 32) // built before anyone runs
	first := newTRTIngester(t, x, base, 32)
	runIngester(t, first)
	wait.For(t, waitLimit, "first admitted", func() bool { return first.State().Admission == AdmissionAdmitted })

	cases := []struct {
		name string
		base string
	}{
		{"same_url", base},
		{"trailing_slash_and_case", "HTTP://" + strings.ToUpper(s.Addrs().HTTP) + "/"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			_, err := NewIngester(IngestConfig{Engine: engines.TRTLLM, Endpoint: 1, HTTPBase: tc.base, BlockSize: 32}, x)
			if !errors.Is(err, ErrSoleConsumer) {
				t.Errorf("NewIngester: got %v, want ErrSoleConsumer", err)
			}
		})
	}
	t.Run("run_of_an_earlier_ingester", func(t *testing.T) {
		if err := early.Run(t.Context()); !errors.Is(err, ErrSoleConsumer) {
			t.Errorf("Run: got %v, want ErrSoleConsumer", err)
		}
	})
	t.Run("second_run_of_the_same_ingester", func(t *testing.T) {
		if err := first.Run(t.Context()); !errors.Is(err, ErrRunning) {
			t.Errorf("Run: got %v, want ErrRunning", err)
		}
	})
}

// scriptedTRT is a /kv_cache_events server that answers the scripted bodies
// in order, then empty arrays; /server_info reports tokens_per_block.
type scriptedTRT struct {
	srv    *httptest.Server
	mu     sync.Mutex
	bodies [][]byte
	polls  atomic.Int64
}

func newScriptedTRT(t *testing.T, tokensPerBlock int, bodies ...[]byte) *scriptedTRT {
	t.Helper()
	st := &scriptedTRT{bodies: bodies}
	mux := http.NewServeMux()
	mux.HandleFunc("GET /server_info", func(w http.ResponseWriter, r *http.Request) {
		_ = json.NewEncoder(w).Encode(map[string]any{"tokens_per_block": tokensPerBlock, "kv_cache_hash_algo": "v1_block_key"})
	})
	mux.HandleFunc("POST /kv_cache_events", func(w http.ResponseWriter, r *http.Request) {
		st.mu.Lock()
		body := []byte("[]")
		if len(st.bodies) > 0 {
			body, st.bodies = st.bodies[0], st.bodies[1:]
		}
		st.mu.Unlock()
		st.polls.Add(1)
		_, _ = w.Write(body)
	})
	st.srv = httptest.NewServer(mux)
	t.Cleanup(st.srv.Close)
	return st
}

// trtBlock builds a stored block of tokens with TRT's own engine hash.
func trtBlock(parent uint64, tokens []uint32) kvevents.TRTStoredBlock {
	b := kvevents.TRTStoredBlock{BlockHash: kvevents.TRTHash{Value: kvhash.TRTLLMBlockKey(parent, tokens)}}
	for _, tk := range tokens {
		b.Tokens = append(b.Tokens, kvevents.TRTToken{TokenID: tk})
	}
	return b
}

func trtBody(t *testing.T, evs ...kvevents.TRTEvent) []byte {
	t.Helper()
	for i := range evs {
		if evs[i].WindowSize == 0 {
			evs[i].WindowSize = 4096
		}
	}
	b, err := kvevents.MarshalTRTEvents(evs)
	if err != nil {
		t.Fatalf("MarshalTRTEvents: %v", err)
	}
	return b
}

func TestIngestTRTRules(t *testing.T) {
	const bs = 4
	h, err := kvhash.New(kvhash.BlockHashTRTLLM, bs, "")
	if err != nil {
		t.Fatalf("kvhash.New: %v", err)
	}
	a, b, c := seqTokens(1, bs), seqTokens(11, bs), seqTokens(21, bs)
	ka := trtBlock(0, a)
	kb := trtBlock(ka.BlockHash.Value, b)
	kc := trtBlock(kb.BlockHash.Value, c)
	keys := h.BlockKeys(nil, slices.Concat(a, b, c)) // routing keys of a, a+b, a+b+c
	hash := func(v uint64) *kvevents.TRTHash { return &kvevents.TRTHash{Value: v} }
	created := kvevents.TRTEvent{EventID: 0, Data: kvevents.TRTEventData{Type: kvevents.TRTCreated, NumBlocksPerCacheLevel: []int64{100, 0}}}
	storedEv := func(id uint64, parent *kvevents.TRTHash, blocks ...kvevents.TRTStoredBlock) kvevents.TRTEvent {
		return kvevents.TRTEvent{EventID: id, Data: kvevents.TRTEventData{Type: kvevents.TRTStored, ParentHash: parent, Blocks: blocks}}
	}
	removedEv := func(id uint64, hs ...uint64) kvevents.TRTEvent {
		d := kvevents.TRTEventData{Type: kvevents.TRTRemoved}
		for _, v := range hs {
			d.BlockHashes = append(d.BlockHashes, kvevents.TRTHash{Value: v})
		}
		return kvevents.TRTEvent{EventID: id, Data: d}
	}
	withExtra := kb
	withExtra.Tokens = slices.Clone(kb.Tokens)
	withExtra.Tokens[1].TokenExtraID = 7
	salted := kb
	salted.CacheSalt = json.RawMessage(`"tenant-a"`)
	mm := kb
	mm.MMKeys = json.RawMessage(`[["abc", 0]]`)
	emptyMM := kb
	emptyMM.MMKeys = json.RawMessage(`[]`)
	lora := kb
	one := int64(1)
	lora.LoraID = &one
	short := trtBlock(ka.BlockHash.Value, b[:bs-1])

	cases := []struct {
		name    string
		maxBody int64
		bodies  [][]byte
		want    []uint64 // keys held at the end (any order)
		dropped uint64
		skipped uint64
		malf    uint64
		reason  string // last resync reason, "" = none
	}{
		{
			name:   "root_run_then_chained_run",
			bodies: [][]byte{trtBody(t, created, storedEv(1, nil, ka)), trtBody(t, storedEv(2, hash(ka.BlockHash.Value), kb, kc))},
			want:   keys,
		},
		{
			name:    "unknown_parent_dropped",
			bodies:  [][]byte{trtBody(t, created, storedEv(1, hash(999), kb))},
			dropped: 1,
		},
		{
			name:   "removed_translated_through_engine_hash",
			bodies: [][]byte{trtBody(t, created, storedEv(1, nil, ka, kb, kc), removedEv(2, kc.BlockHash.Value, 12345))},
			want:   keys[:2],
		},
		{
			name:    "extra_token_id_stops_the_walk",
			bodies:  [][]byte{trtBody(t, created, storedEv(1, nil, ka, withExtra, kc))},
			want:    keys[:1],
			skipped: 2,
		},
		{"cache_salt_stops", 0, [][]byte{trtBody(t, created, storedEv(1, nil, ka, salted, kc))}, keys[:1], 0, 2, 0, ""},
		{"mm_keys_stop", 0, [][]byte{trtBody(t, created, storedEv(1, nil, ka, mm))}, keys[:1], 0, 1, 0, ""},
		{"empty_mm_keys_are_absent", 0, [][]byte{trtBody(t, created, storedEv(1, nil, ka, emptyMM))}, keys[:2], 0, 0, 0, ""},
		{"lora_stops", 0, [][]byte{trtBody(t, created, storedEv(1, nil, ka, lora))}, keys[:1], 0, 1, 0, ""},
		{"short_block_stops", 0, [][]byte{trtBody(t, created, storedEv(1, nil, ka, short))}, keys[:1], 0, 1, 0, ""},
		{
			name: "other_window_skipped",
			bodies: [][]byte{trtBody(t, created, storedEv(1, nil, ka), kvevents.TRTEvent{EventID: 2, WindowSize: 512,
				Data: kvevents.TRTEventData{Type: kvevents.TRTStored, ParentHash: hash(ka.BlockHash.Value), Blocks: []kvevents.TRTStoredBlock{kb}}})},
			want:    keys[:1],
			skipped: 1,
		},
		{
			name: "updated_is_a_no_op",
			bodies: [][]byte{trtBody(t, created, storedEv(1, nil, ka), kvevents.TRTEvent{EventID: 2,
				Data: kvevents.TRTEventData{Type: kvevents.TRTUpdated, BlockHash: ka.BlockHash, CacheLevel: &kvevents.TRTEventDiff{NewValue: 1}}})},
			want:    keys[:1],
			skipped: 1,
		},
		{
			name:   "event_id_gap_clears",
			bodies: [][]byte{trtBody(t, created, storedEv(1, nil, ka)), trtBody(t, storedEv(5, hash(ka.BlockHash.Value), kb))},
			// The clear empties the chain map too: kb names a parent that
			// is no longer known, so it is dropped.
			want:   nil,
			reason: ReasonGap, dropped: 1,
		},
		{
			name:   "malformed_body_clears",
			bodies: [][]byte{trtBody(t, created, storedEv(1, nil, ka)), []byte(`[{"event_id": x}]`), trtBody(t, storedEv(2, nil, ka))},
			want:   keys[:1],
			malf:   1, reason: ReasonMalformed,
		},
		{
			name:    "oversize_body_clears",
			maxBody: 600,
			bodies:  [][]byte{trtBody(t, created, storedEv(1, nil, ka)), trtBody(t, storedEv(2, hash(ka.BlockHash.Value), kb, kc, kc, kc, kc))},
			malf:    1, reason: ReasonOversize,
		},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			srv := newScriptedTRT(t, bs, tc.bodies...)
			x := New(1, 100)
			g, err := NewIngester(IngestConfig{
				Engine: engines.TRTLLM, HTTPBase: srv.srv.URL, BlockSize: bs, MaxResponseBytes: tc.maxBody,
				PollMin: time.Millisecond, PollMax: 2 * time.Millisecond, HTTPClient: httpClient(t),
			}, x)
			if err != nil {
				t.Fatalf("NewIngester: %v", err)
			}
			runIngester(t, g)
			// Bodies are applied before the next poll is made.
			wait.For(t, waitLimit, "script consumed", func() bool { return srv.polls.Load() > int64(len(tc.bodies)) })
			got := x.Keys(0, 0)
			slices.Sort(got)
			want := slices.Sorted(slices.Values(tc.want))
			if !slices.Equal(got, want) && !(len(got) == 0 && len(want) == 0) {
				t.Errorf("keys: got %v, want %v", got, want)
			}
			st := g.State()
			if st.Dropped != tc.dropped || st.Skipped != tc.skipped || st.Malformed != tc.malf {
				t.Errorf("counters: got dropped %d skipped %d malformed %d, want %d %d %d", st.Dropped, st.Skipped, st.Malformed, tc.dropped, tc.skipped, tc.malf)
			}
			if st.LastResyncReason != tc.reason {
				t.Errorf("resync reason: got %q, want %q", st.LastResyncReason, tc.reason)
			}
		})
	}
}

// TestIngestTRTToleratesOneBadEvent: the drain is destructive, so one bad
// event must not cost the others. An event without window_size (executors
// before variable sliding-window attention) is applied; a malformed event
// is rejected and counted alone, its id still advancing the sequence.
func TestIngestTRTToleratesOneBadEvent(t *testing.T) {
	const bs = 4
	h, err := kvhash.New(kvhash.BlockHashTRTLLM, bs, "")
	if err != nil {
		t.Fatalf("kvhash.New: %v", err)
	}
	a, b := seqTokens(1, bs), seqTokens(11, bs)
	ka := trtBlock(0, a)
	kb := trtBlock(ka.BlockHash.Value, b)
	keys := h.BlockKeys(nil, slices.Concat(a, b))
	created := kvevents.TRTEvent{EventID: 0, Data: kvevents.TRTEventData{Type: kvevents.TRTCreated, NumBlocksPerCacheLevel: []int64{100, 0}}}
	stored := func(id uint64, parent *kvevents.TRTHash, blk kvevents.TRTStoredBlock) kvevents.TRTEvent {
		return kvevents.TRTEvent{EventID: id, Data: kvevents.TRTEventData{Type: kvevents.TRTStored, ParentHash: parent, Blocks: []kvevents.TRTStoredBlock{blk}}}
	}
	first := trtBody(t, created, stored(1, nil, ka))
	second := trtBody(t, stored(3, &kvevents.TRTHash{Value: ka.BlockHash.Value}, kb))
	// join splices raw JSON elements between two bodies' events.
	join := func(mid string) []byte {
		return []byte(string(first[:len(first)-1]) + "," + mid + "," + string(second[1:]))
	}
	noWindow := func(body []byte) []byte { return bytes.ReplaceAll(body, []byte(`,"window_size":4096`), nil) }
	cases := []struct {
		name      string
		body      []byte
		want      []uint64
		malfEvent uint64
	}{
		{name: "missing_window_size_applied", body: noWindow(trtBody(t, created, stored(1, nil, ka), stored(2, &kvevents.TRTHash{Value: ka.BlockHash.Value}, kb))), want: keys},
		{name: "bad_hash_rejected_alone", body: join(`{"event_id":2,"data":{"type":"removed","block_hashes":[1.5]},"window_size":4096}`), want: keys, malfEvent: 1},
		{name: "bad_event_id_rejected_alone", body: join(`{"event_id":"two","data":{"type":"removed","block_hashes":[]}}`), want: keys, malfEvent: 1},
		{name: "two_bad_events", body: join(`{"event_id":2,"data":{"type":"stored"}},{"event_id":2,"data":null}`), want: keys, malfEvent: 2},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			srv := newScriptedTRT(t, bs, tc.body)
			x := New(1, 100)
			g, err := NewIngester(IngestConfig{
				Engine: engines.TRTLLM, HTTPBase: srv.srv.URL, BlockSize: bs,
				PollMin: time.Millisecond, PollMax: 2 * time.Millisecond, HTTPClient: httpClient(t),
			}, x)
			if err != nil {
				t.Fatalf("NewIngester: %v", err)
			}
			runIngester(t, g)
			wait.For(t, waitLimit, "script consumed", func() bool { return srv.polls.Load() > 1 })
			got := x.Keys(0, 0)
			slices.Sort(got)
			if want := slices.Sorted(slices.Values(tc.want)); !slices.Equal(got, want) {
				t.Errorf("keys: got %v, want %v", got, want)
			}
			st := g.State()
			if st.MalformedEvents != tc.malfEvent || st.Malformed != 0 || st.Resyncs != 0 {
				t.Errorf("malformed events %d batches %d resyncs %d (%s); want %d 0 0", st.MalformedEvents, st.Malformed, st.Resyncs, st.LastResyncReason, tc.malfEvent)
			}
		})
	}
}

func TestNextPoll(t *testing.T) {
	const lo, hi = 4 * time.Millisecond, 20 * time.Millisecond
	cases := []struct {
		name   string
		cur    time.Duration
		events bool
		want   time.Duration
	}{
		{"events_reset_to_min", 18 * time.Millisecond, true, lo},
		{"empty_grows_by_half", lo, false, 6 * time.Millisecond},
		{"empty_grows_again", 6 * time.Millisecond, false, 9 * time.Millisecond},
		{"empty_capped_at_max", 16 * time.Millisecond, false, hi},
		{"empty_at_max_stays", hi, false, hi},
		{"below_min_is_raised", time.Millisecond, false, lo},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			if got := nextPoll(tc.cur, lo, hi, tc.events); got != tc.want {
				t.Errorf("nextPoll(%v, events=%v): got %v, want %v", tc.cur, tc.events, got, tc.want)
			}
		})
	}
}
