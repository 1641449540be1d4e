package cli

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/charmbracelet/x/ansi"
	"github.com/valyala/fasthttp"
	"sigs.k8s.io/yaml"

	"github.com/llmgw/llmgw/gateway"
	"github.com/llmgw/llmgw/results"
	"github.com/llmgw/llmgw/runbook"
	"github.com/llmgw/llmgw/runbook/converged"
	"github.com/llmgw/llmgw/runbook/pd"
)

// decodeDoc parses out as format (json or yaml) into v, failing the test
// when it does not parse: what `| jq` or a YAML reader would do.
func decodeDoc(t *testing.T, format, out string, v any) {
	t.Helper()
	var err error
	if format == outputYAML {
		err = yaml.UnmarshalStrict([]byte(out), v)
	} else {
		dec := json.NewDecoder(strings.NewReader(out))
		dec.DisallowUnknownFields()
		err = dec.Decode(v)
	}
	if err != nil {
		t.Fatalf("-o %s does not parse as its document: %v\n%s", format, err, out)
	}
}

// TestResultsListParses: `llmgw results list -o json|yaml` is the export
// document, with its schema, whatever the terminal.
func TestResultsListParses(t *testing.T) {
	dir, _ := seedResults(t)
	for _, format := range []string{outputJSON, outputYAML} {
		for _, tty := range []bool{false, true} {
			t.Run(fmt.Sprintf("%s tty=%v", format, tty), func(t *testing.T) {
				code, out, errOut := runCLI(t, tty, "results", "list", "-o", format, "--out", dir)
				if code != ExitOK {
					t.Fatalf("exit %d; stderr %s", code, errOut)
				}
				var doc results.Export
				decodeDoc(t, format, out, &doc)
				if doc.Schema != results.RunSchema || len(doc.Runs) != 2 || doc.Counts.Total != 2 || doc.Note != results.SimulatedNote {
					t.Errorf("document = %+v; want schema %s, 2 runs and the simulated note", doc, results.RunSchema)
				}
			})
		}
	}
}

// startGateway runs a gateway with a token and two rules applied through
// the CLI; it returns the admin URL and the token file.
func startGateway(t *testing.T) (admin, tokenFile string) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	backend := &fasthttp.Server{Handler: func(ctx *fasthttp.RequestCtx) { ctx.SetBodyString(`{}`) }}
	go backend.Serve(ln)
	t.Cleanup(func() { backend.Shutdown() })
	_, port, _ := net.SplitHostPort(ln.Addr().String())
	dir := t.TempDir()
	tokenFile = filepath.Join(dir, "token")
	if err := os.WriteFile(tokenFile, []byte("tok\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	gw, err := gateway.New(gateway.Config{Listen: "127.0.0.1:0", Admin: "127.0.0.1:0", StateDir: filepath.Join(dir, "state"), AdminToken: "tok",
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	if err := gw.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { gw.Close() })
	admin = "http://" + gw.AdminAddr()
	ruleFile := filepath.Join(dir, "rules.yaml")
	long := strings.Repeat("a-very-long-model-name-", 8)
	if err := os.WriteFile(ruleFile, []byte(fmt.Sprintf(`- name: a
  model_name: %s
  endpoints: [{id: w1, endpointIP: 127.0.0.1, targetPort: %s}]
- name: b
  model_name: mb
  sel: chwbl
  endpoints: [{id: w1, endpointIP: 127.0.0.1, targetPort: %s}, {id: w2, endpointIP: 127.0.0.1, targetPort: 9}]
`, long, port, port)), 0o600); err != nil {
		t.Fatal(err)
	}
	if code, _, errOut := runCLI(t, false, "rule", "apply", "-f", ruleFile, "--admin", admin, "--token-file", tokenFile); code != ExitOK {
		t.Fatalf("rule apply: exit %d: %s", code, errOut)
	}
	return admin, tokenFile
}

