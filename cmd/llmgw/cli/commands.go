package cli

import (
	"fmt"
	"runtime/debug"

	"github.com/spf13/cobra"
)

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

// Version is the release name; a release build sets it with
// -ldflags "-X github.com/llmgw/llmgw/cmd/llmgw/cli.Version=v1.2.3".
// Otherwise the module's build info supplies it (see versionString).
var Version = ""

// versionString is what `llmgw version` and `llmgw --version` print: the
// version, the VCS commit and its time as the Go toolchain stamped them
// into the binary, and "modified" for a dirty work tree. `go run` does not
// stamp VCS data; `make build` (go build) does.
func versionString() string {
	version, commit, date, modified := Version, "unknown", "unknown", false
	if bi, ok := debug.ReadBuildInfo(); ok {
		if version == "" && bi.Main.Version != "" && bi.Main.Version != "(devel)" {
			version = bi.Main.Version
		}
		for _, s := range bi.Settings {
			switch s.Key {
			case "vcs.revision":
				commit = s.Value
			case "vcs.time":
				date = s.Value
			case "vcs.modified":
				modified = s.Value == "true"
			}
		}
	}
	if version == "" {
		version = "dev"
	}
	out := fmt.Sprintf("%s (commit %s, %s", version, commit, date)
	if modified {
		out += ", modified"
	}
	return out + ")"
}

func newVersionCmd(io *IOStreams) *cobra.Command {
	return &cobra.Command{
		Use:   "version",
		Short: "Print the llmgw version, commit and build date",
		Args:  cobra.NoArgs,
		RunE: func(*cobra.Command, []string) error {
			_, err := fmt.Fprintf(io.Out, "llmgw %s\n", versionString())
			return err
		},
	}
}
