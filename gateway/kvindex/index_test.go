package kvindex

import (
	"math/rand/v2"
	"runtime"
	"slices"
	"sync"
	"testing"
)

// matchOf runs Match and returns ep's count.
func matchOf(x *Index, ep int, keys []uint64) int {
	out := make([]int, x.Endpoints())
	x.Match(keys, out)
	return out[ep]
}

type op struct {
	kind string // "store", "remove", "clear"
	ep   int
	keys []uint64
}

func TestIndexSemantics(t *testing.T) {
	cases := []struct {
		name   string
		eps    int
		limit  int
		ops    []op
		query  []uint64
		want   []int
		blocks []int
		keys   [][]uint64 // Keys(ep, 0): most recent first
	}{
		{
			name: "empty", eps: 2, limit: 8,
			query: []uint64{1, 2, 3}, want: []int{0, 0}, blocks: []int{0, 0},
			keys: [][]uint64{{}, {}},
		},
		{
			name: "full_prefix", eps: 2, limit: 8,
			ops:   []op{{"store", 0, []uint64{1, 2, 3}}},
			query: []uint64{1, 2, 3}, want: []int{3, 0}, blocks: []int{3, 0},
			keys: [][]uint64{{3, 2, 1}, {}},
		},
		{
			name: "prefix_not_membership", eps: 1, limit: 8,
			// Block 2 is missing: blocks 3 and 4 are held but the engine
			// would recompute them, so the hit is 1, not 3.
			ops:   []op{{"store", 0, []uint64{1, 3, 4}}},
			query: []uint64{1, 2, 3, 4}, want: []int{1}, blocks: []int{3},
			keys: [][]uint64{{4, 3, 1}},
		},
		{
			name: "first_block_missing", eps: 1, limit: 8,
			ops:   []op{{"store", 0, []uint64{2, 3}}},
			query: []uint64{1, 2, 3}, want: []int{0}, blocks: []int{2},
			keys: [][]uint64{{3, 2}},
		},
		{
			name: "remove_middle_cuts_prefix", eps: 1, limit: 8,
			ops:   []op{{"store", 0, []uint64{1, 2, 3}}, {"remove", 0, []uint64{2, 99}}},
			query: []uint64{1, 2, 3}, want: []int{1}, blocks: []int{2},
			keys: [][]uint64{{3, 1}},
		},
		{
			name: "clear_one_endpoint", eps: 2, limit: 8,
			ops: []op{
				{"store", 0, []uint64{1, 2}}, {"store", 1, []uint64{1, 2}},
				{"clear", 0, nil},
			},
			query: []uint64{1, 2}, want: []int{0, 2}, blocks: []int{0, 2},
			keys: [][]uint64{{}, {2, 1}},
		},
		{
			name: "store_after_clear", eps: 1, limit: 8,
			ops:   []op{{"store", 0, []uint64{1, 2}}, {"clear", 0, nil}, {"store", 0, []uint64{5}}},
			query: []uint64{5}, want: []int{1}, blocks: []int{1},
			keys: [][]uint64{{5}},
		},
		{
			name: "duplicates_count_once", eps: 1, limit: 8,
			ops:   []op{{"store", 0, []uint64{7, 7, 7}}},
			query: []uint64{7, 7}, want: []int{2}, blocks: []int{1},
			keys: [][]uint64{{7}},
		},
		{
			name: "key_zero", eps: 1, limit: 8,
			ops:   []op{{"store", 0, []uint64{0, 1}}},
			query: []uint64{0, 1, 2}, want: []int{2}, blocks: []int{2},
			keys: [][]uint64{{1, 0}},
		},
		{
			name: "only_key_zero", eps: 1, limit: 8,
			ops:   []op{{"store", 0, []uint64{0}}},
			query: []uint64{0, 0, 1}, want: []int{2}, blocks: []int{1},
			keys: [][]uint64{{0}},
		},
		{
			name: "key_zero_removed", eps: 1, limit: 8,
			ops:   []op{{"store", 0, []uint64{0, 1}}, {"remove", 0, []uint64{0}}},
			query: []uint64{0, 1}, want: []int{0}, blocks: []int{1},
			keys: [][]uint64{{1}},
		},
		{
			name: "cap_evicts_least_recent", eps: 1, limit: 3,
			ops:   []op{{"store", 0, []uint64{1, 2, 3}}, {"store", 0, []uint64{4}}},
			query: []uint64{1}, want: []int{0}, blocks: []int{3},
			keys: [][]uint64{{4, 3, 2}},
		},
		{
			name: "restore_refreshes_lru", eps: 1, limit: 3,
			// Re-storing 1 makes 2 the oldest, so 2 goes.
			ops:   []op{{"store", 0, []uint64{1, 2, 3}}, {"store", 0, []uint64{1}}, {"store", 0, []uint64{4}}},
			query: []uint64{1, 2}, want: []int{1}, blocks: []int{3},
			keys: [][]uint64{{4, 1, 3}},
		},
		{
			name: "empty_query", eps: 1, limit: 3,
			ops:   []op{{"store", 0, []uint64{1}}},
			query: nil, want: []int{0}, blocks: []int{1},
			keys: [][]uint64{{1}},
		},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			x := New(tc.eps, tc.limit)
			for _, o := range tc.ops {
				switch o.kind {
				case "store":
					x.Store(o.ep, o.keys)
				case "remove":
					x.Remove(o.ep, o.keys)
				case "clear":
					x.Clear(o.ep)
				}
			}
			got := make([]int, tc.eps)
			x.Match(tc.query, got)
			if !slices.Equal(got, tc.want) {
				t.Errorf("Match(%v): got %v, want %v", tc.query, got, tc.want)
			}
			for ep := range tc.eps {
				if got := matchOf(x, ep, tc.query); got != tc.want[ep] {
					t.Errorf("MatchOne(%d): got %d, want %d", ep, got, tc.want[ep])
				}
				if got := x.Blocks(ep); got != tc.blocks[ep] {
					t.Errorf("Blocks(%d): got %d, want %d", ep, got, tc.blocks[ep])
				}
				if got := x.Keys(ep, 0); !slices.Equal(got, tc.keys[ep]) {
					t.Errorf("Keys(%d): got %v, want %v", ep, got, tc.keys[ep])
				}
			}
		})
	}
}

