package cli

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/spf13/cobra"
	"github.com/valyala/fasthttp"

	"github.com/llmgw/llmgw/gateway"
)

func TestServeOptionsFromFlagsEnvAndConfig(t *testing.T) {
	cfgFile := filepath.Join(t.TempDir(), "llmgw.yaml")
	if err := os.WriteFile(cfgFile, []byte("listen: 127.0.0.1:9999\nmax-body-bytes: 1234\nadmin: 127.0.0.1:7777\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		name       string
		args       []string
		env        map[string]string
		wantListen string
		wantAdmin  string
		wantBody   int
		wantState  string
	}{
		{"defaults", nil, nil, "127.0.0.1:8080", "127.0.0.1:8081", 8 << 20, defaultStateDir()},
		{"flags", []string{"--listen", "127.0.0.1:1", "--state-dir", "/tmp/x"}, nil, "127.0.0.1:1", "127.0.0.1:8081", 8 << 20, "/tmp/x"},
		{"environment", nil, map[string]string{"LLMGW_LISTEN": "127.0.0.1:2", "LLMGW_STATE_DIR": "/tmp/y"}, "127.0.0.1:2", "127.0.0.1:8081", 8 << 20, "/tmp/y"},
		{"config file", []string{"--config", cfgFile}, nil, "127.0.0.1:9999", "127.0.0.1:7777", 1234, defaultStateDir()},
		{"flag beats env beats file", []string{"--config", cfgFile, "--listen", "127.0.0.1:3"}, map[string]string{"LLMGW_ADMIN": "127.0.0.1:4"}, "127.0.0.1:3", "127.0.0.1:4", 1234, defaultStateDir()},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			for k, v := range tc.env {
				t.Setenv(k, v)
			}
			ios, _, _ := TestIO()
			var got *ServeOptions
			root := NewRootCmd(ios)
			for _, c := range root.Commands() {
				if c.Name() == "serve" {
					root.RemoveCommand(c)
				}
			}
			root.AddCommand(newServeCmd(ios, func(_ *cobra.Command, o *ServeOptions) error { got = o; return nil }))
			root.SetArgs(append([]string{"serve"}, tc.args...))
			if err := root.ExecuteContext(context.Background()); err != nil {
				t.Fatal(err)
			}
			if got.Listen != tc.wantListen || got.Admin != tc.wantAdmin || got.MaxBodyBytes != tc.wantBody || got.StateDir != tc.wantState {
				t.Errorf("options = listen %q admin %q body %d state %q; want %q %q %d %q", got.Listen, got.Admin, got.MaxBodyBytes, got.StateDir, tc.wantListen, tc.wantAdmin, tc.wantBody, tc.wantState)
			}
		})
	}
}

func TestUsageErrors(t *testing.T) {
	cases := []struct {
		name string
		args []string
		want string
	}{
		{"unknown flag", []string{"serve", "--nope"}, "unknown flag"},
		{"bad log level", []string{"serve", "--log-level", "loud", "--state-dir", "/tmp/llmgw-cli-test"}, "--log-level"},
		{"rule apply without file", []string{"rule", "apply"}, "apply needs -f FILE"},
		{"rule get without name", []string{"rule", "get"}, "get needs the rule NAME"},
		{"rule bad admin url", []string{"rule", "list", "--admin", "localhost"}, "want a URL"},
		{"missing config file", []string{"serve", "--config", "/nonexistent/llmgw.yaml"}, "config file"},
		{"zero write timeout", []string{"serve", "--write-timeout", "0s", "--state-dir", "/tmp/llmgw-cli-test"}, "--write-timeout must be positive"},
		{"negative procs", []string{"serve", "--procs", "-1", "--state-dir", "/tmp/llmgw-cli-test"}, "--procs must be 0 (Go's choice) or positive"},
		{"zero buffer budget", []string{"serve", "--buffer-budget-bytes", "0", "--state-dir", "/tmp/llmgw-cli-test"}, "--buffer-budget-bytes must be positive"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			ios, _, errOut := TestIO()
			code := Main(context.Background(), tc.args, ios)
			if code != ExitUsage {
				t.Errorf("exit code = %d; want %d (usage); stderr: %s", code, ExitUsage, errOut)
			}
			if !strings.Contains(errOut.String(), tc.want) {
				t.Errorf("stderr = %q; want it to mention %q", errOut, tc.want)
			}
		})
	}
}

