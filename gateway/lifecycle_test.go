package gateway

import (
	"context"
	"errors"
	"fmt"
	"net"
	"testing"
	"time"
)

// TestCloseRightAfterStartNeverHangs: a Close that follows Start at once
// used to race the data listener's Serve goroutine (fasthttp's Shutdown
// closes only listeners Serve has registered), leaving Close in wg.Wait
// with the port still accepting. Many rounds make the race likely; each
// round must end, and the port must be closed after it.
func TestCloseRightAfterStartNeverHangs(t *testing.T) {
	for i := 0; i < 200; i++ {
		s, err := New(Config{Listen: "127.0.0.1:0", Admin: "127.0.0.1:0", StateDir: t.TempDir()})
		if err != nil {
			t.Fatal(err)
		}
		if err := s.Start(context.Background()); err != nil {
			t.Fatal(err)
		}
		addr := s.Addr()
		closed := make(chan struct{})
		go func() { s.Close(); close(closed) }()
		select {
		case <-closed:
		case <-time.After(20 * time.Second):
			t.Fatalf("round %d: Close did not return", i)
		}
		if c, err := net.Dial("tcp", addr); err == nil {
			c.Close()
			t.Fatalf("round %d: %s still accepts after Close", i, addr)
		}
	}
}

// TestApplyAfterCloseBindsNothing: a rule applied to a closed server must
// not bind a dedicated listener that nothing would ever shut down.
func TestApplyAfterCloseBindsNothing(t *testing.T) {
	a := newBackend(t, "a", nil)
	s := startGateway(t, "", nil)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port := ln.Addr().(*net.TCPAddr).Port
	ln.Close() // a free port for the rule's dedicated listener
	s.Close()
	r := mustDecode(t, ruleYAML("late", "m-late", fmt.Sprintf("listen: \"127.0.0.1:%d\"", port), a))
	if _, err := s.Apply(r, true); !errors.Is(err, ErrServerClosed) {
		t.Fatalf("Apply after Close: %v; want ErrNoEndpoint", err)
	}
}

// TestFailedStartReturnsPromptly: when Start fails after binding the data
// listener (here the admin port is taken), it must return its error and
// leave the data port closed; it used to wait forever in Close for a
// listener goroutine that nothing stopped.
func TestFailedStartReturnsPromptly(t *testing.T) {
	taken, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer taken.Close()
	s, err := New(Config{Listen: "127.0.0.1:0", Admin: taken.Addr().String(), StateDir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	started := make(chan error, 1)
	go func() { started <- s.Start(context.Background()) }()
	select {
	case err := <-started:
		if err == nil {
			t.Fatal("Start succeeded with its admin port taken")
		}
	case <-time.After(20 * time.Second):
		t.Fatal("Start with a taken admin port did not return")
	}
}
