package cli

import (
	"os"
	"path/filepath"
)

// defaultResultsDir is where runbooks, qualify, results and cleanup keep
// run evidence unless --out says otherwise: $XDG_DATA_HOME/llmgw/results,
// else ~/.local/share/llmgw/results. It is outside any source tree (a
// relative "./results" inside this repository landed in the Go package
// results/) and the same whatever directory a command runs from, so
// `results list` finds what `runbook` wrote.
func defaultResultsDir() string {
	if d := os.Getenv("XDG_DATA_HOME"); d != "" && filepath.IsAbs(d) {
		return filepath.Join(d, "llmgw", "results")
	}
	if d, err := os.UserHomeDir(); err == nil {
		return filepath.Join(d, ".local", "share", "llmgw", "results")
	}
	return ".llmgw-results"
}
