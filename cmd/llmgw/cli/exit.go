package cli

import (
	"context"
	"errors"
)

// ExitCode is the process exit status of llmgw. Every command maps its outcome
// to one of these in exactly one place (exitCodeFor), so scripts can rely on
// them.
type ExitCode int

const (
	ExitOK        ExitCode = 0   // the command did what it was asked; for runbooks: every step PASS
	ExitError     ExitCode = 1   // the command could not do its job (I/O, bad state, unreachable peer)
	ExitUsage     ExitCode = 2   // bad flags or arguments; nothing was started
	ExitFail      ExitCode = 3   // a runbook or qualification ran and at least one step is FAIL
	ExitBlocked   ExitCode = 4   // nothing FAILed but at least one step is BLOCKED
	ExitCancelled ExitCode = 130 // interrupted (Ctrl-C / SIGTERM)
)

// UsageError marks an error caused by the caller's flags or arguments.
type UsageError struct{ Err error }

func (e *UsageError) Error() string { return e.Err.Error() }
func (e *UsageError) Unwrap() error { return e.Err }

// ExitError carries a specific exit code out of a command's run function, for
// commands (runbooks, qualify) whose result is not simply success or error.
type ExitCodeError struct {
	Code ExitCode
	Err  error // may be nil when the command already printed its report
}

func (e *ExitCodeError) Error() string {
	if e.Err == nil {
		return ""
	}
	return e.Err.Error()
}
func (e *ExitCodeError) Unwrap() error { return e.Err }

func exitCodeFor(err error) ExitCode {
	if err == nil {
		return ExitOK
	}
	var ec *ExitCodeError
	if errors.As(err, &ec) {
		return ec.Code
	}
	var ue *UsageError
	if errors.As(err, &ue) {
		return ExitUsage
	}
	if errors.Is(err, context.Canceled) {
		return ExitCancelled
	}
	return ExitError
}
