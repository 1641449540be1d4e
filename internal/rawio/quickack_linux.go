//go:build linux

package rawio

import (
	"errors"
	"net"
	"os"
	"syscall"
	"unsafe"
)

// quickAckOn is TCP_QUICKACK's option value; setsockopt(2) reads it
// through a pointer, so it lives at a fixed address (no allocation).
var quickAckOn int32 = 1

var errNotSocket = errors.New("rawio: not a socket connection")

// doQuickAck is one setsockopt(TCP_QUICKACK, 1); its result is in qerr.
func (r *rw) doQuickAck(fd uintptr) {
	_, _, r.qerr = syscall.RawSyscall6(syscall.SYS_SETSOCKOPT, fd, syscall.IPPROTO_TCP, syscall.TCP_QUICKACK,
		uintptr(unsafe.Pointer(&quickAckOn)), unsafe.Sizeof(quickAckOn), 0)
}

func (r *rw) quickAck() error {
	r.qerr = 0
	if err := r.rc.Control(r.quickFn); err != nil {
		return err
	}
	if r.qerr != 0 {
		return os.NewSyscallError("setsockopt TCP_QUICKACK", r.qerr)
	}
	return nil
}

// QuickAck leaves the kernel's delayed-ACK ("pingpong") mode on c, so the
// next data c receives is acknowledged as soon as it is read instead of up
// to 40 ms later (Linux TCP_QUICKACK, tcp(7)). The mode is not sticky: the
// kernel re-enters it when c sends soon after receiving, so a client calls
// this after writing each request, before reading the answer.
//
// Why a proxy wants it: a server that writes a response's head and body as
// two small writes with Nagle's algorithm on (llama-server: cpp-httplib's
// default, no TCP_NODELAY) sends the body only once the head is
// acknowledged; with the client's ACK delayed, each answer on a reused
// connection waits ~40 ms for the delayed-ACK timer.
//
// c must be a connection from this package (Wrap, DialTCP) or a
// syscall.Conn; anything else is an error. The call allocates nothing for
// this package's connections.
func QuickAck(c net.Conn) error {
	r := rwOf(c)
	if r == nil {
		sc, ok := c.(syscall.Conn)
		if !ok {
			return errNotSocket
		}
		rc, err := sc.SyscallConn()
		if err != nil {
			return err
		}
		r = &rw{rc: rc}
		r.quickFn = r.doQuickAck
	}
	return r.quickAck()
}
