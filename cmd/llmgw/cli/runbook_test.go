package cli

import (
	"context"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/google/shlex"
	"github.com/spf13/cobra"

	"github.com/llmgw/llmgw/gateway"
	"github.com/llmgw/llmgw/gateway/rule"
	"github.com/llmgw/llmgw/internal/golden"
	"github.com/llmgw/llmgw/results"
	"github.com/llmgw/llmgw/runbook"
)

// TestNewCmdRunbookConverged checks flag parsing (through runF, before any
// side effect).
func TestNewCmdRunbookConverged(t *testing.T) {
	cases := []struct {
		name string
		cli  string
		want RunbookOptions
	}{
		// Mode "" is the engine's default, resolved by converged.Options.
		{"defaults", "", RunbookOptions{Engine: "vllm", Profile: "qwen3-0.6b", Mode: "", Workers: 3, Launcher: "sim", Out: defaultResultsDir()}},
		{"engine mode workers", "--engine sglang --mode rr --workers 2 --out /tmp/x", RunbookOptions{Engine: "sglang", Profile: "qwen3-0.6b", Mode: "rr", Workers: 2, Launcher: "sim", Out: "/tmp/x"}},
		{"docker override", "--launcher docker --image-override sim=llmgw-sim:test", RunbookOptions{Engine: "vllm", Profile: "qwen3-0.6b", Mode: "", Workers: 3, Launcher: "docker", Out: defaultResultsDir(), ImageOverrides: []string{"sim=llmgw-sim:test"}}},
		{"attach", "--launcher attach --endpoints 127.0.0.1:1,127.0.0.1:2 --gateway http://127.0.0.1:8081", RunbookOptions{Engine: "vllm", Profile: "qwen3-0.6b", Mode: "", Workers: 3, Launcher: "attach", Out: defaultResultsDir(), Endpoints: "127.0.0.1:1,127.0.0.1:2", Gateway: "http://127.0.0.1:8081"}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			args, err := shlex.Split(tc.cli)
			if err != nil {
				t.Fatal(err)
			}
			ios, _, _ := TestIO()
			var got *RunbookOptions
			cmd := newRunbookCmd(ios, func(_ *cobra.Command, o *RunbookOptions) error { got = o; return nil })
			cmd.SetArgs(append([]string{"converged"}, args...))
			if err := cmd.ExecuteContext(context.Background()); err != nil {
				t.Fatal(err)
			}
			if got.Engine != tc.want.Engine || got.Profile != tc.want.Profile || got.Mode != tc.want.Mode || got.Workers != tc.want.Workers ||
				got.Launcher != tc.want.Launcher || got.Out != tc.want.Out || got.Endpoints != tc.want.Endpoints || got.Gateway != tc.want.Gateway ||
				strings.Join(got.ImageOverrides, ",") != strings.Join(tc.want.ImageOverrides, ",") {
				t.Errorf("options = %+v; want %+v", *got, tc.want)
			}
		})
	}
}

// TestRunbookConvergedBadInput: bad input is a usage error listing the
// valid values, and nothing is started (not even the results directory).
func TestRunbookConvergedBadInput(t *testing.T) {
	cases := []struct {
		name    string
		args    []string
		wantErr string
	}{
		{"unknown engine", []string{"--engine", "tgi"}, "valid: vllm, sglang, trtllm, llamacpp"},
		{"unknown profile", []string{"--profile", "qwen4"}, "exaone-3.5-7.8b-instruct, gemma-2-9b-it, llama-3.1-8b-instruct, qwen2.5-7b-instruct, qwen3-0.6b"},
		{"unknown mode", []string{"--mode", "random"}, "valid: rr, chwbl, exact"},
		{"unknown launcher", []string{"--launcher", "k8s"}, "valid launchers are sim, docker, attach"},
		{"endpoints without attach", []string{"--endpoints", "127.0.0.1:8000"}, "--endpoints needs --launcher attach"},
		{"attach without endpoints", []string{"--launcher", "attach"}, "needs --endpoints"},
		{"attach count conflict", []string{"--launcher", "attach", "--endpoints", "127.0.0.1:1,127.0.0.1:2", "--workers", "3"}, "--workers 3 conflicts with 2 --endpoints"},
		{"image override without docker", []string{"--image-override", "sim=x:y"}, "--image-override needs --launcher docker"},
		{"bad image override", []string{"--launcher", "docker", "--image-override", "tgi=x:y"}, "key must be sim, vllm, sglang, trtllm or llamacpp"},
		{"llamacpp has no kv-exact", []string{"--engine", "llamacpp", "--mode", "exact"}, "valid modes for llamacpp: rr, chwbl"},
		{"bad gateway url", []string{"--gateway", "localhost:8081"}, "want http://host:port"},
		{"zero workers", []string{"--workers", "0"}, "--workers 0: want 1..64"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			out := filepath.Join(t.TempDir(), "results")
			code, _, errOut := runCLI(t, false, append([]string{"runbook", "converged", "--out", out}, tc.args...)...)
			if code != ExitUsage {
				t.Fatalf("exit code = %d; want %d; stderr: %s", code, ExitUsage, errOut)
			}
			if !strings.Contains(errOut, tc.wantErr) {
				t.Errorf("stderr = %q; want it to contain %q", errOut, tc.wantErr)
			}
			if _, err := os.Stat(out); !os.IsNotExist(err) {
				t.Errorf("results directory created for rejected input (%v)", err)
			}
		})
	}
}

