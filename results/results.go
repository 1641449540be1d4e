// Package results is llmgw's run store and result renderers.
//
// A run is a directory <out>/runs/<run-id>/ holding run.json (the tuple, the
// steps with status, reason and timing, the evidence lanes and artifact
// hashes), evidence/... files, and SHA256SUMS (sha256sum format) over every
// evidence file and run.json. Finished runs are appended to
// <out>/history.jsonl; a run directory is never reused and history lines are
// never rewritten.
//
// Evidence lanes stay separate: a PASS in gateway delivery says nothing about
// engine cache reuse. NOT_RUN never counts as PASS, and a run on simulated
// workers qualifies the gateway's behaviour, never an engine.
//
// The package is a leaf (stdlib and lipgloss only).
package results

import (
	"errors"
	"fmt"
	"regexp"
	"slices"
	"strings"
	"time"
)

// Status is the outcome of a step, a lane or a whole run.
type Status string

// The statuses. The zero Status ("") means NOT_RUN wherever a status is
// read, and is written as NOT_RUN.
const (
	StatusPass    Status = "PASS"
	StatusFail    Status = "FAIL"
	StatusBlocked Status = "BLOCKED"
	StatusSkipped Status = "SKIPPED"
	StatusNotRun  Status = "NOT_RUN"
)

// Valid reports whether s is one of the five statuses (the zero value is
// not valid: write StatusNotRun).
func (s Status) Valid() bool {
	switch s {
	case StatusPass, StatusFail, StatusBlocked, StatusSkipped, StatusNotRun:
		return true
	}
	return false
}

// Norm returns s, or StatusNotRun for the zero value.
func (s Status) Norm() Status {
	if s == "" {
		return StatusNotRun
	}
	return s
}

// Launchers: how a run's workers were obtained.
const (
	LauncherSim    = "sim"    // in-process or child simulators
	LauncherDocker = "docker" // containers started by llmgw
	LauncherAttach = "attach" // workers that were already running
)

// Known BLOCKED reason codes: the catalog's (known before anything starts)
// and the launchers' (what the host cannot provide). Other codes are
// allowed; these are the ones renderers and tests rely on.
var BlockedReasonCodes = []string{
	"architecture_unsupported",
	"hardware_unsupported",
	"engine_renderer",
	"checkpoint_format",
	"no_docker",
	"no_gpu",
	"image_unavailable",
}

// SimulatedNote is printed wherever a result on simulated workers is shown.
const SimulatedNote = "simulated workers: qualifies the gateway's behaviour, not the engine"

// Errors callers classify with errors.Is.
var (
	// ErrRunExists: the run ID was used before (directory or history).
	ErrRunExists = errors.New("results: run already exists")
	// ErrRunNotFound: no directory (Get, Verify) or history row for the ID.
	ErrRunNotFound = errors.New("results: no such run")
	// ErrRunIncomplete: the run directory has no run.json (never finished).
	ErrRunIncomplete = errors.New("results: run did not finish")
	// ErrBadRunID: the ID is not a single safe path component.
	ErrBadRunID = errors.New("results: invalid run id")
	// ErrBadEvidenceName: nothing usable was left after sanitising.
	ErrBadEvidenceName = errors.New("results: invalid evidence name")
	// ErrEvidenceExists: evidence is write-once per cleaned name.
	ErrEvidenceExists = errors.New("results: evidence file already written")
	// ErrFinished: the RunWriter was already finished.
	ErrFinished = errors.New("results: run already finished")
	// ErrInvalidRecord: a tuple, step, lane, run.json or history line
	// breaks the schema.
	ErrInvalidRecord = errors.New("results: invalid record")
)

