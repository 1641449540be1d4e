package cli

import (
	"context"
	"encoding/xml"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/spf13/cobra"

	"github.com/llmgw/llmgw/results"
)

func TestNewCmdQualifyDefaults(t *testing.T) {
	cases := []struct {
		name string
		args []string
		want QualifyOptions
	}{
		{"defaults (modes per engine: none given)", nil, QualifyOptions{Engine: "all", Topologies: []string{"converged"}, Launcher: "sim", Out: defaultResultsDir(), Workers: 3}},
		{"lists", []string{"--engine", "sglang", "--profiles", "qwen3-0.6b,gemma-2-9b-it", "--modes", "exact", "--topology", "converged,pd", "--allow-blocked"},
			QualifyOptions{Engine: "sglang", Profiles: []string{"qwen3-0.6b", "gemma-2-9b-it"}, Modes: []string{"exact"}, Topologies: []string{"converged", "pd"}, Launcher: "sim", Out: defaultResultsDir(), Workers: 3, AllowBlocked: true}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			ios, _, _ := TestIO()
			var got *QualifyOptions
			cmd := newQualifyCmd(ios, func(_ *cobra.Command, o *QualifyOptions) error { got = o; return nil })
			cmd.SetArgs(append([]string{}, tc.args...)) // non-nil: cobra would read os.Args
			if err := cmd.ExecuteContext(context.Background()); err != nil {
				t.Fatal(err)
			}
			if got.Engine != tc.want.Engine || !slices.Equal(got.Profiles, tc.want.Profiles) || !slices.Equal(got.Modes, tc.want.Modes) ||
				!slices.Equal(got.Topologies, tc.want.Topologies) || got.Launcher != tc.want.Launcher || got.Out != tc.want.Out ||
				got.Workers != tc.want.Workers || got.AllowBlocked != tc.want.AllowBlocked {
				t.Errorf("options = %+v; want %+v", *got, tc.want)
			}
		})
	}
}

// Bad input is a usage error (exit 2) listing the valid values, and
// nothing is started: not even the results directory exists afterwards.
func TestQualifyBadInput(t *testing.T) {
	cases := []struct {
		name    string
		args    []string
		wantErr string
	}{
		{"unknown engine", []string{"--engine", "tgi"}, "valid: vllm, sglang, trtllm, llamacpp, or all"},
		{"unknown profile", []string{"--profiles", "qwen4"}, "exaone-3.5-7.8b-instruct, gemma-2-9b-it, llama-3.1-8b-instruct, qwen2.5-7b-instruct, qwen3-0.6b"},
		{"unknown mode", []string{"--modes", "rr,fast"}, "valid: rr, chwbl, exact"},
		{"unknown topology", []string{"--topology", "mesh"}, "valid: converged, pd"},
		{"unknown launcher", []string{"--launcher", "k8s"}, "valid: sim, docker, attach"},
		{"attach without endpoints", []string{"--launcher", "attach"}, "--endpoints"},
		{"bad endpoint", []string{"--launcher", "attach", "--endpoints", "nohost"}, "want host:port"},
		{"override without docker", []string{"--image-override", "sim=x:y"}, "--image-override needs --launcher docker"},
		{"bad log level", []string{"--log-level", "loud"}, "want debug, info, warn or error"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			out := filepath.Join(t.TempDir(), "results")
			code, _, errOut := runCLI(t, false, append([]string{"qualify", "--out", out}, tc.args...)...)
			if code != ExitUsage {
				t.Errorf("exit %d; want %d (stderr %q)", code, ExitUsage, errOut)
			}
			if !strings.Contains(errOut, tc.wantErr) {
				t.Errorf("stderr %q; want it to contain %q", errOut, tc.wantErr)
			}
			if _, err := os.Stat(out); !os.IsNotExist(err) {
				t.Errorf("results directory created for bad input (%v)", err)
			}
		})
	}
}

