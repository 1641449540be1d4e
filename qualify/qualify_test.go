package qualify

import (
	"context"
	"encoding/json"
	"encoding/xml"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/llmgw/llmgw/results"
	"github.com/llmgw/llmgw/runbook/converged"
	"github.com/llmgw/llmgw/runbook/gates"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m,
		// fasthttp and zmq4 housekeeping goroutines that end on their own
		// after their pools close.
		goleak.IgnoreAnyFunction("github.com/valyala/fasthttp.(*HostClient).connsCleaner"),
		goleak.IgnoreAnyFunction("github.com/valyala/fasthttp.(*workerPool).Start.func2"),
		goleak.IgnoreAnyFunction("github.com/valyala/fasthttp.(*TCPDialer).tcpAddrsClean"),
		goleak.IgnoreAnyFunction("github.com/valyala/fasthttp.updateServerDate.func1"),
		goleak.IgnoreAnyFunction("github.com/go-zeromq/zmq4.(*pubMWriter).run"),
	)
}

// runMatrix plans and runs o on sims into a fresh store.
func runMatrix(t *testing.T, ctx context.Context, o *Options) (Report, *results.Store, string) {
	t.Helper()
	if o.HealthTimeout == 0 {
		o.HealthTimeout = 10 * time.Second
	}
	if o.ReadyTimeout == 0 {
		o.ReadyTimeout = 10 * time.Second
	}
	cases, err := Plan(o)
	if err != nil {
		t.Fatal(err)
	}
	out := t.TempDir()
	store, err := results.Open(out)
	if err != nil {
		t.Fatal(err)
	}
	rep, err := Run(ctx, o, cases, store, out)
	if err != nil {
		t.Fatalf("Run: %v", err)
	}
	return rep, store, out
}

func rowLines(rows []results.RunSummary) string {
	var b strings.Builder
	for _, r := range rows {
		b.WriteString(r.CaseID + " " + string(r.Verdict) + " " + r.ReasonCode + ": " + r.Reason + "\n")
	}
	return b.String()
}

func TestPlanRejectsBadInput(t *testing.T) {
	cases := []struct {
		name    string
		o       Options
		wantSub string
	}{
		{"unknown engine", Options{Engines: []string{"tgi"}}, "valid: vllm, sglang, trtllm, llamacpp, or all"},
		{"llamacpp has no KV-exact", Options{Engines: []string{"llamacpp"}, Modes: []string{"exact"}}, "publishes no KV events; valid: rr, chwbl"},
		{"llamacpp has no P/D", Options{Engines: []string{"llamacpp"}, Topologies: []string{"pd"}}, "no prefill/decode protocol"},
		{"unknown profile", Options{Profiles: []string{"gpt-9"}}, "qwen3-0.6b"},
		{"unknown mode", Options{Modes: []string{"chwbl2"}}, "valid: rr, chwbl, exact"},
		{"unknown topology", Options{Topologies: []string{"mesh"}}, "valid: converged, pd"},
		{"unknown launcher", Options{Launcher: "k8s"}, "valid: sim, docker, attach"},
		{"attach without endpoints", Options{Launcher: "attach"}, "--endpoints"},
		{"endpoints without attach", Options{Endpoints: []string{"127.0.0.1:1"}}, "only for --launcher attach"},
		{"seed needs sims", Options{Launcher: "docker", SimHashSeed: "1"}, "--launcher sim"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			_, err := Plan(&tc.o)
			if !errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), tc.wantSub) {
				t.Fatalf("err = %v; want ErrInvalid mentioning %q", err, tc.wantSub)
			}
		})
	}
}

