// Package qualify runs the qualification matrix: engines × profiles ×
// modes × topologies, one runbook per case (runbook/converged for the
// converged topology, with the hash-parity gate added in exact mode;
// runbook/pd for the P/D topology), each recorded as one results run.
//
// Known-BLOCKED tuples from the profile catalog are recorded BLOCKED with
// their reason code by the runbook's first step, before anything is
// launched. When the context is cancelled (Ctrl-C) the case in flight ends
// with its cleanups done and its partial row recorded; rows already
// recorded are kept and no further case starts.
package qualify

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/llmgw/llmgw/engines"
	_ "github.com/llmgw/llmgw/engines/all" // the adapters say what each engine supports
	"github.com/llmgw/llmgw/profiles"
	"github.com/llmgw/llmgw/results"
	"github.com/llmgw/llmgw/runbook"
	"github.com/llmgw/llmgw/runbook/converged"
	"github.com/llmgw/llmgw/runbook/gates"
	"github.com/llmgw/llmgw/runbook/labkit"
	"github.com/llmgw/llmgw/runbook/launcher"
	"github.com/llmgw/llmgw/runbook/pd"
)

// Valid values of the matrix dimensions.
var (
	// Engines are the engines qualify runs; "all" selects every one.
	// They are every registered engine; what each supports (modes exact,
	// topology pd) comes from its adapter's KV and P/D contracts (Plan).
	Engines = engines.Names(nil)
	// Modes are the routing modes: round robin, CHWBL prefix affinity and
	// KV-exact. By default an engine with a KV event plane runs rr and
	// exact; one without (llama.cpp) runs the full-proxy lanes rr and chwbl.
	Modes = []string{"rr", "chwbl", "exact"}
	// Topologies are converged (one pool) and pd (prefill/decode).
	Topologies = []string{"converged", "pd"}
	// Launchers are the ways workers are obtained.
	Launchers = []string{results.LauncherSim, results.LauncherDocker, results.LauncherAttach}
)

// ErrInvalid classifies bad Options: nothing was started. The message
// lists the valid values.
var ErrInvalid = errors.New("qualify: invalid options")

// Case is one cell of the matrix.
type Case struct {
	Engine, Profile, Mode, Topology string
}

// ID is the stable case key, as results.Tuple.CaseID spells it.
func (c Case) ID() string {
	return strings.Join([]string{c.Engine, c.Profile, c.Mode, c.Topology}, "-")
}

// Options configure a qualification run. Empty lists mean "all".
type Options struct {
	Engines    []string
	Profiles   []string
	Modes      []string
	Topologies []string
	// Launcher is sim, docker or attach; "" means sim.
	Launcher string
	// Endpoints (converged) and PrefillEndpoints/DecodeEndpoints (pd) are
	// the running workers for the attach launcher.
	Endpoints                         []string
	PrefillEndpoints, DecodeEndpoints []string
	// ImageOverride is the docker launcher's engine (or "sim") → image map.
	ImageOverride map[string]string
	// Workers is the converged pool size; 0 means 3.
	Workers int
	// Catalog is the profile catalog; nil loads the embedded one.
	Catalog *profiles.Catalog
	// HealthTimeout and ReadyTimeout are passed to each runbook (0: their
	// defaults).
	HealthTimeout, ReadyTimeout time.Duration
	// AcceptVersionMismatch lets real workers that report an engine
	// version other than the catalog's be qualified (the mismatch stays on
	// the row).
	AcceptVersionMismatch bool
	// SimHashSeed, when set, starts every simulator with this hash seed
	// instead of the catalog's: the workers then publish hashes the gateway
	// cannot predict. It exists to prove the parity gate catches that.
	SimHashSeed string
	// Progress receives case and step events; nil reports nothing.
	Progress Progress
	// StepHook is called before each step of each case (tests cancel the
	// context from it, as Ctrl-C would).
	StepHook func(c Case, step string)
	// Logger receives the embedded gateways' logs; nil discards them.
	Logger *slog.Logger
}

