// Package kvindex keeps, for one KV-exact rule, which endpoint holds which KV
// block (by routing key), fed from the engines' own KV-cache events, and
// answers the request path's question: how many leading blocks of this
// prompt does each endpoint already hold?
//
// Index is the data structure; Ingester feeds one endpoint's events into it
// (vLLM and SGLang over ZeroMQ, TensorRT-LLM by polling /kv_cache_events)
// with the sequence checks that keep the inventory free of blocks the engine
// no longer has.
package kvindex

import (
	"fmt"
	"math/bits"
	"math/rand/v2"
	"sync"
)

// DefaultMaxBlocks is the per-endpoint inventory cap New uses when given a
// cap <= 0. A million blocks is far more than one worker's KV cache, so the
// cap only bounds memory against a runaway or hostile publisher.
const DefaultMaxBlocks = 1 << 20

// MaxEndpoints is the largest endpoint count New accepts; Match keeps its
// per-call endpoint bitmap on the stack, which needs a fixed bound.
const MaxEndpoints = 1024

// maxBlocksLimit bounds the cap: node indices are uint32 with 0 reserved.
const maxBlocksLimit = 1 << 30

const maxWords = MaxEndpoints / 64

// Index records, per endpoint, the set of block routing keys the endpoint
// holds, each endpoint's set bounded by a cap with least-recently-stored
// eviction.
//
// Endpoints are small ints: their position in the rule's endpoint list.
// All methods are safe for concurrent use: readers (Match, Blocks, Keys,
// Stats) share a read lock, writers (Store, Remove, Clear) take the write
// lock for one call, so a batch applied with one call is seen whole or not
// at all. Methods given an endpoint outside [0, Endpoints()) panic: that is a
// wiring bug, not input.
//
// Layout. Match is the hot path, so one table answers it with one probe per
// prompt block for all endpoints at once: an open-addressing table (linear
// probing, backward-shift deletion, hence no tombstones) of routing key →
// endpoint bitmap. Each endpoint also has its own LRU list of nodes and a
// small table of node indices used only by writers (touch, remove, evict).
// Memory per indexed block, when endpoints hold distinct keys (the worst
// case): a 16-byte node, 4-9 bytes of per-endpoint slots and 10-20 bytes of
// shared table (more with over 64 endpoints); keys held by several endpoints
// share their shared-table slot.
type Index struct {
	seed uint64
	n    int
	w    int // bitmap words per key: ceil(n/64)

	mu sync.RWMutex
	// tab holds size slots of stride 1+w: the key, then its bitmap. A slot
	// is empty iff its key is 0 (key 0 itself lives in zero), and an
	// occupied slot's bitmap is never all zero.
	tab      []uint64
	size     int
	shift    uint8 // 64 - log2(size)
	distinct int   // occupied slots
	// zero is the bitmap of key 0, kept outside the table so that the probe
	// loop can tell an empty slot by its key alone.
	zero [maxWords]uint64

	eps []epState
}

// epState is one endpoint's LRU list and its writer-side lookup table.
type epState struct {
	// slots is an open-addressing table of node indices (0 = empty), keyed
	// by the node's key; only writers use it.
	slots []uint32
	shift uint8

	// pages hold the nodes (paged so that growth never copies); node 0 is
	// the LRU sentinel: next is the most recent, prev the least recent.
	pages [][]node
	free  uint32 // free-node list through next, 0 = none
	used  uint32 // nodes handed out, including the sentinel

	count int
	limit int

	stored, removed, evictions, clears uint64
}

type node struct {
	key        uint64
	prev, next uint32
}

const (
	pageBits = 12
	pageSize = 1 << pageBits
	pageMask = pageSize - 1

	fib = 0x9e3779b97f4a7c15
)

// New returns an Index for nEndpoints endpoints (clamped to
// [0, MaxEndpoints]), each holding at most maxBlocksPerEndpoint keys (<= 0
// means DefaultMaxBlocks; above 2^30 is clamped). When a Store would pass
// the cap, the endpoint's least recently stored (or re-stored) keys are
// evicted and counted in Stats.Evictions. Evicting a block the engine still
// has only costs a cache miss, never a wrong hit.
func New(nEndpoints int, maxBlocksPerEndpoint int) *Index {
	nEndpoints = min(max(nEndpoints, 0), MaxEndpoints)
	if maxBlocksPerEndpoint <= 0 {
		maxBlocksPerEndpoint = DefaultMaxBlocks
	}
	maxBlocksPerEndpoint = min(maxBlocksPerEndpoint, maxBlocksLimit)
	x := &Index{seed: rand.Uint64(), n: nEndpoints, w: (nEndpoints + 63) / 64, eps: make([]epState, nEndpoints)}
	for i := range x.eps {
		x.eps[i].limit = maxBlocksPerEndpoint
	}
	return x
}