func TestPlanExpandsTheBaseline(t *testing.T) {
	cases := []struct {
		name string
		o    Options
		want int
	}{
		{"reference baseline", Options{Engines: []string{"vllm", "sglang", "trtllm"}, Modes: []string{"rr", "exact"}, Topologies: []string{"converged"}}, 30},
		// llama.cpp: its full-proxy lanes rr and chwbl, converged only.
		{"all engines converged", Options{Engines: []string{"all"}, Topologies: []string{"converged"}}, 40},
		{"llamacpp alone", Options{Engines: []string{"llamacpp"}}, 10},
		{"all with rr,exact keeps llamacpp's rr", Options{Engines: []string{"all"}, Modes: []string{"rr", "exact"}, Topologies: []string{"converged"}}, 35},
		{"defaults are everything", Options{}, 70},
		{"duplicates dropped", Options{Engines: []string{"vllm", "vllm"}, Profiles: []string{"qwen3-0.6b"}, Modes: []string{"rr"}, Topologies: []string{"pd"}}, 1},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			got, err := Plan(&tc.o)
			if err != nil {
				t.Fatal(err)
			}
			if len(got) != tc.want {
				t.Fatalf("%d cases; want %d", len(got), tc.want)
			}
		})
	}
}

// The BLOCKED catalogue: of the 30 baseline cases exactly TensorRT-LLM ×
// {Gemma-2, EXAONE} × {rr, exact} are known-BLOCKED, and running them
// records BLOCKED architecture_unsupported with nothing launched.
func TestBlockedCatalogue(t *testing.T) {
	o := &Options{Engines: []string{"vllm", "sglang", "trtllm"}, Modes: []string{"rr", "exact"}, Topologies: []string{"converged"}}
	all, err := Plan(o)
	if err != nil {
		t.Fatal(err)
	}
	var blocked []Case
	for _, c := range all {
		if _, _, b := o.Catalog.Blocked(c.Engine, c.Profile); b {
			blocked = append(blocked, c)
		}
	}
	var ids []string
	for _, c := range blocked {
		ids = append(ids, c.ID())
	}
	want := []string{
		"trtllm-exaone-3.5-7.8b-instruct-rr-converged", "trtllm-exaone-3.5-7.8b-instruct-exact-converged",
		"trtllm-gemma-2-9b-it-rr-converged", "trtllm-gemma-2-9b-it-exact-converged",
	}
	slices.Sort(ids)
	slices.Sort(want)
	if !slices.Equal(ids, want) {
		t.Fatalf("blocked cases %v; want %v", ids, want)
	}
	out := t.TempDir()
	store, err := results.Open(out)
	if err != nil {
		t.Fatal(err)
	}
	rep, err := Run(t.Context(), o, blocked, store, out)
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range rep.Rows {
		if r.Verdict != results.StatusBlocked || r.ReasonCode != "architecture_unsupported" {
			t.Errorf("%s: %s %s; want BLOCKED architecture_unsupported", r.CaseID, r.Verdict, r.ReasonCode)
		}
		run, err := store.Get(r.ID)
		if err != nil {
			t.Fatal(err)
		}
		for _, st := range run.Steps {
			if st.Name == converged.StepLaunch && (st.Status != results.StatusBlocked || len(st.Evidence) != 0) {
				t.Errorf("%s: launch step %s with %d evidence files; want BLOCKED, nothing launched", r.CaseID, st.Status, len(st.Evidence))
			}
		}
	}
	if c := rep.Counts(); c.Blocked != 4 || c.Total != 4 {
		t.Errorf("counts %s; want 4 BLOCKED", c)
	}
}

