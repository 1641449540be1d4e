//go:build linux

package evloop

import (
	"errors"
	"fmt"
	"sync/atomic"
	"syscall"
	"unsafe"

	"github.com/llmgw/llmgw/internal/rawio"
)

// Batched sends.
//
// A loop can batch the sends its handlers make and submit them together,
// with one io_uring_enter(2), when it is about to wait. On a CPU shared
// with the peers being sent to (a gateway and an engine on one core), each
// send(2) wakes a peer, and the scheduler usually hands it the CPU right
// at that call's return, so the peer serves one request per wake-up and
// the sender is switched out once per request. Submitted together, the
// sends wake their peers once per batch: the scheduler switches at the
// end of the one call, and the peers find every request of the batch
// waiting (BENCHMARKS.md, "Sends submitted in batches").
//
// Contracts (Send, CancelSend, Batching):
//   - A queued send is submitted when the loop next waits (or when the
//     submission queue is full), in the order queued; its Sender's Sent is
//     called on the loop with the bytes sent or the errno, once, and never
//     from inside Send or CancelSend: completions are dispatched when the
//     loop is about to wait and when the ring reports late ones.
//   - Its buffers must not change until Sent (or CancelSend returning
//     true).
//   - The descriptor must stay open until Sent: a send not yet submitted
//     is cancelled with CancelSend before its descriptor is closed (the
//     number could be reused). One submitted holds the socket itself;
//     shutdown(2) ends it at once.
//   - Without io_uring (an old kernel, io_uring disabled by sysctl or a
//     seccomp profile) Batching is false and Send is not to be used.

// Sender is told how a send it queued ended.
type Sender interface {
	// Sent reports n bytes sent, or the errno (0 on success; a short
	// count is possible on a stream socket, and EAGAIN when the socket
	// had no room).
	Sent(n int, errno syscall.Errno)
}

// SendID names a queued send (CancelSend).
type SendID struct{ slot, gen uint32 }

// io_uring ABI (linux/io_uring.h).
const (
	sysIOURingSetup = 425
	sysIOURingEnter = 426
	opNop           = 0
	opWritev        = 2
	opSend          = 26
	offSQRing       = 0
	offCQRing       = 0x8000000
	offSQEs         = 0x10000000
	featSingleMMap  = 1 << 0
	featNoDrop      = 1 << 1
	enterGetEvents  = 1 << 0
	sqCQOverflow    = 1 << 1
	ringEntries     = 512
)

type uringParams struct {
	sqEntries, cqEntries, flags, sqThreadCPU, sqThreadIdle, features, wqFd uint32
	resv                                                                   [3]uint32
	sqOff                                                                  [10]uint32 // head, tail, ring_mask, ring_entries, flags, dropped, array, resv1, user_addr
	cqOff                                                                  [10]uint32 // head, tail, ring_mask, ring_entries, overflow, cqes, flags, resv1, user_addr
}

type uringSQE struct {
	opcode   uint8
	flags    uint8
	ioprio   uint16
	fd       int32
	off      uint64
	addr     uint64
	len      uint32
	opFlags  uint32
	userData uint64
	bufIndex uint16
	pers     uint16
	splice   int32
	addr3    uint64
	pad      uint64
}

type uringCQE struct {
	userData uint64
	res      int32
	flags    uint32
}

// sendSlot is one send queued or in flight.
type sendSlot struct {
	s   Sender
	gen uint32
	sq  uint32 // its submission queue index, while queued
	iov [2]syscall.Iovec
	// head, body: the buffers, held until the completion (a send whose
	// owner gave up may still be read by the kernel until then).
	head, body []byte
}

// sends is a loop's io_uring and its sends. Entries are written at tail
// and published (the shared tail moved) only by submit, which makes the
// kernel consume every published entry before it returns: an entry the
// kernel has not consumed is never left behind a descriptor that could be
// closed and its number reused.
type sends struct {
	fd        int
	ring      []byte
	sqem      []byte
	sqHead    *uint32
	sqTail    *uint32
	sqFlags   *uint32
	sqMask    uint32
	sqEntries uint32
	sqArray   []uint32
	sqes      []uringSQE
	cqHead    *uint32
	cqTail    *uint32
	cqMask    uint32
	cqes      []uringCQE
	tail      uint32 // next entry to write; *sqTail is the last published
	slots     []sendSlot
	free      []uint32
}

// errNoRing: io_uring could not be set up (the loop sends one by one).
var errNoRing = errors.New("evloop: io_uring unavailable")

