//go:build linux

// Package evloop is an epoll event loop on one locked OS thread: the
// gateway's own connection handling where a goroutine per connection costs
// too much (BENCHMARKS.md, "An event-loop floor").
//
// A Loop watches non-blocking descriptors that no runtime poller watches
// (internal/rawio's descriptor calls make and use them), calls each one's
// Handler with the readiness epoll reports, and fires Timers. Everything a
// Loop calls runs on its goroutine, one call at a time, so a handler's
// state needs no lock. Other goroutines hand work to a loop with Post.
//
// Contracts:
//   - Run blocks until Stop; it locks its goroutine to its thread.
//   - Add, Del, Forget, Arm, Disarm and Now are for the loop's goroutine
//     only (handlers, timers and posted functions run there). Post and
//     Stop are safe from any goroutine.
//   - A readiness report is delivered only to the handler registered for
//     that very registration: a descriptor closed and its number reused by
//     a new registration within one batch never receives the old one's
//     events (each registration carries a generation).
//   - Handlers must tolerate readiness that finds nothing to do (an
//     edge-triggered registration reports writability with every
//     readability, and a closed-and-reused descriptor may see a report
//     meant for its number just before): a non-blocking call then returns
//     EAGAIN.
package evloop

import (
	"errors"
	"fmt"
	"os"
	"runtime"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
	"unsafe"
)

// Readiness bits a Handler receives (epoll's).
const (
	In    = syscall.EPOLLIN
	Out   = syscall.EPOLLOUT
	RdHup = syscall.EPOLLRDHUP
	Hup   = syscall.EPOLLHUP
	Err   = syscall.EPOLLERR
	// Edge asks for edge-triggered reports (EPOLLET): each new arrival of
	// data or room is reported once, so a registration never needs
	// changing while a connection waits on something else.
	Edge = 1 << 31
	// Exclusive wakes one of the loops sharing a descriptor (a listening
	// socket) per arrival (EPOLLEXCLUSIVE).
	Exclusive = 1 << 28
)

// Handler serves one registered descriptor.
type Handler interface {
	// Ready is called with the readiness epoll reported (In, Out, RdHup,
	// Hup, Err).
	Ready(events uint32)
}

// Expirer is what a Timer calls when its deadline passes.
type Expirer interface {
	Expired()
}

// Timer is one deadline on a loop, embedded in the value that owns it.
// Arm sets or moves it, Disarm cancels it. A Timer moved later costs no
// heap work (the heap entry keeps the earlier key and is re-keyed when it
// comes up), so re-arming a per-request deadline is nearly free.
type Timer struct {
	e     Expirer
	when  int64 // the heap's key (loop nanoseconds)
	next  int64 // the deadline wanted; 0: none
	index int   // position in the heap; -1 when not in it
}

// Init makes t call e. A zero Timer must be initialised before use.
func (t *Timer) Init(e Expirer) { t.e, t.index = e, -1 }

// Armed reports whether t has a deadline.
func (t *Timer) Armed() bool { return t.next != 0 }

type slot struct {
	h   Handler
	gen uint32
}

// Loop is one event loop. Create it with New, run it with Run, end it
// with Stop, and release it with Close once Run has returned.
type Loop struct {
	epfd int
	efd  int // eventfd: Post's wake-up

	slots []slot // by descriptor
	gen   uint32
	heap  []*Timer
	base  time.Time
	now   int64
	evs   [256]syscall.EpollEvent

	// sends batches handlers' sends (sends_linux.go); nil without
	// io_uring. sendsErr says why there is none.
	sends    *sends
	sendsErr error

	mu        sync.Mutex
	posted    []func()
	running   []func()
	signalled atomic.Bool
	stopping  atomic.Bool
	stopped   bool
}

// Options configure a loop.
type Options struct {
	// NoBatching: never batch sends, even where io_uring is available.
	NoBatching bool
}

// New creates a loop: its epoll instance, its wake-up eventfd and, unless
// opts say otherwise and where the kernel offers io_uring, its batched
// sends (Batching; SendsError says why not).
func New(opts Options) (*Loop, error) {
	epfd, err := syscall.EpollCreate1(syscall.EPOLL_CLOEXEC)
	if err != nil {
		return nil, os.NewSyscallError("epoll_create1", err)
	}
	efd, _, e := syscall.RawSyscall(syscall.SYS_EVENTFD2, 0, syscall.O_NONBLOCK|syscall.O_CLOEXEC, 0)
	if e != 0 {
		syscall.Close(epfd)
		return nil, os.NewSyscallError("eventfd2", e)
	}
	l := &Loop{epfd: epfd, efd: int(efd), base: time.Now()}
	ev := syscall.EpollEvent{Events: syscall.EPOLLIN, Fd: int32(efd)}
	if err := syscall.EpollCtl(epfd, syscall.EPOLL_CTL_ADD, int(efd), &ev); err != nil {
		syscall.Close(int(efd))
		syscall.Close(epfd)
		return nil, os.NewSyscallError("epoll_ctl", err)
	}
	if opts.NoBatching {
		l.sendsErr = errors.New("evloop: batching turned off")
		return l, nil
	}
	if l.sends, l.sendsErr = newSends(); l.sends != nil {
		// The ring's descriptor turns readable when a send that had to
		// wait completes.
		ev := syscall.EpollEvent{Events: syscall.EPOLLIN, Fd: int32(l.sends.fd)}
		if err := syscall.EpollCtl(epfd, syscall.EPOLL_CTL_ADD, l.sends.fd, &ev); err != nil {
			l.sends.close()
			l.sends, l.sendsErr = nil, os.NewSyscallError("epoll_ctl io_uring", err)
		}
	}
	return l, nil
}

