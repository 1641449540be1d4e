package cli

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strings"

	"github.com/spf13/cobra"

	"github.com/llmgw/llmgw/results"
	"github.com/llmgw/llmgw/results/htmlreport"
)

// ResultsOptions are the inputs of `llmgw results`.
type ResultsOptions struct {
	IO  *IOStreams
	Out string // the results directory (the runbooks' --out)
	// Output is -o: table, json or yaml; for export also md, junit, tsv.
	Output string
	Runs   []string // export: only these run IDs (all when empty)
	File   string   // export: write here instead of stdout
}

// exportFormats are the -o values of results export beyond the common three.
var exportFormats = []string{string(results.FormatMarkdown), string(results.FormatJUnit), string(results.FormatTSV)}

// VerifyDoc is `results verify -o json|yaml`: the run's hash check.
type VerifyDoc struct {
	Kind string `json:"kind"` // "ResultsVerify"
	OK   bool   `json:"ok"`
	results.VerifyReport
	Problems []string `json:"problems"`
}

func newResultsCmd(io *IOStreams) *cobra.Command {
	opts := &ResultsOptions{IO: io}
	cmd := &cobra.Command{
		Use:   "results",
		Short: "List, show, verify and export recorded runbook results",
		Long: `Runbooks record every run under <out>/runs/<run-id>/: run.json (tuple, steps,
evidence lanes), evidence files, and SHA256SUMS over all of them; finished
runs are appended to <out>/history.jsonl and never rewritten.

  llmgw results list                      one row per run; evidence lanes in separate columns
  llmgw results show RUN                  the run's steps, reasons, timing and evidence
  llmgw results verify RUN                recompute every hash; exit 3 naming any tampered file
  llmgw results export -o md|json|yaml|junit|tsv [--run ID ...] [--file PATH]
  llmgw results report --html DIR RUN...|--all [--bench PATH ...]
                                          a static HTML site: matrix, run pages, trends

The results directory is --out (LLMGW_OUT), by default
$XDG_DATA_HOME/llmgw/results, else ~/.local/share/llmgw/results: outside any
source tree, and the same whatever directory a command runs in.

-o table (the default of list, show, verify) is a table sized to the terminal
on a terminal and tab-separated lines otherwise; -o json is the document
(schema "llmgw.results/v1"), -o yaml the same as YAML. --json and --format
are deprecated aliases of -o.

Rows from simulated workers qualify the gateway's behaviour, not the engine.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error { return cmd.Help() },
	}
	cmd.PersistentFlags().StringVar(&opts.Out, "out", defaultResultsDir(), "results directory, the runbooks' --out (LLMGW_OUT; default $XDG_DATA_HOME/llmgw/results or ~/.local/share/llmgw/results)")

	// Each subcommand has its own -o (their defaults differ).
	var listOut, showOut, verifyOut, exportOut string
	list := &cobra.Command{
		Use:   "list",
		Short: "List recorded runs (a table on a terminal, TSV otherwise)",
		Args:  cobra.NoArgs,
		RunE:  func(*cobra.Command, []string) error { return resultsList(opts.with(listOut)) },
	}
	addOutputFlag(list, &listOut, outputTable)
	deprecatedJSONFlag(list, io, &listOut)

	show := &cobra.Command{
		Use:               "show RUN",
		Short:             "Show one run's steps, lanes and evidence",
		Args:              exactRunArg("show"),
		ValidArgsFunction: completeRunIDs(&opts.Out),
		RunE:              func(_ *cobra.Command, args []string) error { return resultsShow(opts.with(showOut), args[0]) },
	}
	addOutputFlag(show, &showOut, outputTable)
	deprecatedJSONFlag(show, io, &showOut)

	verify := &cobra.Command{
		Use:               "verify RUN",
		Short:             "Recompute a run's hashes; exit 3 if any file was changed, removed or added",
		Args:              exactRunArg("verify"),
		ValidArgsFunction: completeRunIDs(&opts.Out),
		RunE:              func(_ *cobra.Command, args []string) error { return resultsVerify(opts.with(verifyOut), args[0]) },
	}
	addOutputFlag(verify, &verifyOut, outputTable)

	export := &cobra.Command{
		Use:   "export",
		Short: "Export runs as Markdown, JSON, YAML, JUnit XML or TSV",
		Args:  cobra.NoArgs,
		RunE:  func(*cobra.Command, []string) error { return resultsExport(opts.with(exportOut)) },
	}
	addOutputFlag(export, &exportOut, string(results.FormatMarkdown), exportFormats...)
	deprecatedFormatFlag(export, io, &exportOut, map[string]string{"markdown": string(results.FormatMarkdown)})
	export.Flags().StringSliceVar(&opts.Runs, "run", nil, "export only these run IDs (repeatable; default all)")
	_ = export.RegisterFlagCompletionFunc("run", completeRunIDs(&opts.Out))
	export.Flags().StringVar(&opts.File, "file", "", "write to this file instead of standard output")

	var rep reportFlags
	report := &cobra.Command{
		Use:   "report --html DIR RUN...|--all",
		Short: "Write the runs as a self-contained static HTML site (matrix, run pages, trends, benchmarks)",
		Long: `Write a static site into DIR, readable in any browser from the file system
(nothing is fetched: CSS is inline, links are relative):

  index.html        the qualification matrix, one row per engine x profile x
                    mode x topology and kind of workers (simulated, attached,
                    launched): the latest run's verdict and evidence lanes,
                    colour-coded; a script adds filters (without it every
                    row shows)
  runs/RUN.html     each run: its version tuple (the catalog's engine version
                    and the one the workers reported), lanes and their
                    sources, the steps in order (status, code, duration,
                    reason) and every evidence file, rendered (JSON indented,
                    *-exchange.json as request and response) and linked raw
                    under runs/RUN/
  trends.html       every run of each matrix row, oldest first
  bench.html        with --bench: the bench routing chart and tables, and
                    the added latency of each bench overhead report

Name the runs, or give --all for every finished run. DIR must not exist, be
empty, or hold an earlier report (which is replaced). Evidence is shown
escaped; a raw copy a browser would open as a document (.html, .svg, ...)
gets ".txt" appended.`,
		Example: `  llmgw results report --html /tmp/report --all
  llmgw results report --html /tmp/report --all --bench /tmp/llmgw-bench
  llmgw results report --html /tmp/report 20261208T021500Z-vllm-qwen3-0.6b-exact-1a2b3c`,
		ValidArgsFunction: completeRunIDs(&opts.Out),
		RunE:              func(_ *cobra.Command, args []string) error { return resultsReport(opts, rep, args) },
	}
	report.Flags().StringVar(&rep.HTML, "html", "", "directory to write the site into (required)")
	report.Flags().BoolVar(&rep.All, "all", false, "every finished run (instead of naming runs)")
	report.Flags().StringSliceVar(&rep.Bench, "bench", nil, "bench results to include: a directory holding routing.json (bench routing --out) or overhead*.json (bench overhead --json), or one such file (repeatable)")

	cmd.AddCommand(list, show, verify, export, report)
	return cmd
}

// with is a copy of o printing in output.
func (o *ResultsOptions) with(output string) *ResultsOptions {
	c := *o
	c.Output = output
	return &c
}

func exactRunArg(verb string) cobra.PositionalArgs {
	return func(_ *cobra.Command, args []string) error {
		if len(args) != 1 {
			return usageErrorf("results %s needs one run ID (see 'llmgw results list')", verb)
		}
		return nil
	}
}

// openResults opens the store without creating it: reading commands must
// not leave an empty results tree behind. ok is false when the directory
// does not exist.
func openResults(dir string) (s *results.Store, ok bool, err error) {
	if _, err := os.Stat(filepath.Join(dir, "runs")); errors.Is(err, fs.ErrNotExist) {
		return nil, false, nil
	}
	s, err = results.Open(dir)
	return s, err == nil, err
}

// rows returns every finished run, or none when the store does not exist.
func (o *ResultsOptions) rows() ([]results.RunSummary, error) {
	s, ok, err := openResults(o.Out)
	if err != nil || !ok {
		return nil, err
	}
	return s.List()
}

// runNotFound turns a store lookup error into a usage error for unknown or
// malformed run IDs.
func (o *ResultsOptions) runNotFound(id string, err error) error {
	if errors.Is(err, results.ErrRunNotFound) || errors.Is(err, results.ErrBadRunID) {
		return usageErrorf("unknown run %q in %s (see 'llmgw results list --out %s')", id, o.Out, o.Out)
	}
	return err
}

func resultsList(opts *ResultsOptions) error {
	if err := checkOutput(opts.Output); err != nil {
		return err
	}
	rows, err := opts.rows()
	if err != nil {
		return err
	}
	if opts.Output != outputTable {
		return writeDoc(opts.IO.Out, opts.Output, results.NewExport(rows))
	}
	if opts.IO.OutTTY {
		return results.WriteTable(opts.IO.Out, opts.IO.Width, rows)
	}
	if err := results.WriteTSV(opts.IO.Out, rows); err != nil {
		return err
	}
	for _, r := range rows {
		if r.Tuple.SimulatedWorkers {
			// Data stays pure TSV; the warning goes with the messages.
			fmt.Fprintln(opts.IO.ErrOut, "note: "+results.SimulatedNote)
			break
		}
	}
	return nil
}

func resultsShow(opts *ResultsOptions, id string) error {
	if err := checkOutput(opts.Output); err != nil {
		return err
	}
	s, ok, err := openResults(opts.Out)
	if err != nil {
		return err
	}
	if !ok {
		return opts.runNotFound(id, results.ErrRunNotFound)
	}
	run, err := s.Get(id)
	if err != nil {
		return opts.runNotFound(id, err)
	}
	if opts.Output != outputTable {
		return writeDoc(opts.IO.Out, opts.Output, run)
	}
	return results.WriteRunDetail(opts.IO.Out, run, opts.IO.OutTTY, opts.IO.Width)
}

func resultsVerify(opts *ResultsOptions, id string) error {
	if err := checkOutput(opts.Output); err != nil {
		return err
	}
	s, ok, err := openResults(opts.Out)
	if err != nil {
		return err
	}
	if !ok {
		return opts.runNotFound(id, results.ErrRunNotFound)
	}
	rep, err := s.Verify(id)
	if err != nil {
		return opts.runNotFound(id, err)
	}
	problems := rep.Problems()
	switch {
	case opts.Output != outputTable:
		doc := VerifyDoc{Kind: kindResultsVerify, OK: rep.OK(), VerifyReport: rep, Problems: problems}
		if doc.Problems == nil {
			doc.Problems = []string{}
		}
		if err := writeDoc(opts.IO.Out, opts.Output, doc); err != nil || rep.OK() {
			return err
		}
	case rep.OK():
		_, err := fmt.Fprintf(opts.IO.Out, "run %s: OK, %d files match SHA256SUMS, artifact %s\n", id, rep.Checked, rep.ActualArtifactID)
		return err
	default:
		for _, p := range problems {
			fmt.Fprintf(opts.IO.Out, "run %s: %s\n", id, p)
		}
	}
	return &ExitCodeError{Code: ExitFail, Err: fmt.Errorf("results verify: run %s failed verification: %s", id, strings.Join(problems, "; "))}
}

func resultsExport(opts *ResultsOptions) error {
	if err := checkOutput(opts.Output, append(append([]string(nil), outputFormats...), exportFormats...)...); err != nil {
		return err
	}
	rows, err := opts.rows()
	if err != nil {
		return err
	}
	if len(opts.Runs) > 0 {
		byID := map[string]results.RunSummary{}
		for _, r := range rows {
			byID[r.ID] = r
		}
		picked := make([]results.RunSummary, 0, len(opts.Runs))
		for _, id := range opts.Runs {
			r, ok := byID[id]
			if !ok {
				return opts.runNotFound(id, results.ErrRunNotFound)
			}
			picked = append(picked, r)
		}
		rows = picked
	}
	render := func(w io.Writer) error {
		if opts.Output == outputYAML {
			return writeDoc(w, outputYAML, results.NewExport(rows))
		}
		return results.Render(w, results.Format(opts.Output), rows)
	}
	if opts.File == "" {
		return render(opts.IO.Out)
	}
	var buf bytes.Buffer
	if err := render(&buf); err != nil {
		return err
	}
	if err := results.WriteFileAtomic(opts.File, buf.Bytes()); err != nil {
		return fmt.Errorf("results export: %w", err)
	}
	return nil
}

// reportFlags are the flags of results report.
type reportFlags struct {
	HTML  string
	All   bool
	Bench []string
}

func resultsReport(opts *ResultsOptions, f reportFlags, ids []string) error {
	switch {
	case f.HTML == "":
		return usageErrorf("results report needs --html DIR")
	case f.All && len(ids) > 0:
		return usageErrorf("results report: name runs or give --all, not both")
	case !f.All && len(ids) == 0:
		return usageErrorf("results report: name the runs to report, or give --all (see 'llmgw results list')")
	}
	bench, err := htmlreport.LoadBench(f.Bench)
	if err != nil {
		return usageErrorf("%v", err)
	}
	s, ok, err := openResults(opts.Out)
	if err != nil {
		return err
	}
	if !ok && len(ids) > 0 {
		return opts.runNotFound(ids[0], results.ErrRunNotFound)
	}
	if f.All && ok {
		rows, err := s.List()
		if err != nil {
			return err
		}
		seen := map[string]bool{}
		for _, r := range rows {
			if !seen[r.ID] {
				seen[r.ID] = true
				ids = append(ids, r.ID)
			}
		}
	}
	site := htmlreport.Site{Bench: bench}
	if s != nil {
		site.RunDir = s.RunDir
	}
	for _, id := range ids {
		run, err := s.Get(id)
		if err != nil {
			return opts.runNotFound(id, err)
		}
		site.Runs = append(site.Runs, run)
	}
	if err := htmlreport.Write(f.HTML, site); err != nil {
		if errors.Is(err, htmlreport.ErrNotReportDir) {
			return usageErrorf("--html: %v", err)
		}
		return err
	}
	fmt.Fprintf(opts.IO.ErrOut, "wrote %d runs to %s\n", len(site.Runs), filepath.Join(f.HTML, "index.html"))
	return nil
}
