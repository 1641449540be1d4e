//go:build unix

package peerwatch

import (
	"errors"
	"syscall"
)

// peeker peeks at a socket; its method value is kept so that a watch does
// not allocate one.
type peeker struct {
	buf  [1]byte
	n    int
	err  error
	fn   func(fd uintptr) bool
	init bool
}

func (p *peeker) try(fd uintptr) bool {
	for {
		p.n, _, p.err = syscall.Recvfrom(int(fd), p.buf[:], syscall.MSG_PEEK|syscall.MSG_DONTWAIT)
		if !errors.Is(p.err, syscall.EINTR) {
			break
		}
	}
	// EAGAIN: nothing to read yet; wait for the poller.
	return !errors.Is(p.err, syscall.EAGAIN)
}

// closed blocks until the socket is readable (or its read deadline passes)
// and reports whether the peer closed or reset it.
func (p *peeker) closed(rc syscall.RawConn) bool {
	if !p.init {
		p.fn, p.init = p.try, true
	}
	if err := rc.Read(p.fn); err != nil {
		return false // the deadline passed: stopped
	}
	if p.err != nil {
		return true // ECONNRESET and friends: the connection is dead
	}
	return p.n == 0 // end of stream; n > 0 is a pipelined request
}