// Endpoints returns the number of endpoints the Index was built for.
func (x *Index) Endpoints() int { return x.n }

// MaxBlocks returns the per-endpoint cap.
func (x *Index) MaxBlocks() int {
	if x.n == 0 {
		return 0
	}
	return x.eps[0].limit
}

func (x *Index) ep(ep int) *epState {
	if ep < 0 || ep >= x.n {
		panic(fmt.Sprintf("kvindex: endpoint %d out of range [0, %d)", ep, x.n))
	}
	return &x.eps[ep]
}

// Store records that ep holds keys (a BlockStored event). Keys already held
// become the most recently stored; duplicates are harmless.
func (x *Index) Store(ep int, keys []uint64) {
	e := x.ep(ep)
	x.mu.Lock()
	x.storeLocked(ep, e, keys)
	x.mu.Unlock()
}

// Remove records that ep no longer holds keys (a BlockRemoved event). Keys
// not held are ignored.
func (x *Index) Remove(ep int, keys []uint64) {
	e := x.ep(ep)
	x.mu.Lock()
	x.removeLocked(ep, e, keys)
	x.mu.Unlock()
}

// Clear forgets everything ep holds (AllBlocksCleared, or a resync) and
// releases its memory. It costs time proportional to ep's block count.
func (x *Index) Clear(ep int) {
	e := x.ep(ep)
	x.mu.Lock()
	x.clearLocked(ep, e)
	x.mu.Unlock()
}

// Match writes into out[ep], for every endpoint, the number of consecutive
// keys from keys[0] that ep holds. A KV-cache hit is a prefix: a block held
// after a missing one does not count, because the engine recomputes
// everything after the first miss. out must have at least Endpoints()
// elements (extra elements are left alone). Match does not allocate and
// probes the table once per key for all endpoints together, stopping as
// soon as no endpoint can match further.
func (x *Index) Match(keys []uint64, out []int) {
	out = out[:x.n]
	var alive [maxWords]uint64
	for w := range x.w {
		alive[w] = ^uint64(0)
	}
	if r := x.n % 64; r != 0 {
		alive[x.w-1] = 1<<r - 1
	}
	stride := 1 + x.w
	x.mu.RLock()
	defer x.mu.RUnlock()
	tab := x.tab
	mask := uint64(x.size - 1)
	left := x.n
	for n, key := range keys {
		if left == 0 {
			return
		}
		// held points at key's bitmap, or is nil when no endpoint holds it.
		var held []uint64
		switch {
		case key == 0:
			held = x.zero[:x.w]
		case x.size > 0:
			for i := ((key ^ x.seed) * fib) >> x.shift; ; i = (i + 1) & mask {
				base := int(i) * stride
				k := tab[base]
				if k == key {
					held = tab[base+1 : base+stride]
					break
				}
				if k == 0 {
					break
				}
			}
		}
		for w := range x.w {
			a := alive[w]
			if a == 0 {
				continue
			}
			var h uint64
			if held != nil {
				h = held[w]
			}
			lost := a &^ h
			for lost != 0 {
				b := bits.TrailingZeros64(lost)
				lost &= lost - 1
				out[w*64+b] = n
				left--
			}
			alive[w] = a & h
		}
	}
	for w := range x.w {
		for a := alive[w]; a != 0; a &= a - 1 {
			out[w*64+bits.TrailingZeros64(a)] = len(keys)
		}
	}
}

func isZero(ws []uint64) bool {
	for _, v := range ws {
		if v != 0 {
			return false
		}
	}
	return true
}

// Blocks returns the number of keys ep holds.
func (x *Index) Blocks(ep int) int {
	e := x.ep(ep)
	x.mu.RLock()
	defer x.mu.RUnlock()
	return e.count
}

// Contains reports whether ep holds key.
func (x *Index) Contains(ep int, key uint64) bool {
	e := x.ep(ep)
	x.mu.RLock()
	defer x.mu.RUnlock()
	_, n := e.find(x.seed, key)
	return n != 0
}

// Keys returns up to max keys ep holds, most recently stored first (all of
// them when max <= 0). The slice is fresh; it serves the inventory API and
// evidence, not the request path.
func (x *Index) Keys(ep int, max int) []uint64 {
	e := x.ep(ep)
	x.mu.RLock()
	defer x.mu.RUnlock()
	n := e.count
	if max > 0 && max < n {
		n = max
	}
	out := make([]uint64, 0, n)
	if e.used == 0 {
		return out
	}
	for i := e.node(0).next; i != 0 && len(out) < n; i = e.node(i).next {
		out = append(out, e.node(i).key)
	}
	return out
}

