package cli

import "github.com/spf13/cobra"

// subcommands lists every top-level command. Add new commands here, once.
func subcommands(io *IOStreams) []*cobra.Command {
	return []*cobra.Command{
		newServeCmd(io, nil),
		newRuleCmd(io),
		newSimCmd(io),
		newProfilesCmd(io),
		newResultsCmd(io),
		newBenchCmd(io),
		withRunbookPD(newRunbookCmd(io, nil), io),
		newQualifyCmd(io, nil),
		newCleanupCmd(io, nil),
		newPlanCmd(io),
		newVersionCmd(io),
	}
}

// Version is set at build time with -ldflags "-X .../cli.Version=...".
var Version = "dev"

func newVersionCmd(io *IOStreams) *cobra.Command {
	return &cobra.Command{
		Use:   "version",
		Short: "Print the llmgw version",
		Args:  cobra.NoArgs,
		RunE: func(*cobra.Command, []string) error {
			_, err := io.Out.Write([]byte("llmgw " + Version + "\n"))
			return err
		},
	}
}
