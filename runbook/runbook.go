// Package runbook is llmgw's step engine: ordered steps that each end PASS,
// FAIL, BLOCKED or SKIPPED with a reason and evidence files, recorded into a
// results run.
//
// Runner semantics:
//   - Steps run in order, each with the run's context.
//   - When a required step ends FAIL or BLOCKED, every later step is recorded
//     BLOCKED with the reason "blocked by <step>" and does not run.
//   - When the context is cancelled (Ctrl-C), the step in progress ends as it
//     reports, and every later step is recorded NOT_RUN ("interrupted").
//   - Cleanups registered with Run.Defer always run, last registered first
//     (LIFO), after the last step, also after a FAIL, a BLOCKED, a panic in a
//     step or a cancellation; they get a context that is not cancelled with
//     the run's, bounded by CleanupTimeout. Each cleanup runs at most once. The
//     cleanup outcome is recorded as the runbook's final step (its name is
//     Runbook.CleanupStep); a failing cleanup makes that step FAIL.
//   - Every outcome and its evidence is recorded into the results run, which
//     is finished (run.json, SHA256SUMS, history) even when interrupted, so
//     partial rows are kept.
package runbook

import (
	"context"
	"errors"
	"fmt"
	"runtime/debug"
	"strings"
	"sync"
	"time"

	"github.com/llmgw/llmgw/results"
)

// Outcome is what a step reports. Status is one of results.StatusPass,
// StatusFail, StatusBlocked or StatusSkipped. Code is a typed token (required
// for BLOCKED, e.g. "no_docker"; the failure token for FAIL, e.g.
// "ENGINE_NOT_READY"); Reason is one human sentence.
type Outcome struct {
	Status   results.Status
	Code     string
	Reason   string
	Evidence []Evidence
	// Lanes lists the evidence lanes this outcome speaks for (e.g. the direct
	// inference step sets the direct-worker lane). Nil sets none.
	Lanes []Lane
	// Sources names, per lane, the evidence source that proved it (or whose
	// absence blocked it).
	Sources map[Lane]string
}

// Evidence is one evidence file a step leaves: a name relative to the step's
// evidence directory and its bytes.
type Evidence struct {
	Name string
	Data []byte
}

// Lane names one results evidence lane.
type Lane int

// The lanes a step can speak for; see results.Lanes.
const (
	LaneDirectWorker Lane = iota
	LaneGatewayDelivery
	LaneRoutingEvidence
	LaneHashParity
	LaneCacheReuse
)

// Pass, Fail, Blocked and Skip build outcomes; evidence is added with With.
func Pass(format string, a ...any) Outcome {
	return Outcome{Status: results.StatusPass, Reason: fmt.Sprintf(format, a...)}
}

// Fail is a FAIL outcome with a failure token.
func Fail(code, format string, a ...any) Outcome {
	return Outcome{Status: results.StatusFail, Code: code, Reason: fmt.Sprintf(format, a...)}
}

// Blocked is a BLOCKED outcome; code is required (e.g. "no_docker").
func Blocked(code, format string, a ...any) Outcome {
	return Outcome{Status: results.StatusBlocked, Code: code, Reason: fmt.Sprintf(format, a...)}
}

// Skip is a SKIPPED outcome: the step does not apply to this tuple.
func Skip(format string, a ...any) Outcome {
	return Outcome{Status: results.StatusSkipped, Reason: fmt.Sprintf(format, a...)}
}

// With returns o with one more evidence file.
func (o Outcome) With(name string, data []byte) Outcome {
	o.Evidence = append(o.Evidence, Evidence{Name: name, Data: data})
	return o
}

// For returns o speaking for the given lanes.
func (o Outcome) For(lanes ...Lane) Outcome {
	o.Lanes = append(o.Lanes, lanes...)
	return o
}

// From returns o naming src as the evidence source of lane.
func (o Outcome) From(lane Lane, src string) Outcome {
	m := make(map[Lane]string, len(o.Sources)+1)
	for k, v := range o.Sources {
		m[k] = v
	}
	m[lane] = src
	o.Sources = m
	return o
}

// Step is one runbook step. Run must return when ctx ends; it is called at
// most once per run, from the runner's goroutine.
type Step interface {
	Name() string
	Run(ctx context.Context, r *Run) Outcome
}

// Optional marks a step whose FAIL or BLOCKED does not block later steps.
type Optional interface {
	Optional() bool
}

type funcStep struct {
	name     string
	fn       func(context.Context, *Run) Outcome
	optional bool
}

func (s funcStep) Name() string                            { return s.name }
func (s funcStep) Run(ctx context.Context, r *Run) Outcome { return s.fn(ctx, r) }
func (s funcStep) Optional() bool                          { return s.optional }

// NewStep returns a required step named name that runs fn.
func NewStep(name string, fn func(ctx context.Context, r *Run) Outcome) Step {
	return funcStep{name: name, fn: fn}
}

