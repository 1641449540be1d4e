package idcache

import (
	"encoding/binary"
	"fmt"
	"math/rand/v2"
	"runtime"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/cespare/xxhash/v2"
)

// check walks the log from tail to head and verifies the invariants: the
// log spans at most the arena, every index entry points into it at an
// entry of its own hash, and the live entries' bytes are what Stats says.
func check(t testing.TB, c *Cache) {
	t.Helper()
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.tail > c.head || c.head-c.tail > c.size {
		t.Fatalf("log [%d, %d) spans more than the arena's %d bytes", c.tail, c.head, c.size)
	}
	live, n := 0, 0
	for pos := c.tail; pos < c.head; {
		off := pos % c.size
		if c.size-off < headerBytes || binary.LittleEndian.Uint32(c.arena[off+8:]) == gapLen {
			pos += c.size - off
			continue
		}
		h := binary.LittleEndian.Uint64(c.arena[off:])
		sz := uint64(c.sizeAt(off))
		if ip, ok := c.index[h]; ok && ip == pos {
			live += int(sz)
			n++
		}
		pos += sz
	}
	if n != len(c.index) {
		t.Fatalf("walk found %d live entries, index has %d", n, len(c.index))
	}
	if live != c.used {
		t.Fatalf("walk found %d live bytes, cache counts %d", live, c.used)
	}
	if c.used > int(c.size) {
		t.Fatalf("%d bytes live in a %d-byte arena", c.used, c.size)
	}
}

func mustNew(t testing.TB, size, share int) *Cache {
	t.Helper()
	c, err := New(size, share)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func idsOf(text string) []uint32 {
	ids := make([]uint32, 0, len(text)/3+1)
	for i := 0; i < len(text); i += 3 {
		ids = append(ids, uint32(xxhash.Sum64String(text[i:min(i+3, len(text))])))
	}
	return ids
}

// TestCacheAgainstModel runs random puts and lookups against a map: a hit
// always gives the ids last put for that text, an entry just put is found,
// and the log's invariants hold after every step.
func TestCacheAgainstModel(t *testing.T) {
	cases := []struct {
		name              string
		size, share       int
		maxText, distinct int
	}{
		{"tiny arena, one entry may fill it", 256, 1, 200, 20},
		{"small arena, entries an eighth", 4096, 8, 400, 50},
		{"many small entries", 64 << 10, 8, 64, 2000},
		{"odd size", 10007, 4, 700, 40},
		{"entries larger than the arena's end gaps", 1000, 2, 480, 10},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			c := mustNew(t, tc.size, tc.share)
			rng := rand.New(rand.NewPCG(uint64(tc.size), 7))
			texts := make([]string, tc.distinct)
			for i := range texts {
				texts[i] = fmt.Sprintf("%d:%s", i, strings.Repeat("ab", rng.IntN(tc.maxText/2+1)))
			}
			for step := 0; step < 20000; step++ {
				text := texts[rng.IntN(len(texts))]
				want := idsOf(text)
				if rng.IntN(2) == 0 {
					c.Put(text, want)
					if !c.Fits(len(text), len(want)) {
						continue
					}
					got, ok := c.Append([]uint32{42}, text)
					if !ok || got[0] != 42 || !slices.Equal(got[1:], want) {
						t.Fatalf("step %d: %q just put: ok=%v ids %v, want %v", step, text, ok, got, want)
					}
				} else if got, ok := c.Append(nil, text); ok && !slices.Equal(got, want) {
					t.Fatalf("step %d: %q: ids %v, want %v", step, text, got, want)
				} else if !ok && len(got) != 0 {
					t.Fatalf("step %d: a miss appended %v", step, got)
				}
				if step%97 == 0 {
					check(t, c)
				}
			}
			check(t, c)
			if st := c.Stats(); st.Hits == 0 || st.Entries == 0 || st.Capacity != tc.size&^7 {
				t.Fatalf("stats %+v", st)
			}
		})
	}
}

// TestHotEntrySurvives: an entry asked for between every two new entries
// is never evicted, however many bytes of new entries pass through.
func TestHotEntrySurvives(t *testing.T) {
	c := mustNew(t, 16<<10, 8)
	hot := "<|im_start|>system\nYou are a careful assistant.<|im_end|>\n"
	c.Put(hot, idsOf(hot))
	for i := range 5000 { // about 100 times the arena
		cold := fmt.Sprintf("<|im_start|>user\nturn %d %s<|im_end|>\n", i, strings.Repeat("x", i%300))
		c.Put(cold, idsOf(cold))
		if got, ok := c.Append(nil, hot); !ok || !slices.Equal(got, idsOf(hot)) {
			t.Fatalf("after %d new entries the hot entry is gone (ok=%v)", i+1, ok)
		}
	}
	check(t, c)
	if st := c.Stats(); st.Refreshes == 0 || st.Refreshes > 5000/10 {
		t.Fatalf("hot entry written again %d times in 5000 lookups; want a few (once per half lap)", st.Refreshes)
	}
}

// TestColdEntriesGoInOrder: with nothing asked for, the oldest entries go
// first and the newest stay.
func TestColdEntriesGoInOrder(t *testing.T) {
	c := mustNew(t, 4096, 8)
	var texts []string
	for i := range 200 {
		s := fmt.Sprintf("segment %03d %s", i, strings.Repeat("y", 40))
		texts = append(texts, s)
		c.Put(s, idsOf(s))
	}
	check(t, c)
	n := c.Stats().Entries
	for i, s := range texts {
		_, ok := c.Append(nil, s)
		if want := i >= len(texts)-n; ok != want {
			t.Fatalf("entry %d of %d cached = %v, want %v (%d entries live)", i, len(texts), ok, want, n)
		}
	}
}