// Stats are one endpoint's inventory counters, cumulative since New.
type Stats struct {
	Blocks    int    // keys held now
	MaxBlocks int    // the cap
	Stored    uint64 // keys newly added (re-stores of held keys are not counted)
	Removed   uint64 // keys removed by Remove
	Evictions uint64 // keys dropped to stay within the cap
	Clears    uint64 // Clear calls
}

// Stats returns ep's counters.
func (x *Index) Stats(ep int) Stats {
	e := x.ep(ep)
	x.mu.RLock()
	defer x.mu.RUnlock()
	return Stats{Blocks: e.count, MaxBlocks: e.limit, Stored: e.stored, Removed: e.removed, Evictions: e.evictions, Clears: e.clears}
}

// --- writers (x.mu held) ---

func (x *Index) storeLocked(ep int, e *epState, keys []uint64) {
	for _, key := range keys {
		if _, n := e.find(x.seed, key); n != 0 {
			e.unlink(n)
			e.linkFront(n)
			continue
		}
		if e.count >= e.limit {
			old := e.node(0).prev
			x.dropNode(ep, e, e.node(old).key, old)
			e.evictions++
		}
		n := e.allocNode(key)
		e.linkFront(n)
		e.insertSlot(x.seed, n, key)
		e.count++
		e.stored++
		x.setBit(ep, key)
	}
}

func (x *Index) removeLocked(ep int, e *epState, keys []uint64) {
	for _, key := range keys {
		if _, n := e.find(x.seed, key); n != 0 {
			x.dropNode(ep, e, key, n)
			e.removed++
		}
	}
}

// dropNode removes key (held by ep at node n) from every structure.
func (x *Index) dropNode(ep int, e *epState, key uint64, n uint32) {
	i, _ := e.find(x.seed, key)
	e.deleteSlot(x.seed, i)
	e.unlink(n)
	e.freeNode(n)
	e.count--
	x.clearBit(ep, key)
}

func (x *Index) clearLocked(ep int, e *epState) {
	if e.used != 0 {
		for i := e.node(0).next; i != 0; i = e.node(i).next {
			x.clearBit(ep, e.node(i).key)
		}
	}
	e.slots, e.shift = nil, 0
	e.pages, e.free, e.used = nil, 0, 0
	e.count = 0
	e.clears++
}

// --- shared table ---

func (x *Index) home(key uint64) uint64 { return ((key ^ x.seed) * fib) >> x.shift }

// slotOf returns the slot index of key (non-zero) or -1.
func (x *Index) slotOf(key uint64) int {
	if x.size == 0 {
		return -1
	}
	stride := 1 + x.w
	mask := uint64(x.size - 1)
	for i := x.home(key); ; i = (i + 1) & mask {
		switch x.tab[int(i)*stride] {
		case key:
			return int(i)
		case 0:
			return -1
		}
	}
}

func (x *Index) setBit(ep int, key uint64) {
	word, bit := ep/64, uint64(1)<<(ep%64)
	if key == 0 {
		x.zero[word] |= bit
		return
	}
	stride := 1 + x.w
	if i := x.slotOf(key); i >= 0 {
		x.tab[i*stride+1+word] |= bit
		return
	}
	// Grow at a load factor of 4/5: linear probing stays short there with a
	// well-mixed hash, and Match probes mostly hit.
	if (x.distinct+1)*5 > x.size*4 {
		x.growTable()
	}
	mask := uint64(x.size - 1)
	i := x.home(key)
	for x.tab[int(i)*stride] != 0 {
		i = (i + 1) & mask
	}
	base := int(i) * stride
	x.tab[base] = key
	x.tab[base+1+word] = bit
	x.distinct++
}

func (x *Index) clearBit(ep int, key uint64) {
	word, bit := ep/64, uint64(1)<<(ep%64)
	if key == 0 {
		x.zero[word] &^= bit
		return
	}
	i := x.slotOf(key)
	if i < 0 {
		return
	}
	stride := 1 + x.w
	base := i * stride
	x.tab[base+1+word] &^= bit
	if isZero(x.tab[base+1 : base+stride]) {
		x.deleteTableSlot(i)
		x.distinct--
	}
}

