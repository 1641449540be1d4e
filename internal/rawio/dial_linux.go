//go:build linux

package rawio

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"syscall"
	"time"
	"unsafe"
)

// DialTCP connects to addr, an IP literal and port, with raw socket(2),
// setsockopt(2) (TCP_NODELAY, as net.Dial sets it) and connect(2), waits
// for the connection through the runtime poller within ctx's deadline, and
// returns a connection whose Read and Write are raw as Conn's are. Its
// LocalAddr is asked of the kernel (getsockname(2)) only when first called:
// a connection opened for one request usually never needs it.
//
// Why not net.Dialer: a dial through package net is six or seven system
// calls in the scheduler's syscall state (the loopback connect(2) alone runs
// the whole handshake), and on a gateway that opens a connection per
// request (engines that must not see a reused connection) each one
// restarts the runtime monitor's 20 µs polling and hands the P to another
// thread. Here only the final close(2) is a scheduler-visible call.
//
// The address must be numeric (ok false otherwise: the caller dials with
// package net, which resolves names).
func DialTCP(ctx context.Context, addr string) (c net.Conn, ok bool, err error) {
	ap, perr := netip.ParseAddrPort(addr)
	if perr != nil {
		return nil, false, nil
	}
	ap = netip.AddrPortFrom(ap.Addr().Unmap(), ap.Port())
	c, err = dial(ctx, ap)
	if err != nil {
		return nil, true, &net.OpError{Op: "dial", Net: "tcp", Addr: net.TCPAddrFromAddrPort(ap), Err: err}
	}
	return c, true, nil
}