// Tuple identifies what a run qualified.
type Tuple struct {
	Engine        string `json:"engine"`         // vllm, sglang, trtllm, llamacpp
	EngineVersion string `json:"engine_version"` // from the catalog's version tuple
	Profile       string `json:"profile"`        // catalog profile ID
	Model         string `json:"model,omitempty"`
	Topology      string `json:"topology"` // converged, pd
	Mode          string `json:"mode"`     // rr, chwbl, exact
	// Launcher is LauncherSim, LauncherDocker or LauncherAttach.
	Launcher string `json:"launcher"`
	// SimulatedWorkers is true when the workers were llmgw simulators,
	// whichever launcher started them (the docker launcher can run the
	// simulator image). Always true for LauncherSim.
	SimulatedWorkers bool   `json:"simulated_workers"`
	Workers          int    `json:"workers,omitempty"`
	GatewayVersion   string `json:"gateway_version,omitempty"`
	// WorkerEngineVersion is the version the workers themselves report
	// (their adapter's version endpoint), beside the catalog's
	// EngineVersion; "" when not read. Several distinct versions are
	// joined by ",".
	WorkerEngineVersion string `json:"worker_engine_version,omitempty"`
	// VersionMismatch: the workers report a version other than the
	// catalog's (and the run was allowed to go on).
	VersionMismatch bool `json:"version_mismatch,omitempty"`
}

// CaseID is the stable matrix key <engine>-<profile>-<mode>-<topology>.
func (t Tuple) CaseID() string {
	return strings.Join([]string{t.Engine, t.Profile, t.Mode, t.Topology}, "-")
}

func (t Tuple) validate() error {
	for _, f := range []struct{ name, v string }{
		{"engine", t.Engine}, {"profile", t.Profile}, {"topology", t.Topology}, {"mode", t.Mode},
	} {
		if f.v == "" {
			return fmt.Errorf("%w: tuple.%s must be set", ErrInvalidRecord, f.name)
		}
	}
	switch t.Launcher {
	case LauncherSim:
		if !t.SimulatedWorkers {
			return fmt.Errorf("%w: tuple.simulated_workers must be true for the sim launcher", ErrInvalidRecord)
		}
	case LauncherDocker, LauncherAttach:
	default:
		return fmt.Errorf("%w: tuple.launcher must be sim, docker or attach (got %q)", ErrInvalidRecord, t.Launcher)
	}
	if t.Workers < 0 {
		return fmt.Errorf("%w: tuple.workers must be ≥ 0", ErrInvalidRecord)
	}
	return nil
}

// Step is one runbook step's record. Evidence holds paths relative to the
// run directory, as returned by RunWriter.AddEvidence.
type Step struct {
	Name   string `json:"name"`
	Status Status `json:"status"`
	Reason string `json:"reason,omitempty"`
	// ReasonCode is a typed token: required for BLOCKED (e.g.
	// "architecture_unsupported", "no_docker"), the failure token for FAIL.
	ReasonCode string    `json:"reason_code,omitempty"`
	Started    time.Time `json:"started"`
	Ended      time.Time `json:"ended"`
	Evidence   []string  `json:"evidence,omitempty"`
}

// DurationText is the step's duration rounded to the millisecond ("1.25s"),
// or "-" when it has no start or end time.
func (s Step) DurationText() string {
	if s.Started.IsZero() || s.Ended.IsZero() {
		return "-"
	}
	return s.Ended.Sub(s.Started).Round(time.Millisecond).String()
}

var codePattern = regexp.MustCompile(`^[A-Za-z0-9_.-]{1,64}$`)

func (s Step) validate() error {
	if s.Name == "" {
		return fmt.Errorf("%w: step name must be set", ErrInvalidRecord)
	}
	if !s.Status.Valid() {
		return fmt.Errorf("%w: step %q: status %q is not PASS, FAIL, BLOCKED, SKIPPED or NOT_RUN", ErrInvalidRecord, s.Name, s.Status)
	}
	if s.Status == StatusBlocked && s.ReasonCode == "" {
		return fmt.Errorf("%w: step %q: BLOCKED needs a reason code", ErrInvalidRecord, s.Name)
	}
	if s.ReasonCode != "" && !codePattern.MatchString(s.ReasonCode) {
		return fmt.Errorf("%w: step %q: reason code %q is not a token", ErrInvalidRecord, s.Name, s.ReasonCode)
	}
	if !s.Ended.IsZero() && s.Ended.Before(s.Started) {
		return fmt.Errorf("%w: step %q ended before it started", ErrInvalidRecord, s.Name)
	}
	return nil
}

