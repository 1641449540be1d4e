//go:build unix

package peerwatch

import (
	"errors"
	"syscall"
)

// peerClosed blocks until the socket is readable (or its read deadline
// passes) and reports whether the peer closed or reset it.
func peerClosed(rc syscall.RawConn) bool {
	var buf [1]byte
	var n int
	var perr error
	err := rc.Read(func(fd uintptr) bool {
		for {
			n, _, perr = syscall.Recvfrom(int(fd), buf[:], syscall.MSG_PEEK|syscall.MSG_DONTWAIT)
			if !errors.Is(perr, syscall.EINTR) {
				break
			}
		}
		// EAGAIN: nothing to read yet; wait for the poller.
		return !errors.Is(perr, syscall.EAGAIN)
	})
	if err != nil {
		return false // the deadline passed: stopped
	}
	if perr != nil {
		return true // ECONNRESET and friends: the connection is dead
	}
	return n == 0 // end of stream; n > 0 is a pipelined request
}
