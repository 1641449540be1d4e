//go:build linux

package rawio

import (
	"errors"
	"io"
	"net"
	"os"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
	"unsafe"
)

// rw is the raw read(2)/write(2) machinery over a descriptor the runtime
// poller watches (syscall.RawConn). Its callbacks and their arguments live
// in the struct, so a Read or Write allocates nothing. One Read and one
// Write may run at once; concurrent Reads (or Writes) are serialised by
// the descriptor's own locks inside RawConn.
type rw struct {
	rc syscall.RawConn

	rbuf    []byte
	rn      int
	rerr    syscall.Errno
	readFn  func(uintptr) bool
	wbuf    []byte
	wn      int
	werr    syscall.Errno
	writeFn func(uintptr) bool
	qerr    syscall.Errno
	quickFn func(uintptr)

	// first is what SendFirst left for the next read to write before it
	// waits (head, body), hasFirst whether any of it is left; firstQuick
	// asks for TCP_QUICKACK right after it, ferr is its write's error, iov
	// the writev(2) vector's memory.
	first       [2][]byte
	hasFirst    bool
	firstQuick  bool
	firstPeek   bool // peek before sending; notIdle: the peek found the peer not idle
	notIdle     bool
	ferr        syscall.Errno
	iov         [2]syscall.Iovec
	sendFirstFn func(uintptr) bool

	wd writeDeadline
}

// writeDeadline holds a connection's write deadline back from the runtime
// poller until a write has to wait. A deadline only bounds waiting for the
// socket to take bytes, and a proxy's writes almost never wait (the
// kernel's send buffer takes a whole answer), so arming the poller's timer
// for each one is pure cost: two or three timer changes per request
// (fasthttp's per-request write timeouts, the gateway's per-answer one and
// its clearing), each of which may wake the thread sleeping in the poller.
//
// The contract differs from net.TCPConn's in one way: a write that the
// socket takes at once succeeds even after its deadline has passed. A
// write that waits fails with os.ErrDeadlineExceeded at the deadline, as
// on a TCPConn, and a deadline set while a write waits takes effect at
// once. Once the poller holds a deadline (a write waited), every change
// is passed on until the deadline is cleared.
type writeDeadline struct {
	mu      sync.Mutex
	t       time.Time               // the deadline set; zero: none
	armed   bool                    // the poller holds t
	waiting bool                    // a write is waiting for the socket
	set     func(t time.Time) error // the poller's SetWriteDeadline
	waited  bool                    // this write waited (the writer's own)
}

// setDeadline records t, and passes it on when the poller holds a deadline
// or a write is waiting.
func (w *writeDeadline) setDeadline(t time.Time) error {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.t = t
	if !w.armed && !w.waiting {
		return nil
	}
	w.armed = !t.IsZero()
	return w.set(t)
}

// wait is called by a write about to wait for the socket: the poller gets
// the deadline before the wait starts.
func (w *writeDeadline) wait() {
	w.mu.Lock()
	w.waiting, w.waited = true, true
	if !w.armed && !w.t.IsZero() {
		// An error means the descriptor is closing: the wait reports it.
		_ = w.set(w.t)
		w.armed = true
	}
	w.mu.Unlock()
}

// done ends a write's waiting.
func (w *writeDeadline) done() {
	if !w.waited {
		return
	}
	w.waited = false
	w.mu.Lock()
	w.waiting = false
	w.mu.Unlock()
}

func (r *rw) init(setWriteDeadline func(time.Time) error) {
	r.wd.set = setWriteDeadline
	r.readFn = r.doRead
	r.writeFn = r.doWrite
	r.quickFn = r.doQuickAck
	r.sendFirstFn = r.doSendFirst
}

// doRead is one read(2); false asks the poller to wait for readability.
func (r *rw) doRead(fd uintptr) bool {
	for {
		n, _, e := syscall.RawSyscall(syscall.SYS_READ, fd, uintptr(unsafe.Pointer(unsafe.SliceData(r.rbuf))), uintptr(len(r.rbuf)))
		switch e {
		case syscall.EINTR:
			continue
		case syscall.EAGAIN:
			return false
		}
		r.rn, r.rerr = int(n), e
		if e == 0 {
			raceAfterRead(fd, r.rbuf, r.rn)
		}
		return true
	}
}

