//go:build linux

package evloop

import (
	"bytes"
	"syscall"
	"testing"

	"github.com/llmgw/llmgw/internal/rawio"
)

// batchingLoop is a running loop that batches sends; the test is skipped
// only where the kernel refuses io_uring (the loop then reports why, and
// the gateway sends one by one).
func batchingLoop(t *testing.T) *Loop {
	t.Helper()
	l := newLoop(t)
	if !l.Batching() {
		l.Close()
		t.Skipf("no io_uring here: %v", l.SendsError())
	}
	run(t, l)
	return l
}

type sentRec struct {
	ch     chan sent
	inSend bool // set by the test around its Send calls
	nested bool // Sent ran while inSend
}

type sent struct {
	n     int
	errno syscall.Errno
}

func (s *sentRec) Sent(n int, errno syscall.Errno) {
	s.nested = s.nested || s.inSend
	s.ch <- sent{n, errno}
}

// readAll reads from fd (made blocking, with a 10 s receive timeout as the
// deadline) until it holds n bytes.
func readAll(t *testing.T, fd, n int) []byte {
	t.Helper()
	if err := syscall.SetNonblock(fd, false); err != nil {
		t.Fatal(err)
	}
	tv := syscall.Timeval{Sec: 10}
	if err := syscall.SetsockoptTimeval(fd, syscall.SOL_SOCKET, syscall.SO_RCVTIMEO, &tv); err != nil {
		t.Fatal(err)
	}
	var got []byte
	buf := make([]byte, 64<<10)
	for len(got) < n {
		m, err := syscall.Read(fd, buf[:min(len(buf), n-len(got))])
		switch {
		case err != nil:
			t.Fatalf("read after %d of %d bytes: %v", len(got), n, err)
		case m == 0:
			t.Fatalf("EOF after %d of %d bytes", len(got), n)
		}
		got = append(got, buf[:m]...)
	}
	return got
}

func TestSendsAreSubmittedWhenTheLoopWaits(t *testing.T) {
	l := batchingLoop(t)
	p := socketpair(t)
	defer syscall.Close(p[0])
	defer syscall.Close(p[1])
	rec := &sentRec{ch: make(chan sent, 4)}
	head, body := []byte("head:"), []byte("body")
	var queuedNothingSent bool
	onLoop(t, l, func() {
		l.Send(p[0], []byte("one;"), nil, rec)
		l.Send(p[0], head, body, rec)
		// Nothing is sent before the loop waits (p[1] is still
		// non-blocking here).
		var b [8]byte
		_, e := rawio.Read(p[1], b[:])
		queuedNothingSent = e == syscall.EAGAIN
	})
	if !queuedNothingSent {
		t.Fatal("a queued send reached the peer before the loop waited")
	}
	for _, want := range []int{4, 9} {
		if s := <-rec.ch; s.errno != 0 || s.n != want {
			t.Fatalf("Sent(%d, %v), want %d bytes", s.n, s.errno, want)
		}
	}
	if got := readAll(t, p[1], 13); string(got) != "one;head:body" {
		t.Fatalf("peer read %q", got)
	}
}

func TestCancelSendBeforeSubmission(t *testing.T) {
	l := batchingLoop(t)
	p := socketpair(t)
	defer syscall.Close(p[0])
	defer syscall.Close(p[1])
	rec := &sentRec{ch: make(chan sent, 4)}
	var cancelled, again bool
	onLoop(t, l, func() {
		id := l.Send(p[0], []byte("never"), nil, rec)
		cancelled = l.CancelSend(id)
		again = l.CancelSend(id)
		l.Send(p[0], []byte("after"), nil, rec)
	})
	if !cancelled || again {
		t.Fatalf("CancelSend = %v then %v; want true, then false", cancelled, again)
	}
	if s := <-rec.ch; s.errno != 0 || s.n != 5 {
		t.Fatalf("Sent(%d, %v)", s.n, s.errno)
	}
	if got := readAll(t, p[1], 5); string(got) != "after" {
		t.Fatalf("peer read %q; the cancelled send went out", got)
	}
	select {
	case s := <-rec.ch:
		t.Fatalf("a cancelled send reported Sent(%d, %v)", s.n, s.errno)
	default:
	}
	onLoop(t, l, func() {
		// Once submitted a send cannot be cancelled.
		id := l.Send(p[0], []byte("x"), nil, rec)
		l.submit()
		if l.CancelSend(id) {
			t.Error("CancelSend of a submitted send reported true")
		}
	})
	<-rec.ch
}

