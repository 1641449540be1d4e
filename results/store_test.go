package results

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// tickClock returns a clock that starts at a fixed instant and advances one
// second per call, so stored times are deterministic.
func tickClock() func() time.Time {
	var mu sync.Mutex
	t := time.Date(2026, 11, 30, 1, 0, 0, 0, time.UTC)
	return func() time.Time {
		mu.Lock()
		defer mu.Unlock()
		t = t.Add(time.Second)
		return t
	}
}

var simTuple = Tuple{Engine: "vllm", EngineVersion: "0.31.0", Profile: "qwen3-0.6b", Model: "Qwen/Qwen3-0.6B",
	Topology: "converged", Mode: "exact", Launcher: LauncherSim, SimulatedWorkers: true, Workers: 3}

// writeRun records a small PASS run with two evidence files.
func writeRun(t *testing.T, s *Store, id string) RunSummary {
	t.Helper()
	w, err := s.NewRunWithID(id, simTuple)
	if err != nil {
		t.Fatalf("NewRunWithID(%s) error = %v", id, err)
	}
	t0 := time.Date(2026, 11, 30, 1, 0, 0, 0, time.UTC)
	receipt, err := w.AddEvidence("w1/receipt.json", []byte(`{"nonce":"abc"}`))
	if err != nil {
		t.Fatal(err)
	}
	readback, err := w.AddEvidence("rule-readback.json", []byte(`{"name":"qwen-pool"}`))
	if err != nil {
		t.Fatal(err)
	}
	steps := []Step{
		{Name: "select tuple", Status: StatusPass, Started: t0, Ended: t0.Add(time.Millisecond)},
		{Name: "prove direct inference", Status: StatusPass, Started: t0, Ended: t0.Add(2 * time.Second), Evidence: []string{receipt}},
		{Name: "read back", Status: StatusPass, Started: t0, Ended: t0.Add(time.Second), Evidence: []string{readback}},
	}
	for _, st := range steps {
		if err := w.RecordStep(st); err != nil {
			t.Fatalf("RecordStep(%s) error = %v", st.Name, err)
		}
	}
	if err := w.SetLanes(Lanes{DirectWorker: StatusPass, GatewayDelivery: StatusPass, RoutingEvidence: StatusPass, HashParity: StatusPass, CacheReuse: StatusPass}); err != nil {
		t.Fatal(err)
	}
	row, err := w.Finish()
	if err != nil {
		t.Fatalf("Finish() error = %v", err)
	}
	return row
}

func TestWriterRoundTrip(t *testing.T) {
	s, err := Open(t.TempDir(), WithClock(tickClock()))
	if err != nil {
		t.Fatal(err)
	}
	row := writeRun(t, s, "run-1")
	if row.Verdict != StatusPass {
		t.Errorf("Finish() verdict = %s; want PASS", row.Verdict)
	}
	if row.Lanes.Performance != StatusNotRun {
		t.Errorf("unset performance lane = %q; want NOT_RUN", row.Lanes.Performance)
	}
	if row.CaseID != "vllm-qwen3-0.6b-exact-converged" {
		t.Errorf("CaseID = %q; want vllm-qwen3-0.6b-exact-converged", row.CaseID)
	}
	if len(row.ArtifactID) != 64 {
		t.Errorf("ArtifactID = %q; want a sha256 hex digest", row.ArtifactID)
	}

	got, err := s.Get("run-1")
	if err != nil {
		t.Fatalf("Get() error = %v", err)
	}
	if got.Tuple != simTuple {
		t.Errorf("Get().Tuple = %+v; want %+v", got.Tuple, simTuple)
	}
	if len(got.Steps) != 3 || got.Steps[1].Evidence[0] != "evidence/w1/receipt.json" {
		t.Errorf("Get().Steps = %+v; want 3 steps citing evidence/w1/receipt.json", got.Steps)
	}
	wantPaths := []string{"evidence/rule-readback.json", "evidence/w1/receipt.json"}
	var paths []string
	for _, a := range got.Artifacts {
		paths = append(paths, a.Path)
	}
	if !slices.Equal(paths, wantPaths) {
		t.Errorf("artifacts = %v; want %v", paths, wantPaths)
	}
	if got.ArtifactID != row.ArtifactID {
		t.Errorf("Get().ArtifactID = %s; want %s", got.ArtifactID, row.ArtifactID)
	}
	if gs := got.Summary(); !reflect.DeepEqual(gs, row) {
		t.Errorf("Get().Summary() = %+v;\nwant %+v", gs, row)
	}
	if !got.Started.Equal(time.Date(2026, 11, 30, 1, 0, 1, 0, time.UTC)) || !got.Ended.After(got.Started) {
		t.Errorf("run times = %v..%v; want the injected clock", got.Started, got.Ended)
	}

	rows, err := s.List()
	if err != nil {
		t.Fatal(err)
	}
	if len(rows) != 1 || !reflect.DeepEqual(rows[0], row) {
		t.Errorf("List() = %+v; want [%+v]", rows, row)
	}
	rep, err := s.Verify("run-1")
	if err != nil {
		t.Fatal(err)
	}
	if !rep.OK() || rep.Checked != 3 {
		t.Errorf("Verify() = %+v (problems %v); want OK with 3 files checked", rep, rep.Problems())
	}
}