// Progress receives live qualification events. Implementations must be
// safe for concurrent use.
type Progress interface {
	runbook.Progress
	// CaseStarted is called before case i (0-based) of n starts.
	CaseStarted(i, n int, c Case)
	// CaseDone is called with the case's result row.
	CaseDone(i, n int, c Case, row results.RunSummary)
}

// Plan validates o and expands the matrix in a stable order (engine,
// profile, topology, mode). Every error wraps ErrInvalid and lists the
// valid values; nothing is started.
func Plan(o *Options) ([]Case, error) {
	if o.Catalog == nil {
		c, err := labkit.LoadCatalog(nil)
		if err != nil {
			return nil, fmt.Errorf("qualify: %w", err)
		}
		o.Catalog = c
	}
	// An engine named on its own must have cases; under "all" an engine
	// the chosen modes do not apply to is left out.
	explicit := len(o.Engines) > 0 && !(len(o.Engines) == 1 && o.Engines[0] == "all")
	var err error
	if o.Engines, err = pick("engine", o.Engines, Engines, true); err != nil {
		return nil, err
	}
	if o.Profiles, err = pick("profile", o.Profiles, o.Catalog.IDs(), true); err != nil {
		return nil, err
	}
	modesGiven := len(o.Modes) > 0
	if o.Modes, err = pick("mode", o.Modes, Modes, false); err != nil {
		return nil, err
	}
	if o.Topologies, err = pick("topology", o.Topologies, Topologies, false); err != nil {
		return nil, err
	}
	if o.Launcher == "" {
		o.Launcher = results.LauncherSim
	}
	if !slices.Contains(Launchers, o.Launcher) {
		return nil, fmt.Errorf("%w: unknown launcher %q (valid: %s)", ErrInvalid, o.Launcher, strings.Join(Launchers, ", "))
	}
	if o.Workers == 0 {
		o.Workers = converged.DefaultWorkers
	}
	if o.Workers < 1 || o.Workers > 64 {
		return nil, fmt.Errorf("%w: %d workers: want 1..64", ErrInvalid, o.Workers)
	}
	if o.Launcher == results.LauncherAttach {
		if slices.Contains(o.Topologies, "converged") && len(o.Endpoints) == 0 {
			return nil, fmt.Errorf("%w: the attach launcher needs --endpoints for the converged topology", ErrInvalid)
		}
		if slices.Contains(o.Topologies, "pd") && (len(o.PrefillEndpoints) == 0 || len(o.DecodeEndpoints) == 0) {
			return nil, fmt.Errorf("%w: the attach launcher needs --prefill-endpoints and --decode-endpoints for the pd topology", ErrInvalid)
		}
		if len(o.Endpoints) > 0 {
			o.Workers = len(o.Endpoints)
		}
	} else if len(o.Endpoints)+len(o.PrefillEndpoints)+len(o.DecodeEndpoints) > 0 {
		return nil, fmt.Errorf("%w: endpoints are only for --launcher attach (got %s)", ErrInvalid, o.Launcher)
	}
	if o.SimHashSeed != "" && o.Launcher != results.LauncherSim {
		return nil, fmt.Errorf("%w: a simulator hash seed needs --launcher sim", ErrInvalid)
	}
	var cases []Case
	for _, e := range o.Engines {
		modes, tops, err := engineLanes(e, o.Modes, o.Topologies, modesGiven, explicit)
		if err != nil {
			return nil, err
		}
		for _, p := range o.Profiles {
			for _, t := range tops {
				for _, m := range modes {
					if t == "pd" && m == "chwbl" {
						continue // the P/D runbook's modes are rr and KV-exact scoring
					}
					cases = append(cases, Case{Engine: e, Profile: p, Mode: m, Topology: t})
				}
			}
		}
	}
	return cases, nil
}