// TestRunbookConvergedExitCodes runs the command end to end on simulators.
func TestRunbookConvergedExitCodes(t *testing.T) {
	cancelled, cancel := context.WithCancel(context.Background())
	cancel()
	cases := []struct {
		name     string
		ctx      context.Context
		args     []string
		wantCode ExitCode
		wantOut  string
	}{
		{"all pass", context.Background(), nil, ExitOK, "\tPASS\t"},
		{"llamacpp chwbl pass", context.Background(), []string{"--engine", "llamacpp", "--mode", "chwbl", "--workers", "2"}, ExitOK, "\tPASS\t"},
		{"known blocked tuple", context.Background(), []string{"--engine", "trtllm", "--profile", "gemma-2-9b-it"}, ExitBlocked, "architecture_unsupported"},
		{"interrupted", cancelled, nil, ExitCancelled, "NOT_RUN"},
		{"attached worker never healthy", context.Background(), []string{"--launcher", "attach", "--endpoints", "127.0.0.1:1", "--mode", "rr", "--health-timeout", "300ms"}, ExitFail, "ENGINE_NOT_READY"},
		// BLOCKED either way: image_unavailable with a daemon, no_docker without.
		{"docker image absent", context.Background(), []string{"--launcher", "docker", "--image-override", "vllm=llmgw-absent-image:never"}, ExitBlocked, "launch workers\tBLOCKED"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			out := t.TempDir()
			ios, stdout, stderr := TestIO()
			code := Main(tc.ctx, append([]string{"runbook", "converged", "--out", out}, tc.args...), ios)
			if code != tc.wantCode {
				t.Fatalf("exit code = %d; want %d\nstdout:\n%s\nstderr:\n%s", code, tc.wantCode, stdout, stderr)
			}
			if !strings.Contains(stdout.String(), tc.wantOut) {
				t.Errorf("stdout = %s; want it to contain %q", stdout, tc.wantOut)
			}
			if !regexp.MustCompile(`\[(\d+)/(\d+)\] cleanup`).MatchString(stderr.String()) || !cleanupIsLast(stderr.String()) {
				t.Errorf("progress on stderr lacks the cleanup step:\n%s", stderr)
			}
			// Every run, whatever its verdict, is recorded and verifiable.
			s, err := results.Open(out)
			if err != nil {
				t.Fatal(err)
			}
			rows, err := s.List()
			if err != nil || len(rows) != 1 {
				t.Fatalf("history rows = %d (%v); want 1", len(rows), err)
			}
			if vr, err := s.Verify(rows[0].ID); err != nil || !vr.OK() {
				t.Errorf("verify: %v %v", err, vr.Problems())
			}
			if ls, err := runbook.Ledgers(out); err != nil || len(ls) != 0 {
				t.Errorf("ownership ledgers left: %d (%v)", len(ls), err)
			}
		})
	}
}