// A reduced matrix on sims: two engines × two profiles (one known-BLOCKED
// on TensorRT-LLM) × rr and exact, converged, plus the P/D topology.
func TestSmallMatrixOnSims(t *testing.T) {
	o := &Options{Engines: []string{"vllm", "trtllm"}, Profiles: []string{"qwen3-0.6b", "gemma-2-9b-it"}, Modes: []string{"rr", "exact"},
		Topologies: []string{"converged"}}
	rep, store, _ := runMatrix(t, t.Context(), o)
	if len(rep.Rows) != 8 {
		t.Fatalf("%d rows; want 8\n%s", len(rep.Rows), rowLines(rep.Rows))
	}
	for _, r := range rep.Rows {
		want := results.StatusPass
		if r.Tuple.Engine == "trtllm" && r.Tuple.Profile == "gemma-2-9b-it" {
			want = results.StatusBlocked
		}
		if r.Verdict != want {
			t.Errorf("%s: %s; want %s\n%s", r.CaseID, r.Verdict, want, rowLines(rep.Rows))
		}
		if r.Tuple.Launcher != results.LauncherSim || !r.Tuple.SimulatedWorkers {
			t.Errorf("%s: launcher %q simulated %v; want sim, simulated", r.CaseID, r.Tuple.Launcher, r.Tuple.SimulatedWorkers)
		}
		if want != results.StatusPass {
			continue
		}
		wantParity := results.StatusNotRun
		if r.Tuple.Mode == "exact" {
			wantParity = results.StatusPass
			run, err := store.Get(r.ID)
			if err != nil {
				t.Fatal(err)
			}
			if !slices.ContainsFunc(run.Steps, func(s results.Step) bool { return s.Name == gates.StepHashParity && s.Status == results.StatusPass }) {
				t.Errorf("%s: no PASS hash-parity step", r.CaseID)
			}
		}
		if r.Lanes.HashParity != wantParity || r.Lanes.GatewayDelivery != results.StatusPass || r.Lanes.DirectWorker != results.StatusPass {
			t.Errorf("%s: lanes %+v; want delivery and direct PASS, parity %s", r.CaseID, r.Lanes, wantParity)
		}
	}

	p := &Options{Engines: []string{"sglang"}, Profiles: []string{"qwen3-0.6b"}, Modes: []string{"rr", "exact"}, Topologies: []string{"pd"}}
	prep, _, _ := runMatrix(t, t.Context(), p)
	if c := prep.Counts(); c.Pass != 2 || c.Total != 2 {
		t.Fatalf("pd rows: %s\n%s", c, rowLines(prep.Rows))
	}
	for _, r := range prep.Rows {
		if r.Tuple.Topology != "pd" {
			t.Errorf("%s: topology %q; want pd", r.CaseID, r.Tuple.Topology)
		}
	}
}

// A simulator started with another hash seed: the parity gate and the
// cache-reuse lane fail, gateway delivery does not.
func TestMismatchedSeedFailsParityNotDelivery(t *testing.T) {
	o := &Options{Engines: []string{"vllm"}, Profiles: []string{"qwen3-0.6b"}, Modes: []string{"exact"}, Topologies: []string{"converged"},
		SimHashSeed: "4242", ReadyTimeout: 2 * time.Second}
	rep, store, _ := runMatrix(t, t.Context(), o)
	if len(rep.Rows) != 1 {
		t.Fatalf("%d rows; want 1", len(rep.Rows))
	}
	r := rep.Rows[0]
	if r.Verdict != results.StatusFail {
		t.Fatalf("verdict %s; want FAIL", r.Verdict)
	}
	if r.Lanes.GatewayDelivery != results.StatusPass || r.Lanes.DirectWorker != results.StatusPass {
		t.Errorf("delivery %s direct %s; want PASS", r.Lanes.GatewayDelivery, r.Lanes.DirectWorker)
	}
	if r.Lanes.HashParity != results.StatusFail || r.Lanes.CacheReuse != results.StatusFail {
		t.Errorf("parity %s cache %s; want FAIL", r.Lanes.HashParity, r.Lanes.CacheReuse)
	}
	run, err := store.Get(r.ID)
	if err != nil {
		t.Fatal(err)
	}
	i := slices.IndexFunc(run.Steps, func(s results.Step) bool { return s.Name == gates.StepHashParity })
	if i < 0 || run.Steps[i].Status != results.StatusFail || run.Steps[i].ReasonCode != gates.CodeParityMiss {
		t.Fatalf("hash parity step missing or not FAIL %s", gates.CodeParityMiss)
	}
	// The evidence holds both the computed and the observed hashes.
	b, err := os.ReadFile(filepath.Join(store.RunDir(r.ID), run.Steps[i].Evidence[0]))
	if err != nil {
		t.Fatal(err)
	}
	var p gates.Parity
	if err := json.Unmarshal(b, &p); err != nil {
		t.Fatal(err)
	}
	if len(p.Computed) == 0 || len(p.Observed) == 0 || p.GreenHit {
		t.Errorf("parity evidence: %d computed, %d observed endpoints, green hit %v", len(p.Computed), len(p.Observed), p.GreenHit)
	}
}

