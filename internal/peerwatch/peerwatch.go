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
}

var pool = sync.Pool{New: func() any { return &Watcher{done: make(chan struct{}, 1)} }}

// Watch watches conn until Stop and calls gone (at most once, on the
// watch's goroutine) if the peer closes or resets the connection first.
// Stop waits for the watch to end and leaves conn with no read deadline;
// the caller must not read conn between Watch and Stop. For a TLS
// connection the TCP connection under it is watched. A connection that is
// not a socket is not watched (Stop is then a no-op).
func Watch(conn net.Conn, gone func()) *Watcher {
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
	// The server's own read deadline (the whole-request read timeout) may
	// still be armed; the watch lasts as long as the handler does.
	if err := raw.SetReadDeadline(time.Time{}); err != nil {
		return w
	}
	w.raw, w.tls, w.rc, w.gone = raw, isTLS, rc, gone
	go w.run()
	return w
}

func (w *Watcher) run() {
	if w.peek.closed(w.rc, w.tls) {
		w.gone()
	}
	w.done <- struct{}{}
}

// Stop ends the watch and returns once it has ended.
func (w *Watcher) Stop() {
	if w.raw != nil {
		// A past deadline wakes the poller wait; the watch then returns.
		_ = w.raw.SetReadDeadline(time.Unix(1, 0))
		<-w.done
		_ = w.raw.SetReadDeadline(time.Time{})
	}
	w.raw, w.rc, w.gone = nil, nil, nil
	pool.Put(w)
}