// engineLanes are the modes and topologies engine e can be qualified in,
// as its adapter states: KV-exact needs a KV event plane, pd a
// prefill/decode protocol. Defaults (nothing given) are rr and exact for an
// engine with KV events and the full-proxy lanes rr and chwbl for one
// without; a given list is narrowed to what applies. An engine left with
// nothing is an error naming what it supports when it was named
// (explicit), and has no cases otherwise.
func engineLanes(e string, modes, tops []string, modesGiven, explicit bool) ([]string, []string, error) {
	a, err := engines.For(engines.Kind(e))
	if err != nil {
		return nil, nil, fmt.Errorf("%w: %w", ErrInvalid, err)
	}
	kv, hasPD := a.KV() != nil, a.PD() != nil
	capable := []string{"rr", "chwbl"}
	if kv {
		capable = append(capable, "exact")
	}
	var outM []string
	switch {
	case !modesGiven && kv:
		outM = []string{"rr", "exact"}
	case !modesGiven:
		outM = []string{"rr", "chwbl"}
	default:
		for _, m := range modes {
			if slices.Contains(capable, m) {
				outM = append(outM, m)
			}
		}
	}
	var outT []string
	for _, t := range tops {
		if t != "pd" || hasPD {
			outT = append(outT, t)
		}
	}
	if len(outM) == 0 || len(outT) == 0 {
		if !explicit {
			return nil, nil, nil
		}
		var why []string
		if len(outM) == 0 {
			why = append(why, fmt.Sprintf("modes %s (it publishes no KV events; valid: %s)", strings.Join(modes, ","), strings.Join(capable, ", ")))
		}
		if len(outT) == 0 {
			why = append(why, fmt.Sprintf("topologies %s (it has no prefill/decode protocol; valid: converged)", strings.Join(tops, ",")))
		}
		return nil, nil, fmt.Errorf("%w: engine %s has no case for %s", ErrInvalid, e, strings.Join(why, " and "))
	}
	return outM, outT, nil
}

// pick checks every value of got against valid; empty means all (and, when
// allowAll, the single value "all" too). Duplicates are dropped.
func pick(what string, got, valid []string, allowAll bool) ([]string, error) {
	if len(got) == 0 || (allowAll && len(got) == 1 && got[0] == "all") {
		return slices.Clone(valid), nil
	}
	var out []string
	for _, v := range got {
		v = strings.TrimSpace(v)
		if !slices.Contains(valid, v) {
			extra := ""
			if allowAll {
				extra = ", or all"
			}
			return nil, fmt.Errorf("%w: unknown %s %q (valid: %s%s)", ErrInvalid, what, v, strings.Join(valid, ", "), extra)
		}
		if !slices.Contains(out, v) {
			out = append(out, v)
		}
	}
	return out, nil
}

// Report is the outcome of Run.
type Report struct {
	// Rows has one row per planned case, in case order. A case an
	// interruption never reached has a NOT_RUN row (reason code
	// "interrupted", no run ID: nothing was recorded for it), so a partial
	// matrix never reads as complete.
	Rows []results.RunSummary
	// Ran is how many cases started (and have a recorded run).
	Ran int
	// Planned is the number of cases in the matrix.
	Planned int
	// Interrupted reports that the context ended before every case ran.
	Interrupted bool
	// Wall is the time Run took.
	Wall time.Duration
}

// Counts tallies the rows.
func (r Report) Counts() results.Counts { return results.Tally(r.Rows) }

// Run runs every case of the (validated) plan into store, with ownership
// ledgers under outDir. It returns the rows recorded so far together with
// any error; a FAIL or BLOCKED case is a row, not an error.
func Run(ctx context.Context, o *Options, cases []Case, store *results.Store, outDir string) (Report, error) {
	start := time.Now()
	rep := Report{Planned: len(cases)}
	prog := o.Progress
	if prog == nil {
		prog = nopProgress{}
	}
	var errs []error
	next := 0 // the first case not started
	for i, c := range cases {
		if ctx.Err() != nil {
			rep.Interrupted = true
			break
		}
		prog.CaseStarted(i, len(cases), c)
		next = i + 1
		row, interrupted, err := runCase(ctx, o, c, store, outDir, prog)
		if err != nil {
			errs = append(errs, fmt.Errorf("qualify: case %s: %w", c.ID(), err))
		}
		if row.ID != "" {
			rep.Rows = append(rep.Rows, row)
			rep.Ran++
			prog.CaseDone(i, len(cases), c, row)
		}
		if interrupted {
			rep.Interrupted = true
			break
		}
	}
	// Every case without a row did not run: say so, row by row.
	for _, c := range cases[next:] {
		rep.Rows = append(rep.Rows, o.notRunRow(c))
	}
	rep.Wall = time.Since(start)
	return rep, errors.Join(errs...)
}

