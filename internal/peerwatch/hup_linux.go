package peerwatch

import (
	"syscall"
	"unsafe"
)

// poll(2) event bits (linux/include/uapi/asm-generic/poll.h): POLLRDHUP,
// the peer shut down its writing side; POLLERR and POLLHUP.
const (
	pollERR   = 0x8
	pollHUP   = 0x10
	pollRDHUP = 0x2000
)

// peerHungUp reports whether the peer of socket fd has sent its FIN (or
// the connection is gone), whatever unread bytes precede it.
func peerHungUp(fd uintptr) bool {
	pfd := struct {
		fd      int32
		events  int16
		revents int16
	}{fd: int32(fd), events: pollRDHUP}
	var ts syscall.Timespec // zero: do not wait
	n, _, errno := syscall.Syscall6(syscall.SYS_PPOLL, uintptr(unsafe.Pointer(&pfd)), 1, uintptr(unsafe.Pointer(&ts)), 0, 0, 0)
	if errno != 0 || n != 1 {
		return false
	}
	return pfd.revents&(pollRDHUP|pollHUP|pollERR) != 0
}