// TestSHA256SUMSIsSha256sumCompatible checks the file with the coreutils
// tool itself when the machine has it (it does on every Linux CI image).
func TestSHA256SUMSIsSha256sumCompatible(t *testing.T) {
	s, err := Open(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	writeRun(t, s, "run-1")
	data, err := os.ReadFile(filepath.Join(s.RunDir("run-1"), "SHA256SUMS"))
	if err != nil {
		t.Fatal(err)
	}
	entries, bad := ParseSums(data)
	if len(bad) != 0 || len(entries) != 3 {
		t.Fatalf("ParseSums() = %d entries, malformed %v; want 3, none", len(entries), bad)
	}
	tool, err := exec.LookPath("sha256sum")
	if err != nil {
		t.Logf("sha256sum not installed; checked the format with ParseSums only")
		return
	}
	cmd := exec.Command(tool, "--check", "--strict", "SHA256SUMS")
	cmd.Dir = s.RunDir("run-1")
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("sha256sum --check: %v\n%s", err, out)
	}
	if n := strings.Count(string(out), ": OK"); n != 3 {
		t.Errorf("sha256sum --check reported %d OK files; want 3:\n%s", n, out)
	}
}

func TestVerifyCatchesTampering(t *testing.T) {
	tests := []struct {
		name   string
		tamper func(t *testing.T, dir string)
		want   []string // substrings of Problems()
	}{
		{"tampered evidence", func(t *testing.T, dir string) {
			writeFile(t, filepath.Join(dir, "evidence/w1/receipt.json"), `{"nonce":"forged"}`)
		}, []string{"changed: evidence/w1/receipt.json"}},
		{"deleted evidence", func(t *testing.T, dir string) {
			if err := os.Remove(filepath.Join(dir, "evidence/rule-readback.json")); err != nil {
				t.Fatal(err)
			}
		}, []string{"missing: evidence/rule-readback.json"}},
		{"added evidence", func(t *testing.T, dir string) {
			writeFile(t, filepath.Join(dir, "evidence/w2/receipt.json"), `{}`)
		}, []string{"extra: evidence/w2/receipt.json"}},
		{"edited run.json", func(t *testing.T, dir string) {
			p := filepath.Join(dir, "run.json")
			data, _ := os.ReadFile(p)
			writeFile(t, p, strings.Replace(string(data), `"verdict": "PASS"`, `"verdict": "FAIL"`, 1))
		}, []string{"changed: run.json"}},
		{"rewritten SHA256SUMS after tampering", func(t *testing.T, dir string) {
			// A forger who edits evidence and recomputes SHA256SUMS still
			// changes the run's artifact id, which history recorded.
			ev := filepath.Join(dir, "evidence/w1/receipt.json")
			writeFile(t, ev, `{"nonce":"forged"}`)
			sums, _ := os.ReadFile(filepath.Join(dir, "SHA256SUMS"))
			entries, _ := ParseSums(sums)
			for i := range entries {
				if entries[i].Path == "evidence/w1/receipt.json" {
					h, _ := hashRegular(ev)
					entries[i].SHA256 = h
				}
			}
			writeFile(t, filepath.Join(dir, "SHA256SUMS"), string(formatSums(entries)))
		}, []string{"changed: SHA256SUMS"}},
		{"deleted SHA256SUMS", func(t *testing.T, dir string) {
			if err := os.Remove(filepath.Join(dir, "SHA256SUMS")); err != nil {
				t.Fatal(err)
			}
		}, []string{"missing: SHA256SUMS", "extra: run.json"}},
		{"symlink in place of evidence", func(t *testing.T, dir string) {
			p := filepath.Join(dir, "evidence/rule-readback.json")
			target := filepath.Join(t.TempDir(), "same.json")
			data, _ := os.ReadFile(p)
			writeFile(t, target, string(data))
			if err := os.Remove(p); err != nil {
				t.Fatal(err)
			}
			if err := os.Symlink(target, p); err != nil {
				t.Fatal(err)
			}
		}, []string{"changed: evidence/rule-readback.json"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			s, err := Open(t.TempDir())
			if err != nil {
				t.Fatal(err)
			}
			writeRun(t, s, "run-1")
			tc.tamper(t, s.RunDir("run-1"))
			rep, err := s.Verify("run-1")
			if err != nil {
				t.Fatalf("Verify() error = %v", err)
			}
			if rep.OK() {
				t.Fatalf("Verify().OK() = true after %s; want false", tc.name)
			}
			problems := strings.Join(rep.Problems(), "\n")
			for _, w := range tc.want {
				if !strings.Contains(problems, w) {
					t.Errorf("Problems() =\n%s\nwant a line containing %q", problems, w)
				}
			}
		})
	}
}

