package policy

import (
	"sync"
	"sync/atomic"
	"time"

	"github.com/cespare/xxhash/v2"

	"github.com/llmgw/llmgw/gateway/upstream"
)

// session is sel 3: session affinity with a learned binding table.
//
// A request with a session value goes to the endpoint bound to that value
// while the binding is live (used within SessionTTL; every use refreshes
// it) and the endpoint is eligible. Otherwise the least in-flight eligible
// endpoint (ties rotate from pick to pick) is chosen and the binding is created or
// moved to it. In particular the single retry, which excludes the endpoint
// that just failed, rebinds the session to the endpoint that served it.
// A request without a session value goes to the least in-flight endpoint.
//
// The table is split into shards by a hash of the value, each a map plus an
// intrusive list in last-use order. Because every use extends a binding to
// now+TTL, last-use order is also expiry order: the list tail is always the
// next binding to expire. Each pick drops up to sweepPerPick expired tail
// entries, and an insert into a full shard evicts the tail (the least
// recently used binding), so the table never exceeds SessionCap and needs no
// background goroutine.
type session struct {
	eps    []*upstream.Endpoint
	ttl    int64 // nanoseconds
	now    func() time.Time
	mask   uint64 // len(shards)-1; len is a power of two
	shards []sessionShard
	index  map[string]int32 // endpoint ID -> position; read-only after construction
	// next rotates the tie-break start among equally loaded endpoints, so
	// sessions that start one after another on an idle pool spread instead
	// of all binding to the first endpoint.
	next atomic.Uint64
}

// sweepPerPick bounds the expiry work one pick does; any constant ≥ 2 drains
// expired entries faster than picks can add them.
const sweepPerPick = 2

// maxSessionShards caps the shard count; more only helps beyond that many
// cores.
const maxSessionShards = 16

type sessionShard struct {
	mu         sync.Mutex
	bindings   map[string]*binding // guarded by mu
	head, tail *binding            // guarded by mu; head = most recently used
	capacity   int
	_          [40]byte // keep neighbouring shards' locks off one cache line
}

// binding is one session → endpoint entry; all fields are guarded by its
// shard's mu.
type binding struct {
	key        string
	pos        int32 // endpoint position in session.eps
	expires    int64 // unix nanoseconds
	prev, next *binding
}

func newSession(cfg Config, eps []*upstream.Endpoint) *session {
	nShards := 1
	for nShards*2 <= maxSessionShards && nShards*2 <= cfg.SessionCap {
		nShards *= 2
	}
	p := &session{
		eps:    eps,
		ttl:    int64(cfg.SessionTTL),
		now:    cfg.Now,
		mask:   uint64(nShards - 1),
		shards: make([]sessionShard, nShards),
		index:  make(map[string]int32, len(eps)),
	}
	for i := range p.shards {
		// Spread the remainder so the capacities sum to exactly SessionCap.
		c := cfg.SessionCap / nShards
		if i < cfg.SessionCap%nShards {
			c++
		}
		p.shards[i] = sessionShard{bindings: make(map[string]*binding), capacity: c}
	}
	for i, e := range eps {
		p.index[e.ID] = int32(i)
	}
	return p
}

// start is the scan start for a least-loaded choice: rotating, so ties
// spread deterministically for a given sequence of picks.
func (p *session) start() int {
	if len(p.eps) == 0 {
		return 0
	}
	return rotation(p.next.Add(1)-1, len(p.eps))
}

func (p *session) shard(key []byte) *sessionShard {
	return &p.shards[xxhash.Sum64(key)&p.mask]
}