func TestRuleCommandsAgainstAGateway(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	backend := &fasthttp.Server{Handler: func(ctx *fasthttp.RequestCtx) { ctx.SetBodyString(`{}`) }}
	go backend.Serve(ln)
	defer backend.Shutdown()
	_, port, _ := net.SplitHostPort(ln.Addr().String())

	dir := t.TempDir()
	tokenFile := filepath.Join(dir, "token")
	os.WriteFile(tokenFile, []byte("tok\n"), 0o600)
	gw, err := gateway.New(gateway.Config{Listen: "127.0.0.1:0", Admin: "127.0.0.1:0", StateDir: filepath.Join(dir, "state"), AdminToken: "tok", Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	if err := gw.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	defer gw.Close()
	admin := "http://" + gw.AdminAddr()
	ruleFile := filepath.Join(dir, "rules.yaml")
	os.WriteFile(ruleFile, []byte(fmt.Sprintf(`- name: a
  model_name: ma
  endpoints: [{id: w1, endpointIP: 127.0.0.1, targetPort: %s}]
- name: b
  model_name: mb
  sel: 8
  endpoints: [{id: w1, endpointIP: 127.0.0.1, targetPort: %s}]
`, port, port)), 0o600)

	run := func(args ...string) (ExitCode, string, string) {
		ios, out, errOut := TestIO()
		code := Main(context.Background(), append(args, "--admin", admin, "--token-file", tokenFile), ios)
		return code, out.String(), errOut.String()
	}
	if code, _, errOut := run("rule", "apply", "-f", ruleFile); code != ExitOK {
		t.Fatalf("apply: %d %s", code, errOut)
	}
	code, out, _ := run("rule", "list")
	if code != ExitOK || !strings.HasPrefix(out, "NAME\tMODEL\tSEL") || !strings.Contains(out, "b\tmb\tchwbl (8)\t") {
		t.Errorf("list: %d\n%s", code, out)
	}
	code, out, _ = run("rule", "get", "b", "-o", "json")
	if code != ExitOK || !strings.Contains(out, `"load_factor": 1.25`) || !strings.Contains(out, `"kind": "Rule"`) {
		t.Errorf("get: %d\n%s", code, out)
	}
	if code, out, _ = run("rule", "drain", "b", "--endpoint", "w1", "-o", "json"); code != ExitOK || !strings.Contains(out, `"draining": true`) {
		t.Errorf("drain: %d\n%s", code, out)
	}
	// Its only endpoint drained, the rule says why it cannot serve.
	if code, out, _ = run("rule", "get", "b"); code != ExitOK || !strings.Contains(out, "not ready: no endpoint available (1 endpoints: 0 down, 1 draining, 0 breaker-open)") {
		t.Errorf("get a drained rule: %d\n%s", code, out)
	}
	if code, _, errOut := run("rule", "delete", "a", "--drain", "1s"); code != ExitOK {
		t.Errorf("delete: %d %s", code, errOut)
	}
	code, _, errOut := run("rule", "get", "a")
	if code != ExitError || !strings.Contains(errOut, "rule_not_found") {
		t.Errorf("get deleted: %d %s; want exit 1 with rule_not_found", code, errOut)
	}
	// A rejected rule: the admission error reaches the user.
	bad := filepath.Join(dir, "bad.yaml")
	os.WriteFile(bad, []byte(fmt.Sprintf("name: c\nmodel_name: mc\nsel: 9\nendpoints: [{endpointIP: 127.0.0.1, targetPort: %s}]\n", port)), 0o600)
	if code, _, errOut := run("rule", "apply", "-f", bad); code != ExitError || !strings.Contains(errOut, "sel") {
		t.Errorf("apply bad: %d %s", code, errOut)
	}
	// Without the token, mutations are refused.
	ios, _, errOut2 := TestIO()
	if code := Main(context.Background(), []string{"rule", "delete", "b", "--admin", admin}, ios); code != ExitError || !strings.Contains(errOut2.String(), "401") {
		t.Errorf("delete without token: %d %s", code, errOut2)
	}
}

// TestConfigFileUnknownKeys: a misspelled key in --config is refused with a
// suggestion, instead of being silently ignored.
func TestConfigFileUnknownKeys(t *testing.T) {
	dir := t.TempDir()
	cases := []struct {
		name, yaml string
		want       []string
	}{
		{"misspelled key", "listne: 127.0.0.1:1\n", []string{"unknown key", "listne", "did you mean listen"}},
		{"key of no command", "colour: blue\n", []string{"unknown key", "colour"}},
		{"nested table", "listen: 127.0.0.1:1\nchwbl:\n  replicas: 3\n", []string{"chwbl.replicas"}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			path := filepath.Join(dir, strings.ReplaceAll(tc.name, " ", "-")+".yaml")
			if err := os.WriteFile(path, []byte(tc.yaml), 0o600); err != nil {
				t.Fatal(err)
			}
			ios, _, errOut := TestIO()
			code := Main(context.Background(), []string{"serve", "--config", path, "--state-dir", dir}, ios)
			if code != ExitUsage {
				t.Fatalf("exit code = %d; want %d (usage); stderr: %s", code, ExitUsage, errOut)
			}
			for _, w := range tc.want {
				if !strings.Contains(errOut.String(), w) {
					t.Errorf("stderr = %q; want it to mention %q", errOut, w)
				}
			}
		})
	}
}

// TestVersion: `llmgw version` and `llmgw --version` print the same line,
// with a commit field (the test binary carries no VCS stamp: "unknown").
func TestVersion(t *testing.T) {
	var lines []string
	for _, args := range [][]string{{"version"}, {"--version"}} {
		ios, out, errOut := TestIO()
		if code := Main(context.Background(), args, ios); code != ExitOK {
			t.Fatalf("%v: exit %d; stderr %s", args, code, errOut)
		}
		if !strings.HasPrefix(out.String(), "llmgw ") || !strings.Contains(out.String(), "(commit ") {
			t.Errorf("%v printed %q; want \"llmgw VERSION (commit ...)\"", args, out)
		}
		lines = append(lines, out.String())
	}
	if lines[0] != lines[1] {
		t.Errorf("version %q != --version %q", lines[0], lines[1])
	}
}
