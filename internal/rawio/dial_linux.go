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
	fd, inProgress, err := Connect(ap)
	if err != nil {
		return nil, err
	}
	// From here the connection owns fd (os.NewFile registers it with the
	// runtime poller: no scheduler-visible system call, F_GETFL goes
	// through the runtime's own fcntl).
	fc, err := newFileConn(fd, netip.AddrPortFrom(ap.Addr().Unmap(), ap.Port()))
	if err != nil {
		return nil, err
	}
	if inProgress {
		if err := waitConnected(ctx, fc.f, fc.io.rc); err != nil {
			fc.f.Close()
			return nil, err
		}
	}
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
		var done bool
		done, cerr = connectState(fd)
		return done
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