// doWrite writes as much of wbuf as the socket takes; false asks the
// poller to wait for writability.
func (r *rw) doWrite(fd uintptr) bool {
	raceBeforeWrite(r.wbuf[r.wn:])
	for r.wn < len(r.wbuf) {
		rest := r.wbuf[r.wn:]
		n, _, e := syscall.RawSyscall(syscall.SYS_WRITE, fd, uintptr(unsafe.Pointer(unsafe.SliceData(rest))), uintptr(len(rest)))
		switch e {
		case 0:
			r.wn += int(n)
		case syscall.EINTR:
		case syscall.EAGAIN:
			r.wd.wait()
			return false
		default:
			r.werr = e
			return true
		}
	}
	return true
}

// read reads like net.TCPConn.Read: one read(2) once data is there; io.EOF
// after the peer's FIN. Errors are unwrapped (the caller adds its OpError).
func (r *rw) read(p []byte) (int, error) {
	if len(p) == 0 {
		return 0, nil
	}
	if r.hasFirst {
		return r.readAfterSend(p)
	}
	r.rbuf, r.rn, r.rerr = p, 0, 0
	return r.readDone(r.rc.Read(r.readFn))
}

// readDone ends a read whose poller call returned err.
func (r *rw) readDone(err error) (int, error) {
	r.rbuf = nil
	if err == nil && r.rerr != 0 {
		err = os.NewSyscallError("read", r.rerr)
	}
	if err != nil {
		return 0, err
	}
	if r.rn == 0 {
		return 0, io.EOF
	}
	return r.rn, nil
}

// write writes all of p, waiting for the socket as needed; bytes that
// SendFirst left for the next read go first.
func (r *rw) write(p []byte) (int, error) {
	if r.hasFirst {
		if _, err := r.writeFirst(); err != nil {
			return 0, err
		}
	}
	r.wbuf, r.wn, r.werr = p, 0, 0
	err := r.rc.Write(r.writeFn)
	r.wd.done()
	n := r.wn
	r.wbuf = nil
	if err == nil && r.werr != 0 {
		err = os.NewSyscallError("write", r.werr)
	}
	return n, err
}

func opError(op string, local, remote net.Addr, err error) error {
	if err == io.EOF {
		return err
	}
	return &net.OpError{Op: op, Net: "tcp", Source: local, Addr: remote, Err: err}
}

// Conn is a *net.TCPConn whose Read and Write issue read(2) and write(2) as
// raw system calls on the non-blocking socket. The read deadline, Close,
// addresses and SyscallConn are the TCPConn's own, and waiting for
// readiness is still the runtime poller's, so a deadline ends a wait
// exactly as it does on the TCPConn; the write deadline reaches the poller
// only when a write waits (writeDeadline).
type Conn struct {
	*net.TCPConn
	io rw
}

// rwOf is the raw I/O of one of this package's connections, or nil.
func rwOf(c net.Conn) *rw {
	switch x := c.(type) {
	case *Conn:
		return &x.io
	case *fileConn:
		return &x.io
	}
	return nil
}

// Wrap returns c as a *Conn when it is a *net.TCPConn, else c unchanged.
func Wrap(c net.Conn) net.Conn {
	tc, ok := c.(*net.TCPConn)
	if !ok {
		return c
	}
	rc, err := tc.SyscallConn()
	if err != nil {
		return c
	}
	w := &Conn{TCPConn: tc}
	w.io.rc = rc
	w.io.init(tc.SetWriteDeadline)
	return w
}

// SetWriteDeadline sets the deadline for writes that wait (see
// writeDeadline: a write the socket takes at once is not failed by it).
func (c *Conn) SetWriteDeadline(t time.Time) error { return c.io.wd.setDeadline(t) }

// SetDeadline sets the read deadline as a TCPConn does and the write
// deadline as SetWriteDeadline.
func (c *Conn) SetDeadline(t time.Time) error {
	if err := c.TCPConn.SetReadDeadline(t); err != nil {
		return err
	}
	return c.io.wd.setDeadline(t)
}

// Read reads like net.TCPConn.Read.
func (c *Conn) Read(p []byte) (int, error) {
	n, err := c.io.read(p)
	if err != nil {
		return n, opError("read", c.LocalAddr(), c.RemoteAddr(), err)
	}
	return n, nil
}

