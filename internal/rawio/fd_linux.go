//go:build linux

package rawio

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"syscall"
	"time"
	"unsafe"
)

// Descriptor-level calls for an event loop of the gateway's own
// (internal/evloop): the same raw system calls as the connections above,
// on a non-blocking socket descriptor that no runtime poller watches. None
// of them waits; each returns the kernel's errno (0 on success, EAGAIN
// when the socket has nothing to give or no room) and, with a non-zero
// errno, a count of 0 (never the raw call's -1), and none allocates.
// Under the race detector reads and writes are annotated as the
// connections' are (race_linux.go).

// Read is one read(2) on fd into p (n 0 with errno 0 is the peer's FIN).
func Read(fd int, p []byte) (int, syscall.Errno) {
	if len(p) == 0 {
		return 0, 0
	}
	for {
		n, _, e := syscall.RawSyscall(syscall.SYS_READ, uintptr(fd), uintptr(unsafe.Pointer(unsafe.SliceData(p))), uintptr(len(p)))
		if e == syscall.EINTR {
			continue
		}
		if e != 0 {
			return 0, e
		}
		raceAfterRead(uintptr(fd), p, int(n))
		return int(n), 0
	}
}

// MaxIovec is the most buffers one Writev takes.
const MaxIovec = 4

// Writev is one writev(2) of bufs (at most MaxIovec of them; empty ones
// are skipped; a single one is a write(2)) on fd; iov is the caller's scratch for the vector, so
// nothing is allocated. It returns how many bytes the socket took.
func Writev(fd int, bufs [][]byte, iov *[MaxIovec]syscall.Iovec) (int, syscall.Errno) {
	if len(bufs) > MaxIovec {
		return 0, syscall.EINVAL
	}
	k := 0
	for _, b := range bufs {
		if len(b) == 0 {
			continue
		}
		raceBeforeWrite(b)
		iov[k].Base = unsafe.SliceData(b)
		iov[k].SetLen(len(b))
		k++
	}
	if k == 0 {
		return 0, 0
	}
	call := uintptr(syscall.SYS_WRITEV)
	arg, cnt := uintptr(unsafe.Pointer(&iov[0])), uintptr(k)
	if k == 1 {
		// One buffer: write(2), which the kernel takes without importing
		// a vector.
		call, arg, cnt = syscall.SYS_WRITE, uintptr(unsafe.Pointer(iov[0].Base)), uintptr(iov[0].Len)
	}
	for {
		n, _, e := syscall.RawSyscall(call, uintptr(fd), arg, cnt)
		if e == syscall.EINTR {
			continue
		}
		if e != 0 {
			return 0, e
		}
		return int(n), 0
	}
}

// Close is close(2) on fd. A close made this way does not go through the
// scheduler's system-call state, so it does not wake the runtime's monitor
// (BENCHMARKS.md, "the one-shot path's system calls").
func Close(fd int) syscall.Errno {
	_, _, e := syscall.RawSyscall(syscall.SYS_CLOSE, uintptr(fd), 0, 0)
	return e
}

// ShutdownWrite sends fd's FIN (shutdown(2), SHUT_WR).
func ShutdownWrite(fd int) syscall.Errno {
	_, _, e := syscall.RawSyscall(syscall.SYS_SHUTDOWN, uintptr(fd), syscall.SHUT_WR, 0)
	return e
}

// ShutdownRDWR ends both directions of fd's connection (shutdown(2),
// SHUT_RDWR), whoever else holds the socket.
func ShutdownRDWR(fd int) syscall.Errno {
	_, _, e := syscall.RawSyscall(syscall.SYS_SHUTDOWN, uintptr(fd), syscall.SHUT_RDWR, 0)
	return e
}

// QuickAckFD is QuickAck on a descriptor.
func QuickAckFD(fd int) syscall.Errno {
	_, _, e := syscall.RawSyscall6(syscall.SYS_SETSOCKOPT, uintptr(fd), syscall.IPPROTO_TCP, syscall.TCP_QUICKACK,
		uintptr(unsafe.Pointer(&quickAckOn)), unsafe.Sizeof(quickAckOn), 0)
	return e
}