// TestRuleOutputParses: `llmgw rule list|get|apply -o json|yaml` parse as
// their documents, and the read-back is the gateway's effective rule.
func TestRuleOutputParses(t *testing.T) {
	admin, tokenFile := startGateway(t)
	for _, format := range []string{outputJSON, outputYAML} {
		t.Run("list "+format, func(t *testing.T) {
			code, out, errOut := runCLI(t, false, "rule", "list", "-o", format, "--admin", admin)
			if code != ExitOK {
				t.Fatalf("exit %d: %s", code, errOut)
			}
			var doc RuleListDoc
			decodeDoc(t, format, out, &doc)
			var names []string
			for _, r := range doc.Rules {
				names = append(names, r.Rule.Name)
			}
			if doc.Kind != "RuleList" || !slices.Contains(names, "a") || !slices.Contains(names, "b") {
				t.Errorf("kind %q, rules %v; want RuleList with a and b", doc.Kind, names)
			}
		})
		t.Run("get "+format, func(t *testing.T) {
			code, out, errOut := runCLI(t, false, "rule", "get", "b", "-o", format, "--admin", admin)
			if code != ExitOK {
				t.Fatalf("exit %d: %s", code, errOut)
			}
			var doc RuleDoc
			decodeDoc(t, format, out, &doc)
			if doc.Kind != "Rule" || doc.Rule == nil || doc.Rule.Sel.Name() != "chwbl" || len(doc.Status.Endpoints) != 2 {
				t.Errorf("document %+v; want kind Rule, sel chwbl, 2 endpoints", doc)
			}
		})
		t.Run("apply "+format, func(t *testing.T) {
			ios, out, errOut := TestIO()
			ios.In = strings.NewReader("name: c\nmodel_name: mc\nprobe: {disabled: true}\nendpoints: [{endpointIP: 127.0.0.1, targetPort: 9}]\n")
			if code := Main(context.Background(), []string{"rule", "apply", "-f", "-", "-o", format, "--admin", admin, "--token-file", tokenFile}, ios); code != ExitOK {
				t.Fatalf("exit %d: %s", code, errOut)
			}
			var doc RuleApplyDoc
			decodeDoc(t, format, out.String(), &doc)
			if doc.Kind != "RuleApply" || len(doc.Rules) != 1 || doc.Rules[0].Name != "c" {
				t.Errorf("document %+v; want kind RuleApply with rule c", doc)
			}
		})
	}
	t.Run("bad output", func(t *testing.T) {
		code, out, errOut := runCLI(t, false, "rule", "list", "-o", "wide", "--admin", admin)
		if code != ExitUsage || out != "" || !strings.Contains(errOut, `-o "wide": want table, json, yaml`) {
			t.Errorf("exit %d, stdout %q, stderr %q; want a usage error and no output", code, out, errOut)
		}
	})
}

// TestRunbookConvergedParses: `llmgw runbook converged -o json|yaml` is one
// document (no progress or tables mixed in), whose run lists the steps the
// run had.
func TestRunbookConvergedParses(t *testing.T) {
	for _, format := range []string{outputJSON, outputYAML} {
		t.Run(format, func(t *testing.T) {
			code, out, errOut := runCLI(t, false, "runbook", "converged", "--mode", "rr", "--workers", "2", "-o", format, "--out", t.TempDir())
			if code != ExitOK {
				t.Fatalf("exit %d\nstdout %s\nstderr %s", code, out, errOut)
			}
			var doc RunbookDoc
			decodeDoc(t, format, out, &doc)
			if doc.Kind != "RunbookRun" || doc.Runbook != "converged" || doc.Run == nil || doc.Summary.Verdict != results.StatusPass {
				t.Fatalf("document kind %q runbook %q verdict %q; want a passed converged RunbookRun", doc.Kind, doc.Runbook, doc.Summary.Verdict)
			}
			if doc.Run.ID != doc.Summary.ID || len(doc.Run.Steps) != 9 || doc.Run.Steps[8].Name != converged.StepCleanup {
				t.Errorf("run %s (summary %s) has %d steps; want 9 ending with cleanup", doc.Run.ID, doc.Summary.ID, len(doc.Run.Steps))
			}
		})
	}
}