// Pick implements Picker. It allocates only when it creates a binding for a
// session value not in the table.
func (p *session) Pick(req *Request) (Decision, error) {
	if len(req.Session) == 0 {
		i, ok := leastLoaded(p.eps, req.Exclude, p.start(), false)
		if !ok {
			return Decision{}, ErrNoEndpoint
		}
		return Decision{Endpoint: p.eps[i], Reason: ReasonSessionNoKey}, nil
	}
	now := p.now().UnixNano()
	sh := p.shard(req.Session)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	sh.sweep(now, sweepPerPick)

	b := sh.bindings[string(req.Session)] // no allocation: lookup-only conversion
	reason := ReasonSessionNew
	if b != nil && b.expires > now {
		if e := p.eps[b.pos]; eligible(e, req.Exclude) {
			b.expires = now + p.ttl
			sh.toFront(b)
			return Decision{Endpoint: e, Reason: ReasonSessionBound}, nil
		}
		reason = ReasonSessionRebound
	}
	i, ok := leastLoaded(p.eps, req.Exclude, p.start(), false)
	if !ok {
		// Keep any binding: its endpoint may come back.
		return Decision{}, ErrNoEndpoint
	}
	if b == nil {
		b = sh.insert(string(req.Session))
	}
	b.pos, b.expires = int32(i), now+p.ttl
	sh.toFront(b)
	return Decision{Endpoint: p.eps[i], Reason: reason}, nil
}

// Bindings returns the number of bindings held, expired ones not yet swept
// included. Safe for concurrent use.
func (p *session) Bindings() int {
	n := 0
	for i := range p.shards {
		sh := &p.shards[i]
		sh.mu.Lock()
		n += len(sh.bindings)
		sh.mu.Unlock()
	}
	return n
}

// Inherit implements Inheritor: it copies old's live bindings whose
// endpoint ID exists in p, keeping their expiry and relative recency.
func (p *session) Inherit(old Picker) {
	o, ok := old.(*session)
	if !ok || o == nil || o == p {
		return
	}
	now := p.now().UnixNano()
	type entry struct {
		key     string
		pos     int32
		expires int64
	}
	for i := range o.shards {
		osh := &o.shards[i]
		// Snapshot under old's lock only, so no two shard locks are ever held
		// together. Oldest first, so the newest end up most recent in p.
		osh.mu.Lock()
		snap := make([]entry, 0, len(osh.bindings))
		for b := osh.tail; b != nil; b = b.prev {
			if b.expires <= now {
				continue
			}
			if pos, ok := p.index[o.eps[b.pos].ID]; ok {
				snap = append(snap, entry{b.key, pos, b.expires})
			}
		}
		osh.mu.Unlock()
		for _, en := range snap {
			sh := p.shard([]byte(en.key))
			sh.mu.Lock()
			b := sh.bindings[en.key]
			if b == nil {
				b = sh.insert(en.key)
			}
			b.pos, b.expires = en.pos, en.expires
			sh.toFront(b)
			sh.mu.Unlock()
		}
	}
}

// sweep drops up to limit expired bindings from the tail. Caller holds mu.
func (sh *sessionShard) sweep(now int64, limit int) {
	for range limit {
		b := sh.tail
		if b == nil || b.expires > now {
			return
		}
		sh.unlink(b)
		delete(sh.bindings, b.key)
	}
}

// insert adds an unlinked binding for key, evicting the least recently used
// binding (whose node it reuses) when the shard is full. The caller links it
// with toFront. Caller holds mu. A shard of capacity 0 cannot exist
// (newSession makes at most SessionCap shards).
func (sh *sessionShard) insert(key string) *binding {
	var b *binding
	if len(sh.bindings) >= sh.capacity && sh.tail != nil {
		b = sh.tail
		sh.unlink(b)
		delete(sh.bindings, b.key)
		*b = binding{}
	} else {
		b = new(binding)
	}
	b.key = key
	sh.bindings[key] = b
	return b
}

// toFront makes b the most recently used binding, linking it if needed.
// Caller holds mu.
func (sh *sessionShard) toFront(b *binding) {
	if sh.head == b {
		return
	}
	if b.prev != nil || b.next != nil || sh.tail == b {
		sh.unlink(b)
	}
	b.next = sh.head
	if sh.head != nil {
		sh.head.prev = b
	}
	sh.head = b
	if sh.tail == nil {
		sh.tail = b
	}
}

// unlink removes b from the list. Caller holds mu.
func (sh *sessionShard) unlink(b *binding) {
	if b.prev != nil {
		b.prev.next = b.next
	} else if sh.head == b {
		sh.head = b.next
	}
	if b.next != nil {
		b.next.prev = b.prev
	} else if sh.tail == b {
		sh.tail = b.prev
	}
	b.prev, b.next = nil, nil
}

var (
	_ Picker         = (*session)(nil)
	_ Inheritor      = (*session)(nil)
	_ BindingCounter = (*session)(nil)
)
