//go:build linux && race

package rawio

import (
	"runtime"
	"syscall"
	"unsafe"
)

// Under the race detector, raw calls take part in its model of I/O as
// package syscall's calls do: every write is a release and every
// successful read an acquire on one variable shared by all descriptors
// (syscall's ioSync), so what a goroutine stored before sending is ordered
// before what the goroutine that reads the answer does next. Without this
// the detector would see no order between a handler's writes and a test
// that inspects them after the response, and report races that the
// network's causality rules out.
//
// syscall keeps ioSync to itself; its own functions annotate it: Write
// releases before it fails on descriptor -1, and a zero-length Read on the
// socket (which consumes nothing) acquires.

func raceBeforeWrite(p []byte) {
	syscall.Write(-1, nil)
	if len(p) > 0 {
		runtime.RaceReadRange(unsafe.Pointer(&p[0]), len(p))
	}
}

func raceAfterRead(fd uintptr, p []byte, n int) {
	if n > 0 {
		runtime.RaceWriteRange(unsafe.Pointer(&p[0]), n)
	}
	syscall.Read(int(fd), nil)
}

// raceEnabled: built with the race detector (its annotations add system
// calls, and allocations, of their own).
const raceEnabled = true

// RaceReleaseIO is, under the race detector, what every write through
// this package's calls is: a release on the detector's model of I/O, for
// bytes the kernel sends on the caller's behalf later (io_uring).
func RaceReleaseIO() { syscall.Write(-1, nil) }
