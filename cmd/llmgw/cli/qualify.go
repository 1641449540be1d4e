package cli

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"strings"
	"sync"
	"time"

	"github.com/spf13/cobra"

	"github.com/llmgw/llmgw/qualify"
	"github.com/llmgw/llmgw/results"
	"github.com/llmgw/llmgw/runbook"
	"github.com/llmgw/llmgw/runbook/launcher"
)

// QualifyOptions are the inputs of `llmgw qualify`.
type QualifyOptions struct {
	IO                    *IOStreams
	Engine                string
	Profiles              []string
	Modes                 []string
	AcceptVersionMismatch bool
	Topologies            []string
	Launcher              string
	Endpoints             string
	PrefillEndpoints      string
	DecodeEndpoints       string
	ImageOverrides        []string
	Workers               int
	Out                   string
	AllowBlocked          bool
	HealthTimeout         time.Duration
	LogLevel              string
	Output                string
}

// QualifyDoc is `qualify -o json|yaml`: the matrix's rows as the results
// export document (schema llmgw.results/v1) with how the matrix ran.
type QualifyDoc struct {
	Kind        string  `json:"kind"` // "QualifyReport"
	Launcher    string  `json:"launcher"`
	Planned     int     `json:"planned"`
	Ran         int     `json:"ran"`
	Interrupted bool    `json:"interrupted"`
	WallSeconds float64 `json:"wall_seconds"`
	results.Export
}

func newQualifyCmd(io *IOStreams, runF func(*cobra.Command, *QualifyOptions) error) *cobra.Command {
	opts := &QualifyOptions{IO: io}
	cmd := &cobra.Command{
		Use:   "qualify",
		Short: "Run the qualification matrix: engines x profiles x modes x topologies, one runbook per case",
		Long: `Run one runbook per case of the matrix (converged: 'llmgw runbook converged', with
the hash-parity gate in exact mode; pd: 'llmgw runbook pd', kvExactMode 1 in exact
mode) and end with one result table whose columns keep the evidence lanes apart:
direct worker, gateway delivery, routing evidence, hash parity, cache reuse,
performance; every row records its launcher. Known-BLOCKED tuples of the catalog
(TensorRT-LLM x Gemma-2 / EXAONE: architecture_unsupported) are recorded BLOCKED
with their code without launching anything.

-o table (default) prints the result table sized to the terminal (tab-separated
lines when standard output is not one); -o json and -o yaml print the matrix as
one document (kind QualifyReport: the rows in the results export schema).
The table is also exported as Markdown, JSON and JUnit XML under --out
(qualify-<UTC time>.md, .json, .junit.xml); every run is under <out>/runs/.
On simulated workers the table says so: such a result qualifies the gateway's
behaviour, not an engine.

Exit codes: 0 every case PASS, 3 any FAIL, 4 BLOCKED without FAIL (0 with
--allow-blocked), 130 interrupted (the case in flight is cleaned up, rows already
recorded are kept and exported), 2 bad flags (nothing started).`,
		Example: `  # the reference baseline on simulated workers: 35 cases, 31 PASS, 4 BLOCKED
  # (TensorRT-LLM x Gemma-2/EXAONE); without --allow-blocked it exits 4
  llmgw qualify --engine all --modes rr,exact --allow-blocked

  # the matrix as JSON for a script
  llmgw qualify --engine vllm --modes rr -o json | jq .counts

  # P/D on one engine, both modes
  llmgw qualify --engine sglang --profiles qwen3-0.6b --topology pd`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if runF != nil {
				return runF(cmd, opts)
			}
			return qualifyRun(cmd, opts)
		},
	}
	f := cmd.Flags()
	f.StringVar(&opts.Engine, "engine", "all", "engine: vllm, sglang, trtllm, llamacpp or all (llamacpp: converged rr and chwbl, it has no KV events or P/D)")
	f.StringSliceVar(&opts.Profiles, "profiles", nil, "catalog profile IDs, comma separated (default: every profile)")
	f.BoolVar(&opts.AcceptVersionMismatch, "accept-version-mismatch", false, "qualify real workers that report an engine version other than the catalog tuple's (the mismatch stays on the row)")
	f.StringSliceVar(&opts.Modes, "modes", nil, "routing modes: rr, chwbl, exact (default: rr,exact for engines with KV events; rr,chwbl for llamacpp)")
	f.StringSliceVar(&opts.Topologies, "topology", []string{"converged"}, "topologies: converged, pd")
	f.StringVar(&opts.Launcher, "launcher", results.LauncherSim, "how workers are obtained: sim, docker or attach")
	f.StringVar(&opts.Endpoints, "endpoints", "", "attach, converged: running workers as host:port,...")
	f.StringVar(&opts.PrefillEndpoints, "prefill-endpoints", "", "attach, pd: running prefill workers as host:port,...")
	f.StringVar(&opts.DecodeEndpoints, "decode-endpoints", "", "attach, pd: running decode workers as host:port,...")
	f.StringSliceVar(&opts.ImageOverrides, "image-override", nil, "docker: KEY=IMAGE with KEY an engine or sim (repeatable)")
	f.IntVar(&opts.Workers, "workers", 3, "converged workers per case")
	f.StringVar(&opts.Out, "out", defaultResultsDir(), "results directory (LLMGW_OUT; default $XDG_DATA_HOME/llmgw/results or ~/.local/share/llmgw/results)")
	f.BoolVar(&opts.AllowBlocked, "allow-blocked", false, "exit 0 when cases are BLOCKED but none FAILed")
	f.DurationVar(&opts.HealthTimeout, "health-timeout", 0, "how long workers may take to become healthy (default 60s)")
	f.StringVar(&opts.LogLevel, "log-level", "warn", "embedded gateway log level (logs go to standard error)")
	addOutputFlag(cmd, &opts.Output, outputTable)
	completeFlag(cmd, "engine", completeEngines("all"))
	completeFlag(cmd, "profiles", completeList(profileIDs))
	completeFlag(cmd, "modes", completeList(func() []string { return qualify.Modes }))
	completeFlag(cmd, "topology", completeList(func() []string { return qualify.Topologies }))
	completeFlag(cmd, "launcher", fixedCompletion(launcherNames...))
	return cmd
}

