package sim

import "sync"

// prefixCache is a bounded set of KV blocks keyed by the engine's published
// block hash, evicted least-recently-used first. It is safe for concurrent
// use.
//
// A block is identified only by its chained hash, so a hit on block i implies
// the whole prefix up to i matches (as in the engines' hash chains); lookups
// therefore stop at the first miss.
type prefixCache struct {
	mu       sync.Mutex
	capacity int
	nextID   int64
	blocks   map[uint64]*cacheEntry
	// head.next is the most recently used entry, head.prev the least.
	head cacheEntry
}

type cacheEntry struct {
	key        uint64
	id         int64 // engine-local block id (vLLM remote_block_ids)
	prev, next *cacheEntry
}

func newPrefixCache(capacity int) *prefixCache {
	c := &prefixCache{capacity: capacity, blocks: make(map[uint64]*cacheEntry, capacity)}
	c.head.prev, c.head.next = &c.head, &c.head
	return c
}

// insertResult reports what insert changed: the index of the first block
// that was not cached before (len(keys) when all were), the engine block ids
// of all keys, and the keys evicted to make room, oldest first.
type insertResult struct {
	firstNew int
	ids      []int64
	evicted  []uint64
}

// lookup returns how many leading keys are cached, marking them used.
func (c *prefixCache) lookup(keys []uint64) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	for i, k := range keys {
		e, ok := c.blocks[k]
		if !ok {
			return i
		}
		c.moveFront(e)
	}
	return len(keys)
}

// insert stores keys (a chain from the root), marking all of them most
// recently used, and evicts the least recently used blocks beyond capacity.
func (c *prefixCache) insert(keys []uint64) insertResult {
	c.mu.Lock()
	defer c.mu.Unlock()
	res := insertResult{firstNew: len(keys), ids: make([]int64, len(keys))}
	for i, k := range keys {
		e, ok := c.blocks[k]
		if ok {
			c.moveFront(e)
		} else {
			if res.firstNew == len(keys) {
				res.firstNew = i
			}
			c.nextID++
			e = &cacheEntry{key: k, id: c.nextID}
			c.blocks[k] = e
			c.linkFront(e)
		}
		res.ids[i] = e.id
	}
	for len(c.blocks) > c.capacity {
		old := c.head.prev
		c.unlink(old)
		delete(c.blocks, old.key)
		res.evicted = append(res.evicted, old.key)
	}
	return res
}

// clear drops every block and returns their keys, least recently used
// first.
func (c *prefixCache) clear() []uint64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	keys := make([]uint64, 0, len(c.blocks))
	for e := c.head.prev; e != &c.head; e = e.prev {
		keys = append(keys, e.key)
	}
	clear(c.blocks)
	c.head.prev, c.head.next = &c.head, &c.head
	return keys
}

// len returns the number of cached blocks.
func (c *prefixCache) len() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.blocks)
}

func (c *prefixCache) moveFront(e *cacheEntry) {
	c.unlink(e)
	c.linkFront(e)
}

func (c *prefixCache) linkFront(e *cacheEntry) {
	e.prev, e.next = &c.head, c.head.next
	c.head.next.prev = e
	c.head.next = e
}

func (c *prefixCache) unlink(e *cacheEntry) {
	e.prev.next = e.next
	e.next.prev = e.prev
	e.prev, e.next = nil, nil
}
