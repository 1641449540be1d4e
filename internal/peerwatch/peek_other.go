//go:build !unix

package peerwatch

import "syscall"

// peerClosed cannot peek without MSG_PEEK; it waits for the read deadline
// and never reports a close.
func peerClosed(rc syscall.RawConn) bool {
	_ = rc.Read(func(uintptr) bool { return false })
	return false
}
