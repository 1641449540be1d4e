package cli

import (
	"context"
	"encoding/json"
	"encoding/xml"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"go.yaml.in/yaml/v3"

	"github.com/llmgw/llmgw/internal/golden"
	"github.com/llmgw/llmgw/profiles"
	"github.com/llmgw/llmgw/results"
)

// runCLI runs llmgw with args on test streams.
func runCLI(t *testing.T, tty bool, args ...string) (ExitCode, string, string) {
	t.Helper()
	ios, out, errOut := TestIO()
	ios.OutTTY = tty
	code := Main(context.Background(), args, ios)
	return code, out.String(), errOut.String()
}

func TestProfilesCommand(t *testing.T) {
	tests := []struct {
		name     string
		args     []string
		tty      bool
		wantCode ExitCode
		golden   string   // compare stdout with testdata/<golden>
		wantOut  []string // or check substrings of stdout
		wantErr  string   // substring of stderr
	}{
		{name: "list tsv", args: []string{"profiles", "list"}, golden: "profiles-list.tsv"},
		{name: "list tty table", args: []string{"profiles", "list"}, tty: true, golden: "profiles-list.tty"},
		{name: "show yaml", args: []string{"profiles", "show", "qwen3-0.6b"}, golden: "profiles-show-qwen3-0.6b.yaml"},
		{name: "show one engine", args: []string{"profiles", "show", "gemma-2-9b-it", "--engine", "sglang", "--json"},
			wantOut: []string{`"engine": "sglang"`, `"image": "lmsysorg/sglang:v0.5.19"`, `"--page-size"`}},
		{name: "show blocked engine", args: []string{"profiles", "show", "gemma-2-9b-it", "--engine", "trtllm"},
			wantCode: ExitBlocked, wantErr: "BLOCKED (architecture_unsupported)"},
		{name: "unknown profile lists valid ids", args: []string{"profiles", "show", "qwen4"},
			wantCode: ExitUsage, wantErr: "exaone-3.5-7.8b-instruct, gemma-2-9b-it, llama-3.1-8b-instruct, qwen2.5-7b-instruct, qwen3-0.6b"},
		{name: "unknown engine lists valid engines", args: []string{"profiles", "show", "qwen3-0.6b", "--engine", "tgi"},
			wantCode: ExitUsage, wantErr: "vllm, sglang, trtllm, llamacpp"},
		{name: "show without id", args: []string{"profiles", "show"}, wantCode: ExitUsage, wantErr: "needs one profile ID"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			code, out, errOut := runCLI(t, tc.tty, tc.args...)
			if code != tc.wantCode {
				t.Fatalf("exit code = %d; want %d; stderr: %s", code, tc.wantCode, errOut)
			}
			if tc.golden != "" {
				golden.File(t, tc.golden, []byte(out))
			}
			for _, w := range tc.wantOut {
				if !strings.Contains(out, w) {
					t.Errorf("stdout = %s; want it to contain %q", out, w)
				}
			}
			if tc.wantErr != "" && !strings.Contains(errOut, tc.wantErr) {
				t.Errorf("stderr = %q; want it to contain %q", errOut, tc.wantErr)
			}
		})
	}
}

// TestProfilesShowRoundTrips checks that `profiles show` prints YAML and
// JSON that decode back to the catalog's profile.
func TestProfilesShowRoundTrips(t *testing.T) {
	cat, err := profiles.Load()
	if err != nil {
		t.Fatal(err)
	}
	for _, id := range cat.IDs() {
		t.Run(id, func(t *testing.T) {
			want, _ := cat.Get(id)
			_, out, _ := runCLI(t, false, "profiles", "show", id)
			var fromYAML profiles.Profile
			if err := yaml.Unmarshal([]byte(out), &fromYAML); err != nil {
				t.Fatalf("show output is not YAML: %v", err)
			}
			if err := fromYAML.Validate(); err != nil || fromYAML.ID != id {
				t.Errorf("YAML round trip: id %q, Validate() = %v; want %q, nil", fromYAML.ID, err, id)
			}
			_, out, _ = runCLI(t, false, "profiles", "show", id, "--json")
			var fromJSON profiles.Profile
			if err := json.Unmarshal([]byte(out), &fromJSON); err != nil {
				t.Fatalf("show --json output is not JSON: %v", err)
			}
			if fromJSON.Model != want.Model || fromJSON.Tokenizer != want.Tokenizer {
				t.Errorf("JSON round trip = %+v; want %+v", fromJSON.Model, want.Model)
			}
		})
	}
}

