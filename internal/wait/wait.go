// Package wait is the tests' one way to wait for an event: poll a
// condition until it holds, failing if a deadline passes first. The
// deadline only detects a hang (the event never happens); how long a wait
// took is for logs and benchmarks, never for an assertion.
package wait

import (
	"fmt"
	"testing"
	"time"
)

// Poll is how often a condition is re-checked.
const Poll = 5 * time.Millisecond

// Until polls cond every Poll until it returns nil and returns how long
// that took. After d it returns cond's last error (wrapped), or an error
// saying the deadline passed when cond gave none.
func Until(d time.Duration, cond func() error) (time.Duration, error) {
	start := time.Now()
	deadline := time.NewTimer(d)
	defer deadline.Stop()
	tick := time.NewTicker(Poll)
	defer tick.Stop()
	for {
		err := cond()
		if err == nil {
			return time.Since(start), nil
		}
		select {
		case <-deadline.C:
			return time.Since(start), fmt.Errorf("no success after %v: %w", d, err)
		case <-tick.C:
		}
	}
}

// errNotYet is the error For's conditions give Until while they do not
// hold.
var errNotYet = fmt.Errorf("condition not met")

// For polls cond until it holds and returns how long that took; if d
// passes first, t fails with what (t.Fatalf, so call it from the test's
// goroutine).
func For(t testing.TB, d time.Duration, what string, cond func() bool) time.Duration {
	t.Helper()
	took, err := Until(d, func() error {
		if cond() {
			return nil
		}
		return errNotYet
	})
	if err != nil {
		t.Fatalf("timed out after %v waiting for %s", d, what)
	}
	return took
}

// ForErr is For with a condition that says why it does not hold yet; the
// last reason is in the failure.
func ForErr(t testing.TB, d time.Duration, what string, cond func() error) time.Duration {
	t.Helper()
	took, err := Until(d, cond)
	if err != nil {
		t.Fatalf("waiting for %s: %v", what, err)
	}
	return took
}
