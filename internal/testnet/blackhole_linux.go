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

// Blackhole returns a loopback address whose listener never accepts and
// whose accept queue is full, so a new connect gets no SYN-ACK and times
// out: a connect timeout on loopback without any clock in the test. The
// socket and the connections that filled the queue close at t's cleanup.
func Blackhole(t testing.TB) *net.TCPAddr {
	t.Helper()
	fd, err := syscall.Socket(syscall.AF_INET, syscall.SOCK_STREAM, 0)
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
	addr := &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1), Port: sa.(*syscall.SockaddrInet4).Port}
	// Fill the queue until a connect no longer completes.
	for i := 0; ; i++ {
		c, err := net.DialTimeout("tcp", addr.String(), 100*time.Millisecond)
		if err != nil {
			return addr
		}
		t.Cleanup(func() { c.Close() })
		if i > 16 {
			t.Fatal("the accept queue never filled")
		}
	}
}