// TestCleanupCommandTwice leaves a ledger behind as a killed run would (a
// rule on a running gateway and a temporary directory), cleans it up, and
// cleans up again.
func TestCleanupCommandTwice(t *testing.T) {
	gw, err := gateway.New(gateway.Config{Listen: "127.0.0.1:0", Admin: "127.0.0.1:0", StateDir: t.TempDir(), Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	if err := gw.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { gw.Close() })
	apply := func(name string) {
		r, err := rule.Decode([]byte("name: " + name + "\nmodel_name: " + name + "\nprobe: {disabled: true}\nendpoints:\n  - {endpointIP: 127.0.0.1, targetPort: 9}\n"))
		if err != nil {
			t.Fatal(err)
		}
		if _, err := gw.Apply(r, true); err != nil {
			t.Fatal(err)
		}
	}
	apply("rb-owned")
	apply("someone-elses")
	out := t.TempDir()
	runID := "20261130T010000Z-vllm-qwen3-0.6b-exact-abc123"
	led, err := runbook.OpenLedger(out, runID, results.LauncherSim)
	if err != nil {
		t.Fatal(err)
	}
	tmp, err := os.MkdirTemp("", "llmgw-cleanup-test-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(tmp) })
	if err := led.Update(func(s *runbook.LedgerState) {
		s.Rules = append(s.Rules, runbook.OwnedRule{Admin: "http://" + gw.AdminAddr(), Name: "rb-owned"})
		s.Dirs = append(s.Dirs, tmp)
	}); err != nil {
		t.Fatal(err)
	}

	code, out1, errOut := runCLI(t, false, "cleanup", "--run", runID, "--out", out)
	if code != ExitOK || !strings.Contains(out1, "removed: 1 rules, 0 containers, 0 networks, 0 processes, 1 directories") {
		t.Fatalf("first cleanup: exit %d, stdout %q, stderr %q", code, out1, errOut)
	}
	if _, err := gw.Rule("rb-owned"); err == nil {
		t.Errorf("owned rule still present")
	}
	if _, err := gw.Rule("someone-elses"); err != nil {
		t.Errorf("a rule the run does not own was touched: %v", err)
	}
	if _, err := os.Stat(tmp); !os.IsNotExist(err) {
		t.Errorf("owned directory still present (%v)", err)
	}
	code, out2, errOut := runCLI(t, false, "cleanup", "--run", runID, "--out", out)
	if code != ExitOK || !strings.Contains(out2, "nothing to clean up") {
		t.Errorf("second cleanup: exit %d, stdout %q, stderr %q; want 0 and nothing to clean up", code, out2, errOut)
	}
	// --all walks every ledger; an unreachable docker daemon is reported,
	// not fatal, when no ledger lists a container.
	apply("rb-owned-2")
	led2, err := runbook.OpenLedger(out, runID+"-2", results.LauncherSim)
	if err != nil {
		t.Fatal(err)
	}
	if err := led2.Update(func(s *runbook.LedgerState) {
		s.Rules = append(s.Rules, runbook.OwnedRule{Admin: "http://" + gw.AdminAddr(), Name: "rb-owned-2"})
	}); err != nil {
		t.Fatal(err)
	}
	code, out3, errOut := runCLI(t, false, "cleanup", "--all", "--out", out, "--docker-host", "unix:///nonexistent/llmgw-test.sock")
	if code != ExitOK || !strings.Contains(out3, "removed: 1 rules") {
		t.Errorf("cleanup --all: exit %d, stdout %q, stderr %q", code, out3, errOut)
	}
	if _, err := gw.Rule("rb-owned-2"); err == nil {
		t.Errorf("owned rule rb-owned-2 still present after --all")
	}
	for _, bad := range [][]string{{"cleanup"}, {"cleanup", "--run", "x", "--all"}, {"cleanup", "--run", "../etc"}} {
		if code, _, _ := runCLI(t, false, append(bad, "--out", out)...); code != ExitUsage {
			t.Errorf("%v: exit %d; want %d", bad, code, ExitUsage)
		}
	}
}

// TestRunbookHelpGolden pins the runbook's documented steps, launchers and
// exit codes (the contract an operator reads).
func TestRunbookHelpGolden(t *testing.T) {
	t.Setenv("XDG_DATA_HOME", "/xdg-data") // the --out default, the same on every machine
	code, out, errOut := runCLI(t, false, "runbook", "converged", "--help")
	if code != ExitOK {
		t.Fatalf("exit %d: %s", code, errOut)
	}
	golden.File(t, "runbook-converged-help.txt", []byte(out))
}

// cleanupIsLast reports whether the progress shows the cleanup as the last
// step ([n/n] cleanup).
func cleanupIsLast(progress string) bool {
	for _, m := range regexp.MustCompile(`\[(\d+)/(\d+)\] cleanup`).FindAllStringSubmatch(progress, -1) {
		if m[1] == m[2] {
			return true
		}
	}
	return false
}
