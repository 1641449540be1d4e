//go:build linux

package rawio

import (
	"bytes"
	"context"
	"errors"
	"io"
	"net"
	"os"
	"sync"
	"syscall"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/llmgw/llmgw/internal/testnet"
	"github.com/llmgw/llmgw/internal/wait"
)

// ioOf is the raw machinery of either kind of connection.
func ioOf(c net.Conn) *rw {
	switch c := c.(type) {
	case *Conn:
		return &c.io
	case *fileConn:
		return &c.io
	}
	panic("not a rawio connection")
}

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// halfCloser is what both kinds of connection offer the tests.
type halfCloser interface {
	net.Conn
	CloseWrite() error
}

// kinds are the two ways this package makes a connection: wrapping a
// dialed *net.TCPConn, and DialTCP.
var kinds = []struct {
	name string
	pair func(*testing.T) (halfCloser, *net.TCPConn)
}{
	{"wrapped", func(t *testing.T) (halfCloser, *net.TCPConn) { return pair(t) }},
	{"dialed", dialedPair},
}

// listen is a loopback listener and its one accepted connection (the
// channel is closed when Accept fails).
func listen(t testing.TB) (net.Listener, <-chan net.Conn) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	accepted := make(chan net.Conn, 1)
	go func() {
		c, err := ln.Accept()
		if err != nil {
			close(accepted)
			return
		}
		accepted <- c
	}()
	return ln, accepted
}

// dialedPair is pair with the client's end from DialTCP.
func dialedPair(t *testing.T) (halfCloser, *net.TCPConn) {
	t.Helper()
	ln, accepted := listen(t)
	defer ln.Close()
	c, ok, err := DialTCP(context.Background(), ln.Addr().String())
	if !ok || err != nil {
		t.Fatalf("DialTCP = %v, %v", ok, err)
	}
	peer, got := <-accepted
	if !got {
		t.Fatal("accept failed")
	}
	if c.LocalAddr().String() != peer.RemoteAddr().String() || c.RemoteAddr().String() != peer.LocalAddr().String() {
		t.Fatalf("addresses %v -> %v; the peer sees %v -> %v", c.LocalAddr(), c.RemoteAddr(), peer.RemoteAddr(), peer.LocalAddr())
	}
	t.Cleanup(func() { c.Close(); peer.Close() })
	return c.(halfCloser), peer.(*net.TCPConn)
}

// pair returns a wrapped client connection and the server's end of the
// same loopback TCP connection.
func pair(t *testing.T) (*Conn, *net.TCPConn) {
	t.Helper()
	ln, accepted := listen(t)
	defer ln.Close()
	c, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	peer, ok := <-accepted
	if !ok {
		t.Fatal("accept failed")
	}
	rc, ok := Wrap(c).(*Conn)
	if !ok {
		t.Fatalf("Wrap(%T) is not a *Conn", c)
	}
	t.Cleanup(func() { rc.Close(); peer.Close() })
	return rc, peer.(*net.TCPConn)
}

func TestWrapLeavesOtherConnsAlone(t *testing.T) {
	a, b := net.Pipe()
	defer a.Close()
	defer b.Close()
	if got := Wrap(a); got != a {
		t.Fatalf("Wrap(pipe) = %T, want the pipe itself", got)
	}
}