// noDelayOn is TCP_NODELAY's option value, at a fixed address.
var noDelayOn int32 = 1

// Accept takes one connection from the listening socket lfd: non-blocking,
// close-on-exec, TCP_NODELAY set (as package net sets it on accepted
// connections), with its peer's address.
func Accept(lfd int) (int, netip.AddrPort, syscall.Errno) {
	var sa [128]byte
	for {
		sl := uint32(len(sa))
		fd, _, e := syscall.RawSyscall6(syscall.SYS_ACCEPT4, uintptr(lfd), uintptr(unsafe.Pointer(&sa[0])), uintptr(unsafe.Pointer(&sl)), syscall.SOCK_NONBLOCK|syscall.SOCK_CLOEXEC, 0, 0)
		if e == syscall.EINTR {
			continue
		}
		if e != 0 {
			return -1, netip.AddrPort{}, e
		}
		if _, _, e := syscall.RawSyscall6(syscall.SYS_SETSOCKOPT, fd, syscall.IPPROTO_TCP, syscall.TCP_NODELAY, uintptr(unsafe.Pointer(&noDelayOn)), 4, 0); e != 0 && e != syscall.EOPNOTSUPP {
			closeRaw(fd)
			return -1, netip.AddrPort{}, e
		}
		ap := netip.AddrPort{}
		if a, err := parseSockaddr(&sa); err == nil {
			ap = a.AddrPort()
		}
		return int(fd), ap, 0
	}
}

// Connect starts a TCP connection to ap on a new non-blocking socket
// (TCP_NODELAY set). inProgress: the handshake goes on; the socket becomes
// writable when it has ended, and ConnectResult then says how. Any error
// leaves no descriptor open.
func Connect(ap netip.AddrPort) (fd int, inProgress bool, err error) {
	ap = netip.AddrPortFrom(ap.Addr().Unmap(), ap.Port())
	family := syscall.AF_INET
	if ap.Addr().Is6() {
		family = syscall.AF_INET6
	}
	s, _, e := syscall.RawSyscall(syscall.SYS_SOCKET, uintptr(family), syscall.SOCK_STREAM|syscall.SOCK_NONBLOCK|syscall.SOCK_CLOEXEC, syscall.IPPROTO_TCP)
	if e != 0 {
		return -1, false, os.NewSyscallError("socket", e)
	}
	if _, _, e := syscall.RawSyscall6(syscall.SYS_SETSOCKOPT, s, syscall.IPPROTO_TCP, syscall.TCP_NODELAY, uintptr(unsafe.Pointer(&noDelayOn)), 4, 0); e != 0 {
		closeRaw(s)
		return -1, false, os.NewSyscallError("setsockopt", e)
	}
	sa, salen := sockaddr(ap)
	for {
		_, _, e = syscall.RawSyscall(syscall.SYS_CONNECT, s, uintptr(unsafe.Pointer(&sa[0])), uintptr(salen))
		if e != syscall.EINTR {
			break
		}
	}
	switch e {
	case 0:
		return int(s), false, nil
	case syscall.EINPROGRESS, syscall.EALREADY:
		return int(s), true, nil
	}
	closeRaw(s)
	return -1, false, os.NewSyscallError("connect", e)
}

// ConnectResult says how a connection Connect left in progress stands:
// done false while the handshake goes on; done with err nil when it is
// established, with err the reason when it failed.
func ConnectResult(fd int) (done bool, err error) { return connectState(uintptr(fd)) }