func writeFile(t *testing.T, p, content string) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(p, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
}

func TestVerifyUnknownRun(t *testing.T) {
	s, _ := Open(t.TempDir())
	if _, err := s.Verify("nope"); !errors.Is(err, ErrRunNotFound) {
		t.Errorf("Verify(nope) error = %v; want ErrRunNotFound", err)
	}
	if _, err := s.Get("nope"); !errors.Is(err, ErrRunNotFound) {
		t.Errorf("Get(nope) error = %v; want ErrRunNotFound", err)
	}
	if _, err := s.Get("../etc"); !errors.Is(err, ErrBadRunID) {
		t.Errorf("Get(../etc) error = %v; want ErrBadRunID", err)
	}
}

func TestAppendOnly(t *testing.T) {
	root := t.TempDir()
	s, err := Open(root)
	if err != nil {
		t.Fatal(err)
	}
	writeRun(t, s, "run-1")
	history := filepath.Join(root, "history.jsonl")
	first, err := os.ReadFile(history)
	if err != nil {
		t.Fatal(err)
	}

	if _, err := s.NewRunWithID("run-1", simTuple); !errors.Is(err, ErrRunExists) {
		t.Errorf("second NewRunWithID(run-1) error = %v; want ErrRunExists", err)
	}
	// Even with its directory gone, history still owns the id.
	if err := os.RemoveAll(s.RunDir("run-1")); err != nil {
		t.Fatal(err)
	}
	if _, err := s.NewRunWithID("run-1", simTuple); !errors.Is(err, ErrRunExists) {
		t.Errorf("NewRunWithID(run-1) after deleting its dir: error = %v; want ErrRunExists", err)
	}
	// An unfinished run's directory also claims the id.
	if _, err := s.NewRunWithID("run-2", simTuple); err != nil {
		t.Fatal(err)
	}
	if _, err := s.NewRunWithID("run-2", simTuple); !errors.Is(err, ErrRunExists) {
		t.Errorf("NewRunWithID(run-2) while open: error = %v; want ErrRunExists", err)
	}

	writeRun(t, s, "run-3")
	after, err := os.ReadFile(history)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.HasPrefix(after, first) {
		t.Errorf("history was rewritten:\nbefore %q\nafter  %q", first, after)
	}
	rows, err := s.List()
	if err != nil {
		t.Fatal(err)
	}
	var ids []string
	for _, r := range rows {
		ids = append(ids, r.ID)
	}
	if want := []string{"run-1", "run-3"}; !slices.Equal(ids, want) {
		t.Errorf("List() ids = %v; want %v (run-2 never finished)", ids, want)
	}
	if _, err := s.Get("run-2"); !errors.Is(err, ErrRunIncomplete) {
		t.Errorf("Get(run-2) error = %v; want ErrRunIncomplete", err)
	}
}