// End to end on sims: one PASS and one known-BLOCKED case. Without
// --allow-blocked the exit is 4, with it 0; the table says the workers
// are simulated, and the three exports exist (JUnit parses).
func TestQualifyExitCodesAndExports(t *testing.T) {
	cases := []struct {
		name     string
		extra    []string
		wantCode ExitCode
	}{
		{"blocked is exit 4", nil, ExitBlocked},
		{"allow blocked is exit 0", []string{"--allow-blocked"}, ExitOK},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			out := t.TempDir()
			args := append([]string{"qualify", "--engine", "trtllm", "--profiles", "qwen3-0.6b,gemma-2-9b-it", "--modes", "rr", "--out", out}, tc.extra...)
			code, stdout, errOut := runCLI(t, false, args...)
			if code != tc.wantCode {
				t.Fatalf("exit %d; want %d\nstdout %s\nstderr %s", code, tc.wantCode, stdout, errOut)
			}
			for _, want := range []string{"[1/2] trtllm-qwen3-0.6b-rr-converged ...", "[1/2] trtllm-qwen3-0.6b-rr-converged: PASS", "[2/2] trtllm-gemma-2-9b-it-rr-converged: BLOCKED architecture_unsupported"} {
				if !strings.Contains(errOut, want) {
					t.Errorf("progress on stderr lacks %q:\n%s", want, errOut)
				}
			}
			// Not a terminal: TSV rows on stdout, the counts and notes with
			// the messages.
			for _, want := range []string{"\tsimulated\t", "architecture_unsupported"} {
				if !strings.Contains(stdout, want) {
					t.Errorf("stdout lacks %q:\n%s", want, stdout)
				}
			}
			for _, want := range []string{"note: " + results.SimulatedNote, "2 runs: 1 PASS, 0 FAIL, 1 BLOCKED", "launcher: sim"} {
				if !strings.Contains(errOut, want) {
					t.Errorf("stderr lacks %q:\n%s", want, errOut)
				}
			}
			for _, ext := range []string{".md", ".json", ".junit.xml"} {
				m, _ := filepath.Glob(filepath.Join(out, "qualify-*"+ext))
				if len(m) != 1 {
					t.Fatalf("exports %s: %v", ext, m)
				}
				if ext == ".junit.xml" {
					b, err := os.ReadFile(m[0])
					if err != nil {
						t.Fatal(err)
					}
					var doc struct {
						Tests   int `xml:"tests,attr"`
						Skipped int `xml:"skipped,attr"`
					}
					if err := xml.Unmarshal(b, &doc); err != nil || doc.Tests != 2 || doc.Skipped != 1 {
						t.Errorf("junit: %v, tests %d skipped %d; want 2 and 1", err, doc.Tests, doc.Skipped)
					}
				}
			}
		})
	}
}

func TestQualifyCancelledBeforeStart(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	ios, _, errOut := TestIO()
	code := Main(ctx, []string{"qualify", "--engine", "vllm", "--profiles", "qwen3-0.6b", "--out", t.TempDir()}, ios)
	if code != ExitCancelled {
		t.Fatalf("exit %d; want %d (stderr %s)", code, ExitCancelled, errOut)
	}
}

func TestRunbookPD(t *testing.T) {
	cases := []struct {
		name     string
		args     []string
		wantCode ExitCode
		wantOut  string
	}{
		{"trtllm pass", []string{"--engine", "trtllm"}, ExitOK, "context_only then generation_only"},
		{"vllm kv-exact pass", []string{"--engine", "vllm", "--kv-exact", "--prefill", "2"}, ExitOK, "hash parity\tPASS"},
		{"llamacpp is a usage error", []string{"--engine", "llamacpp"}, ExitUsage, ""},
		{"blocked tuple", []string{"--engine", "trtllm", "--profile", "gemma-2-9b-it"}, ExitBlocked, "architecture_unsupported"},
		{"docker is blocked, not failed", []string{"--launcher", "docker"}, ExitBlocked, "launcher_no_pd_roles"},
		{"attach needs endpoints", []string{"--launcher", "attach"}, ExitUsage, ""},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			code, stdout, errOut := runCLI(t, false, append([]string{"runbook", "pd", "--out", t.TempDir()}, tc.args...)...)
			if code != tc.wantCode {
				t.Fatalf("exit %d; want %d\nstdout %s\nstderr %s", code, tc.wantCode, stdout, errOut)
			}
			if !strings.Contains(stdout, tc.wantOut) {
				t.Errorf("stdout lacks %q:\n%s", tc.wantOut, stdout)
			}
		})
	}
}
