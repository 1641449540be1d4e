//go:build linux

package overhead

import (
	"fmt"
	"os"
	"strconv"
	"strings"
	"syscall"
	"unsafe"
)

// pinSelf restricts every thread of this process to the CPUs in list (a
// taskset-style list); threads started later inherit the mask of the
// thread that starts them.
func pinSelf(list string) error {
	var mask [16]uint64 // 1024 CPUs, the kernel's default cpumask size
	for _, part := range strings.Split(list, ",") {
		lo, hi, isRange := strings.Cut(part, "-")
		a, _ := strconv.Atoi(lo)
		b := a
		if isRange {
			b, _ = strconv.Atoi(hi)
		}
		for c := a; c <= b && c < 1024; c++ {
			mask[c/64] |= 1 << (c % 64)
		}
	}
	tasks, err := os.ReadDir("/proc/self/task")
	if err != nil {
		return fmt.Errorf("overhead: pin the load generator: %w", err)
	}
	for _, t := range tasks {
		tid, err := strconv.Atoi(t.Name())
		if err != nil {
			continue
		}
		_, _, errno := syscall.RawSyscall(syscall.SYS_SCHED_SETAFFINITY, uintptr(tid), unsafe.Sizeof(mask), uintptr(unsafe.Pointer(&mask)))
		if errno != 0 && errno != syscall.ESRCH {
			return fmt.Errorf("overhead: pin the load generator to CPUs %s: %w", list, errno)
		}
	}
	return nil
}