func TestIndexEvictionCounted(t *testing.T) {
	x := New(1, 4)
	keys := make([]uint64, 10)
	for i := range keys {
		keys[i] = uint64(i + 100)
	}
	x.Store(0, keys)
	st := x.Stats(0)
	if st.Blocks != 4 || st.Evictions != 6 || st.Stored != 10 || st.MaxBlocks != 4 {
		t.Errorf("stats: got %+v, want 4 blocks, 6 evictions, 10 stored, cap 4", st)
	}
	if got, want := x.Keys(0, 2), []uint64{109, 108}; !slices.Equal(got, want) {
		t.Errorf("Keys(0, 2): got %v, want %v", got, want)
	}
	x.Remove(0, []uint64{109, 1})
	x.Clear(0)
	st = x.Stats(0)
	if st.Removed != 1 || st.Clears != 1 || st.Blocks != 0 {
		t.Errorf("stats after remove/clear: got %+v, want 1 removed, 1 clear, 0 blocks", st)
	}
}

func TestIndexDefaults(t *testing.T) {
	cases := []struct {
		name      string
		eps, cap  int
		wantEps   int
		wantLimit int
	}{
		{"default_cap", 3, 0, 3, DefaultMaxBlocks},
		{"negative_cap", 1, -5, 1, DefaultMaxBlocks},
		{"huge_cap", 1, 1 << 40, 1, maxBlocksLimit},
		{"negative_endpoints", -1, 10, 0, 0},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			x := New(tc.eps, tc.cap)
			if got := x.Endpoints(); got != tc.wantEps {
				t.Errorf("Endpoints: got %d, want %d", got, tc.wantEps)
			}
			if got := x.MaxBlocks(); got != tc.wantLimit {
				t.Errorf("MaxBlocks: got %d, want %d", got, tc.wantLimit)
			}
		})
	}
}

func TestIndexPanicsOnBadEndpoint(t *testing.T) {
	x := New(2, 8)
	defer func() {
		if recover() == nil {
			t.Error("Store(2, ...) on a 2-endpoint index: got no panic, want one")
		}
	}()
	x.Store(2, []uint64{1})
}

// model is the obvious reference implementation: a map for membership and a
// slice for recency, most recent last.
type model struct {
	limit int
	order []uint64
}

func (m *model) store(keys []uint64) {
	for _, k := range keys {
		if i := slices.Index(m.order, k); i >= 0 {
			m.order = slices.Delete(m.order, i, i+1)
		} else if len(m.order) >= m.limit {
			m.order = m.order[1:]
		}
		m.order = append(m.order, k)
	}
}

