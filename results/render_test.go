package results

import (
	"bytes"
	"encoding/xml"
	"strings"
	"testing"
	"time"

	"github.com/llmgw/llmgw/internal/golden"
)

var t0 = time.Date(2026, 11, 30, 1, 0, 0, 0, time.UTC)

// fixtureRows covers every verdict, every launcher and both worker kinds.
func fixtureRows() []RunSummary {
	passLanes := Lanes{DirectWorker: StatusPass, GatewayDelivery: StatusPass, RoutingEvidence: StatusPass,
		HashParity: StatusPass, CacheReuse: StatusPass, Performance: StatusNotRun}
	sim := func(engine, version, profile, mode string) Tuple {
		return Tuple{Engine: engine, EngineVersion: version, Profile: profile, Topology: "converged", Mode: mode,
			Launcher: LauncherSim, SimulatedWorkers: true, Workers: 3}
	}
	row := func(id string, tu Tuple, v Status, code, reason string, l Lanes, secs int) RunSummary {
		return RunSummary{Schema: RunSchema, ID: id, CaseID: tu.CaseID(), Tuple: tu, Verdict: v, ReasonCode: code, Reason: reason,
			Lanes: l.norm(), Started: t0, Ended: t0.Add(time.Duration(secs) * time.Second),
			ArtifactID: strings.Repeat(id[len(id)-1:], 64)}
	}
	return []RunSummary{
		row("r1", sim("vllm", "0.31.0", "qwen3-0.6b", "exact"), StatusPass, "", "", passLanes, 4),
		row("r2", sim("sglang", "0.5.19", "qwen3-0.6b", "rr"), StatusPass, "", "",
			Lanes{DirectWorker: StatusPass, GatewayDelivery: StatusPass, RoutingEvidence: StatusPass, HashParity: StatusSkipped, CacheReuse: StatusSkipped}, 3),
		row("r3", sim("trtllm", "1.3.0rc29", "gemma-2-9b-it", "exact"), StatusBlocked, "architecture_unsupported",
			"TensorRT-LLM 1.3.0rc29 cannot serve Gemma2ForCausalLM on the pinned PyTorch backend", Lanes{}, 0),
		row("r4", sim("vllm", "0.31.0", "llama-3.1-8b-instruct", "exact"), StatusFail, "HASH_PARITY_MISMATCH",
			"canary block hashes absent from the worker's events | seed \"1\" vs \"0\"",
			Lanes{DirectWorker: StatusPass, GatewayDelivery: StatusPass, RoutingEvidence: StatusFail, HashParity: StatusFail, CacheReuse: StatusFail}, 5),
		row("r5", Tuple{Engine: "vllm", EngineVersion: "0.31.0", Profile: "qwen2.5-7b-instruct", Topology: "converged", Mode: "rr",
			Launcher: LauncherDocker, Workers: 3}, StatusBlocked, "no_gpu", "the docker daemon reports no GPU runtime", Lanes{}, 1),
		row("r6", Tuple{Engine: "llamacpp", EngineVersion: "b7800", Profile: "qwen3-0.6b", Topology: "converged", Mode: "chwbl",
			Launcher: LauncherAttach, Workers: 2}, StatusNotRun, "", "", Lanes{DirectWorker: StatusPass}, 2),
	}
}

func TestRenderersGolden(t *testing.T) {
	tests := []struct {
		name   string
		format Format
		file   string
	}{
		{"lipgloss table", FormatTable, "table.golden"},
		{"tsv", FormatTSV, "table.tsv"},
		{"markdown", FormatMarkdown, "table.md"},
		{"json", FormatJSON, "export.json"},
		{"junit", FormatJUnit, "junit.xml"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			var b bytes.Buffer
			if err := Render(&b, tc.format, fixtureRows()); err != nil {
				t.Fatalf("Render(%s) error = %v", tc.format, err)
			}
			golden.File(t, tc.file, b.Bytes())
		})
	}
}

func TestRenderersKeepLanesApartAndSaySimulated(t *testing.T) {
	for _, f := range []Format{FormatTable, FormatMarkdown, FormatJSON, FormatJUnit} {
		t.Run(string(f), func(t *testing.T) {
			var b bytes.Buffer
			if err := Render(&b, f, fixtureRows()); err != nil {
				t.Fatal(err)
			}
			// The XML encoder escapes the note's apostrophe; match the rest.
			if !strings.Contains(b.String(), "simulated workers: qualifies the gateway") {
				t.Errorf("%s output does not carry the simulated-workers note", f)
			}
		})
	}
	var b bytes.Buffer
	rows := fixtureRows()[4:5] // docker, real workers
	if err := WriteMarkdown(&b, rows); err != nil {
		t.Fatal(err)
	}
	if strings.Contains(b.String(), SimulatedNote) {
		t.Errorf("markdown for launched workers carries the simulated note:\n%s", b.String())
	}
	b.Reset()
	if err := WriteTSV(&b, fixtureRows()); err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimSpace(b.String()), "\n")
	for i, l := range lines {
		if n := strings.Count(l, "\t"); n != len(Columns)-1 {
			t.Errorf("TSV line %d has %d tabs; want %d: %q", i, n, len(Columns)-1, l)
		}
	}
	// Row r4: delivery PASS while parity and cache FAIL, each in its own column.
	cols := strings.Split(lines[4], "\t")
	got := map[string]string{}
	for i, c := range Columns {
		got[c] = cols[i]
	}
	if got["DELIVERY"] != "PASS" || got["PARITY"] != "FAIL" || got["CACHE"] != "FAIL" || got["WORKERS"] != "simulated" || got["LAUNCHER"] != "sim" {
		t.Errorf("TSV row r4 = %v; want DELIVERY PASS, PARITY FAIL, CACHE FAIL, simulated sim workers", got)
	}
}