// maxLineWidth is the widest line of s in terminal cells.
func maxLineWidth(s string) (int, string) {
	w, widest := 0, ""
	for _, l := range strings.Split(s, "\n") {
		if n := ansi.StringWidth(l); n > w {
			w, widest = n, l
		}
	}
	return w, widest
}

// TestTablesFitTheTerminal: on a terminal of 80 or 120 columns no line of
// a table command is wider; long cells end with an ellipsis, and -o json
// still has them whole.
func TestTablesFitTheTerminal(t *testing.T) {
	dir := t.TempDir()
	s, err := results.Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	longReason := strings.Repeat("the worker answered but its receipt did not record the nonce; ", 30)
	w, err := s.NewRunWithID("run-long", results.Tuple{Engine: "vllm", EngineVersion: "0.31.0", Profile: "qwen3-0.6b",
		Topology: "converged", Mode: "exact", Launcher: results.LauncherSim, SimulatedWorkers: true, Workers: 3})
	if err != nil {
		t.Fatal(err)
	}
	if err := w.RecordStep(results.Step{Name: "prove direct inference", Status: results.StatusFail, ReasonCode: "RECEIPT_MISSING", Reason: longReason}); err != nil {
		t.Fatal(err)
	}
	if _, err := w.Finish(); err != nil {
		t.Fatal(err)
	}
	admin, _ := startGateway(t)

	commands := [][]string{
		{"results", "list", "--out", dir},
		{"results", "show", "run-long", "--out", dir},
		{"profiles", "list"},
		{"rule", "list", "--admin", admin},
		{"rule", "get", "b", "--admin", admin},
	}
	for _, width := range []int{80, 120} {
		for _, args := range commands {
			t.Run(fmt.Sprintf("%d %s", width, strings.Join(args[:2], " ")), func(t *testing.T) {
				ios, out, errOut := TestIO()
				ios.OutTTY, ios.Width = true, width
				if code := Main(context.Background(), args, ios); code != ExitOK {
					t.Fatalf("exit %d: %s", code, errOut)
				}
				if got, line := maxLineWidth(out.String()); got > width {
					t.Errorf("a line is %d columns wide; want at most %d:\n%s", got, width, line)
				}
				if !strings.Contains(out.String(), "─") {
					t.Errorf("no bordered table in:\n%s", out)
				}
			})
		}
	}
	t.Run("long reason truncated, whole in json", func(t *testing.T) {
		ios, out, _ := TestIO()
		ios.OutTTY, ios.Width = true, 80
		if code := Main(context.Background(), []string{"results", "show", "run-long", "--out", dir}, ios); code != ExitOK {
			t.Fatalf("exit %d", code)
		}
		if !strings.Contains(out.String(), "…") {
			t.Errorf("no ellipsis in a truncated table:\n%s", out)
		}
		code, js, _ := runCLI(t, true, "results", "show", "run-long", "-o", "json", "--out", dir)
		var run results.Run
		if code != ExitOK || json.Unmarshal([]byte(js), &run) != nil || len(run.Steps) == 0 || run.Steps[0].Reason != longReason {
			t.Errorf("-o json lost the full reason (exit %d)", code)
		}
	})
	t.Run("unbounded without a width", func(t *testing.T) {
		ios, out, _ := TestIO()
		ios.OutTTY = true
		if code := Main(context.Background(), []string{"results", "show", "run-long", "--out", dir}, ios); code != ExitOK {
			t.Fatalf("exit %d", code)
		}
		if !strings.Contains(out.String(), strings.TrimSpace(longReason)) {
			t.Errorf("with no known width the reason was cut:\n%s", out)
		}
	})
}

