package htmlreport

import (
	"errors"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"golang.org/x/net/html"

	"github.com/llmgw/llmgw/results"
)

const hostile = `</pre><script>alert("evidence")</script><img src=x onerror=alert(1)>`

// fixture writes a store of four runs: two of one tuple (PASS, then FAIL
// with hostile evidence), a BLOCKED run, and one on launched workers whose
// version differs from the catalog's. It returns the store.
func fixture(t *testing.T) *results.Store {
	t.Helper()
	clock := time.Date(2026, 12, 1, 10, 0, 0, 0, time.UTC)
	st, err := results.Open(t.TempDir(), results.WithClock(func() time.Time { clock = clock.Add(time.Second); return clock }))
	if err != nil {
		t.Fatal(err)
	}
	sim := results.Tuple{Engine: "vllm", EngineVersion: "0.11.0", Profile: "qwen3-0.6b", Topology: "converged", Mode: "exact", Launcher: results.LauncherSim, SimulatedWorkers: true}
	type ev struct{ name, data string }
	runs := []struct {
		tuple    results.Tuple
		status   results.Status
		code     string
		reason   string
		evidence []ev
		reported string
	}{
		{sim, results.StatusPass, "", "delivered", []ev{{"json-exchange.json", `{"method":"POST","url":"http://127.0.0.1:1/v1/chat/completions","request_headers":{"X-Request-Id":"r1"},"request_body":{"model":"m"},"status":200,"response_headers":{"Content-Type":"application/json"},"response_body":"{\"id\":\"x\"}"}`}}, ""},
		{sim, results.StatusFail, "DELIVERY_FAILED", "answer " + hostile, []ev{
			{"json-exchange.json", `{"method":"POST","url":"http://127.0.0.1:1/v1/chat/completions","status":500,"response_body":"` + strings.ReplaceAll(hostile, `"`, `\"`) + `"}`},
			{"evil.html", hostile},
			{"notes.txt", "plain " + hostile},
			{"metrics.json", `{"a":[1,2],"b":"` + strings.ReplaceAll(hostile, `"`, `\"`) + `"}`},
		}, ""},
		{results.Tuple{Engine: "trtllm", EngineVersion: "1.0.0", Profile: "qwen3-0.6b", Topology: "pd", Mode: "exact", Launcher: results.LauncherSim, SimulatedWorkers: true},
			results.StatusBlocked, "no_gpu", "no GPU", nil, ""},
		{results.Tuple{Engine: "llamacpp", EngineVersion: "b7800", Profile: "qwen3-0.6b", Topology: "converged", Mode: "chwbl", Launcher: results.LauncherDocker},
			results.StatusPass, "", "ok", nil, "b0-unknown"},
	}
	for _, r := range runs {
		w, err := st.NewRun(r.tuple)
		if err != nil {
			t.Fatal(err)
		}
		step := results.Step{Name: "deliver", Status: r.status, ReasonCode: r.code, Reason: r.reason, Started: clock, Ended: clock.Add(1250 * time.Millisecond)}
		for _, e := range r.evidence {
			p, err := w.AddEvidence("01-deliver/"+e.name, []byte(e.data))
			if err != nil {
				t.Fatal(err)
			}
			step.Evidence = append(step.Evidence, p)
		}
		if err := w.RecordStep(results.Step{Name: "select tuple", Status: results.StatusPass, Started: clock, Ended: clock}); err != nil {
			t.Fatal(err)
		}
		if err := w.RecordStep(step); err != nil {
			t.Fatal(err)
		}
		if r.reported != "" {
			if err := w.SetWorkerVersion(r.reported, true); err != nil {
				t.Fatal(err)
			}
		}
		if err := w.SetLanes(results.Lanes{GatewayDelivery: r.status}); err != nil {
			t.Fatal(err)
		}
		if _, err := w.Finish(); err != nil {
			t.Fatal(err)
		}
	}
	return st
}

