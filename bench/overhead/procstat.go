package overhead

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"time"
)

// clockTicks is Linux's USER_HZ, the unit of utime and stime in
// /proc/PID/stat: 100 on every Linux ABI Go supports (the kernel exports
// the fixed value whatever its internal HZ).
const clockTicks = 100

// groupUsage is what one process group (a target's processes: nginx's
// master and workers, llmgw serve) has used so far.
type groupUsage struct {
	cpu time.Duration // user + system, all members, all threads
	rss int64         // resident bytes, summed over live members
}

// readGroupUsage sums /proc/PID/stat over the live members of process group
// pgid (fields after the parenthesised command: 3 state, 5 pgrp, 14 utime,
// 15 stime, 24 rss in pages). A member that exited during the run has
// taken its CPU time with it (its parent's cutime is not counted), which
// for the targets measured here (long-lived workers) loses nothing.
func readGroupUsage(pgid int) (groupUsage, error) {
	var u groupUsage
	stats, err := filepath.Glob("/proc/[0-9]*/stat")
	if err != nil || len(stats) == 0 {
		return u, fmt.Errorf("overhead: /proc not readable: %v", err)
	}
	page := int64(os.Getpagesize())
	found := false
	for _, path := range stats {
		b, err := os.ReadFile(path)
		if err != nil {
			continue // exited meanwhile
		}
		i := bytes.LastIndexByte(b, ')')
		if i < 0 {
			continue
		}
		f := bytes.Fields(b[i+1:])
		// f[0] is field 3 (state); field n is f[n-3].
		if len(f) < 22 || string(f[2]) != strconv.Itoa(pgid) || string(f[0]) == "Z" {
			continue
		}
		found = true
		ut, _ := strconv.ParseInt(string(f[11]), 10, 64)
		st, _ := strconv.ParseInt(string(f[12]), 10, 64)
		rss, _ := strconv.ParseInt(string(f[21]), 10, 64)
		u.cpu += time.Duration(ut+st) * time.Second / clockTicks
		u.rss += rss * page
	}
	if !found {
		return u, fmt.Errorf("overhead: no live process in group %d", pgid)
	}
	return u, nil
}

// Placement pins the benchmark's processes to CPUs, as `taskset -c` lists
// them ("0", "0-1", "1,3"): Targets for every proxy process and a
// separate backend, Load for this process (the load generator, and the
// embedded gateway and built-in simulator when those are used). Empty
// leaves that side unpinned.
type Placement struct {
	Targets string `json:"targets_cpus,omitempty"`
	Load    string `json:"load_cpus,omitempty"`
}

// pinned wraps a child's command line in taskset so the process and every
// worker it forks start on p.Targets.
func (p Placement) wrap(bin string, args []string) (string, []string, error) {
	if p.Targets == "" {
		return bin, args, nil
	}
	ts, err := exec.LookPath("taskset")
	if err != nil {
		return "", nil, fmt.Errorf("%w: pinning needs taskset (util-linux): %w", ErrParams, err)
	}
	return ts, append([]string{"-c", p.Targets, bin}, args...), nil
}

// validCPUList checks a taskset-style CPU list.
func validCPUList(s string) bool {
	if s == "" {
		return true
	}
	for _, part := range strings.Split(s, ",") {
		lo, hi, isRange := strings.Cut(part, "-")
		a, err := strconv.Atoi(lo)
		if err != nil || a < 0 {
			return false
		}
		if isRange {
			b, err := strconv.Atoi(hi)
			if err != nil || b < a {
				return false
			}
		}
	}
	return true
}

// cpusAllowed reads the CPU list a process may run on
// (/proc/PID/status Cpus_allowed_list), "" when unknown.
func cpusAllowed(pid int) string {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return ""
	}
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, "Cpus_allowed_list:"); ok {
			return strings.TrimSpace(v)
		}
	}
	return ""
}
