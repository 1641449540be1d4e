//go:build linux

package overhead

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"strconv"
	"strings"
	"syscall"
	"testing"

	"golang.org/x/sys/unix"
)

// TestKeepAwake: one SCHED_IDLE spinner per CPU this process may run on,
// each bound to its CPU, all gone once stop returns.
func TestKeepAwake(t *testing.T) {
	var set unix.CPUSet
	if err := unix.SchedGetaffinity(0, &set); err != nil {
		t.Fatal(err)
	}
	cpus, stop, err := keepAwake(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	stopped := false
	defer func() {
		if !stopped {
			stop()
		}
	}()
	if len(cpus) != set.Count() {
		t.Fatalf("spinners on CPUs %v, want one on each of this process's %d", cpus, set.Count())
	}
	pids := spinnersOf(t, os.Getpid())
	if len(pids) != len(cpus) {
		t.Fatalf("%d spinner processes, want %d", len(pids), len(cpus))
	}
	bound := map[string]bool{}
	for _, pid := range pids {
		attr, err := unix.SchedGetAttr(pid, 0)
		if err != nil {
			t.Fatal(err)
		}
		if attr.Policy != unix.SCHED_IDLE {
			t.Errorf("spinner %d: policy %d, want SCHED_IDLE (%d)", pid, attr.Policy, unix.SCHED_IDLE)
		}
		bound[cpusAllowed(pid)] = true
	}
	for _, c := range cpus {
		if !bound[strconv.Itoa(c)] {
			t.Errorf("no spinner bound to CPU %d alone (bindings %v)", c, bound)
		}
	}
	stop()
	stopped = true
	for _, pid := range pids {
		if err := syscall.Kill(pid, 0); err == nil {
			t.Errorf("spinner %d still alive after stop", pid)
		}
	}
}

// spinnersOf lists the live children of parent (its spinners: the test
// starts no other child process).
func spinnersOf(t *testing.T, parent int) []int {
	t.Helper()
	var pids []int
	// A child is listed under the thread that started it: read them all.
	tasks, err := os.ReadDir(fmt.Sprintf("/proc/%d/task", parent))
	if err != nil {
		t.Fatal(err)
	}
	seen := map[int]bool{}
	for _, task := range tasks {
		b, err := os.ReadFile(fmt.Sprintf("/proc/%d/task/%s/children", parent, task.Name()))
		if err != nil {
			continue
		}
		for _, f := range strings.Fields(string(b)) {
			pid, err := strconv.Atoi(f)
			if err == nil && !seen[pid] {
				seen[pid] = true
				pids = append(pids, pid)
			}
		}
	}
	return pids
}

// TestRunKeepsCPUsAwake: a run with KeepCPUsAwake reports the CPUs it kept
// awake, says so in its Markdown, and leaves no spinner behind.
func TestRunKeepsCPUsAwake(t *testing.T) {
	var set unix.CPUSet
	if err := unix.SchedGetaffinity(0, &set); err != nil {
		t.Fatal(err)
	}
	cfg := baseConfig()
	cfg.KeepCPUsAwake = true
	rep, err := Run(t.Context(), cfg)
	if err != nil {
		t.Fatalf("Run: %v", err)
	}
	if len(rep.AwakeCPUs) != set.Count() {
		t.Errorf("report's awake CPUs %v; want each of this process's %d", rep.AwakeCPUs, set.Count())
	}
	var md bytes.Buffer
	if err := WriteMarkdown(&md, rep); err != nil || !strings.Contains(md.String(), "kept from halting") {
		t.Errorf("markdown %q (err %v); want the awake CPUs named", md.String(), err)
	}
	if left := spinnersOf(t, os.Getpid()); len(left) != 0 {
		t.Errorf("child processes %v still alive after Run", left)
	}
}