// seedResults writes two finished runs (one PASS on simulated workers, one
// BLOCKED) into a fresh results directory.
func seedResults(t *testing.T) (dir string, passID string) {
	t.Helper()
	dir = t.TempDir()
	clock := time.Date(2026, 11, 30, 1, 0, 0, 0, time.UTC)
	s, err := results.Open(dir, results.WithClock(func() time.Time { clock = clock.Add(time.Second); return clock }))
	if err != nil {
		t.Fatal(err)
	}
	w, err := s.NewRunWithID("run-pass", results.Tuple{Engine: "vllm", EngineVersion: "0.31.0", Profile: "qwen3-0.6b",
		Topology: "converged", Mode: "exact", Launcher: results.LauncherSim, SimulatedWorkers: true, Workers: 3})
	if err != nil {
		t.Fatal(err)
	}
	p, err := w.AddEvidence("w1/receipt.json", []byte(`{"nonce":"n1"}`))
	if err != nil {
		t.Fatal(err)
	}
	if err := w.RecordStep(results.Step{Name: "prove direct inference", Status: results.StatusPass, Started: clock, Ended: clock.Add(time.Second), Evidence: []string{p}}); err != nil {
		t.Fatal(err)
	}
	if err := w.SetLanes(results.Lanes{DirectWorker: results.StatusPass, GatewayDelivery: results.StatusPass}); err != nil {
		t.Fatal(err)
	}
	if _, err := w.Finish(); err != nil {
		t.Fatal(err)
	}
	w, err = s.NewRunWithID("run-blocked", results.Tuple{Engine: "trtllm", EngineVersion: "1.3.0rc29", Profile: "gemma-2-9b-it",
		Topology: "converged", Mode: "rr", Launcher: results.LauncherDocker})
	if err != nil {
		t.Fatal(err)
	}
	if err := w.RecordStep(results.Step{Name: "select tuple", Status: results.StatusBlocked, ReasonCode: "architecture_unsupported", Reason: "no Gemma2ForCausalLM"}); err != nil {
		t.Fatal(err)
	}
	if _, err := w.Finish(); err != nil {
		t.Fatal(err)
	}
	return dir, "run-pass"
}

