package cli

import (
	"context"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/llmgw/llmgw/gateway"
	"github.com/llmgw/llmgw/gateway/rule"
	"github.com/llmgw/llmgw/results"
	"github.com/llmgw/llmgw/runbook"
)

// TestCleanupTokenProtectedGateway: a rule a killed run left on a gateway
// that wants an admin token is removed with the token file (the ledger's
// own, or --admin-token-file), and without one the rule stays and the
// command says so instead of "nothing to clean up". An unreadable ledger is
// reported and does not stop the others.
func TestCleanupTokenProtectedGateway(t *testing.T) {
	const token = "s3cret-admin-token"
	gw, err := gateway.New(gateway.Config{Listen: "127.0.0.1:0", Admin: "127.0.0.1:0", AdminToken: token, StateDir: t.TempDir(), Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	if err := gw.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { gw.Close() })
	tokenFile := filepath.Join(t.TempDir(), "admin.token")
	if err := os.WriteFile(tokenFile, []byte(token+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	apply := func(name string) {
		t.Helper()
		r, err := rule.Decode([]byte("name: " + name + "\nmodel_name: " + name + "\nprobe: {disabled: true}\nendpoints:\n  - {endpointIP: 127.0.0.1, targetPort: 9}\n"))
		if err != nil {
			t.Fatal(err)
		}
		if _, err := gw.Apply(r, true); err != nil {
			t.Fatal(err)
		}
	}
	cases := []struct {
		name         string
		ledgerToken  string // TokenFile recorded in the ledger
		args         []string
		wantCode     ExitCode
		wantOut      string
		wantRuleGone bool
	}{
		{"no token anywhere: rule stays, not 'nothing'", "", nil, ExitError, "removed nothing", false},
		{"--admin-token-file", "", []string{"--admin-token-file", tokenFile}, ExitOK, "removed: 1 rules", true},
		{"token file recorded by the run", tokenFile, nil, ExitOK, "removed: 1 rules", true},
		{"unreadable token file", "", []string{"--admin-token-file", filepath.Join(t.TempDir(), "missing")}, ExitError, "removed nothing", false},
	}
	for i, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			name := "rb-token-" + string(rune('a'+i))
			apply(name)
			out := t.TempDir()
			runID := "20261201T010000Z-vllm-qwen3-0.6b-rr-tok00" + string(rune('a'+i))
			led, err := runbook.OpenLedger(out, runID, results.LauncherAttach)
			if err != nil {
				t.Fatal(err)
			}
			if err := led.Update(func(s *runbook.LedgerState) {
				s.Rules = append(s.Rules, runbook.OwnedRule{Admin: "http://" + gw.AdminAddr(), Name: name, TokenFile: tc.ledgerToken})
			}); err != nil {
				t.Fatal(err)
			}
			b, err := os.ReadFile(led.Path())
			if err != nil {
				t.Fatal(err)
			}
			if strings.Contains(string(b), token) {
				t.Fatalf("the ledger holds the token itself: %s", b)
			}
			code, stdout, stderr := runCLI(t, false, append([]string{"cleanup", "--run", runID, "--out", out}, tc.args...)...)
			if code != tc.wantCode || !strings.Contains(stdout, tc.wantOut) {
				t.Fatalf("exit %d, stdout %q, stderr %q; want exit %d and %q", code, stdout, stderr, tc.wantCode, tc.wantOut)
			}
			_, rerr := gw.Rule(name)
			if gone := rerr != nil; gone != tc.wantRuleGone {
				t.Errorf("rule gone = %v; want %v", gone, tc.wantRuleGone)
			}
		})
	}

	t.Run("unreadable ledger does not stop the others", func(t *testing.T) {
		apply("rb-token-all")
		out := t.TempDir()
		led, err := runbook.OpenLedger(out, "20261201T020000Z-vllm-qwen3-0.6b-rr-good00", results.LauncherAttach)
		if err != nil {
			t.Fatal(err)
		}
		if err := led.Update(func(s *runbook.LedgerState) {
			s.Rules = append(s.Rules, runbook.OwnedRule{Admin: "http://" + gw.AdminAddr(), Name: "rb-token-all", TokenFile: tokenFile})
		}); err != nil {
			t.Fatal(err)
		}
		bad := filepath.Join(filepath.Dir(led.Path()), "20261201T020000Z-broken.json")
		if err := os.WriteFile(bad, []byte("{not json"), 0o644); err != nil {
			t.Fatal(err)
		}
		code, stdout, stderr := runCLI(t, false, "cleanup", "--all", "--out", out, "--docker-host", "unix:///nonexistent/llmgw-test.sock")
		if code == ExitOK || !strings.Contains(stdout, "removed: 1 rules") || !strings.Contains(stderr, "unreadable ledger") {
			t.Errorf("exit %d, stdout %q, stderr %q; want a failure naming the unreadable ledger after removing the good one's rule", code, stdout, stderr)
		}
		if _, err := gw.Rule("rb-token-all"); err == nil {
			t.Errorf("the readable ledger's rule was not removed")
		}
	})
}