func (m *model) remove(keys []uint64) {
	for _, k := range keys {
		if i := slices.Index(m.order, k); i >= 0 {
			m.order = slices.Delete(m.order, i, i+1)
		}
	}
}

func (m *model) prefix(keys []uint64) int {
	for i, k := range keys {
		if !slices.Contains(m.order, k) {
			return i
		}
	}
	return len(keys)
}

// TestIndexAgainstModel drives the Index and one reference model per
// endpoint with the same random operations over a small key space, so that
// endpoints share keys, probe runs collide, wrap around the table and shift
// back on deletion, and compares every observable after each step.
func TestIndexAgainstModel(t *testing.T) {
	cases := []struct {
		name     string
		seed     uint64
		eps      int
		limit    int
		keySpace uint64
		steps    int
	}{
		{"one_ep_small_cap", 1, 1, 5, 12, 3000},
		{"three_eps_mid_cap", 2, 3, 60, 200, 4000},
		{"two_eps_growth", 3, 2, 3000, 5000, 3000},
		{"key_zero_in_play", 4, 2, 20, 30, 3000},
		{"seventy_eps_two_bitmap_words", 5, 70, 10, 40, 4000},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			r := rand.New(rand.NewPCG(tc.seed, tc.seed))
			x := New(tc.eps, tc.limit)
			ms := make([]*model, tc.eps)
			for i := range ms {
				ms[i] = &model{limit: tc.limit}
			}
			randKeys := func() []uint64 {
				ks := make([]uint64, 1+r.IntN(8))
				for i := range ks {
					ks[i] = r.Uint64N(tc.keySpace)
				}
				return ks
			}
			out := make([]int, tc.eps)
			for step := range tc.steps {
				ep := r.IntN(tc.eps)
				m := ms[ep]
				switch p := r.IntN(100); {
				case p < 60:
					ks := randKeys()
					x.Store(ep, ks)
					m.store(ks)
				case p < 97:
					ks := randKeys()
					x.Remove(ep, ks)
					m.remove(ks)
				default:
					x.Clear(ep)
					m.order = nil
				}
				if got, want := x.Blocks(ep), len(m.order); got != want {
					t.Fatalf("step %d: Blocks(%d): got %d, want %d", step, ep, got, want)
				}
				q := randKeys()
				x.Match(q, out)
				for e, m := range ms {
					if got, want := out[e], m.prefix(q); got != want {
						t.Fatalf("step %d: Match(%v)[%d]: got %d, want %d", step, q, e, got, want)
					}
				}
				if step%50 == 0 {
					want := slices.Clone(m.order)
					slices.Reverse(want)
					if got := x.Keys(ep, 0); !slices.Equal(got, want) {
						t.Fatalf("step %d: Keys(%d): got %v, want %v", step, ep, got, want)
					}
					for k := range tc.keySpace {
						if got, want := x.Contains(ep, k), slices.Contains(m.order, k); got != want {
							t.Fatalf("step %d: Contains(%d, %d): got %v, want %v", step, ep, k, got, want)
						}
					}
				}
			}
		})
	}
}

// TestIndexConcurrent runs one writer per endpoint against several readers
// at the same time; its value is under -race, and in checking that readers
// only ever see match counts within bounds.
func TestIndexConcurrent(t *testing.T) {
	const eps, writes, reads = 4, 1000, 300
	x := New(eps, 500)
	prompt := make([]uint64, 64)
	for i := range prompt {
		prompt[i] = uint64(i + 1)
	}
	var wg sync.WaitGroup
	for ep := range eps {
		wg.Go(func() {
			r := rand.New(rand.NewPCG(uint64(ep), 9))
			for i := range writes {
				switch i % 10 {
				case 9:
					x.Clear(ep)
				case 7, 8:
					x.Remove(ep, prompt[r.IntN(len(prompt)):][:1])
				default:
					x.Store(ep, prompt[:r.IntN(len(prompt))])
				}
			}
		})
	}
	bad := make(chan int, 4)
	for range 4 {
		wg.Go(func() {
			out := make([]int, eps)
			for range reads {
				x.Match(prompt, out)
				for _, v := range out {
					if v < 0 || v > len(prompt) {
						select {
						case bad <- v:
						default:
						}
					}
				}
				_ = x.Keys(0, 10)
				_ = x.Stats(1)
			}
		})
	}
	wg.Wait()
	close(bad)
	for v := range bad {
		t.Errorf("a reader saw match count %d, want 0..%d", v, len(prompt))
	}
	for ep := range eps {
		if got, want := x.Blocks(ep), len(x.Keys(ep, 0)); got != want {
			t.Errorf("endpoint %d: Blocks %d, Keys %d", ep, got, want)
		}
	}
}