// writeSite renders every run of st (and the routing bench fixture) into
// a fresh directory.
func writeSite(t *testing.T, st *results.Store) string {
	t.Helper()
	rows, err := st.List()
	if err != nil {
		t.Fatal(err)
	}
	site := Site{RunDir: st.RunDir, Generated: time.Date(2026, 12, 2, 0, 0, 0, 0, time.UTC)}
	for _, r := range rows {
		run, err := st.Get(r.ID)
		if err != nil {
			t.Fatal(err)
		}
		site.Runs = append(site.Runs, run)
	}
	site.Bench, err = LoadBench([]string{filepath.Join("testdata", "bench")})
	if err != nil {
		t.Fatal(err)
	}
	dir := filepath.Join(t.TempDir(), "site")
	if err := Write(dir, site); err != nil {
		t.Fatal(err)
	}
	return dir
}

func parse(t *testing.T, file string) *html.Node {
	t.Helper()
	f, err := os.Open(file)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	doc, err := html.Parse(f)
	if err != nil {
		t.Fatalf("%s: %v", file, err)
	}
	return doc
}

func walk(n *html.Node, fn func(*html.Node)) {
	fn(n)
	for c := n.FirstChild; c != nil; c = c.NextSibling {
		walk(c, fn)
	}
}

func attr(n *html.Node, k string) (string, bool) {
	for _, a := range n.Attr {
		if a.Key == k {
			return a.Val, true
		}
	}
	return "", false
}

func text(n *html.Node) string {
	var b strings.Builder
	walk(n, func(c *html.Node) {
		if c.Type == html.TextNode {
			b.WriteString(c.Data)
		}
	})
	return b.String()
}