// qualifyOptions validates the flags into a plan. Every error is a usage
// error: nothing has been started.
func qualifyOptions(o *QualifyOptions) (*qualify.Options, []qualify.Case, error) {
	if err := checkOutput(o.Output); err != nil {
		return nil, nil, err
	}
	level, err := parseLogLevel(o.LogLevel)
	if err != nil {
		return nil, nil, err
	}
	qo := &qualify.Options{
		Engines: []string{o.Engine}, Profiles: o.Profiles, Modes: o.Modes, Topologies: o.Topologies, Launcher: o.Launcher,
		AcceptVersionMismatch: o.AcceptVersionMismatch,
		Workers:               o.Workers, HealthTimeout: o.HealthTimeout,
		Logger: slog.New(slog.NewTextHandler(o.IO.ErrOut, &slog.HandlerOptions{Level: level})),
	}
	for _, l := range []struct {
		flag, v string
		dst     *[]string
	}{{"--endpoints", o.Endpoints, &qo.Endpoints}, {"--prefill-endpoints", o.PrefillEndpoints, &qo.PrefillEndpoints}, {"--decode-endpoints", o.DecodeEndpoints, &qo.DecodeEndpoints}} {
		if l.v == "" {
			continue
		}
		eps, err := launcher.ParseEndpoints(l.v)
		if err != nil {
			return nil, nil, usageErrorf("%s: %v", l.flag, err)
		}
		*l.dst = eps
	}
	if len(o.ImageOverrides) > 0 {
		if o.Launcher != results.LauncherDocker {
			return nil, nil, usageErrorf("--image-override needs --launcher docker (got --launcher %s)", o.Launcher)
		}
		ov, err := launcher.ParseImageOverrides(o.ImageOverrides)
		if err != nil {
			return nil, nil, usageErrorf("%v", err)
		}
		qo.ImageOverride = ov
	}
	cases, err := qualify.Plan(qo)
	if err != nil {
		if errors.Is(err, qualify.ErrInvalid) {
			return nil, nil, &UsageError{Err: err}
		}
		return nil, nil, err
	}
	return qo, cases, nil
}

func qualifyRun(cmd *cobra.Command, o *QualifyOptions) error {
	qo, cases, err := qualifyOptions(o)
	if err != nil {
		return err
	}
	store, err := results.Open(o.Out)
	if err != nil {
		return err
	}
	qo.Progress = newQualifyProgress(o.IO.ErrOut, o.IO.OutTTY, o.IO.Width)
	ctx := cmd.Context()
	started := time.Now().UTC()
	rep, runErr := qualify.Run(ctx, qo, cases, store, o.Out)

	// The rows recorded so far are shown and exported even after Ctrl-C.
	switch {
	case o.Output != outputTable:
		doc := QualifyDoc{Kind: kindQualifyReport, Launcher: qo.Launcher, Planned: rep.Planned, Ran: rep.Ran,
			Interrupted: rep.Interrupted, WallSeconds: rep.Wall.Seconds(), Export: results.NewExport(rep.Rows)}
		err = errors.Join(runErr, writeDoc(o.IO.Out, o.Output, doc))
	case o.IO.OutTTY:
		fmt.Fprintln(o.IO.Out)
		err = errors.Join(runErr, results.WriteTable(o.IO.Out, o.IO.Width, rep.Rows))
	default:
		// Pure TSV on stdout; the counts and the simulated note go with
		// the messages.
		err = errors.Join(runErr, results.WriteTSV(o.IO.Out, rep.Rows))
		fmt.Fprintln(o.IO.ErrOut, results.Tally(rep.Rows))
		if doc := results.NewExport(rep.Rows); doc.Note != "" {
			fmt.Fprintln(o.IO.ErrOut, "note: "+doc.Note)
		}
	}
	fmt.Fprintf(o.IO.ErrOut, "launcher: %s; %d of %d cases ran in %s\n", qo.Launcher, rep.Ran, rep.Planned, rep.Wall.Round(100*time.Millisecond))
	paths, xerr := qualify.Export(o.Out, "qualify-"+started.Format("20060102T150405Z"), rep.Rows)
	err = errors.Join(err, xerr)
	for _, p := range paths {
		fmt.Fprintf(o.IO.ErrOut, "exported %s\n", p)
	}
	if err != nil && rep.Ran == 0 && !rep.Interrupted {
		return err
	}
	if err != nil {
		fmt.Fprintf(o.IO.ErrOut, "llmgw: %v\n", err)
	}
	return qualifyExit(ctx, rep, o.AllowBlocked)
}

