package runbook

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/llmgw/llmgw/results"
)

// LedgerDir is the directory under a results directory (--out) where each
// run's ownership ledger lives: <out>/owned/<run-id>.json. It is outside
// runs/ because a ledger changes as resources come and go, and a run
// directory is immutable evidence (results verify flags extra files).
const LedgerDir = "owned"

// ErrBadLedger classifies a ledger file that cannot be decoded.
var ErrBadLedger = errors.New("runbook: malformed ownership ledger")

// LedgerState is what one run owns. Every list holds only resources this
// tool created; cleanup never touches anything else.
type LedgerState struct {
	RunID    string    `json:"run_id"`
	Launcher string    `json:"launcher"`
	Created  time.Time `json:"created"`
	// Containers and Networks are docker ids (also labelled llmgw.run).
	Containers []string `json:"containers,omitempty"`
	Networks   []string `json:"networks,omitempty"`
	// PIDs are child processes recorded without their start time (ledgers
	// of earlier versions). Cleanup cannot prove such a process is still
	// the one started, so it never signals it.
	PIDs []int `json:"pids,omitempty"`
	// Processes are child processes started by this run, each with its
	// start time, so a recycled PID is never mistaken for ours.
	Processes []OwnedProcess `json:"processes,omitempty"`
	// Rules are rules applied on a gateway's admin API.
	Rules []OwnedRule `json:"rules,omitempty"`
	// Dirs are temporary directories (the embedded gateway's state).
	Dirs []string `json:"dirs,omitempty"`
}

// OwnedRule is one applied rule: the admin API base URL and the rule name.
// Embedded marks a rule on the run's own embedded gateway, which dies with
// the process that ran it. TokenFile is the path of the file holding the
// admin bearer token the rule was applied with ("" for none): cleanup
// reads it then, the token itself is never written to a ledger.
type OwnedRule struct {
	Admin     string `json:"admin"`
	Name      string `json:"name"`
	Embedded  bool   `json:"embedded,omitempty"`
	TokenFile string `json:"token_file,omitempty"`
}

// OwnedProcess is a child process: its PID and its start time in clock
// ticks since boot (field 22 of /proc/PID/stat), which together name the
// very process, not whatever reuses the PID later.
type OwnedProcess struct {
	PID   int    `json:"pid"`
	Start uint64 `json:"start_ticks"`
}

// ProcessStart reads pid's start time (clock ticks since boot) from
// /proc/PID/stat. The command name (field 2) may hold spaces and
// parentheses, so fields are counted after its last ')'.
func ProcessStart(pid int) (uint64, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, fmt.Errorf("runbook: process %d: %w", pid, err)
	}
	return parseStatStart(b)
}

func parseStatStart(b []byte) (uint64, error) {
	i := strings.LastIndexByte(string(b), ')')
	if i < 0 {
		return 0, fmt.Errorf("runbook: /proc stat: no command name")
	}
	// After ")": field 3 (state) onwards; starttime is field 22.
	f := strings.Fields(string(b[i+1:]))
	if len(f) < 20 {
		return 0, fmt.Errorf("runbook: /proc stat: %d fields after the command name, want ≥ 20", len(f))
	}
	v, err := strconv.ParseUint(f[19], 10, 64)
	if err != nil {
		return 0, fmt.Errorf("runbook: /proc stat: start time %q: %w", f[19], err)
	}
	return v, nil
}

// SameProcess reports whether p still names the process that was
// recorded: the PID runs and started at the recorded time.
func SameProcess(p OwnedProcess) bool {
	st, err := ProcessStart(p.PID)
	return err == nil && st == p.Start
}

// Empty reports whether the ledger owns nothing any more.
func (s LedgerState) Empty() bool {
	return len(s.Containers) == 0 && len(s.Networks) == 0 && len(s.PIDs) == 0 && len(s.Processes) == 0 && len(s.Rules) == 0 && len(s.Dirs) == 0
}

// Ledger persists one run's ownership state; every change is written at
// once (atomically), so a crash loses nothing that was created. It is safe
// for concurrent use.
type Ledger struct {
	mu    sync.Mutex
	path  string
	state LedgerState
}

