// Package peerwatch tells an HTTP/1.1 server that its client went away
// while the server is still working on the answer and not reading the
// connection (fasthttp reads a connection only between requests, so a
// client that closes while the handler waits on a worker goes unnoticed
// until the first write fails).
//
// Watch waits, in the runtime's network poller, for the connection to turn
// readable and then peeks (MSG_PEEK) at it without consuming anything: end
// of stream (the client closed or shut down its sending side) or a reset
// reports the client gone; bytes (a pipelined request) end the watch
// without a verdict, since they belong to the server's next read. Under TLS
// a client closing sends a close_notify alert before its FIN (Go's
// tls.Conn.Close, OpenSSL): a TLS record of type alert (21, RFC 8446 §5.1)
// reports the client gone as well; application data does not. This is
// the signal net/http derives from its background read (Request.Context is
// cancelled when the client's connection closes).
package peerwatch

import (
	"container/heap"
	"crypto/tls"
	"net"
	"sync"
	"syscall"
	"time"
)

// Watcher is one watch. Stop must be called exactly once; the Watcher must
// not be used after.
type Watcher struct {
	raw  net.Conn
	tls  bool
	rc   syscall.RawConn
	gone func()
	done chan struct{}
	peek peeker

	// A deferred watch (WatchAfter) waits in pending until due, then
	// starts; mu orders its start against Stop.
	due      time.Duration // since epoch
	idx      int           // index in pending's heap; -1 once out of it
	mu       sync.Mutex
	deferred bool // this watch starts when due
	started  bool // the peek is running (or about to): Stop must wake it
	stopped  bool
}

var pool = sync.Pool{New: func() any {
	return &Watcher{done: make(chan struct{}, 1), idx: -1}
}}

// Watch watches conn until Stop and calls gone (at most once, on the
// watch's goroutine) if the peer closes or resets the connection first.
// Stop waits for the watch to end and leaves conn with no read deadline;
// the caller must not read conn between Watch and Stop. For a TLS
// connection the TCP connection under it is watched. A connection that is
// not a socket is not watched (Stop is then a no-op).
func Watch(conn net.Conn, gone func()) *Watcher {
	return WatchAfter(conn, gone, 0)
}

// WatchAfter is Watch starting after delay: a watch stopped before then
// costs a place in a queue and nothing else (no goroutine, no peek, no
// deadline change, no timer of its own), which is what most of a proxy's
// fast answers need; a client that leaves is noticed at most delay later
// than with Watch (plus the scheduling of the one timer all deferred
// watches share). A watch stopped before it started leaves conn's read
// deadline as it was (one that started leaves none, as Watch). delay <= 0
// starts at once.
func WatchAfter(conn net.Conn, gone func(), delay time.Duration) *Watcher {
	raw, isTLS := conn, false
	if tc, ok := conn.(*tls.Conn); ok {
		raw, isTLS = tc.NetConn(), true
	}
	w := pool.Get().(*Watcher)
	sc, ok := raw.(syscall.Conn)
	if !ok {
		return w
	}
	rc, err := sc.SyscallConn()
	if err != nil {
		return w
	}
	w.raw, w.tls, w.rc, w.gone = raw, isTLS, rc, gone
	w.started, w.stopped, w.deferred = false, false, delay > 0
	if delay > 0 {
		pending.add(w, delay)
		return w
	}
	if !w.arm() {
		w.raw = nil
		return w
	}
	w.started = true
	go w.run()
	return w
}

// arm clears the server's own read deadline (the whole-request read
// timeout may still be armed; the watch lasts as long as the handler).
func (w *Watcher) arm() bool {
	return w.raw.SetReadDeadline(time.Time{}) == nil
}

// deferredStart runs once w is due and out of the queue: unless Stop came
// first, it becomes the watch.
func (w *Watcher) deferredStart() {
	w.mu.Lock()
	if w.stopped || !w.arm() {
		w.mu.Unlock()
		w.done <- struct{}{}
		return
	}
	w.started = true
	w.mu.Unlock()
	w.run()
}

func (w *Watcher) run() {
	if w.peek.closed(w.rc, w.tls) {
		w.gone()
	}
	w.done <- struct{}{}
}