type junitDoc struct {
	XMLName  xml.Name `xml:"testsuites"`
	Tests    int      `xml:"tests,attr"`
	Failures int      `xml:"failures,attr"`
	Skipped  int      `xml:"skipped,attr"`
	Suites   []struct {
		Cases []struct {
			Name    string `xml:"name,attr"`
			Failure *struct {
				Message string `xml:"message,attr"`
			} `xml:"failure"`
			Skipped *struct {
				Message string `xml:"message,attr"`
			} `xml:"skipped"`
			Properties []struct {
				Name  string `xml:"name,attr"`
				Value string `xml:"value,attr"`
			} `xml:"properties>property"`
		} `xml:"testcase"`
	} `xml:"testsuite"`
}

func TestExportFormats(t *testing.T) {
	o := &Options{Engines: []string{"trtllm"}, Profiles: []string{"qwen3-0.6b", "exaone-3.5-7.8b-instruct"}, Modes: []string{"rr"}, Topologies: []string{"converged"}}
	rep, _, out := runMatrix(t, t.Context(), o)
	paths, err := Export(out, "qualify", rep.Rows)
	if err != nil {
		t.Fatal(err)
	}
	if len(paths) != 3 {
		t.Fatalf("paths %v", paths)
	}
	cases := []struct {
		name, file string
		check      func(t *testing.T, b []byte)
	}{
		{"junit parses back", "qualify.junit.xml", func(t *testing.T, b []byte) {
			var doc junitDoc
			if err := xml.Unmarshal(b, &doc); err != nil {
				t.Fatalf("JUnit is not valid XML: %v", err)
			}
			if doc.Tests != 2 || doc.Failures != 0 || doc.Skipped != 1 || len(doc.Suites) != 1 || len(doc.Suites[0].Cases) != 2 {
				t.Fatalf("tests %d failures %d skipped %d; want 2, 0, 1 (the BLOCKED case)", doc.Tests, doc.Failures, doc.Skipped)
			}
			for _, c := range doc.Suites[0].Cases {
				launcher := ""
				for _, p := range c.Properties {
					if p.Name == "launcher" {
						launcher = p.Value
					}
				}
				if launcher != "sim" {
					t.Errorf("%s: launcher property %q; want sim", c.Name, launcher)
				}
				if strings.Contains(c.Name, "exaone") && (c.Skipped == nil || !strings.Contains(c.Skipped.Message, "architecture_unsupported")) {
					t.Errorf("%s: want skipped with architecture_unsupported", c.Name)
				}
			}
		}},
		{"json has the note", "qualify.json", func(t *testing.T, b []byte) {
			var doc results.Export
			if err := json.Unmarshal(b, &doc); err != nil {
				t.Fatal(err)
			}
			if doc.Note != results.SimulatedNote || len(doc.Runs) != 2 || doc.Counts.Blocked != 1 {
				t.Errorf("note %q, %d runs, counts %+v", doc.Note, len(doc.Runs), doc.Counts)
			}
		}},
		{"markdown keeps lanes apart", "qualify.md", func(t *testing.T, b []byte) {
			s := string(b)
			for _, col := range []string{"LAUNCHER", "DIRECT", "DELIVERY", "ROUTING", "PARITY", "CACHE", "PERF", results.SimulatedNote} {
				if !strings.Contains(s, col) {
					t.Errorf("markdown lacks %q", col)
				}
			}
		}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			b, err := os.ReadFile(filepath.Join(out, tc.file))
			if err != nil {
				t.Fatal(err)
			}
			tc.check(t, b)
		})
	}
}