func newSends() (*sends, error) {
	var p uringParams
	fd, _, e := syscall.RawSyscall(sysIOURingSetup, ringEntries, uintptr(unsafe.Pointer(&p)), 0)
	if e != 0 {
		return nil, fmt.Errorf("%w: io_uring_setup: %v", errNoRing, e)
	}
	if p.features&featSingleMMap == 0 || p.features&featNoDrop == 0 {
		// Rings mapped apart, or completions that overflow dropped: an
		// older kernel than this code is written for.
		syscall.Close(int(fd))
		return nil, fmt.Errorf("%w: the kernel lacks IORING_FEAT_SINGLE_MMAP or IORING_FEAT_NODROP", errNoRing)
	}
	s := &sends{fd: int(fd), sqEntries: p.sqEntries}
	sqSize := int(p.sqOff[6] + p.sqEntries*4)
	cqSize := int(p.cqOff[5] + p.cqEntries*uint32(unsafe.Sizeof(uringCQE{})))
	ring, err := syscall.Mmap(int(fd), offSQRing, max(sqSize, cqSize), syscall.PROT_READ|syscall.PROT_WRITE, syscall.MAP_SHARED|syscall.MAP_POPULATE)
	if err != nil {
		syscall.Close(int(fd))
		return nil, fmt.Errorf("%w: mmap: %v", errNoRing, err)
	}
	sqem, err := syscall.Mmap(int(fd), offSQEs, int(p.sqEntries)*int(unsafe.Sizeof(uringSQE{})), syscall.PROT_READ|syscall.PROT_WRITE, syscall.MAP_SHARED|syscall.MAP_POPULATE)
	if err != nil {
		syscall.Munmap(ring)
		syscall.Close(int(fd))
		return nil, fmt.Errorf("%w: mmap: %v", errNoRing, err)
	}
	b := unsafe.Pointer(&ring[0])
	s.ring, s.sqem = ring, sqem
	s.sqHead = (*uint32)(unsafe.Add(b, p.sqOff[0]))
	s.sqTail = (*uint32)(unsafe.Add(b, p.sqOff[1]))
	s.sqFlags = (*uint32)(unsafe.Add(b, p.sqOff[4]))
	s.sqMask = *(*uint32)(unsafe.Add(b, p.sqOff[2]))
	s.sqArray = unsafe.Slice((*uint32)(unsafe.Add(b, p.sqOff[6])), p.sqEntries)
	s.cqHead = (*uint32)(unsafe.Add(b, p.cqOff[0]))
	s.cqTail = (*uint32)(unsafe.Add(b, p.cqOff[1]))
	s.cqMask = *(*uint32)(unsafe.Add(b, p.cqOff[2]))
	s.cqes = unsafe.Slice((*uringCQE)(unsafe.Add(b, p.cqOff[5])), p.cqEntries)
	s.sqes = unsafe.Slice((*uringSQE)(unsafe.Pointer(&sqem[0])), p.sqEntries)
	s.tail = atomic.LoadUint32(s.sqTail)
	return s, nil
}

func (s *sends) close() {
	syscall.Munmap(s.sqem)
	syscall.Munmap(s.ring)
	syscall.Close(s.fd)
}

// Batching reports whether the loop batches sends (Send may be used).
func (l *Loop) Batching() bool { return l.sends != nil }

// Send queues a send of head and then body (either may be empty) on fd;
// see the contracts above. It submits the queue at once when it is full
// (the completions wait for the loop).
func (l *Loop) Send(fd int, head, body []byte, s Sender) SendID {
	q := l.sends
	if len(head) == 0 {
		head, body = body, nil
	}
	if q.tail-atomic.LoadUint32(q.sqTail) == q.sqEntries {
		l.publish()
	}
	var slot uint32
	if n := len(q.free); n > 0 {
		slot = q.free[n-1]
		q.free = q.free[:n-1]
	} else {
		q.slots = append(q.slots, sendSlot{})
		slot = uint32(len(q.slots) - 1)
	}
	sl := &q.slots[slot]
	sl.gen++
	sl.s, sl.head, sl.body = s, head, body
	i := q.tail & q.sqMask
	sl.sq = i
	e := &q.sqes[i]
	*e = uringSQE{fd: int32(fd), userData: uint64(sl.gen)<<32 | uint64(slot)}
	if len(body) == 0 {
		e.opcode, e.addr, e.len, e.opFlags = opSend, uint64(uintptr(unsafe.Pointer(unsafe.SliceData(head)))), uint32(len(head)), syscall.MSG_NOSIGNAL
	} else {
		sl.iov[0].Base, sl.iov[1].Base = unsafe.SliceData(head), unsafe.SliceData(body)
		sl.iov[0].SetLen(len(head))
		sl.iov[1].SetLen(len(body))
		e.opcode, e.addr, e.len = opWritev, uint64(uintptr(unsafe.Pointer(&sl.iov[0]))), 2
	}
	q.sqArray[i] = i
	q.tail++
	return SendID{slot: slot, gen: sl.gen}
}

