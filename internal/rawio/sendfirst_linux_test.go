//go:build linux

package rawio

import (
	"bufio"
	"bytes"
	"errors"
	"io"
	"net"
	"os"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/llmgw/llmgw/internal/wait"
)

// peekAt peeks at c without waiting: has, bytes wait to be read; gone,
// the peer's FIN or reset has arrived.
func peekAt(t *testing.T, c net.Conn) (has, gone bool) {
	t.Helper()
	rc, err := c.(syscall.Conn).SyscallConn()
	if err != nil {
		t.Fatal(err)
	}
	if err := rc.Control(func(fd uintptr) {
		var b [1]byte
		n, _, err := syscall.Recvfrom(int(fd), b[:], syscall.MSG_PEEK|syscall.MSG_DONTWAIT)
		has = n > 0 && err == nil
		gone = n == 0 && err == nil || err != nil && err != syscall.EAGAIN
	}); err != nil {
		t.Fatal(err)
	}
	return has, gone
}

// threadReads is the number of read-like system calls (syscr) the calling
// thread has made.
func threadReads(t *testing.T) int {
	t.Helper()
	b, err := os.ReadFile("/proc/thread-self/io")
	if err != nil {
		t.Skipf("no per-thread I/O accounting: %v", err)
	}
	sc := bufio.NewScanner(bytes.NewReader(b))
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), "syscr: "); ok {
			n, err := strconv.Atoi(v)
			if err != nil {
				t.Fatal(err)
			}
			return n
		}
	}
	t.Fatal("no syscr in /proc/thread-self/io")
	return 0
}

// exchangeReads runs one request and answer on c, the request sent by
// send, and returns how many read(2)s the reading goroutine made for the
// answer. The peer answers only after it has the whole request, so a read
// made right after the request finds nothing (EAGAIN).
func exchangeReads(t *testing.T, c net.Conn, peer *net.TCPConn, send func(req []byte), req, ans []byte) int {
	t.Helper()
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	done := make(chan error, 1)
	go func() {
		got := make([]byte, len(req))
		if _, err := io.ReadFull(peer, got); err != nil {
			done <- err
			return
		}
		if !bytes.Equal(got, req) {
			done <- errors.New("the peer got " + strconv.Quote(string(got)))
			return
		}
		_, err := peer.Write(ans)
		done <- err
	}()
	// The measurement's own reads (open, read, close of the file).
	base := threadReads(t)
	overhead := threadReads(t) - base
	before := threadReads(t)
	send(req)
	buf := make([]byte, len(ans))
	if _, err := io.ReadFull(c, buf); err != nil {
		t.Fatal(err)
	}
	reads := threadReads(t) - before - overhead
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(buf, ans) {
		t.Fatalf("answer %q, want %q", buf, ans)
	}
	return reads
}

// TestSendFirstSavesTheEmptyRead: a request left by SendFirst goes out
// with the answer's read, and that read's first read(2) comes only when
// the answer is there: one read(2) per answer (the peek before it is a
// recvfrom(2), which the count leaves out). The same exchange written
// with Write first makes a read that finds nothing (the control: it shows
// the count can tell the two apart).
func TestSendFirstSavesTheEmptyRead(t *testing.T) {
	if raceEnabled {
		t.Skip("the race detector's annotations make read(2)s of their own")
	}
	for _, k := range kinds {
		t.Run(k.name, func(t *testing.T) {
			c, peer := k.pair(t)
			head, body := []byte("POST / HTTP/1.1\r\nContent-Length: 4\r\n\r\n"), []byte("body")
			req := append(append([]byte(nil), head...), body...)
			ans := []byte("HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n")
			viaWrite := exchangeReads(t, c, peer, func([]byte) {
				if _, err := c.Write(req); err != nil {
					t.Fatal(err)
				}
			}, req, ans)
			viaFirst := exchangeReads(t, c, peer, func([]byte) {
				if !SendFirst(c, head, body, false, true) {
					t.Fatal("SendFirst refused this package's connection")
				}
			}, req, ans)
			if viaFirst != 1 {
				t.Fatalf("SendFirst: %d read(2)s for one answer, want 1 (Write first: %d)", viaFirst, viaWrite)
			}
			t.Logf("read(2)s per answer: Write first %d, SendFirst %d", viaWrite, viaFirst)
		})
	}
}