// TestFitDropsColumnsLast: when even the narrowest cells do not fit, the
// columns named to drop go first, and the caller learns which.
func TestFitDropsColumnsLast(t *testing.T) {
	headers := []string{"RUN", "VERDICT", "ARTIFACT", "REASON"}
	rows := [][]string{{"run-1", "PASS", strings.Repeat("f", 64), strings.Repeat("r", 200)}}
	cases := []struct {
		name        string
		width       int
		wantHeaders []string
		wantDropped []string
	}{
		{"wide enough", 400, headers, nil},
		{"shrunk", 60, headers, nil},
		{"artifact dropped first", 30, []string{"RUN", "VERDICT", "REASON"}, []string{"ARTIFACT"}},
		{"then from the right", 20, []string{"RUN", "VERDICT"}, []string{"ARTIFACT", "REASON"}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			h, r, dropped := results.FitSpec{Drop: []string{"ARTIFACT"}}.Fit(tc.width, headers, rows)
			if !slices.Equal(h, tc.wantHeaders) || !slices.Equal(dropped, tc.wantDropped) {
				t.Errorf("headers %v dropped %v; want %v and %v", h, dropped, tc.wantHeaders, tc.wantDropped)
			}
			table := results.Table(io.Discard, tc.width, headers, rows)
			if got, line := maxLineWidth(table); got > tc.width {
				t.Errorf("table is %d wide; want at most %d:\n%s", got, tc.width, line)
			}
			if len(r) != 1 || len(r[0]) != len(h) {
				t.Errorf("rows %v do not match headers %v", r, h)
			}
		})
	}
}

// helpSteps reads the numbered step table of a runbook's --help: lines
// "  N step name   description".
func helpSteps(t *testing.T, args ...string) []string {
	t.Helper()
	code, out, errOut := runCLI(t, false, append(args, "--help")...)
	if code != ExitOK {
		t.Fatalf("%v --help: exit %d: %s", args, code, errOut)
	}
	re := regexp.MustCompile(`^ {0,2}(\d+) (\S+(?: \S+)*)  `)
	var steps []string
	for _, l := range strings.Split(out, "\n") {
		if m := re.FindStringSubmatch(l); m != nil {
			if m[1] != fmt.Sprint(len(steps)+1) {
				t.Fatalf("%v --help: step %s after %d steps", args, m[1], len(steps))
			}
			steps = append(steps, m[2])
		}
	}
	return steps
}

// stepNames is a runbook's step table: its steps, then its cleanup step.
func stepNames(rb runbook.Runbook) []string {
	var names []string
	for _, s := range rb.Steps {
		names = append(names, s.Name())
	}
	return append(names, rb.CleanupStep)
}

// TestRunbookHelpListsTheSteps: each runbook's --help lists exactly the
// steps its step table has, in order: for the configuration with every
// optional step (converged mode exact, pd --kv-exact), and every other
// configuration's steps are among them in the same order.
func TestRunbookHelpListsTheSteps(t *testing.T) {
	cases := []struct {
		name  string
		args  []string
		full  runbook.Runbook
		other []runbook.Runbook
	}{
		{"converged", []string{"runbook", "converged"}, converged.Runbook(&converged.Options{Mode: "exact"}),
			[]runbook.Runbook{converged.Runbook(&converged.Options{Mode: "rr"}), converged.Runbook(&converged.Options{Mode: "chwbl"})}},
		{"pd", []string{"runbook", "pd"}, pd.Runbook(&pd.Options{KVExact: true}), []runbook.Runbook{pd.Runbook(&pd.Options{})}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			help := helpSteps(t, tc.args...)
			want := stepNames(tc.full)
			if !slices.Equal(help, want) {
				t.Fatalf("--help lists %d steps %q; the runbook has %d: %q", len(help), help, len(want), want)
			}
			for _, rb := range tc.other {
				i := 0
				for _, n := range stepNames(rb) {
					for i < len(help) && help[i] != n {
						i++
					}
					if i == len(help) {
						t.Errorf("step %q of a %s configuration is not in --help's order %q", n, tc.name, help)
					}
				}
			}
		})
	}
}

