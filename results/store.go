package results

import (
	"bufio"
	"bytes"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"maps"
	"os"
	"path"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strings"
	"sync"
	"time"
)

// File and directory names inside a store.
const (
	runsDir     = "runs"
	historyFile = "history.jsonl"
	runFile     = "run.json"
	sumsFile    = "SHA256SUMS"
	evidenceDir = "evidence"
)

// Store is a results directory. It is safe for concurrent use; separate
// processes may share a store (run directories are claimed with an exclusive
// mkdir and history lines are appended in one write each).
type Store struct {
	root string
	now  func() time.Time
	mu   sync.Mutex // serialises history appends within this process
}

// Option configures a Store.
type Option func(*Store)

// WithClock sets the clock used for run start and end times (tests pin it).
// nil keeps time.Now.
func WithClock(now func() time.Time) Option {
	return func(s *Store) {
		if now != nil {
			s.now = now
		}
	}
}

// Open opens (creating if needed) the store rooted at outDir.
func Open(outDir string, opts ...Option) (*Store, error) {
	if outDir == "" {
		return nil, errors.New("results: empty results directory")
	}
	s := &Store{root: outDir, now: time.Now}
	for _, o := range opts {
		o(s)
	}
	if err := os.MkdirAll(filepath.Join(outDir, runsDir), 0o755); err != nil {
		return nil, fmt.Errorf("results: open %s: %w", outDir, err)
	}
	return s, nil
}

// Root returns the store's directory.
func (s *Store) Root() string { return s.root }

// RunDir returns the directory of run id (it may not exist).
func (s *Store) RunDir(id string) string { return filepath.Join(s.root, runsDir, id) }