// The wrapped connection keeps net.TCPConn's observable behaviour: the
// data, io.EOF on the peer's FIN, the error kinds callers classify with
// errors.Is (deadline, reset, closed) and Timeout().
func TestConnBehavesLikeTCPConn(t *testing.T) {
	cases := []struct {
		name string
		run  func(t *testing.T, c halfCloser, peer *net.TCPConn)
	}{
		{"round trip", func(t *testing.T, c halfCloser, peer *net.TCPConn) {
			if n, err := c.Write([]byte("ping")); n != 4 || err != nil {
				t.Fatalf("Write = %d, %v", n, err)
			}
			buf := make([]byte, 4)
			if _, err := io.ReadFull(peer, buf); err != nil || string(buf) != "ping" {
				t.Fatalf("peer read %q, %v", buf, err)
			}
			if _, err := peer.Write([]byte("pong")); err != nil {
				t.Fatal(err)
			}
			if _, err := io.ReadFull(c, buf); err != nil || string(buf) != "pong" {
				t.Fatalf("Read %q, %v", buf, err)
			}
		}},
		{"EOF after the peer's FIN", func(t *testing.T, c halfCloser, peer *net.TCPConn) {
			if _, err := peer.Write([]byte("last")); err != nil {
				t.Fatal(err)
			}
			if err := peer.CloseWrite(); err != nil {
				t.Fatal(err)
			}
			got, err := io.ReadAll(c)
			if err != nil || string(got) != "last" {
				t.Fatalf("ReadAll = %q, %v", got, err)
			}
			if n, err := c.Read(make([]byte, 1)); n != 0 || err != io.EOF {
				t.Fatalf("Read after EOF = %d, %v; want 0, io.EOF", n, err)
			}
		}},
		{"zero-length read", func(t *testing.T, c halfCloser, peer *net.TCPConn) {
			if n, err := c.Read(nil); n != 0 || err != nil {
				t.Fatalf("Read(nil) = %d, %v", n, err)
			}
		}},
		{"read deadline", func(t *testing.T, c halfCloser, peer *net.TCPConn) {
			if err := c.SetReadDeadline(time.Now().Add(20 * time.Millisecond)); err != nil {
				t.Fatal(err)
			}
			_, err := c.Read(make([]byte, 1))
			if !errors.Is(err, os.ErrDeadlineExceeded) {
				t.Fatalf("err = %v, want os.ErrDeadlineExceeded", err)
			}
			var ne net.Error
			if !errors.As(err, &ne) || !ne.Timeout() {
				t.Fatalf("err = %v: not a net.Error with Timeout()", err)
			}
			// A later deadline lets the connection read again.
			if err := c.SetReadDeadline(time.Time{}); err != nil {
				t.Fatal(err)
			}
			if _, err := peer.Write([]byte("x")); err != nil {
				t.Fatal(err)
			}
			if _, err := io.ReadFull(c, make([]byte, 1)); err != nil {
				t.Fatalf("read after clearing the deadline: %v", err)
			}
		}},
		{"reset by the peer", func(t *testing.T, c halfCloser, peer *net.TCPConn) {
			if err := peer.SetLinger(0); err != nil {
				t.Fatal(err)
			}
			peer.Close()
			_, err := c.Read(make([]byte, 1))
			if !errors.Is(err, syscall.ECONNRESET) {
				t.Fatalf("err = %v, want ECONNRESET", err)
			}
			var oe *net.OpError
			if !errors.As(err, &oe) || oe.Op != "read" {
				t.Fatalf("err = %#v, want a *net.OpError for read", err)
			}
		}},
		{"use after Close", func(t *testing.T, c halfCloser, peer *net.TCPConn) {
			c.Close()
			if _, err := c.Read(make([]byte, 1)); !errors.Is(err, net.ErrClosed) {
				t.Fatalf("Read err = %v, want net.ErrClosed", err)
			}
			if _, err := c.Write([]byte("x")); !errors.Is(err, net.ErrClosed) {
				t.Fatalf("Write err = %v, want net.ErrClosed", err)
			}
		}},
		{"write larger than the socket buffers waits for the reader", func(t *testing.T, c halfCloser, peer *net.TCPConn) {
			big := bytes.Repeat([]byte("0123456789abcdef"), 1<<19) // 8 MiB
			got := make(chan []byte, 1)
			go func() {
				b, _ := io.ReadAll(peer)
				got <- b
			}()
			if n, err := c.Write(big); n != len(big) || err != nil {
				t.Fatalf("Write = %d, %v; want %d, nil", n, err, len(big))
			}
			c.CloseWrite()
			if b := <-got; !bytes.Equal(b, big) {
				t.Fatalf("peer got %d bytes, want the %d written", len(b), len(big))
			}
		}},
		{"write deadline while the peer does not read", func(t *testing.T, c halfCloser, peer *net.TCPConn) {
			big := make([]byte, 64<<20) // before the deadline: slow under -race
			if err := c.SetWriteDeadline(time.Now().Add(50 * time.Millisecond)); err != nil {
				t.Fatal(err)
			}
			n, err := c.Write(big)
			if !errors.Is(err, os.ErrDeadlineExceeded) {
				t.Fatalf("Write = %d, %v; want os.ErrDeadlineExceeded", n, err)
			}
			if n <= 0 || n >= len(big) {
				t.Fatalf("Write reported %d bytes: want the part the socket took", n)
			}
		}},
		{"a write the socket takes at once is not failed by a passed deadline", func(t *testing.T, c halfCloser, peer *net.TCPConn) {
			// The contract of writeDeadline: the deadline bounds waiting.
			if err := c.SetWriteDeadline(time.Unix(1, 0)); err != nil {
				t.Fatal(err)
			}
			if n, err := c.Write([]byte("ping")); n != 4 || err != nil {
				t.Fatalf("Write = %d, %v; want 4, nil", n, err)
			}
			buf := make([]byte, 4)
			if _, err := io.ReadFull(peer, buf); err != nil || string(buf) != "ping" {
				t.Fatalf("peer read %q, %v", buf, err)
			}
			if ioOf(c).wd.armed {
				t.Fatal("the poller holds a deadline no write waited for")
			}
		}},
		{"a deadline set while a write waits ends the wait", func(t *testing.T, c halfCloser, peer *net.TCPConn) {
			wrote := make(chan error, 1)
			go func() {
				_, err := c.Write(make([]byte, 64<<20))
				wrote <- err
			}()
			wd := &ioOf(c).wd
			wait.For(t, 10*time.Second, "the write to wait for the socket", func() bool {
				wd.mu.Lock()
				defer wd.mu.Unlock()
				return wd.waiting
			})
			if err := c.SetWriteDeadline(time.Unix(1, 0)); err != nil {
				t.Fatal(err)
			}
			select {
			case err := <-wrote:
				if !errors.Is(err, os.ErrDeadlineExceeded) {
					t.Fatalf("Write: %v; want os.ErrDeadlineExceeded", err)
				}
			case <-time.After(10 * time.Second):
				t.Fatal("the waiting write did not end at its deadline")
			}
			// The poller holds the deadline now: clearing it lets the
			// connection write again once the peer reads.
			if err := c.SetWriteDeadline(time.Time{}); err != nil {
				t.Fatal(err)
			}
			go func() { _, _ = io.Copy(io.Discard, peer) }()
			if n, err := c.Write(make([]byte, 1<<20)); n != 1<<20 || err != nil {
				t.Fatalf("Write after clearing = %d, %v", n, err)
			}
		}},
		{"deadlines moved while writes wait", func(t *testing.T, c halfCloser, peer *net.TCPConn) {
			// A writer moving its deadline forward between writes, as a
			// stream relay does per chunk, against a peer that reads
			// slowly: every write completes (run under -race).
			go func() {
				buf := make([]byte, 4096)
				for {
					if _, err := peer.Read(buf); err != nil {
						return
					}
				}
			}()
			chunk := make([]byte, 256<<10)
			for range 32 {
				if err := c.SetWriteDeadline(time.Now().Add(10 * time.Second)); err != nil {
					t.Fatal(err)
				}
				if n, err := c.Write(chunk); n != len(chunk) || err != nil {
					t.Fatalf("Write = %d, %v", n, err)
				}
			}
			if err := c.SetDeadline(time.Time{}); err != nil {
				t.Fatal(err)
			}
		}},
		{"concurrent read and write", func(t *testing.T, c halfCloser, peer *net.TCPConn) {
			var wg sync.WaitGroup
			wg.Add(2)
			go func() { // echo
				defer wg.Done()
				io.Copy(peer, peer)
				peer.CloseWrite()
			}()
			msg := bytes.Repeat([]byte("m"), 1<<20)
			var got []byte
			var rerr error
			go func() {
				defer wg.Done()
				got, rerr = io.ReadAll(c)
			}()
			if _, err := c.Write(msg); err != nil {
				t.Fatal(err)
			}
			c.CloseWrite()
			wg.Wait()
			if rerr != nil || !bytes.Equal(got, msg) {
				t.Fatalf("echo: %d bytes, %v; want %d", len(got), rerr, len(msg))
			}
		}},
	}
	for _, k := range kinds {
		for _, tc := range cases {
			t.Run(k.name+"/"+tc.name, func(t *testing.T) {
				c, peer := k.pair(t)
				tc.run(t, c, peer)
			})
		}
	}
}