func TestNewRunGeneratesUniqueIDs(t *testing.T) {
	s, _ := Open(t.TempDir(), WithClock(func() time.Time { return time.Date(2026, 11, 30, 1, 2, 3, 0, time.UTC) }))
	a, err := s.NewRun(simTuple)
	if err != nil {
		t.Fatal(err)
	}
	b, err := s.NewRun(simTuple)
	if err != nil {
		t.Fatal(err)
	}
	if a.ID() == b.ID() || !strings.HasPrefix(a.ID(), "20261130T010203Z-vllm-qwen3-0.6b-exact-") {
		t.Errorf("NewRun ids = %q, %q; want distinct ids with the time/engine/profile/mode prefix", a.ID(), b.ID())
	}
}

func TestEvidenceNamesSanitised(t *testing.T) {
	tests := []struct {
		name    string
		in      string
		want    string
		wantErr error
	}{
		{"parent escape", "../x", "evidence/x", nil},
		{"deep parent escape", "../../../../etc/passwd", "evidence/etc/passwd", nil},
		{"absolute path", "/etc/shadow", "evidence/etc/shadow", nil},
		{"NUL byte", "a\x00b.json", "evidence/a_b.json", nil},
		{"windows separators", `..\..\win.ini`, "evidence/win.ini", nil},
		{"dot dot inside", "dir/../../x", "evidence/dir/x", nil},
		{"hidden file", ".bashrc", "evidence/bashrc", nil},
		{"spaces and unicode", "worker 1/réceipt.json", "evidence/worker_1/r__ceipt.json", nil},
		{"plain nested", "w1/receipt.json", "evidence/w1/receipt.json", nil},
		{"only dots", "../..", "", ErrBadEvidenceName},
		{"empty", "", "", ErrBadEvidenceName},
		{"only slashes", "///", "", ErrBadEvidenceName},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			s, err := Open(t.TempDir())
			if err != nil {
				t.Fatal(err)
			}
			w, err := s.NewRunWithID("run-1", simTuple)
			if err != nil {
				t.Fatal(err)
			}
			got, err := w.AddEvidence(tc.in, []byte("data"))
			if tc.wantErr != nil {
				if !errors.Is(err, tc.wantErr) {
					t.Fatalf("AddEvidence(%q) error = %v; want %v", tc.in, err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatalf("AddEvidence(%q) error = %v", tc.in, err)
			}
			if got != tc.want {
				t.Errorf("AddEvidence(%q) = %q; want %q", tc.in, got, tc.want)
			}
			full := filepath.Join(w.Dir(), filepath.FromSlash(got))
			rel, err := filepath.Rel(filepath.Join(w.Dir(), "evidence"), full)
			if err != nil || strings.HasPrefix(rel, "..") {
				t.Errorf("evidence %q landed outside the evidence dir (rel %q)", full, rel)
			}
			if data, err := os.ReadFile(full); err != nil || string(data) != "data" {
				t.Errorf("reading %s = %q, %v; want \"data\"", full, data, err)
			}
			// Nothing may appear in the store root besides runs/.
			entries, _ := os.ReadDir(s.Root())
			for _, e := range entries {
				if e.Name() != "runs" {
					t.Errorf("unexpected %s in the store root", e.Name())
				}
			}
		})
	}
}

