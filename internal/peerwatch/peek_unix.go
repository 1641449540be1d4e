//go:build unix

package peerwatch

import (
	"errors"
	"syscall"
)

// peeker peeks at a socket; its method value is kept so that a watch does
// not allocate one.
type peeker struct {
	buf    [1]byte
	n      int
	err    error
	tls    bool
	hupTLS bool // a TLS peer hung up behind the bytes it sent
	fn     func(fd uintptr) bool
	init   bool
}

func (p *peeker) try(fd uintptr) bool {
	for {
		p.n, _, p.err = syscall.Recvfrom(int(fd), p.buf[:], syscall.MSG_PEEK|syscall.MSG_DONTWAIT)
		if !errors.Is(p.err, syscall.EINTR) {
			break
		}
	}
	if errors.Is(p.err, syscall.EAGAIN) {
		return false // nothing to read yet; wait for the poller
	}
	if p.err != nil || p.n == 0 || !p.tls {
		return true
	}
	// TLS 1.3 encrypts alerts: a close_notify looks like application data
	// on the wire (outer type 23). What tells a closing client from a
	// pipelined request is the FIN behind it.
	if peerHungUp(fd) {
		p.hupTLS = true
		return true
	}
	return false // wait for the next readiness: more data or the FIN
}

// tlsAlert is the TLS record content type of an alert (RFC 8446 §5.1).
const tlsAlert = 21

// closed blocks until the socket is readable (or its read deadline passes)
// and reports whether the peer closed or reset it (for TLS: or sent an
// alert).
func (p *peeker) closed(rc syscall.RawConn, isTLS bool) bool {
	if !p.init {
		p.fn, p.init = p.try, true
	}
	p.tls, p.hupTLS = isTLS, false
	if err := rc.Read(p.fn); err != nil {
		return false // the deadline passed: stopped
	}
	if p.err != nil {
		return true // ECONNRESET and friends: the connection is dead
	}
	if p.n == 0 || p.hupTLS {
		return true // end of stream
	}
	return isTLS && p.buf[0] == tlsAlert // TLS 1.2 alert; else a pipelined request
}