var runIDPattern = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$`)

func checkRunID(id string) error {
	if !runIDPattern.MatchString(id) || strings.Contains(id, "..") {
		return fmt.Errorf("%w %q: use letters, digits, '.', '_' and '-' (at most 128)", ErrBadRunID, id)
	}
	return nil
}

// NewRun starts a run of tuple under a fresh ID:
// <UTC time>-<engine>-<profile>-<mode>-<random>.
func (s *Store) NewRun(t Tuple) (*RunWriter, error) {
	var b [3]byte
	if _, err := rand.Read(b[:]); err != nil {
		return nil, fmt.Errorf("results: run id: %w", err)
	}
	raw := fmt.Sprintf("%s-%s-%s-%s-%x", s.now().UTC().Format("20060102T150405Z"), t.Engine, t.Profile, t.Mode, b)
	id := strings.Map(func(r rune) rune {
		if r < 0x80 && (r == '-' || r == '.' || r == '_' || r >= '0' && r <= '9' || r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z') {
			return r
		}
		return '_'
	}, raw)
	if len(id) > 128 {
		id = id[:121] + id[len(id)-7:]
	}
	return s.NewRunWithID(id, t)
}

// NewRunWithID starts a run with a caller-chosen ID. It fails with
// ErrRunExists when the ID was ever used in this store (its directory exists
// or history records it): a later run never rewrites an earlier one.
func (s *Store) NewRunWithID(id string, t Tuple) (*RunWriter, error) {
	if err := checkRunID(id); err != nil {
		return nil, err
	}
	if err := t.validate(); err != nil {
		return nil, err
	}
	if _, err := s.historyRow(id); err == nil {
		return nil, fmt.Errorf("%w: %s is recorded in history", ErrRunExists, id)
	} else if !errors.Is(err, ErrRunNotFound) {
		return nil, err
	}
	dir := s.RunDir(id)
	if err := os.Mkdir(dir, 0o755); err != nil {
		if errors.Is(err, fs.ErrExist) {
			return nil, fmt.Errorf("%w: %s", ErrRunExists, dir)
		}
		return nil, fmt.Errorf("results: create run %s: %w", id, err)
	}
	if err := os.Mkdir(filepath.Join(dir, evidenceDir), 0o755); err != nil {
		return nil, fmt.Errorf("results: create run %s: %w", id, err)
	}
	return &RunWriter{
		s: s, dir: dir, names: map[string]bool{},
		run: Run{Schema: RunSchema, ID: id, Tuple: t, Started: s.now().UTC()},
	}, nil
}

// RunWriter records one run. It is safe for concurrent use. After Finish
// every method fails with ErrFinished.
type RunWriter struct {
	s   *Store
	dir string

	mu       sync.Mutex
	run      Run
	names    map[string]bool // evidence paths written, relative to dir
	finished bool
}

// ID returns the run ID.
func (w *RunWriter) ID() string { return w.run.ID }

// Dir returns the run directory.
func (w *RunWriter) Dir() string { return w.dir }

// CleanEvidenceName turns a caller-supplied evidence name into a safe
// relative path: backslashes become slashes, empty, "." and ".." components
// are dropped, every byte outside [A-Za-z0-9._-] (NUL included) becomes '_',
// leading dots are removed (no hidden files), components are capped at 100
// bytes and the path at 8 components. A name with nothing left is an error
// wrapping ErrBadEvidenceName. The result never escapes the evidence
// directory.
func CleanEvidenceName(name string) (string, error) {
	var parts []string
	for _, c := range strings.Split(strings.ReplaceAll(name, `\`, "/"), "/") {
		b := []byte(c)
		for i, ch := range b {
			if !(ch == '-' || ch == '.' || ch == '_' || ch >= '0' && ch <= '9' || ch >= 'a' && ch <= 'z' || ch >= 'A' && ch <= 'Z') {
				b[i] = '_'
			}
		}
		c = strings.TrimLeft(string(b), ".")
		if c == "" {
			continue
		}
		if len(c) > 100 {
			c = c[:100]
		}
		parts = append(parts, c)
	}
	if len(parts) == 0 {
		return "", fmt.Errorf("%w %q: nothing left after sanitising", ErrBadEvidenceName, name)
	}
	if len(parts) > 8 {
		parts = append(parts[:7], strings.Join(parts[7:], "_"))
		if len(parts[7]) > 100 {
			parts[7] = parts[7][:100]
		}
	}
	return strings.Join(parts, "/"), nil
}

// AddEvidence writes data as evidence/<clean name> and returns that path
// relative to the run directory (the form Step.Evidence takes). Evidence is
// write-once: a second file with the same cleaned name fails with
// ErrEvidenceExists.
func (w *RunWriter) AddEvidence(name string, data []byte) (string, error) {
	clean, err := CleanEvidenceName(name)
	if err != nil {
		return "", err
	}
	rel := evidenceDir + "/" + clean
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.finished {
		return "", ErrFinished
	}
	if w.names[rel] {
		return "", fmt.Errorf("%w: %s", ErrEvidenceExists, rel)
	}
	full := filepath.Join(w.dir, filepath.FromSlash(rel))
	if err := os.MkdirAll(filepath.Dir(full), 0o755); err != nil {
		return "", fmt.Errorf("results: evidence %s: %w", rel, err)
	}
	f, err := os.OpenFile(full, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o644)
	if err != nil {
		if errors.Is(err, fs.ErrExist) {
			return "", fmt.Errorf("%w: %s", ErrEvidenceExists, rel)
		}
		return "", fmt.Errorf("results: evidence %s: %w", rel, err)
	}
	_, werr := f.Write(data)
	if serr := f.Sync(); werr == nil {
		werr = serr
	}
	if cerr := f.Close(); werr == nil {
		werr = cerr
	}
	if werr != nil {
		return "", fmt.Errorf("results: evidence %s: %w", rel, werr)
	}
	sum := sha256.Sum256(data)
	w.names[rel] = true
	w.run.Artifacts = append(w.run.Artifacts, Artifact{Path: rel, SHA256: hex.EncodeToString(sum[:]), Size: int64(len(data))})
	return rel, nil
}

// RecordStep appends a step. The step must be valid (a name, a known status,
// a reason code for BLOCKED) and its Evidence must be paths this writer
// returned from AddEvidence.
func (w *RunWriter) RecordStep(st Step) error {
	if err := st.validate(); err != nil {
		return err
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.finished {
		return ErrFinished
	}
	for _, e := range st.Evidence {
		if !w.names[e] {
			return fmt.Errorf("%w: step %q cites %q, which this run did not write", ErrInvalidRecord, st.Name, e)
		}
	}
	st.Evidence = slices.Clone(st.Evidence)
	st.Started, st.Ended = st.Started.UTC(), st.Ended.UTC()
	w.run.Steps = append(w.run.Steps, st)
	return nil
}

// SetLanes records the evidence lanes (zero values stay NOT_RUN).
func (w *RunWriter) SetLanes(l Lanes) error {
	if err := l.validate(); err != nil {
		return err
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.finished {
		return ErrFinished
	}
	w.run.Lanes = l
	return nil
}

// SetLaneSources records which evidence source proved each lane (keys
// are LaneNames entries).
func (w *RunWriter) SetLaneSources(m map[string]string) error {
	if err := validLaneSources(m); err != nil {
		return err
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.finished {
		return ErrFinished
	}
	if len(m) > 0 {
		w.run.LaneSources = maps.Clone(m)
	}
	return nil
}

// SetWorkerVersion records the engine version the workers report, and
// whether it differs from the catalog's.
func (w *RunWriter) SetWorkerVersion(version string, mismatch bool) error {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.finished {
		return ErrFinished
	}
	w.run.Tuple.WorkerEngineVersion, w.run.Tuple.VersionMismatch = version, mismatch
	return nil
}

// Finish writes run.json and SHA256SUMS (each atomically: temp file, fsync,
// rename), then appends the run's row to history. It returns that row.
func (w *RunWriter) Finish() (RunSummary, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.finished {
		return RunSummary{}, ErrFinished
	}
	w.finished = true
	r := w.run
	r.Ended = w.s.now().UTC()
	r.Lanes = r.Lanes.norm()
	r.Verdict = Verdict(r.Steps, r.Lanes)
	sort.Slice(r.Artifacts, func(i, j int) bool { return r.Artifacts[i].Path < r.Artifacts[j].Path })
	if r.Steps == nil {
		r.Steps = []Step{}
	}
	if r.Artifacts == nil {
		r.Artifacts = []Artifact{}
	}
	runJSON, err := json.MarshalIndent(r, "", "  ")
	if err != nil {
		return RunSummary{}, fmt.Errorf("results: encode %s: %w", runFile, err)
	}
	runJSON = append(runJSON, '\n')
	if err := WriteFileAtomic(filepath.Join(w.dir, runFile), runJSON); err != nil {
		return RunSummary{}, err
	}
	entries := make([]SumEntry, 0, len(r.Artifacts)+1)
	for _, a := range r.Artifacts {
		entries = append(entries, SumEntry{Path: a.Path, SHA256: a.SHA256})
	}
	runSum := sha256.Sum256(runJSON)
	entries = append(entries, SumEntry{Path: runFile, SHA256: hex.EncodeToString(runSum[:])})
	sums := formatSums(entries)
	if err := WriteFileAtomic(filepath.Join(w.dir, sumsFile), sums); err != nil {
		return RunSummary{}, err
	}
	id := sha256.Sum256(sums)
	r.ArtifactID = hex.EncodeToString(id[:])
	row := r.Summary()
	if err := w.s.appendHistory(row); err != nil {
		return RunSummary{}, err
	}
	w.run = r
	return row, nil
}

// WriteFileAtomic writes path through a temporary file in the same
// directory (written, fsynced, then renamed over path), so a reader sees the
// old content or the new, never a partial file. The file mode is 0644.
func WriteFileAtomic(path string, data []byte) error {
	f, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+".tmp-*")
	if err != nil {
		return fmt.Errorf("results: write %s: %w", path, err)
	}
	tmp := f.Name()
	_, werr := f.Write(data)
	if serr := f.Sync(); werr == nil {
		werr = serr
	}
	if cerr := f.Close(); werr == nil {
		werr = cerr
	}
	if werr == nil {
		werr = os.Chmod(tmp, 0o644)
	}
	if werr == nil {
		werr = os.Rename(tmp, path)
	}
	if werr != nil {
		_ = os.Remove(tmp)
		return fmt.Errorf("results: write %s: %w", path, werr)
	}
	return nil
}

// appendHistory appends one JSON line. A torn last line left by a crash is
// terminated first, so it cannot swallow the new row.
func (s *Store) appendHistory(row RunSummary) error {
	line, err := json.Marshal(row)
	if err != nil {
		return fmt.Errorf("results: encode history row: %w", err)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	p := filepath.Join(s.root, historyFile)
	f, err := os.OpenFile(p, os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o644)
	if err != nil {
		return fmt.Errorf("results: history: %w", err)
	}
	defer f.Close()
	if st, err := f.Stat(); err == nil && st.Size() > 0 {
		last := make([]byte, 1)
		if rf, err := os.Open(p); err == nil {
			_, rerr := rf.ReadAt(last, st.Size()-1)
			rf.Close()
			if rerr == nil && last[0] != '\n' {
				line = append([]byte{'\n'}, line...)
			}
		}
	}
	if _, err := f.Write(append(line, '\n')); err != nil {
		return fmt.Errorf("results: history: %w", err)
	}
	if err := f.Sync(); err != nil {
		return fmt.Errorf("results: history: %w", err)
	}
	return nil
}

// List returns every finished run's row, in the order the runs finished.
// An unterminated last line (a crash mid-append) is ignored; any other line
// that does not decode is an error naming its line number.
func (s *Store) List() ([]RunSummary, error) {
	data, err := os.ReadFile(filepath.Join(s.root, historyFile))
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("results: history: %w", err)
	}
	return ParseHistory(data)
}

// ParseHistory decodes history.jsonl content (see List).
func ParseHistory(data []byte) ([]RunSummary, error) {
	var out []RunSummary
	sc := bufio.NewScanner(bytes.NewReader(data))
	sc.Buffer(make([]byte, 0, 64<<10), 16<<20)
	n := 0
	complete := bytes.HasSuffix(data, []byte("\n"))
	lines := bytes.Count(data, []byte("\n"))
	for sc.Scan() {
		n++
		line := bytes.TrimSpace(sc.Bytes())
		if len(line) == 0 {
			continue
		}
		if n > lines && !complete {
			break // torn final line
		}
		var row RunSummary
		dec := json.NewDecoder(bytes.NewReader(line))
		dec.DisallowUnknownFields()
		if err := dec.Decode(&row); err != nil {
			return nil, fmt.Errorf("%w: history line %d: %w", ErrInvalidRecord, n, err)
		}
		if err := checkRunID(row.ID); err != nil {
			return nil, fmt.Errorf("%w: history line %d: %w", ErrInvalidRecord, n, err)
		}
		out = append(out, row)
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("results: history: %w", err)
	}
	return out, nil
}

// historyRow returns the history row of id, or ErrRunNotFound.
func (s *Store) historyRow(id string) (RunSummary, error) {
	rows, err := s.List()
	if err != nil {
		return RunSummary{}, err
	}
	for i := len(rows) - 1; i >= 0; i-- {
		if rows[i].ID == id {
			return rows[i], nil
		}
	}
	return RunSummary{}, fmt.Errorf("%w: %s", ErrRunNotFound, id)
}

// Get reads run id's run.json (strictly: unknown fields are an error) and
// fills ArtifactID from its SHA256SUMS. A directory without run.json is
// ErrRunIncomplete; no directory is ErrRunNotFound.
func (s *Store) Get(id string) (*Run, error) {
	if err := checkRunID(id); err != nil {
		return nil, err
	}
	dir := s.RunDir(id)
	if _, err := os.Stat(dir); errors.Is(err, fs.ErrNotExist) {
		return nil, fmt.Errorf("%w: %s", ErrRunNotFound, id)
	}
	data, err := os.ReadFile(filepath.Join(dir, runFile))
	if errors.Is(err, fs.ErrNotExist) {
		return nil, fmt.Errorf("%w: %s has no %s", ErrRunIncomplete, id, runFile)
	}
	if err != nil {
		return nil, fmt.Errorf("results: run %s: %w", id, err)
	}
	r, err := DecodeRun(data)
	if err != nil {
		return nil, fmt.Errorf("results: run %s: %w", id, err)
	}
	if sums, err := os.ReadFile(filepath.Join(dir, sumsFile)); err == nil {
		d := sha256.Sum256(sums)
		r.ArtifactID = hex.EncodeToString(d[:])
	}
	return r, nil
}

// DecodeRun strictly decodes run.json content and checks its records.
func DecodeRun(data []byte) (*Run, error) {
	var r Run
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&r); err != nil {
		return nil, fmt.Errorf("%w: %s: %w", ErrInvalidRecord, runFile, err)
	}
	if dec.More() {
		return nil, fmt.Errorf("%w: %s: trailing data", ErrInvalidRecord, runFile)
	}
	if r.Schema != RunSchema {
		return nil, fmt.Errorf("%w: %s: schema %q, want %q", ErrInvalidRecord, runFile, r.Schema, RunSchema)
	}
	if err := checkRunID(r.ID); err != nil {
		return nil, fmt.Errorf("%w: %s: %w", ErrInvalidRecord, runFile, err)
	}
	for _, st := range r.Steps {
		if err := st.validate(); err != nil {
			return nil, err
		}
	}
	if err := r.Lanes.validate(); err != nil {
		return nil, err
	}
	return &r, nil
}

// VerifyReport is what Verify found. The run is intact when OK() is true.
type VerifyReport struct {
	ID string `json:"id"`
	// Checked counts listed files whose hash matched.
	Checked int `json:"checked"`
	// Missing: listed in SHA256SUMS but absent (SHA256SUMS itself when it
	// is gone).
	Missing []string `json:"missing,omitempty"`
	// Changed: present but with a different hash, or no longer a regular file.
	Changed []string `json:"changed,omitempty"`
	// Extra: files in the run directory that SHA256SUMS does not list.
	Extra []string `json:"extra,omitempty"`
	// Malformed: SHA256SUMS lines that do not parse.
	Malformed []string `json:"malformed,omitempty"`
	// RecordedArtifactID is history's digest of SHA256SUMS ("" when the run
	// is not in history); ActualArtifactID is the digest now. They differ
	// when SHA256SUMS itself was rewritten.
	RecordedArtifactID string `json:"recorded_artifact_id,omitempty"`
	ActualArtifactID   string `json:"actual_artifact_id,omitempty"`
}

// OK reports whether nothing was missing, changed, extra or malformed, and
// SHA256SUMS still has the digest history recorded.
func (r VerifyReport) OK() bool {
	return len(r.Missing) == 0 && len(r.Changed) == 0 && len(r.Extra) == 0 && len(r.Malformed) == 0 &&
		r.RecordedArtifactID != "" && r.RecordedArtifactID == r.ActualArtifactID
}

// Problems lists the findings one per line ("changed: evidence/x.json"),
// in a stable order; empty when OK.
func (r VerifyReport) Problems() []string {
	var out []string
	for _, m := range r.Missing {
		out = append(out, "missing: "+m)
	}
	for _, c := range r.Changed {
		out = append(out, "changed: "+c)
	}
	for _, e := range r.Extra {
		out = append(out, "extra: "+e)
	}
	for _, m := range r.Malformed {
		out = append(out, "malformed SHA256SUMS line: "+m)
	}
	switch {
	case r.RecordedArtifactID == "":
		out = append(out, "not in history: the run never finished, or history lost its row")
	case r.ActualArtifactID != "" && r.RecordedArtifactID != r.ActualArtifactID:
		out = append(out, fmt.Sprintf("changed: %s (digest %s, history recorded %s)", sumsFile, short(r.ActualArtifactID), short(r.RecordedArtifactID)))
	}
	return out
}

func short(h string) string {
	if len(h) > 12 {
		return h[:12]
	}
	return h
}

// Verify recomputes the hash of every file SHA256SUMS lists, and reports
// missing, changed and extra files and a rewritten SHA256SUMS. The error is
// non-nil only when the run cannot be examined at all (ErrRunNotFound, I/O).
func (s *Store) Verify(id string) (VerifyReport, error) {
	rep := VerifyReport{ID: id}
	if err := checkRunID(id); err != nil {
		return rep, err
	}
	dir := s.RunDir(id)
	if _, err := os.Stat(dir); errors.Is(err, fs.ErrNotExist) {
		return rep, fmt.Errorf("%w: %s", ErrRunNotFound, id)
	}
	if row, err := s.historyRow(id); err == nil {
		rep.RecordedArtifactID = row.ArtifactID
	} else if !errors.Is(err, ErrRunNotFound) {
		return rep, err
	}
	sums, err := os.ReadFile(filepath.Join(dir, sumsFile))
	listed := map[string]bool{}
	switch {
	case errors.Is(err, fs.ErrNotExist):
		rep.Missing = append(rep.Missing, sumsFile)
	case err != nil:
		return rep, fmt.Errorf("results: verify %s: %w", id, err)
	default:
		d := sha256.Sum256(sums)
		rep.ActualArtifactID = hex.EncodeToString(d[:])
		entries, bad := ParseSums(sums)
		rep.Malformed = bad
		for _, e := range entries {
			listed[e.Path] = true
			got, err := hashRegular(filepath.Join(dir, filepath.FromSlash(e.Path)))
			switch {
			case errors.Is(err, fs.ErrNotExist):
				rep.Missing = append(rep.Missing, e.Path)
			case errors.Is(err, errNotRegular):
				rep.Changed = append(rep.Changed, e.Path)
			case err != nil:
				return rep, fmt.Errorf("results: verify %s: %w", id, err)
			case got != e.SHA256:
				rep.Changed = append(rep.Changed, e.Path)
			default:
				rep.Checked++
			}
		}
	}
	err = filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			return nil
		}
		rel, err := filepath.Rel(dir, p)
		if err != nil {
			return err
		}
		rel = filepath.ToSlash(rel)
		if rel != sumsFile && !listed[rel] {
			rep.Extra = append(rep.Extra, rel)
		}
		return nil
	})
	if err != nil {
		return rep, fmt.Errorf("results: verify %s: %w", id, err)
	}
	sort.Strings(rep.Missing)
	sort.Strings(rep.Changed)
	sort.Strings(rep.Extra)
	return rep, nil
}

var errNotRegular = errors.New("not a regular file")

// hashRegular hashes a regular file without following a symlink put in its
// place.
func hashRegular(p string) (string, error) {
	st, err := os.Lstat(p)
	if err != nil {
		return "", err
	}
	if !st.Mode().IsRegular() {
		return "", errNotRegular
	}
	f, err := os.Open(p)
	if err != nil {
		return "", err
	}
	defer f.Close()
	h := sha256.New()
	if _, err := io.Copy(h, f); err != nil {
		return "", err
	}
	return hex.EncodeToString(h.Sum(nil)), nil
}

// SumEntry is one SHA256SUMS line.
type SumEntry struct {
	Path   string // relative to the run directory, slash-separated
	SHA256 string // lowercase hex
}

// formatSums writes entries in sha256sum's text format: "<hex>  <path>\n".
func formatSums(entries []SumEntry) []byte {
	sorted := slices.Clone(entries)
	sort.Slice(sorted, func(i, j int) bool { return sorted[i].Path < sorted[j].Path })
	var b bytes.Buffer
	for _, e := range sorted {
		fmt.Fprintf(&b, "%s  %s\n", e.SHA256, e.Path)
	}
	return b.Bytes()
}

// ParseSums parses SHA256SUMS content in sha256sum format ("<64 hex>
// <space or *><path>" per line). Lines that do not parse, repeat a path, or
// name a path that is absolute or climbs out of the run directory are
// returned as malformed (quoted), never followed.
func ParseSums(data []byte) (entries []SumEntry, malformed []string) {
	seen := map[string]bool{}
	for _, line := range strings.Split(string(data), "\n") {
		line = strings.TrimSuffix(line, "\r")
		if line == "" {
			continue
		}
		if len(line) < 67 || line[64] != ' ' || (line[65] != ' ' && line[65] != '*') {
			malformed = append(malformed, fmt.Sprintf("%q", truncate(line)))
			continue
		}
		sum, p := line[:64], line[66:]
		if strings.Trim(sum, "0123456789abcdef") != "" || !safeRel(p) || seen[p] {
			malformed = append(malformed, fmt.Sprintf("%q", truncate(line)))
			continue
		}
		seen[p] = true
		entries = append(entries, SumEntry{Path: p, SHA256: sum})
	}
	return entries, malformed
}

// safeRel accepts a clean, relative, slash-separated path inside the run
// directory.
func safeRel(p string) bool {
	if p == "" || strings.ContainsAny(p, "\\\x00") || strings.HasPrefix(p, "/") || path.Clean(p) != p {
		return false
	}
	return p != ".." && !strings.HasPrefix(p, "../")
}

func truncate(s string) string {
	if len(s) > 120 {
		return s[:120] + "…"
	}
	return s
}