// Write writes all of p, waiting for the socket as needed.
func (c *Conn) Write(p []byte) (int, error) {
	n, err := c.io.write(p)
	if err != nil {
		return n, opError("write", c.LocalAddr(), c.RemoteAddr(), err)
	}
	return n, nil
}

// fileConn is a TCP connection DialTCP opened: an *os.File the poller
// watches, read and written raw. Deadlines are the File's, the write
// deadline passed on only when a write waits (writeDeadline).
type fileConn struct {
	f      *os.File
	io     rw
	remote *net.TCPAddr
	// local is asked of the kernel when LocalAddr is first called, and
	// kept (nil when the socket could no longer say, after Close).
	localOnce sync.Once
	local     *net.TCPAddr
	// closed is set before the File is closed: the File's raw calls then
	// fail with the poller's "use of closed file", reported as
	// net.ErrClosed like a closed net.Conn's.
	closed atomic.Bool
}

var (
	_ net.Conn                        = (*fileConn)(nil)
	_ syscall.Conn                    = (*fileConn)(nil)
	_ net.Conn                        = (*Conn)(nil)
	_ syscall.Conn                    = (*Conn)(nil)
	_ interface{ CloseWrite() error } = (*fileConn)(nil)
)

func (c *fileConn) Read(p []byte) (int, error) {
	n, err := c.io.read(p)
	if err != nil {
		return n, c.opError("read", c.closedAsNet(err))
	}
	return n, nil
}

func (c *fileConn) Write(p []byte) (int, error) {
	n, err := c.io.write(p)
	if err != nil {
		return n, c.opError("write", c.closedAsNet(err))
	}
	return n, nil
}

// Close closes the socket (the one call of a dialed connection the
// scheduler sees).
func (c *fileConn) Close() error {
	if c.closed.Swap(true) {
		return c.opError("close", net.ErrClosed)
	}
	if err := c.f.Close(); err != nil {
		return c.opError("close", err)
	}
	return nil
}

// CloseWrite shuts down the sending side (the peer reads EOF).
func (c *fileConn) CloseWrite() error {
	var e syscall.Errno
	if err := c.io.rc.Control(func(fd uintptr) {
		_, _, e = syscall.RawSyscall(syscall.SYS_SHUTDOWN, fd, syscall.SHUT_WR, 0)
	}); err != nil {
		return c.opError("close", c.closedAsNet(err))
	}
	if e != 0 {
		return c.opError("close", os.NewSyscallError("shutdown", e))
	}
	return nil
}

// opError is opError with c's addresses; the local one is asked for only
// here, on a failure (io.EOF is no failure and passes unwrapped).
func (c *fileConn) opError(op string, err error) error {
	if err == io.EOF {
		return err
	}
	return opError(op, c.LocalAddr(), c.remote, err)
}

// LocalAddr is the connection's own address, asked of the kernel on the
// first call (nil once the socket is closed before anyone asked).
func (c *fileConn) LocalAddr() net.Addr {
	c.localOnce.Do(func() { c.local, _ = localAddr(c.io.rc) })
	if c.local == nil {
		return nil
	}
	return c.local
}

func (c *fileConn) RemoteAddr() net.Addr              { return c.remote }
func (c *fileConn) SetReadDeadline(t time.Time) error { return c.f.SetReadDeadline(t) }

// SetWriteDeadline sets the deadline for writes that wait (see
// writeDeadline: a write the socket takes at once is not failed by it).
func (c *fileConn) SetWriteDeadline(t time.Time) error { return c.io.wd.setDeadline(t) }

// SetDeadline is SetReadDeadline and SetWriteDeadline.
func (c *fileConn) SetDeadline(t time.Time) error {
	if err := c.f.SetReadDeadline(t); err != nil {
		return err
	}
	return c.io.wd.setDeadline(t)
}

// SyscallConn is the socket's raw connection (the gateway's peek before
// reuse, the disconnect watch).
func (c *fileConn) SyscallConn() (syscall.RawConn, error) { return c.io.rc, nil }

// closedAsNet reports a failure after Close as net.ErrClosed.
func (c *fileConn) closedAsNet(err error) error {
	if c.closed.Load() && !errors.Is(err, os.ErrDeadlineExceeded) {
		return net.ErrClosed
	}
	return err
}
