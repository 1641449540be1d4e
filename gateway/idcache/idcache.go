// Package idcache holds token ids by the text they encode (a prompt segment,
// an engine's /tokenize request body) in a fixed arena of exactly the
// configured bytes, outside the Go heap.
//
// Why outside the heap: the Go collector lets the heap grow to twice what
// is live (GOGC=100), so a 64 MiB cache of Go strings and slices costs
// about 128 MiB of RSS, and a full cache also makes every collection scan
// its entries. An arena mapped from the kernel (on Unix; elsewhere a byte
// slice, which the collector does not scan either) costs its size once and
// nothing per collection. The index (a map of 64-bit hashes to arena
// positions, 20 to 40 bytes per entry as the map grows) stays on the heap.
//
// Why not github.com/VictoriaMetrics/fastcache, which also keeps its data
// off the heap: it takes memory in 32 MiB steps (512 buckets of 64 KiB
// chunks, rounded up), refuses entries of 64 KiB or more unless stored
// apart with SetBig, and its chunks return to a process-wide free list only
// through an explicit Reset, which a rule replaced while requests still use
// its cache cannot call safely.
//
// Layout: the arena is a log written round and round. An entry is a 16-byte
// header (hash, text length, id count), the text padded to 4 bytes and the
// ids as native uint32s, padded to 8 bytes. Writing at the head evicts the
// oldest entries at the tail. An entry found in the older half of the log
// is written again at the head, so an entry that keeps being asked for is
// never evicted however many new entries pass it: the policy approximates
// least-recently-used without a list (and without a pointer per entry for
// the collector to follow).
package idcache

import (
	"encoding/binary"
	"fmt"
	"sync"
	"unsafe"

	"github.com/cespare/xxhash/v2"
)

const (
	headerBytes = 16
	// gapLen marks a header that ends a lap: the bytes up to the arena's
	// end are unused and the next entry starts at offset 0.
	gapLen = ^uint32(0)
)

// Cache is safe for concurrent use. Ids handed out are always copies: the
// arena's bytes are overwritten by later entries.
type Cache struct {
	mu         sync.Mutex
	arena      []byte
	size       uint64
	maxEntry   int
	head, tail uint64            // logical positions; arena offset = pos % size
	index      map[uint64]uint64 // xxhash of text -> logical position of its entry
	used       int               // bytes of live entries
	hits       uint64
	misses     uint64
	refreshes  uint64
}

// Stats is a snapshot for metrics.
type Stats struct {
	// Bytes is what the live entries take in the arena (headers, texts,
	// ids, padding); at most Capacity.
	Bytes int
	// Capacity is the arena's size: the memory the cache holds once it has
	// been filled, whatever it holds later.
	Capacity  int
	Entries   int
	Hits      uint64
	Misses    uint64
	Refreshes uint64 // entries written again at the head because they were asked for
}

// New returns a cache whose arena is maxBytes rounded down to a multiple of
// 8 (at least 64 bytes); one entry may take at most maxBytes/share. The
// arena's pages cost memory only once written, and are given back to the
// kernel once the cache is unreachable. The error is the kernel refusing
// the mapping.
func New(maxBytes, share int) (*Cache, error) {
	size := max(maxBytes, 64) &^ 7
	if share < 1 {
		share = 1
	}
	arena, err := mapArena(size)
	if err != nil {
		return nil, fmt.Errorf("idcache: mapping a %d-byte arena: %w", size, err)
	}
	c := &Cache{arena: arena, size: uint64(size), maxEntry: size / share, index: map[uint64]uint64{}}
	releaseWith(c, arena)
	return c, nil
}

// entryBytes is the arena bytes of an entry of n text bytes and k ids.
func entryBytes(n, k int) int {
	return (headerBytes + (n+3)&^3 + 4*k + 7) &^ 7
}

// Fits reports whether an entry for a text of n bytes and k ids may be
// cached at all (at most the cache's size over its share).
func (c *Cache) Fits(n, k int) bool { return entryBytes(n, k) <= c.maxEntry }

// Append appends the cached ids of text to dst; false (dst unchanged) when
// text is not cached.
func (c *Cache) Append(dst []uint32, text string) ([]uint32, bool) {
	return c.append(dst, xxhash.Sum64String(text), text)
}

// AppendBytes is Append for a text held as bytes, without copying it.
func (c *Cache) AppendBytes(dst []uint32, text []byte) ([]uint32, bool) {
	return c.append(dst, xxhash.Sum64(text), unsafe.String(unsafe.SliceData(text), len(text)))
}

