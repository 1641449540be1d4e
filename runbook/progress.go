package runbook

import (
	"fmt"
	"io"
	"strings"
	"sync"
	"time"

	"github.com/charmbracelet/lipgloss"
	"github.com/charmbracelet/x/ansi"

	"github.com/llmgw/llmgw/results"
)

// Progress receives live step events. Implementations must be safe for
// concurrent use (Note may be called from a step's helper goroutines).
type Progress interface {
	// StepStarted is called before step idx (0-based) of total runs.
	StepStarted(idx, total int, name string)
	// Note is a progress remark inside a running step.
	Note(idx, total int, name, msg string)
	// StepDone is called once per step with its record, also for steps that
	// did not run (BLOCKED by an earlier step, NOT_RUN after Ctrl-C).
	StepDone(idx, total int, st results.Step)
}

type nopProgress struct{}

func (nopProgress) StepStarted(int, int, string)    {}
func (nopProgress) Note(int, int, string, string)   {}
func (nopProgress) StepDone(int, int, results.Step) {}

// NewProgress returns the progress reporter for w: live, lipgloss-styled
// lines when tty (the running step shows until it ends, then its line is
// replaced by the outcome), plain one-line-per-event text otherwise.
// width > 0 is the terminal's width: a styled line longer than it is cut
// with an ellipsis, because the in-place replacement clears one terminal
// line only (a wrapped line would leave its head behind). Plain lines are
// never cut.
func NewProgress(w io.Writer, tty bool, width int) Progress {
	if tty {
		p := newStyled(w)
		p.width = width
		return p
	}
	return &plainProgress{w: w}
}

// plainProgress writes stable lines for logs and pipes:
//
//	[3/9] prove direct inference: PASS (12ms) 3 workers answered ...
type plainProgress struct {
	mu sync.Mutex
	w  io.Writer
}

func (p *plainProgress) StepStarted(idx, total int, name string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	fmt.Fprintf(p.w, "[%d/%d] %s ...\n", idx+1, total, name)
}

func (p *plainProgress) Note(idx, total int, name, msg string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	fmt.Fprintf(p.w, "[%d/%d] %s: %s\n", idx+1, total, name, oneLine(msg))
}

func (p *plainProgress) StepDone(idx, total int, st results.Step) {
	p.mu.Lock()
	defer p.mu.Unlock()
	fmt.Fprintf(p.w, "[%d/%d] %s: %s%s (%s) %s\n", idx+1, total, st.Name, st.Status.Norm(), codeSuffix(st.ReasonCode),
		duration(st), oneLine(st.Reason))
}

func codeSuffix(code string) string {
	if code == "" {
		return ""
	}
	return " " + code
}

func duration(st results.Step) string {
	return st.Ended.Sub(st.Started).Round(time.Millisecond).String()
}

func oneLine(s string) string {
	return strings.NewReplacer("\n", " ", "\r", " ", "\t", " ").Replace(s)
}

// styledProgress renders with lipgloss for a terminal: a dim "running" line
// while a step runs, replaced in place by a coloured status badge when it
// ends. Colour follows the terminal's profile (none under NO_COLOR).
type styledProgress struct {
	mu      sync.Mutex
	w       io.Writer
	running bool
	badge   map[results.Status]lipgloss.Style
	dim     lipgloss.Style
	name    lipgloss.Style
	width   int // 0: lines are not cut
}

// fit cuts one styled line (ANSI sequences kept intact) to the width.
func (p *styledProgress) fit(line string) string {
	if p.width <= 0 {
		return line
	}
	return ansi.Truncate(line, p.width, "…")
}

func newStyled(w io.Writer) *styledProgress {
	re := lipgloss.NewRenderer(w)
	b := re.NewStyle().Bold(true).Width(9)
	return &styledProgress{
		w: w,
		badge: map[results.Status]lipgloss.Style{
			results.StatusPass:    b.Foreground(lipgloss.Color("2")),
			results.StatusFail:    b.Foreground(lipgloss.Color("1")),
			results.StatusBlocked: b.Foreground(lipgloss.Color("3")),
			results.StatusSkipped: b.Foreground(lipgloss.Color("8")),
			results.StatusNotRun:  b.Foreground(lipgloss.Color("8")),
		},
		dim:  re.NewStyle().Faint(true),
		name: re.NewStyle().Bold(true),
	}
}

// clearLine erases the "running" line so the outcome replaces it.
const clearLine = "\r\x1b[2K"

func (p *styledProgress) StepStarted(idx, total int, name string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	io.WriteString(p.w, p.fit(fmt.Sprintf("%s %s %s", p.dim.Render(fmt.Sprintf("%d/%d", idx+1, total)), p.dim.Render("running  "), p.name.Render(name))))
	p.running = true
}

func (p *styledProgress) Note(idx, total int, name, msg string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.running {
		io.WriteString(p.w, clearLine)
	}
	io.WriteString(p.w, p.fit(fmt.Sprintf("%s %s", p.dim.Render(fmt.Sprintf("%d/%d", idx+1, total)), p.dim.Render("  "+name+": "+oneLine(msg))))+"\n")
	io.WriteString(p.w, p.fit(fmt.Sprintf("%s %s %s", p.dim.Render(fmt.Sprintf("%d/%d", idx+1, total)), p.dim.Render("running  "), p.name.Render(name))))
}

func (p *styledProgress) StepDone(idx, total int, st results.Step) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.running {
		io.WriteString(p.w, clearLine)
		p.running = false
	}
	s := st.Status.Norm()
	label := string(s)
	io.WriteString(p.w, p.fit(fmt.Sprintf("%s %s %s %s %s", p.dim.Render(fmt.Sprintf("%d/%d", idx+1, total)), p.badge[s].Render(label),
		p.name.Render(st.Name), p.dim.Render(duration(st)+codeSuffix(st.ReasonCode)), oneLine(st.Reason)))+"\n")
}