// TestSendFirst: what is left goes out before anything else, whole, in
// order, also when the socket cannot take it at once; its failures are
// *SendError, and after one nothing of it is sent later.
func TestSendFirst(t *testing.T) {
	for _, k := range kinds {
		t.Run(k.name+"/large body waits for the socket", func(t *testing.T) {
			c, peer := k.pair(t)
			head := []byte("head:")
			body := bytes.Repeat([]byte("0123456789abcdef"), 1<<19) // 8 MiB: more than the socket takes
			errc := make(chan error, 1)
			go func() {
				got, err := io.ReadAll(io.LimitReader(peer, int64(len(head)+len(body))))
				switch {
				case err != nil:
				case !bytes.Equal(got[:len(head)], head) || !bytes.Equal(got[len(head):], body):
					err = errors.New("the peer got other bytes")
				default:
					_, err = peer.Write([]byte("ok"))
				}
				errc <- err
			}()
			SendFirst(c, head, body, false, false)
			buf := make([]byte, 2)
			if _, err := io.ReadFull(c, buf); err != nil {
				t.Fatal(err)
			}
			if err := <-errc; err != nil {
				t.Fatal(err)
			}
		})
		t.Run(k.name+"/a write before the read sends it first", func(t *testing.T) {
			c, peer := k.pair(t)
			SendFirst(c, []byte("one "), []byte("two "), false, false)
			if _, err := c.Write([]byte("three")); err != nil {
				t.Fatal(err)
			}
			got := make([]byte, len("one two three"))
			if _, err := io.ReadFull(peer, got); err != nil {
				t.Fatal(err)
			}
			if string(got) != "one two three" {
				t.Fatalf("the peer got %q", got)
			}
		})
		t.Run(k.name+"/reset peer", func(t *testing.T) {
			c, peer := k.pair(t)
			if err := peer.SetLinger(0); err != nil {
				t.Fatal(err)
			}
			peer.Close() // RST
			wait.For(t, 5*time.Second, "the reset to arrive", func() bool { _, gone := peekAt(t, c); return gone })
			SendFirst(c, []byte("req"), nil, false, false)
			_, err := c.Read(make([]byte, 8))
			var se *SendError
			if !errors.As(err, &se) || !(errors.Is(err, syscall.ECONNRESET) || errors.Is(err, syscall.EPIPE)) {
				t.Fatalf("read after SendFirst to a reset peer: %v, want a *SendError (reset or broken pipe)", err)
			}
		})
		t.Run(k.name+"/deadline already passed", func(t *testing.T) {
			c, peer := k.pair(t)
			if err := c.SetReadDeadline(time.Now().Add(-time.Second)); err != nil {
				t.Fatal(err)
			}
			SendFirst(c, []byte("lost"), nil, false, false)
			_, err := c.Read(make([]byte, 8))
			var se *SendError
			if !errors.As(err, &se) || !errors.Is(err, os.ErrDeadlineExceeded) {
				t.Fatalf("read after SendFirst past the deadline: %v, want a *SendError for the deadline", err)
			}
			// Nothing of it was sent, and it is not sent later either.
			if _, err := c.Write([]byte("next")); err != nil {
				t.Fatal(err)
			}
			got := make([]byte, 4)
			if _, err := io.ReadFull(peer, got); err != nil {
				t.Fatal(err)
			}
			if string(got) != "next" {
				t.Fatalf("the peer got %q first, want \"next\"", got)
			}
		})
		t.Run(k.name+"/allocates nothing", func(t *testing.T) {
			c, peer := k.pair(t)
			head, body := []byte("01234"), []byte("56789")
			// The worker answers each request once it has it (the
			// contract: nothing before the request).
			done := make(chan struct{})
			go func() {
				defer close(done)
				req := make([]byte, 10)
				for {
					if _, err := io.ReadFull(peer, req); err != nil {
						return
					}
					if _, err := peer.Write([]byte("x")); err != nil {
						return
					}
				}
			}()
			buf := make([]byte, 1)
			allocs := testing.AllocsPerRun(200, func() {
				SendFirst(c, head, body, true, true)
				if _, err := io.ReadFull(c, buf); err != nil {
					t.Fatal(err)
				}
			})
			c.Close()
			<-done
			if raceEnabled {
				t.Skipf("%v allocations under the race detector, which allocates for itself", allocs)
			}
			if allocs != 0 {
				t.Fatalf("%v allocations per SendFirst and read, want 0", allocs)
			}
		})
		for _, tc := range []struct {
			name string
			kill func(*net.TCPConn) error
		}{
			{"unsolicited bytes", func(p *net.TCPConn) error {
				_, err := p.Write([]byte("HTTP/1.1 408 Request Timeout\r\n\r\n"))
				return err
			}},
			{"half-closed", (*net.TCPConn).CloseWrite},
		} {
			t.Run(k.name+"/peek: "+tc.name, func(t *testing.T) {
				c, peer := k.pair(t)
				if err := tc.kill(peer); err != nil {
					t.Fatal(err)
				}
				wait.For(t, 5*time.Second, "the worker's bytes or FIN to arrive", func() bool { has, gone := peekAt(t, c); return has || gone })
				SendFirst(c, []byte("req"), nil, false, true)
				if _, err := c.Read(make([]byte, 8)); !errors.Is(err, ErrNotIdle) {
					t.Fatalf("read: %v, want ErrNotIdle", err)
				}
				// Nothing was sent. (Closing with the unsolicited bytes
				// unread resets the connection.)
				c.Close()
				got, err := io.ReadAll(peer)
				if err != nil && !errors.Is(err, syscall.ECONNRESET) || len(got) != 0 {
					t.Fatalf("the worker read %q, %v", got, err)
				}
			})
		}
	}
	t.Run("other connections", func(t *testing.T) {
		a, b := net.Pipe()
		defer a.Close()
		defer b.Close()
		if CanSendFirst(a) || SendFirst(a, []byte("x"), nil, false, false) {
			t.Fatal("SendFirst accepted a net.Pipe")
		}
	})
}

