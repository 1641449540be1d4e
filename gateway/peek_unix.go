//go:build unix

package gateway

import (
	"net"
	"syscall"
	"unsafe"
)

// peerOpen reports whether an idle connection can still carry a request:
// nothing is waiting to be read on it (no FIN, no RST, no unsolicited bytes
// such as a 408 sent before closing). It peeks without blocking and without
// consuming anything.
func peerOpen(c net.Conn) bool {
	sc, ok := c.(syscall.Conn)
	if !ok {
		return true
	}
	rc, err := sc.SyscallConn()
	if err != nil {
		return false
	}
	open := false
	var buf [1]byte
	cerr := rc.Read(func(fd uintptr) bool {
		// A raw system call: it never blocks (MSG_DONTWAIT), and entering
		// the scheduler's syscall state would wake the runtime's monitor
		// thread on every reuse.
		_, _, e := syscall.RawSyscall6(syscall.SYS_RECVFROM, fd, uintptr(unsafe.Pointer(&buf[0])), 1, syscall.MSG_PEEK|syscall.MSG_DONTWAIT, 0, 0)
		// EAGAIN: nothing to read, the peer is idle and open. No error
		// with n == 0 is the peer's FIN, n > 0 unsolicited data; any other
		// error (ECONNRESET) is a dead connection.
		open = e == syscall.EAGAIN || e == syscall.EWOULDBLOCK
		return true // never wait for readability
	})
	return cerr == nil && open
}
