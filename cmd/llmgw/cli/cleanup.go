package cli

import (
	"fmt"
	"strings"

	"github.com/spf13/cobra"

	"github.com/llmgw/llmgw/runbook"
	"github.com/llmgw/llmgw/runbook/launcher"
)

// CleanupOptions are the inputs of `llmgw cleanup`.
type CleanupOptions struct {
	IO             *IOStreams
	Run            string
	All            bool
	Out            string
	DockerEndpoint string
}

func newCleanupCmd(io *IOStreams, runF func(*cobra.Command, *CleanupOptions) error) *cobra.Command {
	opts := &CleanupOptions{IO: io}
	cmd := &cobra.Command{
		Use:   "cleanup",
		Short: "Remove what runbook runs own: rules, containers, networks, processes, temp dirs",
		Long: `Remove the resources runbook runs left behind, as recorded in their ownership
ledgers (<out>/owned/<run-id>.json): applied rules are deleted with a drain
first, then containers (found by id and by the label llmgw.run=<run-id>),
networks, child processes and temporary directories. A run cleans up after
itself; this is for runs that were killed or whose cleanup failed.

With --all, every ledger is processed, and containers and networks labelled
llmgw.owner=llmgw are removed too. Nothing without a ledger entry or an
llmgw label is ever touched. Running it twice is safe: the second run finds
nothing.`,
		Example: `  llmgw cleanup --run 20261130T004608Z-vllm-qwen3-0.6b-exact-df6dd0
  llmgw cleanup --all --out /tmp/lab-results`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if runF != nil {
				return runF(cmd, opts)
			}
			return cleanupRun(cmd, opts)
		},
	}
	f := cmd.Flags()
	f.StringVar(&opts.Run, "run", "", "clean up this run (see 'llmgw results list')")
	f.BoolVar(&opts.All, "all", false, "clean up every run and every llmgw-labelled container and network")
	f.StringVar(&opts.Out, "out", defaultResultsDir(), "results directory holding the ownership ledgers (LLMGW_OUT; default $XDG_DATA_HOME/llmgw/results or ~/.local/share/llmgw/results)")
	f.StringVar(&opts.DockerEndpoint, "docker-host", "", "docker daemon address (default: DOCKER_HOST or the local socket)")
	return cmd
}

func cleanupRun(cmd *cobra.Command, o *CleanupOptions) error {
	switch {
	case o.Run == "" && !o.All:
		return usageErrorf("cleanup needs --run ID or --all")
	case o.Run != "" && o.All:
		return usageErrorf("--run and --all are mutually exclusive")
	case o.Run != "" && !runbook.ValidRunID(o.Run):
		return usageErrorf("--run %q is not a run ID (see 'llmgw results list')", o.Run)
	}
	rep, err := launcher.Cleanup(cmd.Context(), launcher.CleanupOptions{
		Out: o.Out, RunID: o.Run, All: o.All, DockerEndpoint: o.DockerEndpoint,
		Logf: func(format string, a ...any) { fmt.Fprintf(o.IO.ErrOut, format+"\n", a...) },
	})
	if rep.Nothing() {
		fmt.Fprintln(o.IO.Out, "nothing to clean up")
	} else {
		fmt.Fprintf(o.IO.Out, "removed: %d rules, %d containers, %d networks, %d processes, %d directories\n",
			len(rep.Rules), len(rep.Containers), len(rep.Networks), len(rep.Processes), len(rep.Dirs))
	}
	if len(rep.Kept) > 0 {
		fmt.Fprintf(o.IO.ErrOut, "still owned (retry later): %s\n", strings.Join(rep.Kept, ", "))
	}
	if err != nil {
		return fmt.Errorf("cleanup: %w", err)
	}
	return nil
}