// TestSendFirstQuickAck: with quickAck the read takes the connection out
// of delayed-ACK mode after the request is written (before would not
// hold: the write itself re-enters it); without, it stays in.
func TestSendFirstQuickAck(t *testing.T) {
	for _, k := range kinds {
		for _, quick := range []bool{false, true} {
			t.Run(k.name+"/quickAck="+strconv.FormatBool(quick), func(t *testing.T) {
				c, peer := k.pair(t)
				buf := make([]byte, 64)
				entered := false
				for range 50 {
					request(t, c, peer, buf)
					answer(t, c, peer, buf)
					SendFirst(c, buf, nil, quick, false)
					errc := make(chan error, 1)
					go func() {
						got := make([]byte, len(buf))
						_, err := io.ReadFull(peer, got)
						if err == nil {
							_, err = peer.Write(got)
						}
						errc <- err
					}()
					if _, err := io.ReadFull(c, buf); err != nil {
						t.Fatal(err)
					}
					if err := <-errc; err != nil {
						t.Fatal(err)
					}
					if !quick && pingpong(t, c) {
						entered = true
						break
					}
					if quick && pingpong(t, c) {
						t.Fatal("in delayed-ACK mode after a SendFirst with quickAck")
					}
				}
				if !quick && !entered {
					t.Fatal("never in delayed-ACK mode without quickAck; the test cannot tell quickAck works")
				}
			})
		}
	}
}