func TestMatchDoesNotAllocate(t *testing.T) {
	x, prompt := benchIndex(4, 5000, 256)
	out := make([]int, 4)
	if got := testing.AllocsPerRun(100, func() { x.Match(prompt, out) }); got != 0 {
		t.Errorf("Match allocations: got %v, want 0", got)
	}
}

// benchIndex builds an index of eps endpoints with perEP blocks each; every
// endpoint holds the whole prompt (promptLen keys), the worst case for
// Match, plus random other blocks.
func benchIndex(eps, perEP, promptLen int) (*Index, []uint64) {
	r := rand.New(rand.NewPCG(42, 42))
	prompt := make([]uint64, promptLen)
	for i := range prompt {
		prompt[i] = r.Uint64()
	}
	x := New(eps, perEP)
	batch := make([]uint64, 0, 1024)
	for ep := range eps {
		for i := 0; i < perEP-promptLen; i++ {
			batch = append(batch, r.Uint64())
			if len(batch) == cap(batch) {
				x.Store(ep, batch)
				batch = batch[:0]
			}
		}
		x.Store(ep, batch)
		batch = batch[:0]
		x.Store(ep, prompt)
	}
	return x, prompt
}

// BenchmarkMatch is the acceptance lookup: a 2,048-block prompt across 8
// endpoints × 100k blocks each, every endpoint holding the whole prompt.
func BenchmarkMatch(b *testing.B) {
	x, prompt := benchIndex(8, 100_000, 2048)
	out := make([]int, 8)
	b.ReportAllocs()
	b.ResetTimer()
	for b.Loop() {
		x.Match(prompt, out)
	}
	b.StopTimer()
	for ep, v := range out {
		if v != len(prompt) {
			b.Fatalf("endpoint %d matched %d, want %d", ep, v, len(prompt))
		}
	}
}

// BenchmarkMatchCold looks up a different random prompt each time, so that
// the probed table lines are mostly not in cache.
func BenchmarkMatchCold(b *testing.B) {
	x, _ := benchIndex(8, 100_000, 2048)
	// Prompts made of keys each endpoint holds, chosen at random per round.
	all := x.Keys(0, 0)
	r := rand.New(rand.NewPCG(7, 7))
	prompts := make([][]uint64, 64)
	for i := range prompts {
		p := make([]uint64, 2048)
		for j := range p {
			p[j] = all[r.IntN(len(all))]
		}
		prompts[i] = p
	}
	out := make([]int, 8)
	b.ReportAllocs()
	b.ResetTimer()
	i := 0
	for b.Loop() {
		x.Match(prompts[i%len(prompts)], out)
		i++
	}
}

// BenchmarkIndexMemory indexes 800k blocks (8 endpoints × 100k distinct
// keys) and reports the live heap per block.
func BenchmarkIndexMemory(b *testing.B) {
	for b.Loop() {
		perBlock := measureBytesPerBlock(b, 8, 100_000)
		b.ReportMetric(perBlock, "bytes/block")
	}
}

func measureBytesPerBlock(tb testing.TB, eps, perEP int) float64 {
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	x, _ := benchIndex(eps, perEP, 16)
	runtime.GC()
	runtime.ReadMemStats(&after)
	total := 0
	for ep := range eps {
		total += x.Blocks(ep)
	}
	if total != eps*perEP {
		tb.Fatalf("indexed %d blocks, want %d", total, eps*perEP)
	}
	runtime.KeepAlive(x)
	return float64(after.HeapAlloc-before.HeapAlloc) / float64(total)
}

// TestMemoryPerBlock holds the ≤ 64 bytes per indexed block budget at the
// acceptance size (800k blocks).
func TestMemoryPerBlock(t *testing.T) {
	got := measureBytesPerBlock(t, 8, 100_000)
	t.Logf("%.1f bytes per indexed block", got)
	if got > 64 {
		t.Errorf("memory: got %.1f bytes/block, want ≤ 64", got)
	}
}
