package wait

import (
	"errors"
	"sync/atomic"
	"testing"
	"time"
)

func TestUntil(t *testing.T) {
	errNo := errors.New("not yet")
	tests := []struct {
		name    string
		cond    func(calls int) error
		d       time.Duration
		wantErr error // nil: success
	}{
		{name: "holds at once", cond: func(int) error { return nil }, d: time.Hour},
		{name: "holds on the third poll", cond: func(n int) error {
			if n < 3 {
				return errNo
			}
			return nil
		}, d: time.Hour},
		// The deadline is the only way out of a condition that never
		// holds: the last reason is kept.
		{name: "never holds", cond: func(int) error { return errNo }, d: 3 * Poll, wantErr: errNo},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			var calls atomic.Int64
			_, err := Until(tc.d, func() error { return tc.cond(int(calls.Add(1))) })
			if tc.wantErr == nil && err != nil {
				t.Fatalf("Until: %v after %d calls", err, calls.Load())
			}
			if tc.wantErr != nil && !errors.Is(err, tc.wantErr) {
				t.Fatalf("Until: got %v, want %v", err, tc.wantErr)
			}
		})
	}
}

// fakeTB records Fatalf without stopping the goroutine that calls it.
type fakeTB struct {
	testing.TB
	failed bool
}

func (f *fakeTB) Helper()               {}
func (f *fakeTB) Fatalf(string, ...any) { f.failed = true }

func TestForFailsOnDeadline(t *testing.T) {
	for _, tc := range []struct {
		name string
		cond func() bool
		fail bool
	}{
		{"holds", func() bool { return true }, false},
		{"never holds", func() bool { return false }, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := &fakeTB{TB: t}
			For(f, 3*Poll, tc.name, tc.cond)
			if f.failed != tc.fail {
				t.Fatalf("failed = %v, want %v", f.failed, tc.fail)
			}
		})
	}
}
