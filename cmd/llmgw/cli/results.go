package cli

import (
	"bytes"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"

	"github.com/spf13/cobra"

	"github.com/llmgw/llmgw/results"
)

// ResultsOptions are the inputs of `llmgw results`.
type ResultsOptions struct {
	IO     *IOStreams
	Out    string   // the results directory (the runbooks' --out)
	JSON   bool     // list, show: print JSON
	Format string   // export: md, json, junit, tsv or table
	Runs   []string // export: only these run IDs (all when empty)
	File   string   // export: write here instead of stdout
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
  llmgw results export --format md|json|junit [--run ID ...] [--file PATH]

Rows from simulated workers qualify the gateway's behaviour, not the engine.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error { return cmd.Help() },
	}
	cmd.PersistentFlags().StringVar(&opts.Out, "out", defaultResultsDir(), "results directory, the runbooks' --out (LLMGW_OUT; default $XDG_DATA_HOME/llmgw/results or ~/.local/share/llmgw/results)")

	list := &cobra.Command{
		Use:   "list",
		Short: "List recorded runs (a table on a terminal, TSV otherwise)",
		Args:  cobra.NoArgs,
		RunE:  func(*cobra.Command, []string) error { return resultsList(opts) },
	}
	list.Flags().BoolVar(&opts.JSON, "json", false, "print the JSON export document")

	show := &cobra.Command{
		Use:   "show RUN",
		Short: "Show one run's steps, lanes and evidence",
		Args:  exactRunArg("show"),
		RunE:  func(_ *cobra.Command, args []string) error { return resultsShow(opts, args[0]) },
	}
	show.Flags().BoolVar(&opts.JSON, "json", false, "print run.json (with the artifact id)")

	verify := &cobra.Command{
		Use:   "verify RUN",
		Short: "Recompute a run's hashes; exit 3 if any file was changed, removed or added",
		Args:  exactRunArg("verify"),
		RunE:  func(_ *cobra.Command, args []string) error { return resultsVerify(opts, args[0]) },
	}

	export := &cobra.Command{
		Use:   "export",
		Short: "Export runs as Markdown, JSON or JUnit XML",
		Args:  cobra.NoArgs,
		RunE:  func(*cobra.Command, []string) error { return resultsExport(opts) },
	}
	export.Flags().StringVar(&opts.Format, "format", "md", "md, json, junit, tsv or table")
	export.Flags().StringSliceVar(&opts.Runs, "run", nil, "export only these run IDs (repeatable; default all)")
	export.Flags().StringVar(&opts.File, "file", "", "write to this file instead of standard output")

	cmd.AddCommand(list, show, verify, export)
	return cmd
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
	rows, err := opts.rows()
	if err != nil {
		return err
	}
	if opts.JSON {
		return results.WriteJSON(opts.IO.Out, rows)
	}
	if opts.IO.OutTTY {
		return results.WriteTable(opts.IO.Out, rows)
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
	if opts.JSON {
		return writeIndentedJSON(opts.IO.Out, run)
	}
	return results.WriteRunDetail(opts.IO.Out, run, opts.IO.OutTTY)
}

func resultsVerify(opts *ResultsOptions, id string) error {
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
	if rep.OK() {
		_, err := fmt.Fprintf(opts.IO.Out, "run %s: OK, %d files match SHA256SUMS, artifact %s\n", id, rep.Checked, rep.ActualArtifactID)
		return err
	}
	problems := rep.Problems()
	for _, p := range problems {
		fmt.Fprintf(opts.IO.Out, "run %s: %s\n", id, p)
	}
	return &ExitCodeError{Code: ExitFail, Err: fmt.Errorf("results verify: run %s failed verification: %s", id, strings.Join(problems, "; "))}
}

func resultsExport(opts *ResultsOptions) error {
	f, err := results.ParseFormat(opts.Format)
	if err != nil {
		return usageErrorf("--format: %v", err)
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
	if opts.File == "" {
		return results.Render(opts.IO.Out, f, rows)
	}
	var buf bytes.Buffer
	if err := results.Render(&buf, f, rows); err != nil {
		return err
	}
	if err := results.WriteFileAtomic(opts.File, buf.Bytes()); err != nil {
		return fmt.Errorf("results export: %w", err)
	}
	return nil
}