func TestEvidenceIsWriteOnce(t *testing.T) {
	s, _ := Open(t.TempDir())
	w, _ := s.NewRunWithID("run-1", simTuple)
	if _, err := w.AddEvidence("a.json", []byte("1")); err != nil {
		t.Fatal(err)
	}
	if _, err := w.AddEvidence("./a.json", []byte("2")); !errors.Is(err, ErrEvidenceExists) {
		t.Errorf("second AddEvidence(a.json) error = %v; want ErrEvidenceExists", err)
	}
}

func TestRecordStepValidation(t *testing.T) {
	tests := []struct {
		name string
		step Step
		want string
	}{
		{"no name", Step{Status: StatusPass}, "step name must be set"},
		{"zero status", Step{Name: "x"}, "is not PASS"},
		{"lowercase status", Step{Name: "x", Status: "pass"}, "is not PASS"},
		{"blocked without code", Step{Name: "x", Status: StatusBlocked, Reason: "no docker"}, "BLOCKED needs a reason code"},
		{"code with spaces", Step{Name: "x", Status: StatusFail, ReasonCode: "not a token"}, "is not a token"},
		{"evidence not written", Step{Name: "x", Status: StatusPass, Evidence: []string{"evidence/forged.json"}}, "did not write"},
		{"ends before start", Step{Name: "x", Status: StatusPass, Started: time.Unix(10, 0), Ended: time.Unix(5, 0)}, "ended before it started"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			s, _ := Open(t.TempDir())
			w, _ := s.NewRunWithID("run-1", simTuple)
			err := w.RecordStep(tc.step)
			if !errors.Is(err, ErrInvalidRecord) || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("RecordStep() error = %v; want ErrInvalidRecord containing %q", err, tc.want)
			}
		})
	}
}

func TestTupleValidation(t *testing.T) {
	tests := []struct {
		name  string
		tuple func(Tuple) Tuple
		want  string
	}{
		{"sim launcher must be simulated", func(t Tuple) Tuple { t.SimulatedWorkers = false; return t }, "simulated_workers must be true"},
		{"unknown launcher", func(t Tuple) Tuple { t.Launcher = "k8s"; return t }, "launcher must be sim, docker or attach"},
		{"no engine", func(t Tuple) Tuple { t.Engine = ""; return t }, "tuple.engine must be set"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			s, _ := Open(t.TempDir())
			_, err := s.NewRunWithID("run-1", tc.tuple(simTuple))
			if !errors.Is(err, ErrInvalidRecord) || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("NewRunWithID() error = %v; want one containing %q", err, tc.want)
			}
		})
	}
}

func TestFinishTwice(t *testing.T) {
	s, _ := Open(t.TempDir())
	w, _ := s.NewRunWithID("run-1", simTuple)
	if _, err := w.Finish(); err != nil {
		t.Fatal(err)
	}
	if _, err := w.Finish(); !errors.Is(err, ErrFinished) {
		t.Errorf("second Finish() error = %v; want ErrFinished", err)
	}
	if _, err := w.AddEvidence("late.json", nil); !errors.Is(err, ErrFinished) {
		t.Errorf("AddEvidence after Finish error = %v; want ErrFinished", err)
	}
	rows, _ := s.List()
	if len(rows) != 1 || rows[0].Verdict != StatusNotRun {
		t.Errorf("a run with no steps: rows = %+v; want one NOT_RUN row", rows)
	}
}

func TestConcurrentWriters(t *testing.T) {
	s, _ := Open(t.TempDir())
	var wg sync.WaitGroup
	errs := make(chan error, 8)
	for i := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			w, err := s.NewRunWithID(fmt.Sprintf("run-%d", i), simTuple)
			if err != nil {
				errs <- err
				return
			}
			p, err := w.AddEvidence("e.json", []byte{byte(i)})
			if err == nil {
				err = w.RecordStep(Step{Name: "s", Status: StatusPass, Evidence: []string{p}})
			}
			if err == nil {
				_, err = w.Finish()
			}
			errs <- err
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Error(err)
		}
	}
	rows, err := s.List()
	if err != nil || len(rows) != 8 {
		t.Errorf("List() = %d rows, %v; want 8", len(rows), err)
	}
}