// TestValueCompletion: the shell completion of engines, profiles, modes,
// run IDs and rule names (cobra's __complete protocol: one candidate a
// line, then ":<directive>").
func TestValueCompletion(t *testing.T) {
	dir, _ := seedResults(t)
	admin, _ := startGateway(t)
	// A port nothing listens on: completion answers nothing, not an error.
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	dead := "http://" + ln.Addr().String()
	ln.Close()
	cases := []struct {
		name    string
		args    []string
		want    []string
		notWant []string
	}{
		{"engine", []string{"runbook", "converged", "--engine", ""}, []string{"vllm", "sglang", "trtllm", "llamacpp"}, nil},
		{"pd engine", []string{"runbook", "pd", "--engine", ""}, []string{"vllm", "sglang", "trtllm"}, []string{"llamacpp"}},
		{"qualify engine", []string{"qualify", "--engine", ""}, []string{"all", "vllm"}, nil},
		{"profile", []string{"runbook", "converged", "--profile", ""}, []string{"qwen3-0.6b", "gemma-2-9b-it"}, nil},
		{"mode", []string{"runbook", "converged", "--mode", ""}, []string{"rr", "chwbl", "exact"}, nil},
		{"modes list", []string{"qualify", "--modes", "rr,"}, []string{"rr,chwbl", "rr,exact"}, []string{"rr,rr"}},
		{"output", []string{"results", "list", "-o", ""}, []string{"table", "json", "yaml"}, nil},
		{"run ids", []string{"results", "show", "--out", dir, ""}, []string{"run-pass", "run-blocked"}, nil},
		{"export --run", []string{"results", "export", "--out", dir, "--run", ""}, []string{"run-pass"}, nil},
		{"rule names", []string{"rule", "get", "--admin", admin, ""}, []string{"a", "b"}, nil},
		{"rule names, gateway down", []string{"rule", "get", "--admin", dead, ""}, nil, []string{"a"}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			code, out, errOut := runCLI(t, false, append([]string{"__complete"}, tc.args...)...)
			if code != ExitOK {
				t.Fatalf("exit %d: %s", code, errOut)
			}
			var got []string
			for _, l := range strings.Split(strings.TrimSpace(out), "\n") {
				if strings.HasPrefix(l, ":") {
					break
				}
				v, _, _ := strings.Cut(l, "\t")
				got = append(got, v)
			}
			for _, w := range tc.want {
				if !slices.Contains(got, w) {
					t.Errorf("candidates %q lack %q", got, w)
				}
			}
			for _, w := range tc.notWant {
				if slices.Contains(got, w) {
					t.Errorf("candidates %q include %q", got, w)
				}
			}
		})
	}
}

// TestQualifyParses: `llmgw qualify -o json` is one QualifyReport document.
func TestQualifyParses(t *testing.T) {
	code, out, errOut := runCLI(t, false, "qualify", "--engine", "trtllm", "--profiles", "qwen3-0.6b,gemma-2-9b-it", "--modes", "rr",
		"--allow-blocked", "-o", "json", "--out", t.TempDir())
	if code != ExitOK {
		t.Fatalf("exit %d\nstdout %s\nstderr %s", code, out, errOut)
	}
	var doc QualifyDoc
	decodeDoc(t, outputJSON, out, &doc)
	if doc.Kind != "QualifyReport" || doc.Schema != results.RunSchema || doc.Planned != 2 || doc.Ran != 2 || len(doc.Runs) != 2 || doc.Counts.Blocked != 1 {
		t.Errorf("document %+v; want a QualifyReport of 2 runs, 1 BLOCKED", doc)
	}
}

// TestOutputKindsDocumented: every document kind has its row in
// docs/output.md.
func TestOutputKindsDocumented(t *testing.T) {
	doc, err := os.ReadFile("../../../docs/output.md")
	if err != nil {
		t.Fatal(err)
	}
	for _, k := range outputKinds {
		if !strings.Contains(string(doc), "| kind `"+k+"` |") {
			t.Errorf("kind %s has no row (| kind `%s` |) in docs/output.md", k, k)
		}
	}
}
