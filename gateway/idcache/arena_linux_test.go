package idcache

import (
	"bufio"
	"fmt"
	"os"
	"runtime"
	"testing"
	"time"
	"unsafe"
)

// mapped reports whether addr lies in one of the process's mappings.
func mapped(t *testing.T, addr uintptr) bool {
	t.Helper()
	f, err := os.Open("/proc/self/maps")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		var lo, hi uintptr
		if _, err := fmt.Sscanf(sc.Text(), "%x-%x", &lo, &hi); err == nil && lo <= addr && addr < hi {
			return true
		}
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	return false
}

// TestArenaUnmappedWhenUnreachable: a cache dropped (a rule replaced)
// gives its arena back to the kernel; nothing waits for a Close.
func TestArenaUnmappedWhenUnreachable(t *testing.T) {
	addr := func() uintptr {
		c := mustNew(t, 8<<20, 8)
		c.Put("text", []uint32{1, 2})
		return uintptr(unsafe.Pointer(&c.arena[0]))
	}()
	if !mapped(t, addr) {
		t.Fatal("the arena is not in /proc/self/maps")
	}
	deadline := time.Now().Add(30 * time.Second)
	for mapped(t, addr) {
		if time.Now().After(deadline) {
			t.Fatal("the arena of an unreachable cache is still mapped")
		}
		runtime.GC()
		runtime.Gosched()
	}
}