// Lanes keeps the evidence lanes apart. The zero value of each is NOT_RUN.
type Lanes struct {
	DirectWorker    Status `json:"direct_worker"`
	GatewayDelivery Status `json:"gateway_delivery"`
	RoutingEvidence Status `json:"routing_evidence"`
	HashParity      Status `json:"hash_parity"`
	CacheReuse      Status `json:"cache_reuse"`
	Performance     Status `json:"performance"`
}

// LaneNames are the lanes in column order, as the renderers title them.
var LaneNames = []string{"direct", "delivery", "routing", "parity", "cache", "perf"}

// List returns the lanes in LaneNames order, zero values as NOT_RUN.
func (l Lanes) List() []Status {
	return []Status{l.DirectWorker.Norm(), l.GatewayDelivery.Norm(), l.RoutingEvidence.Norm(),
		l.HashParity.Norm(), l.CacheReuse.Norm(), l.Performance.Norm()}
}

func (l Lanes) norm() Lanes {
	s := l.List()
	return Lanes{s[0], s[1], s[2], s[3], s[4], s[5]}
}

func (l Lanes) validate() error {
	for i, s := range l.List() {
		if !s.Valid() {
			return fmt.Errorf("%w: lane %s: status %q is not valid", ErrInvalidRecord, LaneNames[i], s)
		}
	}
	return nil
}

func validLaneSources(m map[string]string) error {
	for k, v := range m {
		if !slices.Contains(LaneNames, k) {
			return fmt.Errorf("%w: lane source for unknown lane %q (lanes: %s)", ErrInvalidRecord, k, strings.Join(LaneNames, ", "))
		}
		if v == "" {
			return fmt.Errorf("%w: lane %s: empty source", ErrInvalidRecord, k)
		}
	}
	return nil
}

// Artifact is one evidence file's identity.
type Artifact struct {
	Path   string `json:"path"` // relative to the run directory
	SHA256 string `json:"sha256"`
	Size   int64  `json:"size"`
}

// Run is the content of run.json.
type Run struct {
	Schema string `json:"schema"`
	ID     string `json:"id"`
	Tuple  Tuple  `json:"tuple"`
	Steps  []Step `json:"steps"`
	Lanes  Lanes  `json:"lanes"`
	// LaneSources names the evidence source that proved each lane, by
	// LaneNames entry (e.g. "delivery": "engine_metrics vllm:request_success_total").
	LaneSources map[string]string `json:"lane_sources,omitempty"`
	Verdict     Status            `json:"verdict"`
	Artifacts   []Artifact        `json:"artifacts"`
	Started     time.Time         `json:"started"`
	Ended       time.Time         `json:"ended"`
	// ArtifactID is the SHA-256 of the run's SHA256SUMS file, the run's
	// immutable identity. It is not stored in run.json (which SHA256SUMS
	// covers); Store.Get fills it in.
	ArtifactID string `json:"artifact_id,omitempty"`
}

// RunSchema is the schema tag of run.json and history lines.
const RunSchema = "llmgw.results/v1"

// Verdict folds steps and lanes into one status:
//   - any FAIL (step or lane) is FAIL;
//   - otherwise any BLOCKED is BLOCKED;
//   - otherwise any NOT_RUN step, or no PASS step at all, is NOT_RUN
//     (not_run never counts as PASS; a run of only SKIPPED steps proved
//     nothing);
//   - otherwise PASS. SKIPPED steps and NOT_RUN lanes do not demote a PASS
//     (e.g. performance is not measured by a functional runbook).
func Verdict(steps []Step, lanes Lanes) Status {
	all := make([]Status, 0, len(steps)+6)
	for _, s := range steps {
		all = append(all, s.Status.Norm())
	}
	lane := lanes.List()
	switch {
	case slices.Contains(all, StatusFail) || slices.Contains(lane, StatusFail):
		return StatusFail
	case slices.Contains(all, StatusBlocked) || slices.Contains(lane, StatusBlocked):
		return StatusBlocked
	case slices.Contains(all, StatusNotRun) || !slices.Contains(all, StatusPass):
		return StatusNotRun
	}
	return StatusPass
}

