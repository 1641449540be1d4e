package cli

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"strings"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/llmgw/llmgw/gateway/adminclient"
	"github.com/llmgw/llmgw/results"
	"github.com/llmgw/llmgw/runbook"
)

// What the lab runbook commands (`llmgw runbook converged` and `llmgw
// runbook pd`) share: the gateway, results and log flags, their checks,
// and how a finished run is printed and turned into an exit code.

// addLabFlags registers --gateway, --gateway-token-file and --out on f,
// bound to the given fields. --log-level is registered by addLabLogFlag.
func addLabFlags(f *pflag.FlagSet, gateway, tokenFile, out *string) {
	f.StringVar(gateway, "gateway", "", "admin API URL of a running gateway (default: an embedded gateway on loopback)")
	f.StringVar(tokenFile, "gateway-token-file", "", "file holding the external gateway's admin bearer token")
	f.StringVar(out, "out", defaultResultsDir(), "results directory (LLMGW_OUT; default $XDG_DATA_HOME/llmgw/results or ~/.local/share/llmgw/results)")
}

// addLabLogFlag registers --log-level on f, bound to level.
func addLabLogFlag(f *pflag.FlagSet, level *string) {
	f.StringVar(level, "log-level", "warn", "embedded gateway log level (logs go to standard error)")
}

// labLogger is the embedded gateway's logger at level, on standard error;
// a bad level is a usage error.
func labLogger(io *IOStreams, level string) (*slog.Logger, error) {
	l, err := parseLogLevel(level)
	if err != nil {
		return nil, err
	}
	return slog.New(slog.NewTextHandler(io.ErrOut, &slog.HandlerOptions{Level: l})), nil
}

// labGatewayToken checks --gateway and --gateway-token-file and returns
// the token ("" without a file). Every error is a usage error.
func labGatewayToken(gateway, tokenFile string) (string, error) {
	var token string
	if tokenFile != "" {
		if gateway == "" {
			return "", usageErrorf("--gateway-token-file needs --gateway")
		}
		b, err := os.ReadFile(tokenFile)
		if err != nil {
			return "", usageErrorf("--gateway-token-file: %v", err)
		}
		token = strings.TrimSpace(string(b))
	}
	if gateway != "" {
		if _, err := adminclient.New(gateway, "", nil); err != nil {
			return "", usageErrorf("--gateway: %v", err)
		}
	}
	return token, nil
}

// labValidated maps a runbook's Validate error: one wrapping invalid (bad
// options, nothing started) is a usage error, others pass through.
func labValidated(err, invalid error) error {
	if err != nil && errors.Is(err, invalid) {
		return &UsageError{Err: err}
	}
	return err
}

// runLab opens the results store at out, runs exec with progress on
// standard error, prints the run's detail and summary row, and maps the
// run to its exit code (runbookExit). An error before the run has an ID
// is returned as is.
// RunbookDoc is `runbook converged|pd -o json|yaml`: the finished run
// (run.json with its artifact id, as 'results show -o json' prints it) and
// its summary row (as in 'results list -o json'). Run is absent when the
// run record could not be read back.
type RunbookDoc struct {
	Kind    string             `json:"kind"` // "RunbookRun"
	Runbook string             `json:"runbook"`
	Run     *results.Run       `json:"run,omitempty"`
	Summary results.RunSummary `json:"summary"`
}

// addLabOutputFlag registers the runbooks' -o.
func addLabOutputFlag(cmd *cobra.Command, output *string) {
	addOutputFlag(cmd, output, outputTable)
}

// runLab opens the results store at out, runs exec with progress on
// standard error, prints the run (output: its detail and summary row as
// tables, or one RunbookDoc), and maps the run to its exit code
// (runbookExit). An error before the run has an ID is returned as is.
func runLab(cmd *cobra.Command, io *IOStreams, out, output string, exec func(context.Context, *results.Store, runbook.Progress) (runbook.Report, error)) error {
	if err := checkOutput(output); err != nil {
		return err
	}
	store, err := results.Open(out)
	if err != nil {
		return err
	}
	rep, err := exec(cmd.Context(), store, runbook.NewProgress(io.ErrOut, io.OutTTY, io.Width))
	if err != nil && rep.Summary.ID == "" {
		return err
	}
	run, gerr := store.Get(rep.Summary.ID)
	rows := []results.RunSummary{rep.Summary}
	switch {
	case output != outputTable:
		doc := RunbookDoc{Kind: kindRunbookRun, Runbook: cmd.Name(), Summary: rep.Summary}
		if gerr == nil {
			doc.Run = run
		}
		err = errors.Join(err, writeDoc(io.Out, output, doc))
	case io.OutTTY:
		if gerr == nil {
			fmt.Fprintln(io.Out)
			err = errors.Join(err, results.WriteRunDetail(io.Out, run, true, io.Width))
		}
		fmt.Fprintln(io.Out)
		err = errors.Join(err, results.WriteTable(io.Out, io.Width, rows))
	default:
		if gerr == nil {
			fmt.Fprintln(io.Out)
			err = errors.Join(err, results.WriteRunDetail(io.Out, run, false, 0))
		}
		fmt.Fprintln(io.Out)
		err = errors.Join(err, results.WriteTSV(io.Out, rows))
	}
	fmt.Fprintf(io.ErrOut, "results: %s (llmgw results show %s --out %s)\n", store.RunDir(rep.Summary.ID), rep.Summary.ID, out)
	if err != nil {
		return err
	}
	return runbookExit(rep)
}