func TestResultsCommand(t *testing.T) {
	dir, _ := seedResults(t)
	tests := []struct {
		name     string
		args     []string
		tty      bool
		wantCode ExitCode
		golden   string
		wantOut  []string
		wantErr  string
	}{
		{name: "list tsv", args: []string{"results", "list"}, golden: "results-list.tsv", wantErr: "note: " + results.SimulatedNote},
		{name: "list tty", args: []string{"results", "list"}, tty: true,
			wantOut: []string{"run-blocked", "architecture_unsupported", "2 runs: 1 PASS, 0 FAIL, 1 BLOCKED, 0 NOT_RUN", results.SimulatedNote}},
		{name: "show", args: []string{"results", "show", "run-pass"}, golden: "results-show.txt"},
		{name: "show json", args: []string{"results", "show", "run-blocked", "-o", "json"}, wantOut: []string{`"reason_code": "architecture_unsupported"`, `"artifact_id": "`}},
		{name: "show deprecated --json", args: []string{"results", "show", "run-blocked", "--json"}, wantOut: []string{`"reason_code": "architecture_unsupported"`},
			wantErr: "--json is deprecated; use -o json"},
		{name: "show yaml", args: []string{"results", "show", "run-blocked", "-o", "yaml"}, wantOut: []string{"reason_code: architecture_unsupported", "schema: llmgw.results/v1"}},
		{name: "verify json", args: []string{"results", "verify", "run-pass", "-o", "json"}, wantOut: []string{`"kind": "ResultsVerify"`, `"ok": true`}},
		{name: "-o and --json disagree", args: []string{"results", "list", "-o", "yaml", "--json"}, wantCode: ExitUsage, wantErr: "--json conflicts with -o yaml"},
		{name: "verify ok", args: []string{"results", "verify", "run-pass"}, wantOut: []string{"run run-pass: OK, 2 files match SHA256SUMS"}},
		{name: "export markdown", args: []string{"results", "export", "-o", "md"}, wantOut: []string{"| RUN | ENGINE |", "> " + results.SimulatedNote}},
		{name: "export one run as json", args: []string{"results", "export", "-o", "json", "--run", "run-blocked"},
			wantOut: []string{`"verdict": "BLOCKED"`, `"total": 1`}},
		{name: "export deprecated --format", args: []string{"results", "export", "--format", "markdown"}, wantOut: []string{"| RUN | ENGINE |"},
			wantErr: "--format is deprecated; use -o md"},
		{name: "unknown run", args: []string{"results", "show", "nope"}, wantCode: ExitUsage, wantErr: `unknown run "nope"`},
		{name: "hostile run id", args: []string{"results", "verify", "../../etc"}, wantCode: ExitUsage, wantErr: "unknown run"},
		{name: "bad format lists valid", args: []string{"results", "export", "-o", "xml"}, wantCode: ExitUsage, wantErr: "table, json, yaml, md, junit, tsv"},
		{name: "export unknown run", args: []string{"results", "export", "--run", "nope"}, wantCode: ExitUsage, wantErr: `unknown run "nope"`},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			code, out, errOut := runCLI(t, tc.tty, append(tc.args, "--out", dir)...)
			if code != tc.wantCode {
				t.Fatalf("exit code = %d; want %d; stderr: %s", code, tc.wantCode, errOut)
			}
			if tc.golden != "" {
				golden.File(t, tc.golden, []byte(out))
			}
			for _, w := range tc.wantOut {
				if !strings.Contains(out, w) {
					t.Errorf("stdout = %s; want it to contain %q", out, w)
				}
			}
			if tc.wantErr != "" && !strings.Contains(errOut, tc.wantErr) {
				t.Errorf("stderr = %q; want it to contain %q", errOut, tc.wantErr)
			}
		})
	}
}

func TestResultsVerifyNamesTamperedFile(t *testing.T) {
	tests := []struct {
		name   string
		tamper func(t *testing.T, runDir string)
		want   string
	}{
		{"tampered", func(t *testing.T, runDir string) {
			if err := os.WriteFile(filepath.Join(runDir, "evidence/w1/receipt.json"), []byte(`{"nonce":"forged"}`), 0o644); err != nil {
				t.Fatal(err)
			}
		}, "changed: evidence/w1/receipt.json"},
		{"deleted", func(t *testing.T, runDir string) {
			if err := os.Remove(filepath.Join(runDir, "evidence/w1/receipt.json")); err != nil {
				t.Fatal(err)
			}
		}, "missing: evidence/w1/receipt.json"},
		{"added", func(t *testing.T, runDir string) {
			if err := os.WriteFile(filepath.Join(runDir, "evidence/planted.json"), []byte(`{}`), 0o644); err != nil {
				t.Fatal(err)
			}
		}, "extra: evidence/planted.json"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			dir, id := seedResults(t)
			tc.tamper(t, filepath.Join(dir, "runs", id))
			code, out, errOut := runCLI(t, false, "results", "verify", id, "--out", dir)
			if code != ExitFail {
				t.Errorf("exit code = %d; want %d (ExitFail)", code, ExitFail)
			}
			if !strings.Contains(out, tc.want) || !strings.Contains(errOut, tc.want) {
				t.Errorf("stdout %q / stderr %q; want both to name %q", out, errOut, tc.want)
			}
		})
	}
}