// qualifyExit maps the matrix to its exit code: interrupted 130, any FAIL
// 3, any BLOCKED 4 (0 with allowBlocked), all PASS 0; a matrix in which
// nothing passed or ran (NOT_RUN) is an error.
func qualifyExit(ctx context.Context, rep qualify.Report, allowBlocked bool) error {
	c := rep.Counts()
	switch {
	case rep.Interrupted || ctx.Err() != nil:
		return &ExitCodeError{Code: ExitCancelled, Err: fmt.Errorf("qualify interrupted after %d of %d cases; the case in flight was cleaned up, %d rows kept and %d cases exported as NOT_RUN", rep.Ran, rep.Planned, rep.Ran, len(rep.Rows)-rep.Ran)}
	case c.Overall() == results.StatusFail:
		return &ExitCodeError{Code: ExitFail, Err: fmt.Errorf("qualify: %s", c)}
	case c.Overall() == results.StatusBlocked && allowBlocked:
		return nil
	case c.Overall() == results.StatusBlocked:
		return &ExitCodeError{Code: ExitBlocked, Err: fmt.Errorf("qualify: %s (--allow-blocked accepts BLOCKED cases)", c)}
	case c.Overall() == results.StatusPass:
		return nil
	}
	return &ExitCodeError{Code: ExitError, Err: fmt.Errorf("qualify: %s: no case passed", c)}
}

// qualifyProgress shows one line per case (plain), or per case and its
// live steps (terminal).
type qualifyProgress struct {
	mu    sync.Mutex
	w     io.Writer
	tty   bool
	steps runbook.Progress
}

func newQualifyProgress(w io.Writer, tty bool, width int) *qualifyProgress {
	p := &qualifyProgress{w: w, tty: tty}
	if tty {
		p.steps = runbook.NewProgress(w, true, width)
	}
	return p
}

func (p *qualifyProgress) CaseStarted(i, n int, c qualify.Case) {
	p.mu.Lock()
	defer p.mu.Unlock()
	fmt.Fprintf(p.w, "[%d/%d] %s ...\n", i+1, n, c.ID())
}

func (p *qualifyProgress) CaseDone(i, n int, c qualify.Case, row results.RunSummary) {
	p.mu.Lock()
	defer p.mu.Unlock()
	code := ""
	if row.ReasonCode != "" {
		code = " " + row.ReasonCode
	}
	fmt.Fprintf(p.w, "[%d/%d] %s: %s%s (%s) %s\n", i+1, n, c.ID(), row.Verdict.Norm(), code,
		row.Ended.Sub(row.Started).Round(time.Millisecond), strings.NewReplacer("\n", " ", "\t", " ").Replace(row.Reason))
}

func (p *qualifyProgress) StepStarted(idx, total int, name string) {
	if p.steps != nil {
		p.steps.StepStarted(idx, total, name)
	}
}

func (p *qualifyProgress) Note(idx, total int, name, msg string) {
	if p.steps != nil {
		p.steps.Note(idx, total, name, msg)
	}
}

// StepDone shows every step on a terminal; in plain output only the steps
// that FAILed, so a log names the failing step without 10 lines per case.
func (p *qualifyProgress) StepDone(idx, total int, st results.Step) {
	if p.steps != nil {
		p.steps.StepDone(idx, total, st)
		return
	}
	if st.Status == results.StatusFail {
		p.mu.Lock()
		defer p.mu.Unlock()
		fmt.Fprintf(p.w, "      step %d/%d %s: FAIL %s %s\n", idx+1, total, st.Name, st.ReasonCode, strings.NewReplacer("\n", " ", "\t", " ").Replace(st.Reason))
	}
}