func (c *Cache) append(dst []uint32, h uint64, text string) ([]uint32, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	pos, ok := c.index[h]
	if !ok {
		c.misses++
		return dst, false
	}
	off := pos % c.size
	hdr := c.arena[off : off+headerBytes]
	n, k := int(binary.LittleEndian.Uint32(hdr[8:])), int(binary.LittleEndian.Uint32(hdr[12:]))
	t := c.arena[off+headerBytes : off+headerBytes+uint64(n)]
	if n != len(text) || string(t) != text {
		// Another text with the same hash: a miss, the entry stays.
		c.misses++
		return dst, false
	}
	c.hits++
	start := len(dst)
	dst = append(dst, c.ids(off, n, k)...)
	if c.head-pos > c.size/2 {
		// In the older half: write it again at the head so that it is
		// not the next to go. The text is the caller's (equal to the
		// entry's) and the ids are dst's copy, so the arena bytes being
		// overwritten by the new write cannot matter.
		c.refreshes++
		c.putLocked(h, text, dst[start:])
	}
	return dst, true
}

// ids is the id array of the entry at arena offset off (n text bytes, k
// ids). Offsets are 8-aligned and the text padded to 4, so the view is
// aligned for uint32.
func (c *Cache) ids(off uint64, n, k int) []uint32 {
	if k == 0 {
		return nil
	}
	p := off + headerBytes + uint64((n+3)&^3)
	return unsafe.Slice((*uint32)(unsafe.Pointer(&c.arena[p])), k)
}

// Put caches a copy of ids for text, evicting the oldest entries as
// needed; an entry that does not Fit is not cached and leaves the cache as
// it was (for a tokenizer, a text's ids never change).
func (c *Cache) Put(text string, ids []uint32) {
	if !c.Fits(len(text), len(ids)) {
		return
	}
	h := xxhash.Sum64String(text)
	c.mu.Lock()
	defer c.mu.Unlock()
	c.putLocked(h, text, ids)
}

func (c *Cache) putLocked(h uint64, text string, ids []uint32) {
	need := uint64(entryBytes(len(text), len(ids)))
	start := c.head
	if off := start % c.size; off+need > c.size {
		// Not enough room before the arena's end: the entry starts the
		// next lap.
		start += c.size - off
	}
	// Evict until the live log, which ends at the head, and the new entry
	// together fit in the arena: then neither overlaps the other nor the
	// gap before the next lap.
	for start+need-c.tail > c.size && c.tail < c.head {
		c.evictTail()
	}
	if c.tail == c.head {
		c.tail = start
	}
	if start != c.head {
		// Mark the rest of the lap unused (when a header fits there).
		if off := c.head % c.size; c.size-off >= headerBytes {
			binary.LittleEndian.PutUint32(c.arena[off+8:], gapLen)
		}
		c.head = start
	}
	if old, ok := c.index[h]; ok {
		c.used -= c.sizeAt(old % c.size)
	}
	pos := c.head
	off := pos % c.size
	e := c.arena[off : off+need]
	binary.LittleEndian.PutUint64(e, h)
	binary.LittleEndian.PutUint32(e[8:], uint32(len(text)))
	binary.LittleEndian.PutUint32(e[12:], uint32(len(ids)))
	copy(e[headerBytes:], text)
	copy(c.ids(off, len(text), len(ids)), ids)
	c.head += need
	c.index[h] = pos
	c.used += int(need)
}

// sizeAt is the arena bytes of the entry at offset off.
func (c *Cache) sizeAt(off uint64) int {
	hdr := c.arena[off : off+headerBytes]
	return entryBytes(int(binary.LittleEndian.Uint32(hdr[8:])), int(binary.LittleEndian.Uint32(hdr[12:])))
}

// evictTail drops the entry (or the end-of-lap gap) at the tail. An entry
// the index no longer points at was replaced and is already uncounted.
func (c *Cache) evictTail() {
	off := c.tail % c.size
	if c.size-off < headerBytes || binary.LittleEndian.Uint32(c.arena[off+8:]) == gapLen {
		c.tail += c.size - off
		return
	}
	h := binary.LittleEndian.Uint64(c.arena[off:])
	n := uint64(c.sizeAt(off))
	if pos, ok := c.index[h]; ok && pos == c.tail {
		delete(c.index, h)
		c.used -= int(n)
	}
	c.tail += n
}

// Stats reports the cache's state.
func (c *Cache) Stats() Stats {
	c.mu.Lock()
	defer c.mu.Unlock()
	return Stats{Bytes: c.used, Capacity: int(c.size), Entries: len(c.index), Hits: c.hits, Misses: c.misses, Refreshes: c.refreshes}
}