// Counts tallies run verdicts.
type Counts struct {
	Total   int `json:"total"`
	Pass    int `json:"pass"`
	Fail    int `json:"fail"`
	Blocked int `json:"blocked"`
	Skipped int `json:"skipped"`
	NotRun  int `json:"not_run"`
}

// Tally counts the verdicts of runs.
func Tally(runs []RunSummary) Counts {
	var c Counts
	for _, r := range runs {
		c.Total++
		switch r.Verdict.Norm() {
		case StatusPass:
			c.Pass++
		case StatusFail:
			c.Fail++
		case StatusBlocked:
			c.Blocked++
		case StatusSkipped:
			c.Skipped++
		default:
			c.NotRun++
		}
	}
	return c
}

// Overall is the verdict of a set of runs, with the typed exit semantics the
// CLI maps to exit codes: FAIL if any run failed; otherwise BLOCKED if any was
// blocked; otherwise NOT_RUN if any did not run or there are no runs;
// otherwise PASS.
func (c Counts) Overall() Status {
	switch {
	case c.Fail > 0:
		return StatusFail
	case c.Blocked > 0:
		return StatusBlocked
	case c.NotRun > 0 || c.Skipped > 0 || c.Pass == 0:
		return StatusNotRun
	}
	return StatusPass
}

// String is "30 runs: 26 PASS, 0 FAIL, 4 BLOCKED, 0 NOT_RUN" (SKIPPED only
// when non-zero).
func (c Counts) String() string {
	s := fmt.Sprintf("%d runs: %d PASS, %d FAIL, %d BLOCKED, %d NOT_RUN", c.Total, c.Pass, c.Fail, c.Blocked, c.NotRun)
	if c.Skipped > 0 {
		s += fmt.Sprintf(", %d SKIPPED", c.Skipped)
	}
	return s
}

// RunSummary is one result row: a history line and what renderers show.
type RunSummary struct {
	Schema  string `json:"schema"`
	ID      string `json:"id"`
	CaseID  string `json:"case_id"`
	Tuple   Tuple  `json:"tuple"`
	Verdict Status `json:"verdict"`
	// ReasonCode and Reason come from the first FAIL step, else the first
	// BLOCKED step; empty for PASS.
	ReasonCode string `json:"reason_code,omitempty"`
	Reason     string `json:"reason,omitempty"`
	Lanes      Lanes  `json:"lanes"`
	// LaneSources: as in Run.
	LaneSources map[string]string `json:"lane_sources,omitempty"`
	Started     time.Time         `json:"started"`
	Ended       time.Time         `json:"ended"`
	ArtifactID  string            `json:"artifact_id"`
}

// Summary builds the result row of r.
func (r *Run) Summary() RunSummary {
	s := RunSummary{
		Schema: RunSchema, ID: r.ID, CaseID: r.Tuple.CaseID(), Tuple: r.Tuple,
		Verdict: r.Verdict.Norm(), Lanes: r.Lanes.norm(), LaneSources: r.LaneSources, Started: r.Started, Ended: r.Ended, ArtifactID: r.ArtifactID,
	}
	for _, want := range []Status{StatusFail, StatusBlocked} {
		if i := slices.IndexFunc(r.Steps, func(st Step) bool { return st.Status == want }); i >= 0 {
			s.ReasonCode, s.Reason = r.Steps[i].ReasonCode, r.Steps[i].Reason
			break
		}
	}
	return s
}
