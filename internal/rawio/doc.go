// Package rawio reads and writes the gateway's TCP connections without
// entering the Go scheduler's system-call state.
//
// Why: every read(2) and write(2) through net.Conn goes through
// entersyscall/exitsyscall. While a goroutine is "in a system call" the
// runtime's monitor thread (sysmon) may hand its P to another thread, and
// any such call wakes sysmon from its deep sleep and puts it back on a
// 20 µs polling loop. On a proxy whose loopback writes run the receiver's
// TCP processing and often get preempted by the woken peer, that costs a
// thread hand-off and a futex wake-up per request, and sysmon's own
// wake-ups take the CPU from the backend sharing it (measured: see
// BENCHMARKS.md, "Raw socket I/O").
//
// Non-blocking socket calls never sleep in the kernel: they copy what the
// socket buffer holds or takes and return EAGAIN otherwise, so there is no
// blocking for the scheduler to cover. Waiting stays the runtime poller's
// job (syscall.RawConn), so deadlines, Close and the poller's wake-ups work
// exactly as on a *net.TCPConn.
//
// Write deadlines are held back from the poller until a write has to wait
// (writeDeadline): a write the socket takes at once succeeds even past its
// deadline, and the per-request timer changes of a proxy whose writes never
// wait are saved.
//
// A client's request can be left for the read of its answer (SendFirst):
// that read writes it after arming its wait, so its first read(2) comes
// when the answer is there, not once before to find nothing (EAGAIN).
//
// What is lost: libraries that type-switch on *net.TCPConn no longer see
// one. fasthttp sends a response larger than its write buffer as one
// writev(2) only to a *net.TCPConn; here it is two writes, as on TLS.
package rawio