// connectState is ConnectResult (and waitConnected's check): a peer name
// means connected, one system call on the usual path; without one,
// SO_ERROR tells a handshake in progress from a failed one.
func connectState(fd uintptr) (done bool, err error) {
	var sa [128]byte
	sl := uint32(len(sa))
	_, _, e := syscall.RawSyscall(syscall.SYS_GETPEERNAME, fd, uintptr(unsafe.Pointer(&sa[0])), uintptr(unsafe.Pointer(&sl)))
	switch e {
	case 0:
		return true, nil
	case syscall.ENOTCONN:
	default:
		return true, os.NewSyscallError("getpeername", e)
	}
	var soerr int32
	l := uint32(4)
	if _, _, e := syscall.RawSyscall6(syscall.SYS_GETSOCKOPT, fd, syscall.SOL_SOCKET, syscall.SO_ERROR, uintptr(unsafe.Pointer(&soerr)), uintptr(unsafe.Pointer(&l)), 0); e != 0 {
		return true, os.NewSyscallError("getsockopt", e)
	}
	switch e := syscall.Errno(soerr); e {
	case 0, syscall.EINPROGRESS, syscall.EALREADY, syscall.EINTR:
		// SO_ERROR stays 0 until the handshake ends one way or the
		// other.
		return false, nil
	default:
		return true, os.NewSyscallError("connect", e)
	}
}

// ListenFD binds a TCP listener to addr as net.Listen does (names, port 0,
// dual-stack wildcards) and returns a non-blocking, close-on-exec
// descriptor of the listening socket that no runtime poller watches, with
// the address it is bound to. The caller owns the descriptor (Close).
func ListenFD(addr string) (int, net.Addr, error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return -1, nil, err
	}
	defer ln.Close() // the duplicate below keeps the socket listening
	tl, ok := ln.(*net.TCPListener)
	if !ok {
		return -1, nil, fmt.Errorf("rawio: listen %s: not a TCP listener", addr)
	}
	rc, err := tl.SyscallConn()
	if err != nil {
		return -1, nil, err
	}
	fd := -1
	var e syscall.Errno
	if cerr := rc.Control(func(s uintptr) {
		var r uintptr
		r, _, e = syscall.RawSyscall(syscall.SYS_FCNTL, s, syscall.F_DUPFD_CLOEXEC, 0)
		fd = int(r)
	}); cerr != nil {
		return -1, nil, cerr
	}
	if e != 0 {
		return -1, nil, os.NewSyscallError("fcntl F_DUPFD_CLOEXEC", e)
	}
	// O_NONBLOCK belongs to the open file, which the duplicate shares with
	// the poller's descriptor (already non-blocking); set it anyway, so
	// nothing depends on that.
	if err := syscall.SetNonblock(fd, true); err != nil {
		closeRaw(uintptr(fd))
		return -1, nil, err
	}
	// Closing ln takes its descriptor out of the runtime poller (epoll_ctl
	// DEL) and closes it; the socket stays open through fd.
	return fd, ln.Addr(), nil
}

// ConnFromFD makes the connected socket fd (non-blocking, as Accept and
// Connect leave it) a net.Conn read and written raw like DialTCP's, its
// waits the runtime poller's; the connection owns fd from here, also when
// an error is returned. remote is the peer's address.
func ConnFromFD(fd int, remote netip.AddrPort) (net.Conn, error) {
	fc, err := newFileConn(fd, remote)
	if err != nil {
		return nil, err
	}
	return fc, nil
}

// newFileConn is ConnFromFD.
func newFileConn(fd int, remote netip.AddrPort) (*fileConn, error) {
	f := os.NewFile(uintptr(fd), "tcp")
	if f == nil {
		closeRaw(uintptr(fd))
		return nil, errors.New("rawio: NewFile refused the socket")
	}
	// NewFile falls back to a blocking, unpolled File when the poller
	// refuses the descriptor; such a File has no deadlines (ErrNoDeadline)
	// and would block a thread per wait: refuse it here, not later.
	if err := f.SetDeadline(time.Time{}); err != nil {
		f.Close()
		return nil, fmt.Errorf("rawio: the runtime poller did not take the socket: %w", err)
	}
	rc, err := f.SyscallConn()
	if err != nil {
		f.Close()
		return nil, err
	}
	fc := &fileConn{f: f, remote: net.TCPAddrFromAddrPort(remote)}
	fc.io.rc = rc
	fc.io.init(f.SetWriteDeadline)
	return fc, nil
}