func dial(ctx context.Context, ap netip.AddrPort) (net.Conn, error) {
	if err := ctxErr(ctx); err != nil {
		return nil, err
	}
	family := syscall.AF_INET
	if ap.Addr().Is6() {
		family = syscall.AF_INET6
	}
	fd, _, e := syscall.RawSyscall(syscall.SYS_SOCKET, uintptr(family), syscall.SOCK_STREAM|syscall.SOCK_NONBLOCK|syscall.SOCK_CLOEXEC, syscall.IPPROTO_TCP)
	if e != 0 {
		return nil, os.NewSyscallError("socket", e)
	}
	one := int32(1)
	if _, _, e := syscall.RawSyscall6(syscall.SYS_SETSOCKOPT, fd, syscall.IPPROTO_TCP, syscall.TCP_NODELAY, uintptr(unsafe.Pointer(&one)), 4, 0); e != 0 {
		closeRaw(fd)
		return nil, os.NewSyscallError("setsockopt", e)
	}
	sa, salen := sockaddr(ap)
	inProgress := false
	for {
		_, _, e = syscall.RawSyscall(syscall.SYS_CONNECT, fd, uintptr(unsafe.Pointer(&sa[0])), uintptr(salen))
		if e == syscall.EINTR {
			continue
		}
		break
	}
	switch e {
	case 0:
	case syscall.EINPROGRESS, syscall.EALREADY:
		inProgress = true
	default:
		closeRaw(fd)
		return nil, os.NewSyscallError("connect", e)
	}
	// A non-blocking socket descriptor: os.NewFile registers it with the
	// runtime poller (no scheduler-visible system call: F_GETFL goes
	// through the runtime's own fcntl). From here the File owns fd.
	f := os.NewFile(fd, "tcp")
	if f == nil {
		closeRaw(fd)
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
	if inProgress {
		if err := waitConnected(ctx, f, rc); err != nil {
			f.Close()
			return nil, err
		}
	}
	fc := &fileConn{f: f, remote: net.TCPAddrFromAddrPort(ap)}
	fc.io.rc = rc
	fc.io.init(f.SetWriteDeadline)
	return fc, nil
}

// waitConnected waits until the connection in progress is established or
// has failed, within ctx.
func waitConnected(ctx context.Context, f *os.File, rc syscall.RawConn) error {
	if dl, ok := ctx.Deadline(); ok {
		if err := f.SetWriteDeadline(dl); err != nil {
			return err
		}
		defer f.SetWriteDeadline(time.Time{})
	}
	stop := context.AfterFunc(ctx, func() { f.SetWriteDeadline(aLongTimeAgo) })
	defer stop()
	var cerr error
	werr := rc.Write(func(fd uintptr) bool {
		// A peer name means connected: one system call on the usual
		// path (the poller's first call comes right after connect(2),
		// whose loopback handshake is already done). Without one the
		// connect is in progress or failed, which SO_ERROR tells.
		var sa [128]byte
		sl := uint32(len(sa))
		_, _, e := syscall.RawSyscall(syscall.SYS_GETPEERNAME, fd, uintptr(unsafe.Pointer(&sa[0])), uintptr(unsafe.Pointer(&sl)))
		switch e {
		case 0:
			return true
		case syscall.ENOTCONN:
		default:
			cerr = os.NewSyscallError("getpeername", e)
			return true
		}
		var soerr int32
		l := uint32(4)
		if _, _, e := syscall.RawSyscall6(syscall.SYS_GETSOCKOPT, fd, syscall.SOL_SOCKET, syscall.SO_ERROR, uintptr(unsafe.Pointer(&soerr)), uintptr(unsafe.Pointer(&l)), 0); e != 0 {
			cerr = os.NewSyscallError("getsockopt", e)
			return true
		}
		switch e := syscall.Errno(soerr); e {
		case 0, syscall.EINPROGRESS, syscall.EALREADY, syscall.EINTR:
			// Still connecting (SO_ERROR stays 0 until the handshake
			// ends one way or the other): wait for writability.
			return false
		default:
			cerr = os.NewSyscallError("connect", e)
			return true
		}
	})
	if werr != nil {
		if err := ctxErr(ctx); err != nil {
			return err
		}
		return werr
	}
	return cerr
}

// ctxErr is ctx's error as package net reports it: an expired deadline is
// os.ErrDeadlineExceeded (a net.Error whose Timeout is true).
func ctxErr(ctx context.Context) error {
	err := ctx.Err()
	if errors.Is(err, context.DeadlineExceeded) {
		return os.ErrDeadlineExceeded
	}
	return err
}

var aLongTimeAgo = time.Unix(1, 0)

func localAddr(rc syscall.RawConn) (*net.TCPAddr, error) {
	var sa [128]byte
	var err error
	cerr := rc.Control(func(fd uintptr) {
		sl := uint32(len(sa))
		if _, _, e := syscall.RawSyscall(syscall.SYS_GETSOCKNAME, fd, uintptr(unsafe.Pointer(&sa[0])), uintptr(unsafe.Pointer(&sl))); e != 0 {
			err = os.NewSyscallError("getsockname", e)
		}
	})
	if cerr != nil {
		return nil, cerr
	}
	if err != nil {
		return nil, err
	}
	return parseSockaddr(&sa)
}

func closeRaw(fd uintptr) { syscall.RawSyscall(syscall.SYS_CLOSE, fd, 0, 0) }

// sockaddr is ap as a struct sockaddr_in or sockaddr_in6.
func sockaddr(ap netip.AddrPort) ([28]byte, int) {
	var b [28]byte
	port := ap.Port()
	if ap.Addr().Is4() {
		sa := (*syscall.RawSockaddrInet4)(unsafe.Pointer(&b[0]))
		sa.Family = syscall.AF_INET
		sa.Port = port<<8 | port>>8
		sa.Addr = ap.Addr().As4()
		return b, syscall.SizeofSockaddrInet4
	}
	sa := (*syscall.RawSockaddrInet6)(unsafe.Pointer(&b[0]))
	sa.Family = syscall.AF_INET6
	sa.Port = port<<8 | port>>8
	sa.Addr = ap.Addr().As16()
	return b, syscall.SizeofSockaddrInet6
}

func parseSockaddr(b *[128]byte) (*net.TCPAddr, error) {
	switch (*syscall.RawSockaddr)(unsafe.Pointer(&b[0])).Family {
	case syscall.AF_INET:
		sa := (*syscall.RawSockaddrInet4)(unsafe.Pointer(&b[0]))
		p := sa.Port<<8 | sa.Port>>8
		return net.TCPAddrFromAddrPort(netip.AddrPortFrom(netip.AddrFrom4(sa.Addr), p)), nil
	case syscall.AF_INET6:
		sa := (*syscall.RawSockaddrInet6)(unsafe.Pointer(&b[0]))
		p := sa.Port<<8 | sa.Port>>8
		return net.TCPAddrFromAddrPort(netip.AddrPortFrom(netip.AddrFrom16(sa.Addr), p)), nil
	}
	return nil, fmt.Errorf("rawio: getsockname: unexpected address family")
}
