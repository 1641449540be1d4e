package runbook

import (
	"os"
	"testing"
)

func TestParseStatStart(t *testing.T) {
	tail := " S 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16 17 18 4242 99 100\n"
	cases := []struct {
		name, stat string
		want       uint64
		err        bool
	}{
		{"plain", "123 (llmgw)" + tail, 4242, false},
		{"command name with spaces and parens", "123 (a) b (c))" + tail, 4242, false},
		{"no command name", "123 llmgw S 1", 0, true},
		{"too short", "123 (x) S 1 2", 0, true},
		{"bad number", "123 (x) S 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16 17 18 abc", 0, true},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			got, err := parseStatStart([]byte(tc.stat))
			if (err != nil) != tc.err || got != tc.want {
				t.Errorf("parseStatStart = %d, %v; want %d (err %v)", got, err, tc.want, tc.err)
			}
		})
	}
}

// TestSameProcess: our own process matches its recorded start time; the same
// PID with another start time (a recycled PID) does not.
func TestSameProcess(t *testing.T) {
	pid := os.Getpid()
	st, err := ProcessStart(pid)
	if err != nil {
		t.Skipf("no /proc on this system: %v", err)
	}
	if !SameProcess(OwnedProcess{PID: pid, Start: st}) {
		t.Errorf("own process with its start time not recognised")
	}
	if SameProcess(OwnedProcess{PID: pid, Start: st + 1}) {
		t.Errorf("a different start time was taken for the same process")
	}
}
