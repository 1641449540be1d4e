package runbook

import (
	"bytes"
	"strings"
	"testing"
	"time"

	"github.com/charmbracelet/x/ansi"

	"github.com/llmgw/llmgw/results"
)

// TestStyledProgressFitsTheWidth: on a terminal of a known width no styled
// progress line is wider (the in-place replacement clears one terminal line
// only); without a width and in plain mode nothing is cut.
func TestStyledProgressFitsTheWidth(t *testing.T) {
	t0 := time.Date(2026, 12, 1, 0, 0, 0, 0, time.UTC)
	reason := strings.Repeat("a long reason that a terminal would wrap ", 10)
	st := results.Step{Name: "prove direct inference", Status: results.StatusFail, ReasonCode: "RECEIPT_MISSING", Reason: reason, Started: t0, Ended: t0.Add(time.Second)}
	cases := []struct {
		name      string
		tty       bool
		width     int
		wantWhole bool
	}{
		{"styled at 60", true, 60, false},
		{"styled, width unknown", true, 0, true},
		{"plain", false, 60, true},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			var buf bytes.Buffer
			p := NewProgress(&buf, tc.tty, tc.width)
			p.StepStarted(2, 9, st.Name)
			p.Note(2, 9, st.Name, reason)
			p.StepDone(2, 9, st)
			out := buf.String()
			if tc.width > 0 && tc.tty {
				for _, l := range strings.FieldsFunc(out, func(r rune) bool { return r == '\n' || r == '\r' }) {
					if w := ansi.StringWidth(l); w > tc.width {
						t.Errorf("line of %d columns; want at most %d: %q", w, tc.width, l)
					}
				}
			}
			if got := strings.Contains(out, strings.TrimSpace(reason)); got != tc.wantWhole {
				t.Errorf("whole reason in output = %v; want %v:\n%s", got, tc.wantWhole, out)
			}
		})
	}
}