// Read and Write allocate nothing: the callbacks and their arguments live
// in the Conn.
func TestReadWriteAllocateNothing(t *testing.T) {
	for _, k := range kinds {
		t.Run(k.name, func(t *testing.T) { allocateNothing(t, k.pair) })
	}
}

func allocateNothing(t *testing.T, mk func(*testing.T) (halfCloser, *net.TCPConn)) {
	c, peer := mk(t)
	msg := []byte("0123456789")
	buf := make([]byte, len(msg))
	allocs := testing.AllocsPerRun(200, func() {
		if _, err := c.Write(msg); err != nil {
			t.Fatal(err)
		}
		if _, err := io.ReadFull(peer, buf); err != nil {
			t.Fatal(err)
		}
		if _, err := peer.Write(msg); err != nil {
			t.Fatal(err)
		}
		if _, err := io.ReadFull(c, buf); err != nil {
			t.Fatal(err)
		}
	})
	if allocs != 0 {
		t.Fatalf("%v allocations per write+read round trip, want 0", allocs)
	}
}

func blackhole(t *testing.T) string { return testnet.Blackhole(t).String() }

// DialTCP's failures are dial errors of the kind callers classify: refused,
// timed out (ctx deadline on a port that never answers), cancelled; a name
// is left to package net.
func TestDialTCPFailures(t *testing.T) {
	refused := func(t *testing.T) string {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		addr := ln.Addr().String()
		ln.Close()
		return addr
	}
	cases := []struct {
		name   string
		addr   func(*testing.T) string
		ctx    func() (context.Context, context.CancelFunc)
		notOK  bool
		wantIs error
	}{
		{"name, not an address", func(*testing.T) string { return "localhost:80" }, nil, true, nil},
		{"refused", refused, nil, false, syscall.ECONNREFUSED},
		{"connect timeout", blackhole, func() (context.Context, context.CancelFunc) {
			return context.WithTimeout(context.Background(), 50*time.Millisecond)
		}, false, os.ErrDeadlineExceeded},
		{"cancelled while connecting", blackhole, func() (context.Context, context.CancelFunc) {
			ctx, cancel := context.WithCancel(context.Background())
			time.AfterFunc(30*time.Millisecond, cancel)
			return ctx, cancel
		}, false, context.Canceled},
		{"cancelled before", refused, func() (context.Context, context.CancelFunc) {
			ctx, cancel := context.WithCancel(context.Background())
			cancel()
			return ctx, cancel
		}, false, context.Canceled},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			ctx, cancel := context.Background(), context.CancelFunc(func() {})
			if tc.ctx != nil {
				ctx, cancel = tc.ctx()
			}
			defer cancel()
			c, ok, err := DialTCP(ctx, tc.addr(t))
			if tc.notOK {
				if ok || c != nil || err != nil {
					t.Fatalf("DialTCP = %v, %v, %v; want not handled", c, ok, err)
				}
				return
			}
			if !ok || c != nil || !errors.Is(err, tc.wantIs) {
				t.Fatalf("DialTCP = %v, %v, %v; want an error that is %v", c, ok, err, tc.wantIs)
			}
			var oe *net.OpError
			if !errors.As(err, &oe) || oe.Op != "dial" {
				t.Fatalf("err %#v is not a dial *net.OpError", err)
			}
		})
	}
}

