//go:build linux

package rawio

import (
	"errors"
	"net"
	"os"
	"syscall"
	"unsafe"
)

// ErrNotIdle: the peek that SendFirst asked for found the connection not
// idle (the peer had closed or reset it, or sent bytes nobody asked for),
// so nothing was sent.
var ErrNotIdle = errors.New("rawio: the connection was not idle before the request (closed, reset or unsolicited bytes)")

// SendError is a failure to write the bytes SendFirst left for the next
// Read; that Read reports it (inside its *net.OpError) and reads nothing.
// None of the bytes, or only part of them, reached the socket.
type SendError struct{ Err error }

func (e *SendError) Error() string { return "sending before the read: " + e.Err.Error() }
func (e *SendError) Unwrap() error { return e.Err }

// CanSendFirst reports whether c supports SendFirst: this package's
// connections do.
func CanSendFirst(c net.Conn) bool { return rwOf(c) != nil }

// SendFirst makes c's next Read write head and then body before it reads,
// and reports whether c supports it (CanSendFirst; for any other
// connection nothing is done and the caller writes the bytes itself). With
// quickAck that Read also takes c out of delayed-ACK mode right after the
// bytes are written, as QuickAck does. With peek that Read first checks
// that the connection is idle (a non-blocking MSG_PEEK finds nothing) and
// otherwise returns ErrNotIdle, sending nothing: how a client finds that a
// pooled connection died while idle before it reuses it.
//
// Why: a client that writes a request and then reads the answer issues a
// read(2) that almost always finds nothing yet (EAGAIN) before it waits for
// the poller. The Read after SendFirst arms its wait before the request is
// written, so no readiness can be missed, and its first read(2) comes only
// once the poller says there are bytes: one system call less per request.
// Head and body go out in one writev(2), uncopied.
//
// The contract the saving rests on: the peer sends nothing before it has
// the request (HTTP/1.1 without pipelining). Bytes that arrived before the
// Read may not wake it (the poller's readiness is reset when the wait is
// armed); the peek sees them, and everything after the peek wakes it. So
// without peek, a peer that sends unsolicited bytes and then nothing more
// leaves the Read waiting until its deadline; use peek on any connection
// that has been idle.
//
// head and body must stay unchanged until that Read returns. When the
// socket does not take them all at once, the Read writes the rest as Write
// does (waiting under the write deadline), then reads as usual. A Write
// before the Read sends them first (without the peek). SendFirst, that
// Read and Write must not run concurrently with one another.
func SendFirst(c net.Conn, head, body []byte, quickAck, peek bool) bool {
	r := rwOf(c)
	if r == nil {
		return false
	}
	r.first = [2][]byte{head, body}
	r.hasFirst = len(head)+len(body) > 0
	r.firstQuick, r.firstPeek = quickAck, peek
	return true
}

// advanceFirst drops the first n bytes of what SendFirst left.
func (r *rw) advanceFirst(n int) {
	for i := range r.first {
		k := min(n, len(r.first[i]))
		r.first[i] = r.first[i][k:]
		n -= k
	}
	r.hasFirst = len(r.first[0])+len(r.first[1]) > 0
}

// doSendFirst writes what SendFirst left and, once the socket holds all of
// it, asks the poller to wait (false) without reading: the answer cannot
// be there before the request. After the wait it reads (doRead). It stops
// (true) with bytes still left when the socket would block, and with ferr
// set when the write fails.
func (r *rw) doSendFirst(fd uintptr) bool {
	if !r.hasFirst {
		return r.doRead(fd)
	}
	if r.firstPeek {
		// After the wait was armed: anything arriving from here on wakes
		// the read, anything before is seen now.
		r.firstPeek = false
		var b [1]byte
		_, _, e := syscall.RawSyscall6(syscall.SYS_RECVFROM, fd, uintptr(unsafe.Pointer(&b[0])), 1, syscall.MSG_PEEK|syscall.MSG_DONTWAIT, 0, 0)
		if e != syscall.EAGAIN {
			// Bytes, the peer's FIN (0 bytes) or an error (a reset).
			r.notIdle = true
			return true
		}
	}
	raceBeforeWrite(r.first[0])
	raceBeforeWrite(r.first[1])
	for r.hasFirst {
		iov := r.iov[:0]
		for _, b := range r.first {
			if len(b) > 0 {
				v := syscall.Iovec{Base: unsafe.SliceData(b)}
				v.SetLen(len(b))
				iov = append(iov, v)
			}
		}
		n, _, e := syscall.RawSyscall(syscall.SYS_WRITEV, fd, uintptr(unsafe.Pointer(&iov[0])), uintptr(len(iov)))
		switch e {
		case 0:
			r.advanceFirst(int(n))
		case syscall.EINTR:
		case syscall.EAGAIN:
			return true
		default:
			r.ferr = e
			return true
		}
	}
	if r.firstQuick {
		// After the write: sending soon after receiving is what puts the
		// kernel back into delayed-ACK mode (see QuickAck). A failure
		// means the socket is unusable, which the read reports.
		r.doQuickAck(fd)
	}
	return false
}

// readAfterSend is read for a Read that SendFirst prepared.
func (r *rw) readAfterSend(p []byte) (int, error) {
	r.rbuf, r.rn, r.rerr, r.ferr = p, 0, 0, 0
	err := r.rc.Read(r.sendFirstFn)
	switch {
	case r.notIdle:
		err = ErrNotIdle
	case err != nil && r.hasFirst:
		// The wait could not start (closed, deadline passed) before all
		// of it was written.
		err = &SendError{Err: err}
	case err != nil:
	case r.ferr != 0:
		err = &SendError{Err: os.NewSyscallError("writev", r.ferr)}
	case r.hasFirst:
		// The socket did not take it all at once: the rest as Write
		// sends it, then an ordinary read.
		r.rbuf = nil
		if _, werr := r.writeFirst(); werr != nil {
			return 0, &SendError{Err: werr}
		}
		return r.read(p)
	}
	r.clearFirst()
	if err != nil {
		r.rbuf = nil
		return 0, err
	}
	return r.readDone(nil)
}

// writeFirst writes what SendFirst left, as Write does.
func (r *rw) writeFirst() (int, error) {
	first := r.first
	r.clearFirst()
	n, err := r.write(first[0])
	if err != nil {
		return n, err
	}
	m, err := r.write(first[1])
	return n + m, err
}

func (r *rw) clearFirst() {
	r.first, r.hasFirst, r.ferr = [2][]byte{}, false, 0
	r.firstPeek, r.notIdle = false, false
}