func TestSendErrorsReachTheSender(t *testing.T) {
	l := batchingLoop(t)
	p := socketpair(t)
	defer syscall.Close(p[0])
	syscall.Close(p[1])
	rec := &sentRec{ch: make(chan sent, 1)}
	onLoop(t, l, func() { l.Send(p[0], []byte("to nobody"), nil, rec) })
	if s := <-rec.ch; s.errno != syscall.EPIPE && s.errno != syscall.ECONNRESET {
		t.Fatalf("Sent(%d, %v) to a closed peer; want EPIPE or ECONNRESET", s.n, s.errno)
	}
}

// TestManySendsInOrder queues more sends than the ring has entries in one
// go (Send submits when the queue is full) and on many sockets; each
// socket's bytes arrive whole and in order.
func TestManySendsInOrder(t *testing.T) {
	l := batchingLoop(t)
	const socks, each = 8, 100 // 800 sends: more than the ring (512), fewer per socket than its buffer holds
	var pairs [socks][2]int
	for i := range pairs {
		pairs[i] = socketpair(t)
		defer syscall.Close(pairs[i][0])
		defer syscall.Close(pairs[i][1])
	}
	rec := &sentRec{ch: make(chan sent, socks*each)}
	msgs := make([][]byte, each)
	for j := range msgs {
		msgs[j] = []byte{byte('a' + j%26)}
	}
	onLoop(t, l, func() {
		rec.inSend = true
		for j := range each {
			for i := range pairs {
				l.Send(pairs[i][0], msgs[j], nil, rec)
			}
		}
		rec.inSend = false
	})
	for range socks * each {
		if s := <-rec.ch; s.errno != 0 || s.n != 1 {
			t.Fatalf("Sent(%d, %v)", s.n, s.errno)
		}
	}
	var nested bool
	onLoop(t, l, func() { nested = rec.nested })
	if nested {
		t.Fatal("a completion was dispatched inside Send (the queue filled and was submitted)")
	}
	want := bytes.Join(msgs, nil)
	for i := range pairs {
		if got := readAll(t, pairs[i][1], each); !bytes.Equal(got, want) {
			t.Fatalf("socket %d read %q, want %q", i, got, want)
		}
	}
}

// TestSendThatMustWait fills a socket's buffer: the send completes short
// or later (EAGAIN, a partial count, or once the peer reads), and what
// completes is exactly what the peer gets.
func TestSendThatMustWait(t *testing.T) {
	l := batchingLoop(t)
	p := socketpair(t)
	defer syscall.Close(p[0])
	defer syscall.Close(p[1])
	big := bytes.Repeat([]byte("0123456789abcdef"), 1<<16) // 1 MiB, over a socket buffer
	rec := &sentRec{ch: make(chan sent, 1)}
	onLoop(t, l, func() { l.Send(p[0], big, nil, rec) })
	got := readAll(t, p[1], 1) // the peer starts reading, which makes room
	s := <-rec.ch
	if s.errno != 0 && s.errno != syscall.EAGAIN {
		t.Fatalf("Sent(%d, %v)", s.n, s.errno)
	}
	if s.n > len(big) {
		t.Fatalf("Sent(%d) of %d bytes", s.n, len(big))
	}
	if s.n > 1 {
		got = append(got, readAll(t, p[1], s.n-1)...)
	}
	if !bytes.Equal(got, big[:max(s.n, len(got))]) {
		t.Fatal("the peer read other bytes than the first ones sent")
	}
}

func TestNoBatching(t *testing.T) {
	l, err := New(Options{NoBatching: true})
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	if l.Batching() || l.SendsError() == nil {
		t.Fatalf("Batching %v (%v) with NoBatching", l.Batching(), l.SendsError())
	}
}