// NewOptionalStep returns a step whose failure does not block later steps.
func NewOptionalStep(name string, fn func(ctx context.Context, r *Run) Outcome) Step {
	return funcStep{name: name, fn: fn, optional: true}
}

// Runbook is an ordered list of steps. CleanupStep names the final step that
// records the deferred cleanups; "" means "cleanup".
type Runbook struct {
	Name        string
	Steps       []Step
	CleanupStep string
}

// DefaultCleanupTimeout bounds all deferred cleanups of one run together.
const DefaultCleanupTimeout = 60 * time.Second

// Runner executes runbooks. The zero value is usable: it reports no
// progress, uses time.Now and DefaultCleanupTimeout.
type Runner struct {
	// Progress receives step events; nil reports nothing.
	Progress Progress
	// Clock returns the current time; nil means time.Now. Tests pin it.
	Clock func() time.Time
	// CleanupTimeout bounds the deferred cleanups; 0 means
	// DefaultCleanupTimeout.
	CleanupTimeout time.Duration
}

// Run is the state of one runbook execution that steps share. Its Defer
// method is safe for concurrent use; Vars is for the runbook's own state and
// is only touched from step code (the runner goroutine).
type Run struct {
	// ID is the results run ID.
	ID string
	// Writer records the run; steps normally leave evidence through their
	// Outcome and need not use it.
	Writer *results.RunWriter
	// Vars carries runbook-specific state between steps.
	Vars any

	mu       sync.Mutex
	cleanups []cleanup
	logf     func(format string, a ...any)
}

type cleanup struct {
	name string
	fn   func(context.Context) error
	once *sync.Once
}

// Defer registers a cleanup that the runner calls after the last step, in
// LIFO order, whatever happened. fn must be idempotent: `llmgw cleanup` may
// repeat the same work from the persisted ownership ledger.
func (r *Run) Defer(name string, fn func(ctx context.Context) error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.cleanups = append(r.cleanups, cleanup{name: name, fn: fn, once: &sync.Once{}})
}

// Logf reports a progress note under the current step (plain line or
// styled, depending on the Progress in use).
func (r *Run) Logf(format string, a ...any) {
	if r.logf != nil {
		r.logf(format, a...)
	}
}

// Report is the result of Execute.
type Report struct {
	Summary results.RunSummary
	Steps   []results.Step
	// Interrupted reports that the context was cancelled during the run.
	Interrupted bool
}

// BlockedByCode is the reason code of a step that did not run because an
// earlier required step failed or was blocked.
func BlockedByCode(step string) string {
	return "blocked_by_" + slug(step)
}

// Execute runs rb, recording into w (which it finishes). vars becomes
// Run.Vars. It returns an error only when the run cannot be recorded; a
// FAIL or BLOCKED step is reported in the Report, not as an error.
func (rn *Runner) Execute(ctx context.Context, rb Runbook, w *results.RunWriter, vars any) (Report, error) {
	now := rn.Clock
	if now == nil {
		now = time.Now
	}
	prog := rn.Progress
	if prog == nil {
		prog = nopProgress{}
	}
	cleanupName := rb.CleanupStep
	if cleanupName == "" {
		cleanupName = "cleanup"
	}
	total := len(rb.Steps) + 1
	run := &Run{ID: w.ID(), Writer: w, Vars: vars}
	var rep Report
	var recErr error
	record := func(idx int, name string, o Outcome, started, ended time.Time) {
		st := results.Step{Name: name, Status: o.Status, Reason: o.Reason, ReasonCode: o.Code, Started: started, Ended: ended}
		for _, ev := range o.Evidence {
			p, err := w.AddEvidence(fmt.Sprintf("%02d-%s/%s", idx+1, slug(name), ev.Name), ev.Data)
			if err != nil {
				recErr = errors.Join(recErr, fmt.Errorf("runbook: step %q: %w", name, err))
				continue
			}
			st.Evidence = append(st.Evidence, p)
		}
		if err := w.RecordStep(st); err != nil {
			recErr = errors.Join(recErr, fmt.Errorf("runbook: step %q: %w", name, err))
		}
		rep.Steps = append(rep.Steps, st)
		prog.StepDone(idx, total, st)
	}

	lanes := results.Lanes{}
	sources := map[string]string{}
	blockedBy := ""
	for i, step := range rb.Steps {
		name := step.Name()
		run.logf = func(format string, a ...any) { prog.Note(i, total, name, fmt.Sprintf(format, a...)) }
		switch {
		case ctx.Err() != nil:
			rep.Interrupted = true
			t := now()
			record(i, name, Outcome{Status: results.StatusNotRun, Code: "interrupted", Reason: "interrupted before this step"}, t, t)
			continue
		case blockedBy != "":
			t := now()
			record(i, name, Blocked(BlockedByCode(blockedBy), "blocked by %s", blockedBy), t, t)
			continue
		}
		prog.StepStarted(i, total, name)
		started := now()
		o := runStep(ctx, step, run)
		ended := now()
		if !o.Status.Valid() || o.Status == results.StatusNotRun {
			o = Fail("STEP_BAD_OUTCOME", "step returned status %q", o.Status)
		}
		if o.Status == results.StatusBlocked && o.Code == "" {
			o.Code = "blocked"
		}
		if ctx.Err() != nil && o.Status != results.StatusPass {
			rep.Interrupted = true
		}
		record(i, name, o, started, ended)
		for _, l := range o.Lanes {
			setLane(&lanes, l, o.Status)
			if src := o.Sources[l]; src != "" && o.Status != results.StatusSkipped {
				sources[laneName(l)] = src
			}
		}
		if o.Status == results.StatusFail || o.Status == results.StatusBlocked {
			if opt, ok := step.(Optional); !ok || !opt.Optional() {
				blockedBy = name
			}
		}
	}

	// Cleanups: always, LIFO, on a context that outlives the run's.
	idx := len(rb.Steps)
	run.logf = func(format string, a ...any) { prog.Note(idx, total, cleanupName, fmt.Sprintf(format, a...)) }
	prog.StepStarted(idx, total, cleanupName)
	started := now()
	o := rn.runCleanups(ctx, run)
	record(idx, cleanupName, o, started, now())
	if ctx.Err() != nil {
		rep.Interrupted = true
	}
	if err := w.SetLanes(lanes); err != nil {
		recErr = errors.Join(recErr, err)
	}
	if err := w.SetLaneSources(sources); err != nil {
		recErr = errors.Join(recErr, err)
	}
	sum, err := w.Finish()
	if err != nil {
		return rep, errors.Join(recErr, fmt.Errorf("runbook: finish run: %w", err))
	}
	rep.Summary = sum
	return rep, recErr
}