// SendsError says why the loop does not batch sends (nil when it does).
func (l *Loop) SendsError() error { return l.sendsErr }

// Now is the loop's clock, in nanoseconds since New, read when the
// loop's latest wait ended (Tick reads it again).
func (l *Loop) Now() int64 { return l.now }

// Tick reads the loop's clock anew and returns it.
func (l *Loop) Tick() int64 {
	l.now = int64(time.Since(l.base))
	if l.now <= 0 {
		l.now = 1 // 0 means "no deadline" to a Timer
	}
	return l.now
}

// Wall is the wall-clock time of loop time t (from the loop's start, with
// no clock read of its own).
func (l *Loop) Wall(t int64) time.Time { return l.base.Add(time.Duration(t)) }

// At is the loop time d from now (Now, not Tick), never 0.
func (l *Loop) At(d time.Duration) int64 { return max(1, l.now+int64(d)) }

// Add registers fd with h for events (In, Out, RdHup, Edge, Exclusive).
// fd must not be registered on this loop already.
func (l *Loop) Add(fd int, h Handler, events uint32) error {
	if fd < 0 {
		return fmt.Errorf("evloop: add: bad descriptor %d", fd)
	}
	for fd >= len(l.slots) {
		l.slots = append(l.slots, make([]slot, len(l.slots)+64)...)
	}
	if l.slots[fd].h != nil {
		return fmt.Errorf("evloop: add: descriptor %d is registered already", fd)
	}
	if l.gen++; l.gen == 0 {
		l.gen = 1
	}
	ev := syscall.EpollEvent{Events: events, Fd: int32(fd), Pad: int32(l.gen)}
	if err := syscall.EpollCtl(l.epfd, syscall.EPOLL_CTL_ADD, fd, &ev); err != nil {
		return os.NewSyscallError("epoll_ctl add", err)
	}
	l.slots[fd] = slot{h: h, gen: l.gen}
	return nil
}

// Del takes fd off the loop (epoll_ctl DEL): for a descriptor that stays
// open but leaves the loop.
func (l *Loop) Del(fd int) error {
	l.Forget(fd)
	if err := syscall.EpollCtl(l.epfd, syscall.EPOLL_CTL_DEL, fd, nil); err != nil {
		return os.NewSyscallError("epoll_ctl del", err)
	}
	return nil
}

// Forget drops fd's handler without telling epoll: for a descriptor about
// to be closed, which takes it out of the epoll set by itself (the loop's
// descriptors are never duplicated).
func (l *Loop) Forget(fd int) {
	if fd >= 0 && fd < len(l.slots) {
		l.slots[fd] = slot{}
	}
}

// Arm sets t's deadline to at (loop nanoseconds; see At); 0 disarms it.
func (l *Loop) Arm(t *Timer, at int64) {
	if at == 0 {
		l.Disarm(t)
		return
	}
	t.next = at
	switch {
	case t.index < 0:
		t.when = at
		t.index = len(l.heap)
		l.heap = append(l.heap, t)
		l.up(t.index)
	case at < t.when:
		t.when = at
		l.up(t.index)
	}
	// Later than the heap's key: re-keyed when the key comes up.
}

// Cancel cancels t's deadline without heap work: t stays in the heap
// until its old deadline comes up (or it is armed again, which then costs
// nothing when the new deadline is later). For a timer cancelled and
// re-armed with every request; Disarm before the owner goes away.
func (l *Loop) Cancel(t *Timer) { t.next = 0 }

// Disarm cancels t's deadline and takes it out of the heap, so the loop
// holds no reference to its owner.
func (l *Loop) Disarm(t *Timer) {
	t.next = 0
	if t.index >= 0 {
		l.remove(t.index)
	}
}

// Post runs f on the loop's goroutine soon; false when the loop is
// stopping (f will not run).
func (l *Loop) Post(f func()) bool {
	l.mu.Lock()
	if l.stopping.Load() {
		l.mu.Unlock()
		return false
	}
	l.posted = append(l.posted, f)
	l.wake()
	l.mu.Unlock()
	return true
}