func sitePages(t *testing.T, dir string) []string {
	t.Helper()
	var out []string
	err := filepath.WalkDir(dir, func(p string, d os.DirEntry, err error) error {
		if err == nil && strings.HasSuffix(p, ".html") {
			out = append(out, p)
		}
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// TestSiteStructure parses every page: links and images are relative and
// resolve to files (and anchors to ids), no page loads anything external,
// the only script is the matrix's inline filter, hostile evidence is text,
// and the matrix, run pages and trends say what the store holds.
func TestSiteStructure(t *testing.T) {
	st := fixture(t)
	dir := writeSite(t, st)
	all := sitePages(t, dir)
	if len(all) != 4+3 { // 4 runs, index, trends, bench
		t.Fatalf("pages: %v", all)
	}
	ids := map[string]map[string]bool{}
	docs := map[string]*html.Node{}
	for _, p := range all {
		doc := parse(t, p)
		docs[p] = doc
		ids[p] = map[string]bool{}
		walk(doc, func(n *html.Node) {
			if v, ok := attr(n, "id"); ok {
				ids[p][v] = true
			}
		})
	}
	for p, doc := range docs {
		scripts := 0
		walk(doc, func(n *html.Node) {
			if n.Type != html.ElementNode {
				return
			}
			if n.Data == "script" {
				scripts++
				if _, ok := attr(n, "src"); ok || filepath.Base(p) != "index.html" {
					t.Errorf("%s: script element %v", p, n.Attr)
				}
			}
			if n.Data == "link" {
				t.Errorf("%s: <link> element: pages must be self-contained", p)
			}
			for _, a := range n.Attr {
				if strings.HasPrefix(a.Key, "on") {
					t.Errorf("%s: event handler attribute %s=%q", p, a.Key, a.Val)
				}
				if a.Key != "href" && a.Key != "src" {
					continue
				}
				u, err := url.Parse(a.Val)
				if err != nil || u.Scheme != "" || u.Host != "" || strings.HasPrefix(u.Path, "/") {
					t.Errorf("%s: %s=%q is not a relative link", p, a.Key, a.Val)
					continue
				}
				target := p
				if u.Path != "" {
					target = filepath.Join(filepath.Dir(p), filepath.FromSlash(u.Path))
					if _, err := os.Stat(target); err != nil {
						t.Errorf("%s: %s=%q does not resolve: %v", p, a.Key, a.Val, err)
						continue
					}
				}
				if u.Fragment != "" && !ids[target][u.Fragment] {
					t.Errorf("%s: %s=%q: no id %q in %s", p, a.Key, a.Val, u.Fragment, target)
				}
			}
		})
		if filepath.Base(p) == "index.html" && scripts != 1 {
			t.Errorf("index.html: %d scripts, want the one filter", scripts)
		}
		raw, _ := os.ReadFile(p)
		if strings.Contains(string(raw), "<script>alert") {
			t.Errorf("%s: hostile evidence unescaped", p)
		}
	}

	rows, _ := st.List()
	index := docs[filepath.Join(dir, "index.html")]
	var matrix []*html.Node
	walk(index, func(n *html.Node) {
		if n.Type == html.ElementNode && n.Data == "tr" {
			if _, ok := attr(n, "data-engine"); ok {
				matrix = append(matrix, n)
			}
		}
	})
	// Three rows: the two vllm runs share a tuple; the latest (FAIL) shows.
	want := map[string]string{"vllm": "FAIL", "trtllm": "BLOCKED", "llamacpp": "PASS"}
	if len(matrix) != len(want) {
		t.Fatalf("matrix rows = %d, want %d", len(matrix), len(want))
	}
	for _, tr := range matrix {
		e, _ := attr(tr, "data-engine")
		v, _ := attr(tr, "data-verdict")
		if v != want[e] {
			t.Errorf("matrix row %s: verdict %s, want %s", e, v, want[e])
		}
		if e == "llamacpp" && !strings.Contains(text(tr), "b7800≠b0-unknown") {
			t.Errorf("matrix row llamacpp does not show the version mismatch: %q", text(tr))
		}
	}

	failed := rows[1].ID
	runDoc := docs[filepath.Join(dir, "runs", failed+".html")]
	var pres []string
	var stepNames []string
	walk(runDoc, func(n *html.Node) {
		if n.Type != html.ElementNode {
			return
		}
		switch n.Data {
		case "pre":
			pres = append(pres, text(n))
		case "tbody":
			if tr := n.Parent; tr != nil {
				if c, _ := attr(tr, "class"); c == "steps" {
					for row := n.FirstChild; row != nil; row = row.NextSibling {
						if row.Type == html.ElementNode {
							stepNames = append(stepNames, text(row))
						}
					}
				}
			}
		}
	})
	if len(stepNames) != 2 || !strings.HasPrefix(stepNames[0], "1select tuplePASS") || !strings.Contains(stepNames[1], "deliverFAILDELIVERY_FAILED1.25s") {
		t.Errorf("steps in order with status, code, duration: %q", stepNames)
	}
	joined := strings.Join(pres, "\n")
	for _, w := range []string{"status 500", hostile, "plain " + hostile, "{\n  \"a\": [\n    1,"} {
		if !strings.Contains(joined, w) {
			t.Errorf("run page lacks %q as text; pre blocks:\n%s", w, joined)
		}
	}
	if _, err := os.Stat(filepath.Join(dir, "runs", failed, "evidence", "01-deliver", "evil.html.txt")); err != nil {
		t.Errorf("raw copy of evil.html is not kept as .txt: %v", err)
	}
	if _, err := os.Stat(filepath.Join(dir, "runs", failed, "evidence", "01-deliver", "evil.html")); err == nil {
		t.Error("raw copy of evil.html kept under a name a browser runs")
	}
	ll := docs[filepath.Join(dir, "runs", rows[3].ID+".html")]
	if s := text(ll); !strings.Contains(s, "b0-unknown mismatch with the catalog") || !strings.Contains(s, "b7800") {
		t.Errorf("run page lacks the catalog and reported versions")
	}
	trends := text(docs[filepath.Join(dir, "trends.html")])
	if !strings.Contains(trends, "vllm-qwen3-0.6b-exact-converged (simulated)") || strings.Count(trends, rows[0].ID) < 2 {
		t.Errorf("trends lack the vllm tuple's runs")
	}
}

// TestWriteRefusesForeignDir: a non-empty directory that is not an
// earlier report is never emptied; an earlier report is replaced.
func TestWriteRefusesForeignDir(t *testing.T) {
	cases := []struct {
		name    string
		prepare func(dir string)
		wantErr error
	}{
		{"foreign", func(dir string) { _ = os.WriteFile(filepath.Join(dir, "keep.txt"), nil, 0o644) }, ErrNotReportDir},
		{"earlier report", func(dir string) {
			_ = os.WriteFile(filepath.Join(dir, Marker), nil, 0o644)
			_ = os.WriteFile(filepath.Join(dir, "stale.html"), nil, 0o644)
		}, nil},
		{"empty", func(string) {}, nil},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			tc.prepare(dir)
			err := Write(dir, Site{RunDir: func(string) string { return dir }})
			if !errors.Is(err, tc.wantErr) {
				t.Fatalf("Write = %v, want %v", err, tc.wantErr)
			}
			if tc.wantErr != nil {
				if _, err := os.Stat(filepath.Join(dir, "keep.txt")); err != nil {
					t.Errorf("foreign file removed: %v", err)
				}
				return
			}
			if _, err := os.Stat(filepath.Join(dir, "stale.html")); err == nil {
				t.Error("stale page of the earlier report kept")
			}
			if _, err := os.Stat(filepath.Join(dir, "index.html")); err != nil {
				t.Error(err)
			}
		})
	}
}

// FuzzEvidence renders arbitrary evidence bytes under an exchange, a JSON
// and a document name: the run page never gains an element or attribute
// from them.
func FuzzEvidence(f *testing.F) {
	f.Add([]byte(hostile))
	f.Add([]byte(`{"method":"GET","url":"x","status":200,"response_body":"<script>x</script>"}`))
	f.Add([]byte{0xff, 0x00, '<'})
	f.Fuzz(func(t *testing.T, data []byte) {
		runDir, site := t.TempDir(), t.TempDir()
		if err := os.MkdirAll(filepath.Join(runDir, "evidence"), 0o755); err != nil {
			t.Fatal(err)
		}
		p := &runPage{Run: &results.Run{ID: "r"}}
		for _, name := range []string{"evidence/a" + "-exchange.json", "evidence/b.json", "evidence/c.html"} {
			if err := os.WriteFile(filepath.Join(runDir, filepath.FromSlash(name)), data, 0o644); err != nil {
				t.Fatal(err)
			}
			ev, err := copyEvidence(site, "r", runDir, name)
			if err != nil {
				t.Fatal(err)
			}
			ev.Anchor = "ev"
			p.Evidence = append(p.Evidence, ev)
		}
		var b strings.Builder
		if err := pages.ExecuteTemplate(&b, "run.html", p); err != nil {
			t.Fatal(err)
		}
		doc, err := html.Parse(strings.NewReader(b.String()))
		if err != nil {
			t.Fatal(err)
		}
		walk(doc, func(n *html.Node) {
			if n.Type != html.ElementNode {
				return
			}
			switch n.Data {
			case "script", "img", "iframe", "object", "embed", "svg", "form", "style":
				if n.Data != "style" || n.Parent == nil || n.Parent.Data != "head" {
					t.Errorf("evidence %q made a <%s>", data, n.Data)
				}
			}
			for _, a := range n.Attr {
				if strings.HasPrefix(a.Key, "on") {
					t.Errorf("evidence %q made an attribute %s", data, a.Key)
				}
			}
		})
	})
}
