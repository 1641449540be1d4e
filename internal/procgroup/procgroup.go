// Package procgroup starts child processes in their own process group and
// stops the whole group. A reference proxy such as nginx forks worker
// processes: killing only the master leaves the workers running and holding
// their ports, so every stop goes through the group.
package procgroup

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"syscall"
	"time"
)

// Prepare makes cmd (not yet started) the leader of a new process group,
// and asks the kernel to kill it if this process dies first.
func Prepare(cmd *exec.Cmd) {
	if cmd.SysProcAttr == nil {
		cmd.SysProcAttr = &syscall.SysProcAttr{}
	}
	cmd.SysProcAttr.Setpgid = true
	cmd.SysProcAttr.Pdeathsig = syscall.SIGKILL
}

// Kill sends SIGKILL to the process group led by the started cmd and waits,
// up to timeout, until no process of the group is left. The caller still
// reaps cmd itself (cmd.Wait): Kill does not, since one goroutine should own
// Wait. It returns an error when processes of the group survive the
// timeout.
func Kill(cmd *exec.Cmd, timeout time.Duration) error {
	if cmd.Process == nil {
		return nil
	}
	pgid := cmd.Process.Pid
	if err := syscall.Kill(-pgid, syscall.SIGKILL); err != nil && !errors.Is(err, syscall.ESRCH) {
		return fmt.Errorf("procgroup: kill group %d: %w", pgid, err)
	}
	deadline := time.Now().Add(timeout)
	for {
		// A zombie has released its ports and memory; only live members
		// count (an orphaned worker's zombie may wait for a PID 1 that
		// never reaps it).
		if !liveMembers(pgid) {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("procgroup: group %d still has processes after %v", pgid, timeout)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// liveMembers reports whether any process of group pgid is alive and not a
// zombie, from /proc/PID/stat (fields after the parenthesised command:
// state, ppid, pgrp).
func liveMembers(pgid int) bool {
	stats, _ := filepath.Glob("/proc/[0-9]*/stat")
	for _, path := range stats {
		b, err := os.ReadFile(path)
		if err != nil {
			continue // exited while we looked
		}
		i := bytes.LastIndexByte(b, ')')
		if i < 0 {
			continue
		}
		f := bytes.Fields(b[i+1:])
		if len(f) < 3 || string(f[0]) == "Z" {
			continue
		}
		if g, err := strconv.Atoi(string(f[2])); err == nil && g == pgid {
			return true
		}
	}
	return false
}
