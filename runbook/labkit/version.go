package labkit

import (
	"context"
	"fmt"
	"net/http"
	"slices"
	"strings"

	"github.com/llmgw/llmgw/engines"
	"github.com/llmgw/llmgw/runbook"
)

// WorkerVersion is what one worker says about its own engine version.
type WorkerVersion struct {
	Worker  string `json:"worker"`
	Path    string `json:"path,omitempty"`
	Version string `json:"version,omitempty"`
	Error   string `json:"error,omitempty"`
}

// VersionCheck is the workers' reported versions beside the catalog's.
type VersionCheck struct {
	Catalog string          `json:"catalog_version"`
	Workers []WorkerVersion `json:"workers"`
	// Reported are the distinct versions the workers reported, sorted.
	Reported []string `json:"reported"`
	// Mismatch: some worker reported a version other than the catalog's.
	Mismatch bool `json:"mismatch"`
	// Simulated: the workers are simulators (their version is a persona's).
	Simulated bool `json:"simulated,omitempty"`
}

// Joined is the reported versions joined by "," ("" when none reported).
func (v VersionCheck) Joined() string { return strings.Join(v.Reported, ",") }

// CheckVersions asks every worker for its engine version through the
// adapter's version endpoint and compares it with the catalog's. A worker
// whose engine has no version endpoint, or that does not answer it, is
// recorded with the error and is not a mismatch (nothing was reported).
func CheckVersions(ctx context.Context, c *http.Client, ws []runbook.Worker, a engines.Adapter, catalog string) VersionCheck {
	out := VersionCheck{Catalog: catalog}
	path := a.Surfaces().Version
	for _, w := range ws {
		wv := WorkerVersion{Worker: w.ID, Path: path}
		if path == "" {
			wv.Error = fmt.Sprintf("%s has no version endpoint", a.Display())
			out.Workers = append(out.Workers, wv)
			continue
		}
		ex, err := Do(ctx, c, http.MethodGet, "http://"+w.HTTP+path, nil, nil)
		switch {
		case err != nil:
			wv.Error = err.Error()
		case ex.Status != http.StatusOK:
			wv.Error = fmt.Sprintf("GET %s answered %d", path, ex.Status)
		default:
			v, perr := a.ParseVersion([]byte(ex.Body))
			if perr != nil {
				wv.Error = perr.Error()
			} else {
				wv.Version = v
				if !slices.Contains(out.Reported, v) {
					out.Reported = append(out.Reported, v)
				}
				if v != catalog {
					out.Mismatch = true
				}
			}
		}
		out.Workers = append(out.Workers, wv)
	}
	slices.Sort(out.Reported)
	return out
}

// RecordVersions checks the workers' versions, records them on the run
// and decides: a mismatch on real engines fails the step unless accepted
// (simulated workers report their persona's version, which qualifies
// nothing about an engine, so it is recorded but never refused). ok is
// false when the step must end with the returned outcome.
func RecordVersions(ctx context.Context, r *runbook.Run, c *http.Client, ws []runbook.Worker, a engines.Adapter, catalog string, simulated, accept bool) (VersionCheck, runbook.Outcome, bool) {
	vc := CheckVersions(ctx, c, ws, a, catalog)
	if simulated {
		// A simulator reports its persona's version: recorded, but it says
		// nothing about an engine build, so it is never a row's mismatch.
		vc.Simulated = true
	}
	if r.Writer != nil {
		if err := r.Writer.SetWorkerVersion(vc.Joined(), vc.Mismatch && !simulated); err != nil {
			return vc, runbook.Fail("RESULTS_WRITE_FAILED", "record worker version: %v", err), false
		}
	}
	if vc.Mismatch && !simulated && !accept {
		return vc, runbook.Fail("ENGINE_VERSION_MISMATCH", "workers report %s %s but the catalog tuple is %s (pass --accept-version-mismatch to qualify it anyway)",
			a.Display(), vc.Joined(), catalog).With("versions.json", MustJSON(vc)), false
	}
	return vc, runbook.Outcome{}, true
}

// Note says what the workers reported beside the catalog, for a step reason.
func (v VersionCheck) Note() string {
	switch {
	case len(v.Reported) == 0:
		return fmt.Sprintf("workers report no version (catalog %s)", v.Catalog)
	case v.Simulated:
		return fmt.Sprintf("simulated workers report their persona's version %s (catalog %s)", v.Joined(), v.Catalog)
	case v.Mismatch:
		return fmt.Sprintf("workers report version %s, catalog %s: MISMATCH accepted", v.Joined(), v.Catalog)
	}
	return fmt.Sprintf("workers report version %s, as the catalog", v.Joined())
}