// wake signals the loop's eventfd; the caller holds mu, so Close (which
// takes it) never closes the descriptor under a signal.
func (l *Loop) wake() {
	if l.efd < 0 || l.signalled.Swap(true) {
		return
	}
	var one = uint64(1)
	// EAGAIN: the counter is full, so the loop wakes anyway.
	syscall.RawSyscall(syscall.SYS_WRITE, uintptr(l.efd), uintptr(unsafe.Pointer(&one)), 8)
}

// Stop makes Run return after the functions posted before it have run.
// Safe from any goroutine, and more than once.
func (l *Loop) Stop() {
	l.mu.Lock()
	l.stopping.Store(true)
	l.wake()
	l.mu.Unlock()
}

// ErrClosed is returned by Run on a closed loop.
var ErrClosed = errors.New("evloop: loop closed")

// Run serves the loop until Stop. Its goroutine is locked to its thread
// while it runs.
func (l *Loop) Run() error {
	if l.epfd < 0 {
		return ErrClosed
	}
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	l.Tick()
	for !l.stopped {
		if l.sends != nil {
			l.submit()
		}
		n, err := syscall.EpollWait(l.epfd, l.evs[:], l.waitMillis())
		l.Tick()
		if err != nil {
			if err == syscall.EINTR {
				continue
			}
			return os.NewSyscallError("epoll_wait", err)
		}
		for i := range n {
			ev := &l.evs[i]
			fd := int(ev.Fd)
			if fd == l.efd {
				l.runPosted()
				continue
			}
			if l.sends != nil && fd == l.sends.fd {
				l.reap()
				continue
			}
			if fd >= len(l.slots) {
				continue
			}
			s := &l.slots[fd]
			if s.h == nil || s.gen != uint32(ev.Pad) {
				continue // closed (and maybe reused) within this batch
			}
			s.h.Ready(ev.Events)
		}
		l.expire()
	}
	return nil
}

// waitMillis is how long epoll_wait may sleep: until the earliest timer
// (rounded up to a millisecond), -1 with none, 0 when work is posted.
func (l *Loop) waitMillis() int {
	if len(l.heap) == 0 {
		return -1
	}
	d := l.heap[0].when - l.now
	if d <= 0 {
		return 0
	}
	return int((d + int64(time.Millisecond) - 1) / int64(time.Millisecond))
}

// runPosted runs what Post queued; it ends the loop after Stop.
func (l *Loop) runPosted() {
	var cnt [8]byte
	syscall.RawSyscall(syscall.SYS_READ, uintptr(l.efd), uintptr(unsafe.Pointer(&cnt[0])), 8)
	l.signalled.Store(false)
	l.mu.Lock()
	l.running, l.posted = l.posted, l.running[:0]
	stop := l.stopping.Load()
	l.mu.Unlock()
	for i, f := range l.running {
		l.running[i] = nil
		f()
	}
	if stop {
		l.stopped = true
	}
}

// expire fires every timer whose deadline has passed.
func (l *Loop) expire() {
	for len(l.heap) > 0 {
		t := l.heap[0]
		if t.when > l.now {
			return
		}
		switch {
		case t.next == 0:
			l.remove(0)
		case t.next > l.now:
			t.when = t.next
			l.down(0)
		default:
			l.remove(0)
			t.next = 0
			t.e.Expired()
		}
	}
}

// Close releases the loop's descriptors. Call it after Run has returned;
// the handlers' own descriptors are their owners' to close.
func (l *Loop) Close() error {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.stopping.Store(true)
	if l.epfd < 0 {
		return nil
	}
	err := syscall.Close(l.epfd)
	if e := syscall.Close(l.efd); err == nil {
		err = e
	}
	if l.sends != nil {
		l.sends.close()
	}
	l.epfd, l.efd = -1, -1
	return err
}

// The timer heap: a binary min-heap on when, each Timer knowing its index.

func (l *Loop) up(i int) {
	h := l.heap
	for i > 0 {
		p := (i - 1) / 2
		if h[p].when <= h[i].when {
			break
		}
		h[p], h[i] = h[i], h[p]
		h[p].index, h[i].index = p, i
		i = p
	}
}

func (l *Loop) down(i int) {
	h := l.heap
	n := len(h)
	for {
		c := 2*i + 1
		if c >= n {
			return
		}
		if r := c + 1; r < n && h[r].when < h[c].when {
			c = r
		}
		if h[i].when <= h[c].when {
			return
		}
		h[i], h[c] = h[c], h[i]
		h[i].index, h[c].index = i, c
		i = c
	}
}

func (l *Loop) remove(i int) {
	h := l.heap
	last := len(h) - 1
	t := h[i]
	if i != last {
		h[i] = h[last]
		h[i].index = i
	}
	h[last] = nil
	l.heap = h[:last]
	t.index = -1
	if i != last {
		l.down(i)
		l.up(i)
	}
}