// Stop ends the watch and returns once it has ended.
func (w *Watcher) Stop() {
	switch {
	case w.raw == nil:
	case w.deferred && pending.remove(w):
		// Stopped before it started: nothing ran, nothing to undo.
	case w.deferred:
		// It was due: its goroutine is starting or watching.
		w.mu.Lock()
		w.stopped = true
		started := w.started
		if started {
			// A past deadline wakes the poller wait; the watch then
			// returns. Under mu, so it lands after deferredStart's arm.
			_ = w.raw.SetReadDeadline(time.Unix(1, 0))
		}
		w.mu.Unlock()
		<-w.done
		if started {
			_ = w.raw.SetReadDeadline(time.Time{})
		}
	default:
		_ = w.raw.SetReadDeadline(time.Unix(1, 0))
		<-w.done
		_ = w.raw.SetReadDeadline(time.Time{})
	}
	w.raw, w.rc, w.gone = nil, nil, nil
	pool.Put(w)
}

// pending holds the deferred watches that are not due yet, earliest
// first, under one runtime timer set for the earliest. Why one timer: a
// timer of its own per watch costs every request a timer insertion, and
// inserting a timer earlier than any other on the P wakes the thread
// sleeping in the network poller to shorten its sleep (runtime
// wakeNetPoller) — at one request in flight that was about half of the
// gateway's context switches (BENCHMARKS.md, "Kept llama.cpp
// connections"). Here the timer is set only when a watch is due before
// the one it is set for (with one delay for all, only when the queue was
// empty), and a watch stopped in time only leaves the queue.
var pending deferrals

// epoch is the origin of Watcher.due (monotonic clock).
var epoch = time.Now()

type deferrals struct {
	mu    sync.Mutex
	q     watchHeap
	timer *time.Timer
	armed time.Duration // due time the timer is set for; 0: not set
}

func (d *deferrals) add(w *Watcher, delay time.Duration) {
	now := time.Since(epoch)
	w.due = now + delay
	d.mu.Lock()
	heap.Push(&d.q, w)
	if d.armed == 0 || w.due < d.armed {
		d.armed = w.due
		if d.timer == nil {
			d.timer = time.AfterFunc(delay, d.fire)
		} else {
			d.timer.Reset(delay)
		}
	}
	d.mu.Unlock()
}

// remove takes w out of the queue and reports whether it was still there
// (not yet due and handed to its start).
func (d *deferrals) remove(w *Watcher) bool {
	d.mu.Lock()
	defer d.mu.Unlock()
	if w.idx < 0 {
		return false
	}
	heap.Remove(&d.q, w.idx)
	return true
}

// fire starts every due watch and sets the timer for the next one.
func (d *deferrals) fire() {
	now := time.Since(epoch)
	var due []*Watcher
	d.mu.Lock()
	for len(d.q) > 0 && d.q[0].due <= now {
		due = append(due, heap.Pop(&d.q).(*Watcher))
	}
	d.armed = 0
	if len(d.q) > 0 {
		d.armed = d.q[0].due
		d.timer.Reset(d.armed - now)
	}
	d.mu.Unlock()
	// Each started watch waits on its peek until Stop: its own goroutine;
	// the last one runs on this one.
	for i, w := range due {
		if i == len(due)-1 {
			w.deferredStart()
		} else {
			go w.deferredStart()
		}
	}
}

// watchHeap is a min-heap of watches on due (container/heap); each
// watch's idx is its index, -1 once popped or removed.
type watchHeap []*Watcher

func (h watchHeap) Len() int           { return len(h) }
func (h watchHeap) Less(i, j int) bool { return h[i].due < h[j].due }
func (h watchHeap) Swap(i, j int) {
	h[i], h[j] = h[j], h[i]
	h[i].idx, h[j].idx = i, j
}
func (h *watchHeap) Push(x any) {
	w := x.(*Watcher)
	w.idx = len(*h)
	*h = append(*h, w)
}
func (h *watchHeap) Pop() any {
	old := *h
	w := old[len(old)-1]
	old[len(old)-1] = nil
	w.idx = -1
	*h = old[:len(old)-1]
	return w
}