func TestVerdict(t *testing.T) {
	pass := Step{Name: "a", Status: StatusPass}
	tests := []struct {
		name  string
		steps []Step
		lanes Lanes
		want  Status
	}{
		{"all pass", []Step{pass, pass}, Lanes{}, StatusPass},
		{"skipped does not demote", []Step{pass, {Name: "b", Status: StatusSkipped}}, Lanes{}, StatusPass},
		{"fail wins over blocked", []Step{{Name: "a", Status: StatusBlocked, ReasonCode: "no_gpu"}, {Name: "b", Status: StatusFail}}, Lanes{}, StatusFail},
		{"blocked", []Step{pass, {Name: "b", Status: StatusBlocked, ReasonCode: "no_docker"}}, Lanes{}, StatusBlocked},
		{"not run never counts as pass", []Step{pass, {Name: "b", Status: StatusNotRun}}, Lanes{}, StatusNotRun},
		{"zero status is not run", []Step{pass, {Name: "b"}}, Lanes{}, StatusNotRun},
		{"only skipped", []Step{{Name: "a", Status: StatusSkipped}}, Lanes{}, StatusNotRun},
		{"no steps", nil, Lanes{}, StatusNotRun},
		{"failed lane", []Step{pass}, Lanes{HashParity: StatusFail}, StatusFail},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if got := Verdict(tc.steps, tc.lanes); got != tc.want {
				t.Errorf("Verdict() = %s; want %s", got, tc.want)
			}
		})
	}
}

func TestCountsOverall(t *testing.T) {
	tests := []struct {
		name string
		v    []Status
		want Status
	}{
		{"all pass", []Status{StatusPass, StatusPass}, StatusPass},
		{"pass and blocked", []Status{StatusPass, StatusBlocked}, StatusBlocked},
		{"fail beats blocked", []Status{StatusBlocked, StatusFail, StatusPass}, StatusFail},
		{"not run", []Status{StatusPass, StatusNotRun}, StatusNotRun},
		{"empty", nil, StatusNotRun},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			var rows []RunSummary
			for _, v := range tc.v {
				rows = append(rows, RunSummary{Verdict: v})
			}
			if got := Tally(rows).Overall(); got != tc.want {
				t.Errorf("Overall() = %s; want %s", got, tc.want)
			}
		})
	}
}

func TestParseHistory(t *testing.T) {
	good := `{"schema":"llmgw.results/v1","id":"r1","case_id":"c","tuple":{"engine":"vllm","engine_version":"","profile":"p","topology":"converged","mode":"rr","launcher":"sim","simulated_workers":true},"verdict":"PASS","lanes":{"direct_worker":"PASS","gateway_delivery":"PASS","routing_evidence":"PASS","hash_parity":"NOT_RUN","cache_reuse":"NOT_RUN","performance":"NOT_RUN"},"started":"2026-11-30T01:00:00Z","ended":"2026-11-30T01:00:01Z","artifact_id":"ab"}`
	tests := []struct {
		name    string
		data    string
		wantN   int
		wantErr string
	}{
		{"one row", good + "\n", 1, ""},
		{"torn last line ignored", good + "\n" + good[:40], 1, ""},
		{"blank lines", "\n" + good + "\n\n", 1, ""},
		{"corrupt middle line", good + "\n{bad\n" + good + "\n", 0, "history line 2"},
		{"unknown field", strings.Replace(good, `"id"`, `"idx":1,"id"`, 1) + "\n", 0, "unknown field"},
		{"hostile id", strings.Replace(good, `"id":"r1"`, `"id":"../../etc"`, 1) + "\n", 0, "invalid run id"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			rows, err := ParseHistory([]byte(tc.data))
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("ParseHistory() error = %v; want %q", err, tc.wantErr)
				}
				return
			}
			if err != nil || len(rows) != tc.wantN {
				t.Errorf("ParseHistory() = %d rows, %v; want %d", len(rows), err, tc.wantN)
			}
		})
	}
}