// notRunRow is the row of case c when it never started.
func (o *Options) notRunRow(c Case) results.RunSummary {
	t := results.Tuple{Engine: c.Engine, Profile: c.Profile, Topology: c.Topology, Mode: c.Mode,
		Launcher: o.Launcher, SimulatedWorkers: o.Launcher == results.LauncherSim}
	if v, err := o.Catalog.Versions().For(c.Engine); err == nil {
		t.EngineVersion = v.Version
	}
	if p, err := o.Catalog.Get(c.Profile); err == nil {
		t.Model = p.Model.ServedName
	}
	return results.RunSummary{Schema: results.RunSchema, CaseID: t.CaseID(), Tuple: t, Verdict: results.StatusNotRun,
		ReasonCode: "interrupted", Reason: "the matrix was interrupted before this case started"}
}

func (o *Options) logger() *slog.Logger {
	if o.Logger != nil {
		return o.Logger
	}
	return slog.New(slog.NewTextHandler(io.Discard, nil))
}

// runCase runs one case's runbook and returns its row.
func runCase(ctx context.Context, o *Options, c Case, store *results.Store, outDir string, prog runbook.Progress) (results.RunSummary, bool, error) {
	hook := func(step string) {
		if o.StepHook != nil {
			o.StepHook(c, step)
		}
	}
	var (
		rb    runbook.Runbook
		tuple results.Tuple
		lname string
	)
	switch c.Topology {
	case "pd":
		po := &pd.Options{Engine: c.Engine, Profile: c.Profile, KVExact: c.Mode == "exact", Catalog: o.Catalog,
			Launcher: o.pdLauncher(), HealthTimeout: o.HealthTimeout, ReadyTimeout: o.ReadyTimeout, StepHook: hook, Logger: o.logger(),
			AcceptVersionMismatch: o.AcceptVersionMismatch}
		if o.Launcher == results.LauncherAttach {
			po.Prefill, po.Decode = len(o.PrefillEndpoints), len(o.DecodeEndpoints)
		}
		if err := po.Validate(); err != nil {
			return results.RunSummary{}, false, err
		}
		rb, tuple, lname = pd.Runbook(po), po.Tuple(), po.Launcher.Name()
	default:
		co := &converged.Options{Engine: c.Engine, Profile: c.Profile, Mode: c.Mode, Workers: o.Workers, Catalog: o.Catalog,
			Launcher: o.convergedLauncher(), HealthTimeout: o.HealthTimeout, ReadyTimeout: o.ReadyTimeout, StepHook: hook, Logger: o.logger(),
			AcceptVersionMismatch: o.AcceptVersionMismatch}
		if err := co.Validate(); err != nil {
			return results.RunSummary{}, false, err
		}
		rb, tuple, lname = convergedRunbook(co, hook), co.Tuple(), co.Launcher.Name()
	}
	w, err := store.NewRun(tuple)
	if err != nil {
		return results.RunSummary{}, false, err
	}
	led, err := runbook.OpenLedger(outDir, w.ID(), lname)
	if err != nil {
		return results.RunSummary{}, false, err
	}
	rn := runbook.Runner{Progress: prog}
	rep, err := rn.Execute(ctx, rb, w, led)
	if ferr := led.Finish(); ferr != nil {
		err = errors.Join(err, ferr)
	}
	return rep.Summary, rep.Interrupted, err
}