func (x *Index) growTable() {
	size := max(64, 2*x.size)
	stride := 1 + x.w
	old, oldSize := x.tab, x.size
	x.tab = make([]uint64, size*stride)
	x.size = size
	x.shift = uint8(64 - bits.TrailingZeros(uint(size)))
	mask := uint64(size - 1)
	for j := range oldSize {
		src := old[j*stride : (j+1)*stride]
		if src[0] == 0 {
			continue
		}
		i := x.home(src[0])
		for x.tab[int(i)*stride] != 0 {
			i = (i + 1) & mask
		}
		copy(x.tab[int(i)*stride:], src)
	}
}

// deleteTableSlot empties slot i and shifts the rest of its probe run back,
// so that lookups never meet tombstones.
func (x *Index) deleteTableSlot(i int) {
	stride := 1 + x.w
	mask := x.size - 1
	j := i
	for {
		j = (j + 1) & mask
		src := x.tab[j*stride : (j+1)*stride]
		if src[0] == 0 {
			break
		}
		if movable(i, j, int(x.home(src[0]))) {
			copy(x.tab[i*stride:(i+1)*stride], src)
			i = j
		}
	}
	clear(x.tab[i*stride : (i+1)*stride])
}

// movable reports whether the entry in slot j, whose home slot is h, may move
// back into the hole at i: unless h lies cyclically in (i, j], moving it keeps
// it reachable from home.
func movable(i, j, h int) bool {
	if j > i {
		return h <= i || h > j
	}
	return h <= i && h > j
}

// --- per-endpoint writer table and LRU ---

func (e *epState) node(i uint32) *node { return &e.pages[i>>pageBits][i&pageMask] }

func (e *epState) home(seed, key uint64) uint64 { return ((key ^ seed) * fib) >> e.shift }

// find returns the slot and node of key; node 0 means absent.
func (e *epState) find(seed, key uint64) (int, uint32) {
	if len(e.slots) == 0 {
		return -1, 0
	}
	mask := uint64(len(e.slots) - 1)
	for i := e.home(seed, key); ; i = (i + 1) & mask {
		n := e.slots[i]
		if n == 0 {
			return -1, 0
		}
		if e.node(n).key == key {
			return int(i), n
		}
	}
}

// insertSlot adds node n (holding key, known absent), growing the table at a
// load factor of 7/8: writers tolerate longer probe runs than Match would.
func (e *epState) insertSlot(seed uint64, n uint32, key uint64) {
	if (e.count+1)*8 > len(e.slots)*7 {
		e.grow(seed)
	}
	mask := uint64(len(e.slots) - 1)
	i := e.home(seed, key)
	for e.slots[i] != 0 {
		i = (i + 1) & mask
	}
	e.slots[i] = n
}

func (e *epState) grow(seed uint64) {
	size := max(16, 2*len(e.slots))
	old := e.slots
	e.slots = make([]uint32, size)
	e.shift = uint8(64 - bits.TrailingZeros(uint(size)))
	mask := uint64(size - 1)
	for _, n := range old {
		if n == 0 {
			continue
		}
		i := e.home(seed, e.node(n).key)
		for e.slots[i] != 0 {
			i = (i + 1) & mask
		}
		e.slots[i] = n
	}
}

func (e *epState) deleteSlot(seed uint64, i int) {
	mask := len(e.slots) - 1
	j := i
	for {
		j = (j + 1) & mask
		n := e.slots[j]
		if n == 0 {
			break
		}
		if movable(i, j, int(e.home(seed, e.node(n).key))) {
			e.slots[i] = n
			i = j
		}
	}
	e.slots[i] = 0
}

func (e *epState) allocNode(key uint64) uint32 {
	if e.used == 0 {
		e.pages = append(e.pages, make([]node, pageSize))
		e.used = 1 // node 0: the sentinel, an empty circular list
	}
	var n uint32
	if e.free != 0 {
		n = e.free
		e.free = e.node(n).next
	} else {
		n = e.used
		if int(n>>pageBits) == len(e.pages) {
			e.pages = append(e.pages, make([]node, pageSize))
		}
		e.used++
	}
	*e.node(n) = node{key: key}
	return n
}

func (e *epState) freeNode(n uint32) {
	*e.node(n) = node{next: e.free}
	e.free = n
}

func (e *epState) linkFront(n uint32) {
	head := e.node(0)
	first := head.next
	nd := e.node(n)
	nd.prev, nd.next = 0, first
	e.node(first).prev = n
	head.next = n
}

func (e *epState) unlink(n uint32) {
	nd := e.node(n)
	e.node(nd.prev).next = nd.next
	e.node(nd.next).prev = nd.prev
}