func TestResultsExportJUnitFile(t *testing.T) {
	dir, _ := seedResults(t)
	file := filepath.Join(t.TempDir(), "results.xml")
	code, out, errOut := runCLI(t, false, "results", "export", "--format", "junit", "--file", file, "--out", dir)
	if code != ExitOK || out != "" {
		t.Fatalf("exit code = %d, stdout %q; want 0 and nothing on stdout; stderr: %s", code, out, errOut)
	}
	data, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	var doc struct {
		Tests   int `xml:"tests,attr"`
		Skipped int `xml:"skipped,attr"`
		Suite   struct {
			Cases []struct {
				Name string `xml:"name,attr"`
			} `xml:"testcase"`
		} `xml:"testsuite"`
	}
	if err := xml.Unmarshal(data, &doc); err != nil {
		t.Fatalf("exported JUnit does not parse: %v", err)
	}
	if doc.Tests != 2 || doc.Skipped != 1 || len(doc.Suite.Cases) != 2 {
		t.Errorf("JUnit tests/skipped/cases = %d/%d/%d; want 2/1/2", doc.Tests, doc.Skipped, len(doc.Suite.Cases))
	}
}

func TestResultsReadCommandsCreateNothing(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "absent")
	code, out, _ := runCLI(t, false, "results", "list", "--out", dir)
	if code != ExitOK || !strings.HasPrefix(out, "RUN\tENGINE") {
		t.Errorf("list on a missing dir = %d, %q; want 0 and a header", code, out)
	}
	if code, _, _ := runCLI(t, false, "results", "verify", "x", "--out", dir); code != ExitUsage {
		t.Errorf("verify on a missing dir: exit %d; want %d", code, ExitUsage)
	}
	if _, err := os.Stat(dir); !os.IsNotExist(err) {
		t.Errorf("reading commands created %s (stat error %v)", dir, err)
	}
}

// TestResultsReportCommand: results report writes a page per named run
// (or every run with --all) and refuses what it cannot do with a reason.
func TestResultsReportCommand(t *testing.T) {
	dir, _ := seedResults(t)
	foreign := t.TempDir()
	if err := os.WriteFile(filepath.Join(foreign, "mine.txt"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name      string
		args      []string
		site      string // "" = a fresh directory
		wantCode  ExitCode
		wantErr   string
		wantPages []string
	}{
		{name: "all", args: []string{"--all"}, wantPages: []string{"index.html", "trends.html", "runs/run-pass.html", "runs/run-blocked.html"}},
		{name: "one run", args: []string{"run-blocked"}, wantPages: []string{"index.html", "runs/run-blocked.html"}},
		{name: "bench", args: []string{"--all", "--bench", filepath.Join("..", "..", "..", "results", "htmlreport", "testdata", "bench")}, wantPages: []string{"bench.html"}},
		{name: "neither runs nor --all", wantCode: ExitUsage, wantErr: "name the runs to report, or give --all"},
		{name: "both", args: []string{"--all", "run-pass"}, wantCode: ExitUsage, wantErr: "not both"},
		{name: "unknown run", args: []string{"nope"}, wantCode: ExitUsage, wantErr: `unknown run "nope"`},
		{name: "foreign directory", args: []string{"--all"}, site: foreign, wantCode: ExitUsage, wantErr: "holds no earlier report"},
		{name: "bench without a report", args: []string{"--all", "--bench", dir}, wantCode: ExitUsage, wantErr: "no benchmark report"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			site := tc.site
			if site == "" {
				site = filepath.Join(t.TempDir(), "site")
			}
			args := append([]string{"results", "report", "--html", site, "--out", dir}, tc.args...)
			code, _, errOut := runCLI(t, false, args...)
			if code != tc.wantCode {
				t.Fatalf("exit code = %d; want %d; stderr: %s", code, tc.wantCode, errOut)
			}
			if tc.wantErr != "" && !strings.Contains(errOut, tc.wantErr) {
				t.Errorf("stderr = %q; want it to contain %q", errOut, tc.wantErr)
			}
			for _, p := range tc.wantPages {
				if _, err := os.Stat(filepath.Join(site, filepath.FromSlash(p))); err != nil {
					t.Errorf("page %s: %v", p, err)
				}
			}
			if tc.name == "one run" {
				if _, err := os.Stat(filepath.Join(site, "runs", "run-pass.html")); err == nil {
					t.Error("a run not named got a page")
				}
			}
		})
	}
}
