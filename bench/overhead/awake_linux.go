//go:build linux

package overhead

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"syscall"

	"golang.org/x/sys/unix"
)

// keepAwake starts one spinning process per CPU this process may run on,
// each bound to its CPU and scheduled SCHED_IDLE, and returns the CPU list
// and a stop function that kills them and waits for them to exit.
//
// Why: on a VM whose idle vCPUs halt (no cpuidle driver, so the idle loop
// executes HLT and the hypervisor deschedules the vCPU), waking a halted
// vCPU takes tens of microseconds, and at low concurrency every request
// waits for several such wake-ups: the proxy's CPU when the answer comes,
// the engine's when the request comes, the client's when the answer
// leaves. Whichever proxy happens to send the peer a packet earlier (a
// connect's SYN, a FIN) wakes that CPU ahead of time and looks faster for
// it. A SCHED_IDLE task runs only when nothing else is runnable and is
// preempted at once by any woken task, so with one on every CPU no CPU
// halts and a wake-up costs what it costs on a busy machine; it takes
// next to no time from the processes measured (SCHED_IDLE's weight is
// 3 against a nice-0 task's 1024) and its CPU is not charged to any
// target.
//
// The spinner is sh's built-in loop (no fork, no system call): sh is on
// every Linux system and needs nothing from this binary.
func keepAwake(ctx context.Context) (cpus []int, stop func(), err error) {
	var set unix.CPUSet
	if err := unix.SchedGetaffinity(0, &set); err != nil {
		return nil, nil, fmt.Errorf("overhead: keep CPUs awake: read this process's CPUs: %w", err)
	}
	sh, err := exec.LookPath("sh")
	if err != nil {
		return nil, nil, fmt.Errorf("%w: keeping CPUs awake needs sh: %w", ErrParams, err)
	}
	var procs []*exec.Cmd
	stop = func() {
		for _, p := range procs {
			_ = p.Process.Kill()
		}
		for _, p := range procs {
			// The spinners end only by the kill above; their exit status
			// says nothing.
			_ = p.Wait()
		}
	}
	for cpu := 0; cpu < 1024; cpu++ {
		if !set.IsSet(cpu) {
			continue
		}
		if err := startSpinner(ctx, sh, cpu, &procs); err != nil {
			stop()
			return nil, nil, err
		}
		cpus = append(cpus, cpu)
	}
	return cpus, stop, nil
}

// startSpinner starts one spinner on cpu and appends it to procs.
func startSpinner(ctx context.Context, sh string, cpu int, procs *[]*exec.Cmd) error {
	cmd := exec.CommandContext(ctx, sh, "-c", "while :; do :; done")
	// Pdeathsig: a benchmark killed outright leaves no spinner behind.
	// (Linux sends it when the thread that forked exits; the benchmark
	// locks no goroutine to a thread, so its threads live as long as it
	// does, and stop kills the spinners in any case.)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("overhead: keep CPU %d awake: %w", cpu, err)
	}
	*procs = append(*procs, cmd)
	pid := cmd.Process.Pid
	var one unix.CPUSet
	one.Set(cpu)
	if err := unix.SchedSetaffinity(pid, &one); err != nil {
		return fmt.Errorf("overhead: keep CPU %d awake: bind the spinner: %w", cpu, err)
	}
	attr := unix.SchedAttr{Size: unix.SizeofSchedAttr, Policy: unix.SCHED_IDLE}
	if err := unix.SchedSetAttr(pid, &attr, 0); err != nil {
		if errors.Is(err, os.ErrPermission) {
			return fmt.Errorf("%w: keep CPU %d awake: SCHED_IDLE refused: %w", ErrParams, cpu, err)
		}
		return fmt.Errorf("overhead: keep CPU %d awake: make the spinner SCHED_IDLE: %w", cpu, err)
	}
	return nil
}