// OpenLedger creates (or loads) the ledger of runID under outDir.
func OpenLedger(outDir, runID, launcher string) (*Ledger, error) {
	if !ValidRunID(runID) {
		return nil, fmt.Errorf("runbook: ledger: invalid run id %q", runID)
	}
	dir := filepath.Join(outDir, LedgerDir)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, fmt.Errorf("runbook: ledger: %w", err)
	}
	l := &Ledger{path: filepath.Join(dir, runID+".json")}
	if st, err := readLedger(l.path); err == nil {
		l.state = st
		return l, nil
	} else if !errors.Is(err, fs.ErrNotExist) {
		return nil, err
	}
	l.state = LedgerState{RunID: runID, Launcher: launcher, Created: time.Now().UTC()}
	return l, l.saveLocked()
}

// Path is the ledger file.
func (l *Ledger) Path() string { return l.path }

// State returns a copy of the current state.
func (l *Ledger) State() LedgerState {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.state.clone()
}

// Update changes the state with fn and persists it. A nil Ledger ignores
// updates, so launchers need not check.
func (l *Ledger) Update(fn func(*LedgerState)) error {
	if l == nil {
		return nil
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	fn(&l.state)
	return l.saveLocked()
}

// Finish removes the ledger file when it owns nothing any more, and keeps
// it otherwise (for `llmgw cleanup`).
func (l *Ledger) Finish() error {
	if l == nil {
		return nil
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if !l.state.Empty() {
		return nil
	}
	if err := os.Remove(l.path); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("runbook: ledger: %w", err)
	}
	return nil
}

func (l *Ledger) saveLocked() error {
	b, err := json.MarshalIndent(l.state, "", "  ")
	if err != nil {
		return fmt.Errorf("runbook: ledger: %w", err)
	}
	if err := results.WriteFileAtomic(l.path, append(b, '\n')); err != nil {
		return fmt.Errorf("runbook: ledger: %w", err)
	}
	return nil
}

func (s LedgerState) clone() LedgerState {
	c := s
	c.Containers = slices.Clone(s.Containers)
	c.Networks = slices.Clone(s.Networks)
	c.PIDs = slices.Clone(s.PIDs)
	c.Processes = slices.Clone(s.Processes)
	c.Rules = slices.Clone(s.Rules)
	c.Dirs = slices.Clone(s.Dirs)
	return c
}

func readLedger(path string) (LedgerState, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return LedgerState{}, err
	}
	var st LedgerState
	dec := json.NewDecoder(strings.NewReader(string(b)))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&st); err != nil {
		return LedgerState{}, fmt.Errorf("%w: %s: %w", ErrBadLedger, path, err)
	}
	return st, nil
}

// Ledgers lists the ledgers under outDir, sorted by run ID. A missing
// directory is no ledgers. A ledger that cannot be read does not hide the
// others: they are returned with an error (wrapping ErrBadLedger or the
// read error) naming each unreadable file.
func Ledgers(outDir string) ([]*Ledger, error) {
	dir := filepath.Join(outDir, LedgerDir)
	ents, err := os.ReadDir(dir)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("runbook: ledgers: %w", err)
	}
	var out []*Ledger
	var bad []error
	for _, e := range ents {
		name := e.Name()
		if e.IsDir() || !strings.HasSuffix(name, ".json") || strings.HasPrefix(name, ".") {
			continue
		}
		p := filepath.Join(dir, name)
		st, err := readLedger(p)
		if err != nil {
			bad = append(bad, err)
			continue
		}
		out = append(out, &Ledger{path: p, state: st})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].state.RunID < out[j].state.RunID })
	return out, errors.Join(bad...)
}

// LoadLedger returns the ledger of runID under outDir; fs.ErrNotExist when
// the run owns nothing (or never existed).
func LoadLedger(outDir, runID string) (*Ledger, error) {
	if !ValidRunID(runID) {
		return nil, fmt.Errorf("runbook: ledger: invalid run id %q: %w", runID, fs.ErrNotExist)
	}
	p := filepath.Join(outDir, LedgerDir, runID+".json")
	st, err := readLedger(p)
	if err != nil {
		return nil, err
	}
	return &Ledger{path: p, state: st}, nil
}