func TestParseSums(t *testing.T) {
	h := strings.Repeat("a", 64)
	tests := []struct {
		name          string
		data          string
		wantEntries   int
		wantMalformed int
	}{
		{"text mode", h + "  run.json\n", 1, 0},
		{"binary marker", h + " *run.json\n", 1, 0},
		{"crlf", h + "  run.json\r\n", 1, 0},
		{"absolute path", h + "  /etc/passwd\n", 0, 1},
		{"parent path", h + "  ../x\n", 0, 1},
		{"unclean path", h + "  evidence/../run.json\n", 0, 1},
		{"uppercase hex", strings.ToUpper(h) + "  run.json\n", 0, 1},
		{"short hash", "abc  run.json\n", 0, 1},
		{"repeated path", h + "  run.json\n" + h + "  run.json\n", 1, 1},
		{"one space", h + " run.json\n", 0, 1},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			e, bad := ParseSums([]byte(tc.data))
			if len(e) != tc.wantEntries || len(bad) != tc.wantMalformed {
				t.Errorf("ParseSums() = %d entries, %d malformed (%v); want %d, %d", len(e), len(bad), bad, tc.wantEntries, tc.wantMalformed)
			}
		})
	}
}

func FuzzParseSums(f *testing.F) {
	h := strings.Repeat("0", 64)
	f.Add([]byte(h + "  run.json\n" + h + "  evidence/a.json\n"))
	f.Add([]byte(h + " *../../x\n"))
	f.Add([]byte("garbage\x00\n\n"))
	f.Fuzz(func(t *testing.T, data []byte) {
		entries, _ := ParseSums(data)
		for _, e := range entries {
			if !safeRel(e.Path) || len(e.SHA256) != 64 {
				t.Fatalf("ParseSums accepted unsafe entry %+v", e)
			}
			if strings.HasPrefix(filepath.Clean(filepath.Join("run", e.Path)), "..") {
				t.Fatalf("entry %q escapes the run directory", e.Path)
			}
		}
	})
}

func FuzzParseHistory(f *testing.F) {
	f.Add([]byte(`{"schema":"llmgw.results/v1","id":"r1","verdict":"PASS"}` + "\n"))
	f.Add([]byte("{\n"))
	f.Add([]byte(`{"id":"../x"}` + "\n" + `{"id":"ok"}`))
	f.Fuzz(func(t *testing.T, data []byte) {
		rows, err := ParseHistory(data)
		if err != nil {
			return
		}
		for _, r := range rows {
			if checkRunID(r.ID) != nil {
				t.Fatalf("ParseHistory accepted run id %q", r.ID)
			}
		}
	})
}

func FuzzDecodeRun(f *testing.F) {
	s, _ := Open(f.TempDir())
	w, _ := s.NewRunWithID("seed", simTuple)
	_, _ = w.Finish()
	seed, _ := os.ReadFile(filepath.Join(s.RunDir("seed"), "run.json"))
	f.Add(seed)
	f.Add([]byte(`{"schema":"llmgw.results/v1","id":"x","steps":[{"name":"a","status":"BLOCKED"}]}`))
	f.Add([]byte(`[]`))
	f.Fuzz(func(t *testing.T, data []byte) {
		r, err := DecodeRun(data)
		if err != nil {
			return
		}
		for _, st := range r.Steps {
			if st.validate() != nil {
				t.Fatalf("DecodeRun accepted invalid step %+v", st)
			}
		}
	})
}

func FuzzCleanEvidenceName(f *testing.F) {
	for _, s := range []string{"../x", "/abs", "a\x00b", `..\..\x`, "w1/receipt.json", "..."} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, name string) {
		clean, err := CleanEvidenceName(name)
		if err != nil {
			return
		}
		if !safeRel(clean) || strings.Count(clean, "/") > 7 {
			t.Fatalf("CleanEvidenceName(%q) = %q: not a safe relative path", name, clean)
		}
		for _, c := range strings.Split(clean, "/") {
			if strings.HasPrefix(c, ".") || len(c) > 100 {
				t.Fatalf("CleanEvidenceName(%q) = %q: bad component %q", name, clean, c)
			}
		}
	})
}
