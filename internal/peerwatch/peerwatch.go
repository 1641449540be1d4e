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
// without a verdict, since they belong to the server's next read. This is
// the signal net/http derives from its background read (Request.Context is
// cancelled when the client's connection closes).
package peerwatch

import (
	"crypto/tls"
	"net"
	"syscall"
	"time"
)

// Watch watches conn until stop is called and calls gone (at most once, on
// its own goroutine) if the peer closes or resets the connection first. stop
// waits for the watch to end and leaves conn with no read deadline; the
// caller must not read conn between Watch and stop. For a TLS connection the
// TCP connection under it is watched. A connection that is not a socket is
// not watched (stop is then a no-op).
func Watch(conn net.Conn, gone func()) (stop func()) {
	raw := conn
	if tc, ok := conn.(*tls.Conn); ok {
		raw = tc.NetConn()
	}
	sc, ok := raw.(syscall.Conn)
	if !ok {
		return func() {}
	}
	rc, err := sc.SyscallConn()
	if err != nil {
		return func() {}
	}
	// The server's own read deadline (the whole-request read timeout) may
	// still be armed; the watch lasts as long as the handler does.
	if err := raw.SetReadDeadline(time.Time{}); err != nil {
		return func() {}
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		if peerClosed(rc) {
			gone()
		}
	}()
	return func() {
		// A past deadline wakes the poller wait; the watch then returns.
		_ = raw.SetReadDeadline(time.Unix(1, 0))
		<-done
		_ = raw.SetReadDeadline(time.Time{})
	}
}