// The JUnit document is parsed back with structs written independently of
// the encoder's.
type parsedSuites struct {
	XMLName  xml.Name `xml:"testsuites"`
	Tests    int      `xml:"tests,attr"`
	Failures int      `xml:"failures,attr"`
	Errors   int      `xml:"errors,attr"`
	Skipped  int      `xml:"skipped,attr"`
	Suites   []struct {
		Name  string `xml:"name,attr"`
		Tests int    `xml:"tests,attr"`
		Cases []struct {
			Name      string `xml:"name,attr"`
			Classname string `xml:"classname,attr"`
			Time      string `xml:"time,attr"`
			Failure   *struct {
				Message string `xml:"message,attr"`
				Text    string `xml:",chardata"`
			} `xml:"failure"`
			Skipped *struct {
				Message string `xml:"message,attr"`
			} `xml:"skipped"`
			Error *struct {
				Message string `xml:"message,attr"`
			} `xml:"error"`
			Props []struct {
				Name  string `xml:"name,attr"`
				Value string `xml:"value,attr"`
			} `xml:"properties>property"`
			SystemOut string `xml:"system-out"`
		} `xml:"testcase"`
	} `xml:"testsuite"`
}

func TestJUnitParsesBack(t *testing.T) {
	var b bytes.Buffer
	if err := WriteJUnit(&b, fixtureRows()); err != nil {
		t.Fatal(err)
	}
	var doc parsedSuites
	dec := xml.NewDecoder(&b)
	dec.Strict = true
	if err := dec.Decode(&doc); err != nil {
		t.Fatalf("JUnit output does not parse: %v", err)
	}
	// NOT_RUN is an error (nothing was qualified: CI must not go green),
	// BLOCKED is skipped (a known result).
	if doc.Tests != 6 || doc.Failures != 1 || doc.Errors != 1 || doc.Skipped != 2 {
		t.Errorf("testsuites tests/failures/errors/skipped = %d/%d/%d/%d; want 6/1/1/2", doc.Tests, doc.Failures, doc.Errors, doc.Skipped)
	}
	if len(doc.Suites) != 1 || len(doc.Suites[0].Cases) != 6 {
		t.Fatalf("suites = %+v; want one suite with 6 cases", doc.Suites)
	}
	cases := doc.Suites[0].Cases
	tests := []struct {
		name        string
		i           int
		wantCase    string
		wantFailure string
		wantSkipped string
		wantError   string
		wantSimNote bool
	}{
		{"pass", 0, "vllm-qwen3-0.6b-exact-converged", "", "", "", true},
		{"blocked", 2, "trtllm-gemma-2-9b-it-exact-converged", "", "BLOCKED architecture_unsupported", "", true},
		{"fail", 3, "vllm-llama-3.1-8b-instruct-exact-converged", "FAIL HASH_PARITY_MISMATCH", "", "", true},
		{"docker blocked", 4, "vllm-qwen2.5-7b-instruct-rr-converged", "", "BLOCKED no_gpu", "", false},
		{"not run", 5, "llamacpp-qwen3-0.6b-chwbl-converged", "", "", "NOT_RUN", false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			c := cases[tc.i]
			if c.Name != tc.wantCase {
				t.Errorf("case name = %q; want %q", c.Name, tc.wantCase)
			}
			gotFail, gotSkip, gotErr := "", "", ""
			if c.Failure != nil {
				gotFail = c.Failure.Message
			}
			if c.Skipped != nil {
				gotSkip = c.Skipped.Message
			}
			if c.Error != nil {
				gotErr = c.Error.Message
			}
			if gotFail != tc.wantFailure || gotSkip != tc.wantSkipped || gotErr != tc.wantError {
				t.Errorf("failure, skipped, error = %q, %q, %q; want %q, %q, %q", gotFail, gotSkip, gotErr, tc.wantFailure, tc.wantSkipped, tc.wantError)
			}
			if (c.SystemOut == SimulatedNote) != tc.wantSimNote {
				t.Errorf("system-out = %q; want simulated note %v", c.SystemOut, tc.wantSimNote)
			}
			lanes := 0
			for _, p := range c.Props {
				if strings.HasPrefix(p.Name, "lane.") {
					lanes++
				}
			}
			if lanes != 6 {
				t.Errorf("case has %d lane properties; want 6", lanes)
			}
		})
	}
	if cases[3].Failure.Text != `canary block hashes absent from the worker's events | seed "1" vs "0"` {
		t.Errorf("failure text = %q; want the reason, XML-escaped and restored", cases[3].Failure.Text)
	}
}

