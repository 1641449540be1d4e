//go:build linux

package rawio

import (
	"io"
	"net"
	"syscall"
	"testing"
)

// pingpong reports whether the kernel holds c in delayed-ACK ("pingpong")
// mode: getsockopt(TCP_QUICKACK) reads 1 when it does not (tcp(7); Linux
// answers !inet_csk_in_pingpong_mode).
func pingpong(t *testing.T, c net.Conn) bool {
	t.Helper()
	rc, err := c.(syscall.Conn).SyscallConn()
	if err != nil {
		t.Fatal(err)
	}
	var v int
	var gerr error
	if err := rc.Control(func(fd uintptr) {
		v, gerr = syscall.GetsockoptInt(int(fd), syscall.IPPROTO_TCP, syscall.TCP_QUICKACK)
	}); err != nil {
		t.Fatal(err)
	}
	if gerr != nil {
		t.Fatal(gerr)
	}
	return v == 0
}

// request and answer are the two halves of an exchange on c; a client that
// writes right after reading an answer is what puts the kernel into
// pingpong mode.
func request(t *testing.T, c net.Conn, peer *net.TCPConn, buf []byte) {
	t.Helper()
	if _, err := c.Write(buf); err != nil {
		t.Fatal(err)
	}
	if _, err := io.ReadFull(peer, buf); err != nil {
		t.Fatal(err)
	}
}

func answer(t *testing.T, c net.Conn, peer *net.TCPConn, buf []byte) {
	t.Helper()
	if _, err := peer.Write(buf); err != nil {
		t.Fatal(err)
	}
	if _, err := io.ReadFull(c, buf); err != nil {
		t.Fatal(err)
	}
}

// TestQuickAck: after back-to-back exchanges the kernel delays c's ACKs
// (the state that stalls a Nagle server's second write ~40 ms); QuickAck
// takes c out of it, on every kind of connection this package makes and
// on a plain *net.TCPConn, and allocates nothing on this package's own.
func TestQuickAck(t *testing.T) {
	plain := func(t *testing.T) (net.Conn, *net.TCPConn) {
		c, peer := pair(t)
		return c.TCPConn, peer
	}
	for _, tc := range []struct {
		name string
		pair func(*testing.T) (net.Conn, *net.TCPConn)
	}{
		{"wrapped", func(t *testing.T) (net.Conn, *net.TCPConn) { return pair(t) }},
		{"dialed", func(t *testing.T) (net.Conn, *net.TCPConn) { return dialedPair(t) }},
		{"net.TCPConn", plain},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c, peer := tc.pair(t)
			buf := make([]byte, 64)
			entered := false
			for range 50 {
				request(t, c, peer, buf)
				if pingpong(t, c) {
					entered = true
					break
				}
				answer(t, c, peer, buf)
			}
			if !entered {
				t.Fatal("the kernel never entered delayed-ACK mode; the test cannot tell QuickAck works")
			}
			if err := QuickAck(c); err != nil {
				t.Fatal(err)
			}
			if pingpong(t, c) {
				t.Fatal("still in delayed-ACK mode after QuickAck")
			}
			if tc.name == "net.TCPConn" {
				return
			}
			if n := testing.AllocsPerRun(100, func() {
				if err := QuickAck(c); err != nil {
					t.Fatal(err)
				}
			}); n != 0 {
				t.Fatalf("%v allocations per QuickAck, want 0", n)
			}
		})
	}
}

// TestQuickAckErrors: a closed connection and a connection that is not a
// socket are errors, not silently ignored.
func TestQuickAckErrors(t *testing.T) {
	c, _ := pair(t)
	c.Close()
	if err := QuickAck(c); err == nil {
		t.Error("QuickAck on a closed connection: no error")
	}
	a, b := net.Pipe()
	defer a.Close()
	defer b.Close()
	if err := QuickAck(a); err == nil {
		t.Error("QuickAck on a net.Pipe: no error")
	}
}