// An IPv6 loopback address dials too (skipped only where the machine has
// no ::1).
func TestDialTCPIPv6(t *testing.T) {
	ln, err := net.Listen("tcp", "[::1]:0")
	if err != nil {
		t.Skipf("no IPv6 loopback here: %v", err)
	}
	defer ln.Close()
	go func() {
		if c, err := ln.Accept(); err == nil {
			c.Write([]byte("6"))
			c.Close()
		}
	}()
	c, ok, err := DialTCP(context.Background(), ln.Addr().String())
	if !ok || err != nil {
		t.Fatalf("DialTCP = %v, %v", ok, err)
	}
	defer c.Close()
	b, err := io.ReadAll(c)
	if err != nil || string(b) != "6" {
		t.Fatalf("read %q, %v", b, err)
	}
}

// BenchmarkWriteDeadline: what a proxy does per answer, a write deadline set
// and a small write the socket takes at once, with the deadline passed to
// the poller (net.TCPConn's SetWriteDeadline) and held back (Conn's).
func BenchmarkWriteDeadline(b *testing.B) {
	for _, bc := range []struct {
		name string
		set  func(c *Conn, t time.Time) error
	}{
		{"poller", func(c *Conn, t time.Time) error { return c.TCPConn.SetWriteDeadline(t) }},
		{"held", func(c *Conn, t time.Time) error { return c.SetWriteDeadline(t) }},
	} {
		b.Run(bc.name, func(b *testing.B) {
			ln, accepted := listen(b)
			defer ln.Close()
			raw, err := net.Dial("tcp", ln.Addr().String())
			if err != nil {
				b.Fatal(err)
			}
			c := Wrap(raw).(*Conn)
			defer c.Close()
			peer := <-accepted
			defer peer.Close()
			drained := make(chan struct{})
			go func() { _, _ = io.Copy(io.Discard, peer); close(drained) }()
			msg := make([]byte, 512)
			b.ReportAllocs()
			for b.Loop() {
				if err := bc.set(c, time.Now().Add(30*time.Second)); err != nil {
					b.Fatal(err)
				}
				if _, err := c.Write(msg); err != nil {
					b.Fatal(err)
				}
				if err := bc.set(c, time.Time{}); err != nil {
					b.Fatal(err)
				}
			}
			c.Close()
			<-drained
		})
	}
}
