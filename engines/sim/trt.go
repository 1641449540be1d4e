package sim

import (
	"sync"
)

// trtWindowSize is the attention window TensorRT-LLM reports with each event
// (the full context for models without sliding window).
const trtWindowSize = maxModelLen

// trtDefaultPriority is TensorRT-LLM's default KV block retention priority.
const trtDefaultPriority = 35

// trtEventQueue is TensorRT-LLM's KV event buffer behind POST
// /kv_cache_events: events are JSON-encoded when they happen, get monotonic
// event_ids from 0 (a "created" event first), and reading drains the queue.
// Beyond its capacity the oldest events are dropped, as the engine's bounded
// buffer does. It is safe for concurrent use.
type trtEventQueue struct {
	mu       sync.Mutex
	capacity int
	blocks   int // num_blocks_per_cache_level[0] announced by "created"
	nextID   int64
	queue    [][]byte
	faults   *faultState
}

func newTRTEventQueue(cacheBlocks int) *trtEventQueue {
	q := &trtEventQueue{capacity: max(1024, cacheBlocks), blocks: cacheBlocks}
	q.restart()
	return q
}

// restart models a fresh engine: event ids from 0, a new "created" event,
// nothing else queued.
func (q *trtEventQueue) restart() {
	q.mu.Lock()
	defer q.mu.Unlock()
	q.nextID = 0
	q.queue = q.queue[:0]
	w := &jw{}
	w.obj().key("data").obj().kstr("type", "created").key("num_blocks_per_cache_level").arr().int(int64(q.blocks)).int(0).aend().end()
	q.enqueueLocked(w)
}

// enqueueLocked assigns the next event id to the event whose "data" w holds
// (an open object) and queues it, applying drop and gap faults.
func (q *trtEventQueue) enqueueLocked(w *jw) {
	drop, gap := false, 0
	if q.faults != nil {
		drop, gap = q.faults.takeEventFaults()
	}
	q.nextID += int64(gap)
	id := q.nextID
	q.nextID++
	if drop {
		return
	}
	// event_id first: rebuild the object with the id in front.
	out := &jw{b: make([]byte, 0, len(w.b)+48)}
	out.obj().kint("event_id", id)
	out.b = append(out.b, ',')
	out.b = append(out.b, w.b[1:]...) // w.b is `{"data":{...}` without its closing brace
	out.comma[len(out.comma)-1] = true
	out.kint("window_size", trtWindowSize).end()
	if len(q.queue) >= q.capacity {
		q.queue = q.queue[1:]
	}
	q.queue = append(q.queue, out.b)
}

// push queues the TensorRT-LLM form of evs: one "stored" event per stored
// run (one stored_block per block), one "removed" event per removal.
func (q *trtEventQueue) push(evs []simEvent, blockSize int) {
	q.mu.Lock()
	defer q.mu.Unlock()
	for _, e := range evs {
		w := &jw{}
		w.obj().key("data").obj()
		switch e.kind {
		case evStored:
			w.kstr("type", "stored")
			if e.hasParent {
				w.key("parent_hash").uint(e.parent)
			} else {
				w.knull("parent_hash")
			}
			w.key("blocks").arr()
			for i, h := range e.hashes {
				w.obj().kstr("type", "stored_block").key("block_hash").uint(h).key("tokens").arr()
				for _, t := range e.tokens[i*blockSize : (i+1)*blockSize] {
					w.obj().kstr("type", "unique_token").kint("token_id", int64(t)).kint("token_extra_id", 0).end()
				}
				w.aend().kint("cache_level", 0).kint("priority", trtDefaultPriority).end()
			}
			w.aend()
		case evRemoved, evCleared:
			w.kstr("type", "removed").key("block_hashes").arr()
			for _, h := range e.hashes {
				w.uint(h)
			}
			w.aend()
		}
		w.end()
		q.enqueueLocked(w)
	}
}

// drain returns every queued event as a JSON array and empties the queue.
func (q *trtEventQueue) drain() []byte {
	q.mu.Lock()
	defer q.mu.Unlock()
	n := 2
	for _, e := range q.queue {
		n += len(e) + 1
	}
	b := make([]byte, 0, n)
	b = append(b, '[')
	for i, e := range q.queue {
		if i > 0 {
			b = append(b, ',')
		}
		b = append(b, e...)
	}
	b = append(b, ']')
	q.queue = q.queue[:0]
	return b
}
