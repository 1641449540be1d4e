//go:build !unix

package peerwatch

import "syscall"

// peeker cannot peek without MSG_PEEK: it waits for the read deadline and
// never reports a close.
type peeker struct{}

func (peeker) closed(rc syscall.RawConn, _ bool) bool {
	_ = rc.Read(func(uintptr) bool { return false })
	return false
}
