//go:build linux

// Package testnet holds network fixtures for tests: real sockets on
// loopback, no clocks.
package testnet

import (
	"net"
	"syscall"
	"testing"
	"time"
)

// FullListener is a loopback listener whose accept queue is full, so a new
// connect gets no SYN-ACK (its SYN is dropped) until Accept makes room; the
// connect's retransmitted SYN then completes it.
type FullListener struct {
	// Addr is the listener's address.
	Addr *net.TCPAddr
	fd   int
	t    testing.TB
}

// NewFullListener returns a listener whose accept queue is full. The socket
// and the connections that filled the queue close at t's cleanup.
func NewFullListener(t testing.TB) *FullListener {
	t.Helper()
	fd, err := syscall.Socket(syscall.AF_INET, syscall.SOCK_STREAM|syscall.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { syscall.Close(fd) })
	if err := syscall.Bind(fd, &syscall.SockaddrInet4{Addr: [4]byte{127, 0, 0, 1}}); err != nil {
		t.Fatal(err)
	}
	// Backlog 0: the accept queue is full once one connection waits in it.
	if err := syscall.Listen(fd, 0); err != nil {
		t.Fatal(err)
	}
	sa, err := syscall.Getsockname(fd)
	if err != nil {
		t.Fatal(err)
	}
	l := &FullListener{Addr: &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1), Port: sa.(*syscall.SockaddrInet4).Port}, fd: fd, t: t}
	// Fill the queue until a connect no longer completes.
	for i := 0; ; i++ {
		c, err := net.DialTimeout("tcp", l.Addr.String(), 100*time.Millisecond)
		if err != nil {
			return l
		}
		t.Cleanup(func() { c.Close() })
		if i > 16 {
			t.Fatal("the accept queue never filled")
		}
	}
}

// Accept takes the oldest connection out of the queue (making room for
// one more) and returns its peer's address; the accepted socket closes at
// the test's cleanup.
func (l *FullListener) Accept() (*net.TCPAddr, error) {
	nfd, sa, err := syscall.Accept4(l.fd, syscall.SOCK_CLOEXEC)
	if err != nil {
		return nil, err
	}
	l.t.Cleanup(func() { syscall.Close(nfd) })
	in4 := sa.(*syscall.SockaddrInet4)
	return &net.TCPAddr{IP: net.IP(in4.Addr[:]).To16(), Port: in4.Port}, nil
}

// Blackhole returns a loopback address whose listener never accepts and
// whose accept queue is full, so a new connect gets no SYN-ACK and times
// out: a connect timeout on loopback without any clock in the test.
func Blackhole(t testing.TB) *net.TCPAddr {
	t.Helper()
	return NewFullListener(t).Addr
}