// convergedRunbook is the converged runbook with, in exact mode, the
// hash-parity gate inserted before the routing step (so a parity miss is
// recorded before routing evidence runs; the gate is optional, so routing
// and cache reuse still record what they see).
func convergedRunbook(co *converged.Options, hook func(string)) runbook.Runbook {
	rb := converged.Runbook(co)
	has := slices.ContainsFunc(rb.Steps, func(s runbook.Step) bool { return s.Name() == gates.StepHashParity })
	if co.Mode != "exact" || has { // never twice, should the runbook gain the gate itself
		return rb
	}
	chat := false
	if p, err := co.Catalog.Get(co.Profile); err == nil {
		chat = p.APIMode == "chat"
	}
	gate := gates.Step(func(r *runbook.Run) (gates.Target, error) {
		hook(gates.StepHashParity)
		// The rule to check is the one this run applied, as its ownership
		// ledger records it (admin API and name) for cleanup.
		led, _ := r.Vars.(*runbook.Ledger)
		if led == nil {
			return gates.Target{}, fmt.Errorf("qualify: run %s has no ownership ledger", r.ID)
		}
		rules := led.State().Rules
		if len(rules) == 0 {
			return gates.Target{}, fmt.Errorf("qualify: run %s applied no rule", r.ID)
		}
		owned := rules[len(rules)-1]
		return gates.Target{AdminBase: owned.Admin, AdminToken: co.GatewayToken, Rule: owned.Name,
			Chat: chat, Nonce: r.ID, Timeout: co.ReadyTimeout}, nil
	})
	i := slices.IndexFunc(rb.Steps, func(s runbook.Step) bool { return s.Name() == converged.StepRouting })
	if i < 0 {
		i = len(rb.Steps)
	}
	rb.Steps = slices.Insert(rb.Steps, i, gate)
	return rb
}

func (o *Options) convergedLauncher() runbook.Launcher {
	switch o.Launcher {
	case results.LauncherDocker:
		return &launcher.Docker{ImageOverride: o.ImageOverride}
	case results.LauncherAttach:
		return &launcher.Attach{Endpoints: o.Endpoints}
	}
	return &launcher.Sim{HashSeed: o.SimHashSeed}
}

func (o *Options) pdLauncher() pd.Launcher {
	switch o.Launcher {
	case results.LauncherDocker:
		return &pd.Unsupported{Kind: results.LauncherDocker, Code: "launcher_no_pd_roles",
			Detail: "the docker launcher starts converged workers only; P/D roles are not wired into it yet"}
	case results.LauncherAttach:
		return &pd.Attach{Prefill: o.PrefillEndpoints, Decode: o.DecodeEndpoints}
	}
	return &pd.Sim{HashSeed: o.SimHashSeed}
}

// Export writes the rows as Markdown, JSON and JUnit XML into dir, named
// <base>.md, <base>.json and <base>.junit.xml (atomically), and returns the
// paths.
func Export(dir, base string, rows []results.RunSummary) ([]string, error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, fmt.Errorf("qualify: export: %w", err)
	}
	var paths []string
	for _, f := range []struct {
		ext    string
		format results.Format
	}{{".md", results.FormatMarkdown}, {".json", results.FormatJSON}, {".junit.xml", results.FormatJUnit}} {
		var b strings.Builder
		if err := results.Render(&b, f.format, rows); err != nil {
			return paths, fmt.Errorf("qualify: export %s: %w", f.format, err)
		}
		p := filepath.Join(dir, base+f.ext)
		if err := results.WriteFileAtomic(p, []byte(b.String())); err != nil {
			return paths, fmt.Errorf("qualify: export: %w", err)
		}
		paths = append(paths, p)
	}
	return paths, nil
}

type nopProgress struct{}

func (nopProgress) StepStarted(int, int, string)                {}
func (nopProgress) Note(int, int, string, string)               {}
func (nopProgress) StepDone(int, int, results.Step)             {}
func (nopProgress) CaseStarted(int, int, Case)                  {}
func (nopProgress) CaseDone(int, int, Case, results.RunSummary) {}
