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

	// A deferred watch (WatchAfter) starts from timer; mu orders its start
	// against Stop.
	timer    *time.Timer
	startFn  func()
	mu       sync.Mutex
	deferred bool // this watch starts from timer
	started  bool // the peek is running (or about to): Stop must wake it
	stopped  bool
}

var pool = sync.Pool{New: func() any {
	w := &Watcher{done: make(chan struct{}, 1)}
	w.startFn = w.deferredStart
	return w
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
// costs a timer and nothing else (no goroutine, no peek, no deadline
// change), which is what most of a proxy's fast answers need; a client
// that leaves is noticed at most delay later than with Watch. A watch
// stopped before it started leaves conn's read deadline as it was (one that
// started leaves none, as Watch). delay <= 0 starts at once.
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
		if w.timer == nil {
			w.timer = time.AfterFunc(delay, w.startFn)
		} else {
			w.timer.Reset(delay)
		}
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

// deferredStart runs on the timer's goroutine: unless Stop came first, it
// becomes the watch.
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
	case w.deferred && w.timer.Stop():
		// Stopped before it started: nothing ran, nothing to undo.
	case w.deferred:
		// The timer fired: its goroutine is starting or watching.
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