// Ctrl-C during the second case: its cleanups run, its partial row and the
// first row are kept, the third case never starts and is exported as a
// NOT_RUN row, so the matrix's verdict is not PASS.
func TestCancelKeepsRows(t *testing.T) {
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	var mu sync.Mutex
	started := map[string]bool{}
	o := &Options{Engines: []string{"vllm", "sglang", "trtllm"}, Profiles: []string{"qwen3-0.6b"}, Modes: []string{"rr"}, Topologies: []string{"converged"},
		StepHook: func(c Case, step string) {
			mu.Lock()
			started[c.Engine] = true
			mu.Unlock()
			if c.Engine == "sglang" && step == converged.StepDeliver {
				cancel()
			}
		}}
	rep, store, _ := runMatrix(t, ctx, o)
	if !rep.Interrupted || rep.Ran != 2 || len(rep.Rows) != 3 {
		t.Fatalf("interrupted %v, %d ran, %d rows; want interrupted, 2 ran, 3 rows\n%s", rep.Interrupted, rep.Ran, len(rep.Rows), rowLines(rep.Rows))
	}
	if nr := rep.Rows[2]; nr.Verdict != results.StatusNotRun || nr.ReasonCode != "interrupted" || nr.ID != "" || nr.CaseID != "trtllm-qwen3-0.6b-rr-converged" {
		t.Errorf("unrun case row = %+v; want NOT_RUN interrupted trtllm-qwen3-0.6b-rr-converged with no run id", nr)
	}
	if c := rep.Counts(); c.NotRun < 1 || c.Overall() == results.StatusPass {
		t.Errorf("counts %s, overall %s; want NOT_RUN counted and no PASS", c, c.Overall())
	}
	// The exports say the same: every planned case, a non-PASS verdict,
	// and JUnit counting the unrun case as an error.
	xdir := t.TempDir()
	if _, err := Export(xdir, "q", rep.Rows); err != nil {
		t.Fatal(err)
	}
	var doc struct {
		Verdict results.Status `json:"verdict"`
		Counts  results.Counts `json:"counts"`
	}
	b, err := os.ReadFile(filepath.Join(xdir, "q.json"))
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(b, &doc); err != nil {
		t.Fatal(err)
	}
	if doc.Verdict == results.StatusPass || doc.Counts.Total != 3 || doc.Counts.NotRun < 1 {
		t.Errorf("exported verdict %s, counts %+v; want not PASS, total 3, NOT_RUN counted", doc.Verdict, doc.Counts)
	}
	j, err := os.ReadFile(filepath.Join(xdir, "q.junit.xml"))
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(j), `tests="3"`) || !strings.Contains(string(j), `<error message="NOT_RUN interrupted"`) {
		t.Errorf("JUnit does not count the unrun case as an error:\n%s", j)
	}
	if rep.Rows[0].Verdict != results.StatusPass {
		t.Errorf("first row %s; want PASS kept", rep.Rows[0].Verdict)
	}
	if started["trtllm"] {
		t.Errorf("the third case started after the interrupt")
	}
	// The case in flight was cleaned up: its cleanup step ran and passed
	// (workers stopped and proven gone, rule deleted, gateway closed).
	inflight, err := store.Get(rep.Rows[1].ID)
	if err != nil {
		t.Fatal(err)
	}
	last := inflight.Steps[len(inflight.Steps)-1]
	if last.Name != converged.StepCleanup || last.Status != results.StatusPass {
		t.Errorf("in-flight case's last step %q = %s; want cleanup PASS", last.Name, last.Status)
	}
	hist, err := store.List()
	if err != nil || len(hist) != 2 {
		t.Fatalf("history has %d rows (%v); want 2", len(hist), err)
	}
	for _, r := range hist {
		if rep, err := store.Verify(r.ID); err != nil || !rep.OK() {
			t.Errorf("run %s does not verify: %v %+v", r.ID, err, rep)
		}
	}
}
