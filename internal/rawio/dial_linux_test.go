//go:build linux

package rawio

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/llmgw/llmgw/internal/testnet"
	"github.com/llmgw/llmgw/internal/wait"
)

// A dialed connection asks the kernel for its local address only when
// LocalAddr is called, and then gives the address the peer sees; one
// closed before anyone asked has none.
func TestDialTCPLocalAddrOnDemand(t *testing.T) {
	ln, accepted := listen(t)
	defer ln.Close()
	dial := func() *fileConn {
		t.Helper()
		c, ok, err := DialTCP(context.Background(), ln.Addr().String())
		if !ok || err != nil {
			t.Fatalf("DialTCP = %v, %v", ok, err)
		}
		return c.(*fileConn)
	}
	c := dial()
	peer, got := <-accepted
	if !got {
		t.Fatal("accept failed")
	}
	defer peer.Close()
	if c.local != nil {
		t.Fatalf("local address %v known before LocalAddr was called", c.local)
	}
	if got, want := c.LocalAddr().String(), peer.RemoteAddr().String(); got != want {
		t.Fatalf("LocalAddr %s; the peer sees %s", got, want)
	}
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
	if got, want := c.LocalAddr().String(), peer.RemoteAddr().String(); got != want {
		t.Fatalf("after Close, LocalAddr %s; want the address asked for before, %s", got, want)
	}

	// A second connection, closed unasked: no address, and its errors say
	// so without a bogus one.
	ln2, accepted2 := listen(t)
	defer ln2.Close()
	c2, ok, err := DialTCP(context.Background(), ln2.Addr().String())
	if !ok || err != nil {
		t.Fatalf("DialTCP = %v, %v", ok, err)
	}
	if p, ok := <-accepted2; ok {
		defer p.Close()
	}
	if err := c2.Close(); err != nil {
		t.Fatal(err)
	}
	if a := c2.LocalAddr(); a != nil {
		t.Fatalf("LocalAddr after an unasked Close = %v; want nil", a)
	}
	_, err = c2.Read(make([]byte, 1))
	var oe *net.OpError
	if !errors.As(err, &oe) || oe.Source != nil || oe.Addr == nil || oe.Err != net.ErrClosed {
		t.Fatalf("Read after Close = %#v; want an OpError with no source, the remote address and net.ErrClosed", err)
	}
}

// When the handshake does not finish inside connect(2) (the listener's
// accept queue is full, so its SYN is dropped and sent again about a
// second later), DialTCP waits for the poller and then connects.
func TestDialTCPWaitsForTheHandshake(t *testing.T) {
	if testing.Short() {
		t.Skip("waits for a SYN retransmission (about 1 s)")
	}
	fl := testnet.NewFullListener(t)
	addr, port := fl.Addr.String(), fl.Addr.Port
	type result struct {
		c   net.Conn
		err error
	}
	done := make(chan result, 1)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	go func() {
		c, _, err := DialTCP(ctx, addr)
		done <- result{c, err}
	}()
	// The dial's connection is in SYN_SENT (state 02 in /proc/net/tcp)
	// towards the listener: its SYN was dropped.
	remote := fmt.Sprintf(" 0100007F:%04X 02 ", port)
	wait.ForErr(t, 10*time.Second, "a connection in SYN_SENT to the listener", func() error {
		b, err := os.ReadFile("/proc/net/tcp")
		if err != nil {
			return err
		}
		if !strings.Contains(string(b), remote) {
			return fmt.Errorf("none yet")
		}
		return nil
	})
	select {
	case r := <-done:
		t.Fatalf("DialTCP returned %v, %v before the listener had room", r.c, r.err)
	default:
	}
	// Make room: accept one of the queued connections. The retransmitted
	// SYN then completes the dial's.
	if _, err := fl.Accept(); err != nil {
		t.Fatal(err)
	}
	r := <-done
	if r.err != nil {
		t.Fatalf("DialTCP after the wait: %v", r.err)
	}
	defer r.c.Close()
	// The dialed connection is the next in the queue.
	peer, err := fl.Accept()
	if err != nil {
		t.Fatal(err)
	}
	if got, want := r.c.LocalAddr().(*net.TCPAddr).Port, peer.Port; got != want {
		t.Fatalf("LocalAddr port %d; the listener accepted port %d", got, want)
	}
	if _, err := r.c.Write([]byte("x")); err != nil {
		t.Fatalf("Write on the connection: %v", err)
	}
}