// laneName is the results name of lane (results.LaneNames order).
func laneName(l Lane) string {
	if int(l) >= 0 && int(l) < len(results.LaneNames) {
		return results.LaneNames[l]
	}
	return fmt.Sprintf("lane%d", int(l))
}

func setLane(l *results.Lanes, lane Lane, s results.Status) {
	if s == results.StatusSkipped {
		return
	}
	p := map[Lane]*results.Status{
		LaneDirectWorker: &l.DirectWorker, LaneGatewayDelivery: &l.GatewayDelivery, LaneRoutingEvidence: &l.RoutingEvidence,
		LaneHashParity: &l.HashParity, LaneCacheReuse: &l.CacheReuse,
	}[lane]
	if p == nil {
		return
	}
	// A lane keeps its worst status: FAIL over BLOCKED over PASS.
	switch {
	case *p == results.StatusFail:
	case s == results.StatusFail, *p == "" || *p == results.StatusNotRun, *p == results.StatusPass && s == results.StatusBlocked:
		*p = s
	}
}

// runStep runs one step, turning a panic into a FAIL so that cleanups still
// run.
func runStep(ctx context.Context, s Step, r *Run) (o Outcome) {
	defer func() {
		if p := recover(); p != nil {
			o = Fail("STEP_PANIC", "step panicked: %v", p).With("panic.txt", debug.Stack())
		}
	}()
	return s.Run(ctx, r)
}

func (rn *Runner) runCleanups(ctx context.Context, r *Run) Outcome {
	timeout := rn.CleanupTimeout
	if timeout <= 0 {
		timeout = DefaultCleanupTimeout
	}
	cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), timeout)
	defer cancel()
	r.mu.Lock()
	list := append([]cleanup(nil), r.cleanups...)
	r.mu.Unlock()
	var log strings.Builder
	var failed []string
	for i := len(list) - 1; i >= 0; i-- {
		c := list[i]
		var err error
		c.once.Do(func() {
			defer func() {
				if p := recover(); p != nil {
					err = fmt.Errorf("panic: %v", p)
				}
			}()
			err = c.fn(cctx)
		})
		if err != nil {
			failed = append(failed, c.name)
			fmt.Fprintf(&log, "FAIL\t%s\t%v\n", c.name, err)
			r.Logf("%s: %v", c.name, err)
			continue
		}
		fmt.Fprintf(&log, "ok\t%s\n", c.name)
	}
	switch {
	case len(list) == 0:
		return Pass("nothing to clean up").With("cleanup.log", []byte("nothing registered\n"))
	case len(failed) > 0:
		return Fail("CLEANUP_FAILED", "%d of %d cleanups failed: %s", len(failed), len(list), strings.Join(failed, ", ")).With("cleanup.log", []byte(log.String()))
	}
	return Pass("%d cleanups done (last registered first)", len(list)).With("cleanup.log", []byte(log.String()))
}

// slug turns a step name into a file-name and code friendly token.
func slug(s string) string {
	var b strings.Builder
	for _, r := range strings.ToLower(s) {
		switch {
		case r >= 'a' && r <= 'z', r >= '0' && r <= '9':
			b.WriteRune(r)
		default:
			if b.Len() > 0 && !strings.HasSuffix(b.String(), "_") {
				b.WriteByte('_')
			}
		}
	}
	return strings.TrimSuffix(b.String(), "_")
}