// TestSameHashOtherText: an index slot whose entry holds another text is a
// miss, never that text's ids; putting the new text replaces it.
func TestSameHashOtherText(t *testing.T) {
	c := mustNew(t, 4096, 2)
	a, b := "first text", "second, longer text"
	c.Put(a, []uint32{1, 2, 3})
	// Point b's hash at a's entry, as a 64-bit collision would.
	c.mu.Lock()
	pa := c.index[xxhash.Sum64String(a)]
	c.index[xxhash.Sum64String(b)] = pa
	c.used += c.sizeAt(pa % c.size) // the walk counts it once per index slot
	c.mu.Unlock()
	if got, ok := c.Append(nil, b); ok {
		t.Fatalf("b found a's ids %v", got)
	}
	if got, ok := c.AppendBytes(nil, []byte(a)); !ok || !slices.Equal(got, []uint32{1, 2, 3}) {
		t.Fatalf("a: %v %v", got, ok)
	}
	c.Put(b, []uint32{9})
	if got, ok := c.Append(nil, b); !ok || !slices.Equal(got, []uint32{9}) {
		t.Fatalf("b after put: %v %v", got, ok)
	}
}

// TestTooLargeNotCached: an entry over the share is refused, and counted
// as nothing.
func TestTooLargeNotCached(t *testing.T) {
	c := mustNew(t, 4096, 8)
	big := strings.Repeat("z", 600)
	c.Put(big, idsOf(big))
	if _, ok := c.Append(nil, big); ok {
		t.Fatal("an entry over an eighth of the arena was cached")
	}
	if st := c.Stats(); st.Bytes != 0 || st.Entries != 0 {
		t.Fatalf("stats %+v after a refused put", st)
	}
	if c.Fits(600, 200) || !c.Fits(100, 50) {
		t.Fatal("Fits disagrees with the share")
	}
}

// TestEntriesOffTheHeap: filling the cache grows the Go heap by its index
// only (a few dozen bytes per entry), not by the texts and ids, so the
// collector's heap goal does not double the cache.
func TestEntriesOffTheHeap(t *testing.T) {
	c := mustNew(t, 32<<20, 8)
	var ms runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&ms)
	before := ms.HeapAlloc
	text := strings.Repeat("a longer turn of a conversation, ", 30)
	ids := idsOf(text)
	for i := 0; c.Stats().Bytes < 30<<20; i++ {
		c.Put(fmt.Sprintf("%d %s", i, text), ids)
	}
	runtime.GC()
	runtime.ReadMemStats(&ms)
	st := c.Stats()
	grew := int64(ms.HeapAlloc) - int64(before)
	if limit := int64(st.Entries) * 96; grew > limit {
		t.Fatalf("%d entries (%d bytes) grew the Go heap by %d bytes; want at most %d (96 per entry)", st.Entries, st.Bytes, grew, limit)
	}
	t.Logf("%d entries, %d bytes in the arena; Go heap grew %d bytes", st.Entries, st.Bytes, grew)
	runtime.KeepAlive(c)
}

// TestConcurrentUse: lookups and puts from several goroutines (run under
// -race) never see another text's ids or a torn entry.
func TestConcurrentUse(t *testing.T) {
	c := mustNew(t, 32<<10, 8)
	texts := make([]string, 64)
	for i := range texts {
		texts[i] = fmt.Sprintf("%d %s", i, strings.Repeat("w", i*13%400))
	}
	var wg sync.WaitGroup
	errs := make(chan string, 4)
	for g := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(uint64(g), 1))
			var dst []uint32
			for range 5000 {
				text := texts[rng.IntN(len(texts))]
				if rng.IntN(3) == 0 {
					c.Put(text, idsOf(text))
					continue
				}
				var ok bool
				if dst, ok = c.Append(dst[:0], text); ok && !slices.Equal(dst, idsOf(text)) {
					errs <- fmt.Sprintf("%q: ids %v", text, dst)
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for e := range errs {
		t.Fatal(e)
	}
	check(t, c)
}

// FuzzCache drives puts and lookups from arbitrary bytes and checks every
// hit and the log's invariants.
func FuzzCache(f *testing.F) {
	f.Add(uint16(256), uint8(1), []byte("\x00\x05hello\x01\x05hello\x00\xf0"))
	f.Add(uint16(1000), uint8(2), []byte("\x00\xff\x00\x10\x01\xff"))
	f.Fuzz(func(t *testing.T, size uint16, share uint8, ops []byte) {
		c := mustNew(t, int(size), int(share))
		model := map[string][]uint32{}
		for i := 0; i+1 < len(ops); i += 2 {
			text := fmt.Sprintf("t%d.%s", ops[i+1]%32, strings.Repeat("q", int(ops[i+1])))
			if ops[i]&1 == 0 {
				ids := idsOf(text + string(ops[i]))
				c.Put(text, ids)
				if c.Fits(len(text), len(ids)) {
					// A Put that does not fit leaves the cache as
					// it was, an older entry of text included.
					model[text] = ids
				}
			} else if got, ok := c.Append(nil, text); ok && !slices.Equal(got, model[text]) {
				t.Fatalf("op %d: %q gave %v, last put %v", i/2, text, got, model[text])
			}
		}
		check(t, c)
	})
}

func BenchmarkAppendHit(b *testing.B) {
	c := mustNew(b, 64<<20, 8)
	text := strings.Repeat("You are a careful assistant. ", 80)
	ids := idsOf(text)
	c.Put(text, ids)
	dst := make([]uint32, 0, len(ids))
	b.ReportAllocs()
	for b.Loop() {
		dst, _ = c.Append(dst[:0], text)
	}
}