// CancelSend cancels a send not yet submitted and reports true (its Sent
// will not be called); false when it was submitted or ended already.
func (l *Loop) CancelSend(id SendID) bool {
	q := l.sends
	if q == nil || int(id.slot) >= len(q.slots) {
		return false
	}
	sl := &q.slots[id.slot]
	if sl.gen != id.gen || sl.s == nil || !q.queued(sl.sq) {
		return false
	}
	// The entry goes to the kernel as a no-op whose completion frees the
	// slot and calls nobody.
	e := &q.sqes[sl.sq]
	*e = uringSQE{opcode: opNop, userData: e.userData}
	sl.s = nil
	return true
}

// queued reports whether submission queue index i holds an entry written
// and not yet published.
func (q *sends) queued(i uint32) bool {
	pub := atomic.LoadUint32(q.sqTail)
	for t := pub; t != q.tail; t++ {
		if t&q.sqMask == i {
			return true
		}
	}
	return false
}

// publish has the kernel take every queued send, dispatching nothing (a
// send the socket takes at once completes inside the call; its completion
// waits in the ring, or in the kernel's overflow list when the ring is
// full). It returns the error of a ring that refuses work.
func (l *Loop) publish() syscall.Errno {
	q := l.sends
	if q.tail == atomic.LoadUint32(q.sqTail) && q.tail == atomic.LoadUint32(q.sqHead) {
		return 0
	}
	// What the loop wrote before these sends happens before the peer's
	// read of them, for the race detector as for rawio's writes.
	rawio.RaceReleaseIO()
	atomic.StoreUint32(q.sqTail, q.tail)
	for {
		left := q.tail - atomic.LoadUint32(q.sqHead)
		if left == 0 {
			return 0
		}
		_, _, e := syscall.RawSyscall6(sysIOURingEnter, uintptr(q.fd), uintptr(left), 0, 0, 0, 0)
		switch e {
		case 0, syscall.EINTR:
			continue
		case syscall.EAGAIN:
			// Short of memory for the requests: the rest go with the
			// next submit.
			return 0
		}
		return e
	}
}

// submit publishes the queued sends and dispatches every completion there
// is, overflowed ones included. Called where the loop is about to wait.
func (l *Loop) submit() {
	q := l.sends
	if e := l.publish(); e != 0 {
		// The ring refuses work: the sends it did not take fail with
		// the reason (the kernel consumes nothing beyond its head).
		l.failUnconsumed(e)
	}
	l.reap()
	for atomic.LoadUint32(q.sqFlags)&sqCQOverflow != 0 {
		// Completions the full ring could not hold wait in the kernel:
		// GETEVENTS moves them into the ring, which reap just emptied.
		_, _, e := syscall.RawSyscall6(sysIOURingEnter, uintptr(q.fd), 0, 0, enterGetEvents, 0, 0)
		if e != 0 && e != syscall.EINTR && e != syscall.EBUSY {
			break
		}
		l.reap()
	}
}

// failUnconsumed takes back the published entries the kernel did not
// consume and reports them failed with errno.
func (l *Loop) failUnconsumed(errno syscall.Errno) {
	q := l.sends
	head := atomic.LoadUint32(q.sqHead)
	for t := head; t != q.tail; t++ {
		e := &q.sqes[q.sqArray[t&q.sqMask]]
		slot := uint32(e.userData)
		sl := &q.slots[slot]
		s := sl.s
		sl.s, sl.head, sl.body = nil, nil, nil
		sl.gen++
		q.free = append(q.free, slot)
		if s != nil {
			s.Sent(0, errno)
		}
	}
	q.tail = head
	atomic.StoreUint32(q.sqTail, head)
}

// reap dispatches every completion the ring holds.
func (l *Loop) reap() {
	q := l.sends
	for {
		h := atomic.LoadUint32(q.cqHead)
		if h == atomic.LoadUint32(q.cqTail) {
			return
		}
		c := q.cqes[h&q.cqMask]
		atomic.StoreUint32(q.cqHead, h+1)
		slot, gen := uint32(c.userData), uint32(c.userData>>32)
		if int(slot) >= len(q.slots) || q.slots[slot].gen != gen {
			continue
		}
		sl := &q.slots[slot]
		s := sl.s
		sl.s, sl.head, sl.body = nil, nil, nil
		q.free = append(q.free, slot)
		if s == nil {
			continue // cancelled
		}
		if c.res < 0 {
			s.Sent(0, syscall.Errno(-c.res))
		} else {
			s.Sent(int(c.res), 0)
		}
	}
}