func TestRunDetailGolden(t *testing.T) {
	run := &Run{
		Schema: RunSchema, ID: "r4", Verdict: StatusFail, Started: t0, Ended: t0.Add(5 * time.Second),
		Tuple: Tuple{Engine: "vllm", EngineVersion: "0.31.0", Profile: "llama-3.1-8b-instruct", Topology: "converged", Mode: "exact",
			Launcher: LauncherSim, SimulatedWorkers: true, Workers: 3},
		Steps: []Step{
			{Name: "select tuple", Status: StatusPass, Started: t0, Ended: t0.Add(2 * time.Millisecond)},
			{Name: "launch workers", Status: StatusPass, Started: t0, Ended: t0.Add(800 * time.Millisecond), Evidence: []string{"evidence/launch.json"}},
			{Name: "hash parity", Status: StatusFail, ReasonCode: "HASH_PARITY_MISMATCH", Reason: "canary hashes\tmissing", Started: t0, Ended: t0.Add(time.Second),
				Evidence: []string{"evidence/canary.json", "evidence/events.json"}},
			{Name: "cleanup", Status: StatusPass},
		},
		Lanes:      Lanes{DirectWorker: StatusPass, GatewayDelivery: StatusPass, RoutingEvidence: StatusFail, HashParity: StatusFail, CacheReuse: StatusFail}.norm(),
		ArtifactID: strings.Repeat("4", 64),
	}
	for _, tty := range []bool{true, false} {
		name := "run-detail.txt"
		if tty {
			name = "run-detail.tty"
		}
		t.Run(name, func(t *testing.T) {
			var b bytes.Buffer
			if err := WriteRunDetail(&b, run, tty, 0); err != nil {
				t.Fatal(err)
			}
			golden.File(t, name, b.Bytes())
		})
	}
}

func TestParseFormat(t *testing.T) {
	tests := []struct {
		in      string
		want    Format
		wantErr bool
	}{
		{"md", FormatMarkdown, false},
		{"markdown", FormatMarkdown, false},
		{"junit", FormatJUnit, false},
		{"json", FormatJSON, false},
		{"xml", "", true},
	}
	for _, tc := range tests {
		t.Run(tc.in, func(t *testing.T) {
			got, err := ParseFormat(tc.in)
			if got != tc.want || (err != nil) != tc.wantErr {
				t.Errorf("ParseFormat(%q) = %q, %v; want %q, error %v", tc.in, got, err, tc.want, tc.wantErr)
			}
			if err != nil && !strings.Contains(err.Error(), "md, json, junit") {
				t.Errorf("ParseFormat error %q does not list the valid formats", err)
			}
		})
	}
}

// TestVersionMismatchOnTheRow: the workers' reported version stands beside
// the catalog's on the row and in the detail, and lane sources are listed.
func TestVersionMismatchOnTheRow(t *testing.T) {
	cases := []struct {
		name     string
		tuple    Tuple
		wantCell string
	}{
		{"mismatch", Tuple{EngineVersion: "b7800", WorkerEngineVersion: "b0-unknown", VersionMismatch: true}, "b7800≠b0-unknown"},
		{"same", Tuple{EngineVersion: "0.31.0", WorkerEngineVersion: "0.31.0"}, "0.31.0"},
		{"not read", Tuple{EngineVersion: "0.31.0"}, "0.31.0"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			if got := VersionCell(tc.tuple); got != tc.wantCell {
				t.Errorf("VersionCell = %q; want %q", got, tc.wantCell)
			}
		})
	}
	r := &Run{ID: "r1", Tuple: Tuple{Engine: "llamacpp", EngineVersion: "b7800", WorkerEngineVersion: "b0-unknown", VersionMismatch: true,
		Profile: "p", Topology: "converged", Mode: "rr", Launcher: LauncherAttach},
		LaneSources: map[string]string{"delivery": "engine_metrics llamacpp:prompt_tokens_total", "direct": "worker_answer"}}
	var b strings.Builder
	if err := WriteRunDetail(&b, r, false, 0); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"reported\tllamacpp b0-unknown (MISMATCH with the catalog's b7800)", "sources\tdirect=worker_answer delivery=engine_metrics llamacpp:prompt_tokens_total"} {
		if !strings.Contains(b.String(), want) {
			t.Errorf("detail lacks %q:\n%s", want, b.String())
		}
	}
}
