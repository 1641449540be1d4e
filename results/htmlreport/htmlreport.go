// Package htmlreport writes the qualification results as a self-contained
// static site (`llmgw results report --html DIR`): the matrix, a page per
// run with its steps and rendered evidence, the trends of each tuple, and
// the benchmark reports when given.
//
// Every page carries its own CSS; the matrix page alone has an inline
// script, which only adds filters (every page reads whole without it).
// Nothing is fetched from anywhere: links and images are relative paths to
// files inside the site. Evidence is untrusted bytes: it is rendered
// through html/template, and a raw copy whose name a browser would open
// as a document (.html, .svg, ...) gets ".txt" appended.
package htmlreport

import (
	"bytes"
	"embed"
	"encoding/json"
	"errors"
	"fmt"
	"html/template"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/llmgw/llmgw/results"
	"github.com/llmgw/llmgw/runbook/labkit"
)

// Marker is the file a report directory carries, so that a later report
// may replace it; a non-empty directory without it is refused.
const Marker = ".llmgw-report"

// MaxRendered is the largest evidence file rendered inline on a run page;
// a larger one is linked only.
const MaxRendered = 1 << 20

// ErrNotReportDir: the target directory holds files and is not an earlier
// report.
var ErrNotReportDir = errors.New("htmlreport: directory is not empty and holds no earlier report")

// Site is what Write renders.
type Site struct {
	// Runs are the runs, each read with results.Store.Get, in the order
	// they finished.
	Runs []*results.Run
	// RunDir returns the directory of a run (results.Store.RunDir), from
	// which evidence files are copied.
	RunDir func(id string) string
	// Bench holds benchmark reports (LoadBench); empty: no bench page.
	Bench Bench
	// Generated is the time stamped on the pages.
	Generated time.Time
}

//go:embed templates/*.html templates/style.css templates/filter.js
var tmplFS embed.FS

var pages = template.Must(template.New("").Funcs(template.FuncMap{
	"statusClass": statusClass,
	"css":         func() template.CSS { return template.CSS(styleCSS) },
	"js":          func() template.JS { return template.JS(filterJS) },
	"utc":         func(t time.Time) string { return t.UTC().Format(time.RFC3339) },
	"dash":        dash,
	"version":     results.VersionCell,
	"workers":     results.WorkersKind,
	"lanes":       func() []string { return results.LaneNames },
	"simnote":     func() string { return results.SimulatedNote },
}).ParseFS(tmplFS, "templates/*.html"))

var styleCSS, filterJS = mustRead("templates/style.css"), mustRead("templates/filter.js")

func mustRead(name string) string {
	b, err := tmplFS.ReadFile(name)
	if err != nil {
		panic(err)
	}
	return string(b)
}

// statusClass is the CSS class of a status; anything that is not one of the
// five statuses gets the neutral class.
func statusClass(s results.Status) string {
	s = s.Norm()
	if !s.Valid() {
		return "st st-other"
	}
	return "st st-" + string(s)
}

func dash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

// Write renders s into dir: index.html (the matrix), trends.html,
// runs/<id>.html with runs/<id>/evidence/... (raw copies), and bench.html
// when s.Bench has reports. dir must not exist, be empty, or hold an
// earlier report (Marker), which is replaced.
func Write(dir string, s Site) error {
	if err := prepare(dir); err != nil {
		return err
	}
	if s.Generated.IsZero() {
		s.Generated = time.Now()
	}
	rows := make([]results.RunSummary, len(s.Runs))
	for i, r := range s.Runs {
		rows[i] = r.Summary()
	}
	groups := group(s.Runs)
	hasBench := !s.Bench.empty()
	nav := navData{Bench: hasBench}
	idx := indexPage{Nav: nav, Generated: s.Generated, Counts: results.Tally(rows), Simulated: anySimulated(s.Runs)}
	idx.Overall = idx.Counts.Overall()
	for _, g := range groups {
		idx.Rows = append(idx.Rows, g.matrixRow())
	}
	if err := render(filepath.Join(dir, "index.html"), "index.html", idx); err != nil {
		return err
	}
	if err := render(filepath.Join(dir, "trends.html"), "trends.html", trendsPage{Nav: nav, Groups: groups}); err != nil {
		return err
	}
	for _, r := range s.Runs {
		p, err := runPageOf(dir, r, s.RunDir(r.ID), groups)
		if err != nil {
			return err
		}
		p.Nav = navData{Up: "../", Bench: hasBench}
		if err := render(filepath.Join(dir, "runs", r.ID+".html"), "run.html", p); err != nil {
			return err
		}
	}
	if hasBench {
		bp, err := s.Bench.page(dir)
		if err != nil {
			return err
		}
		bp.Nav = nav
		if err := render(filepath.Join(dir, "bench.html"), "bench.html", bp); err != nil {
			return err
		}
	}
	return os.WriteFile(filepath.Join(dir, Marker), []byte("written by llmgw results report --html; the next report replaces this directory\n"), 0o644)
}

// prepare makes dir an empty directory, refusing one that holds anything
// other than an earlier report.
func prepare(dir string) error {
	ents, err := os.ReadDir(dir)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		return os.MkdirAll(filepath.Join(dir, "runs"), 0o755)
	case err != nil:
		return fmt.Errorf("htmlreport: %w", err)
	case len(ents) > 0:
		if _, err := os.Stat(filepath.Join(dir, Marker)); err != nil {
			return fmt.Errorf("%w: %s", ErrNotReportDir, dir)
		}
		for _, e := range ents {
			if err := os.RemoveAll(filepath.Join(dir, e.Name())); err != nil {
				return fmt.Errorf("htmlreport: replace %s: %w", dir, err)
			}
		}
	}
	return os.MkdirAll(filepath.Join(dir, "runs"), 0o755)
}

func render(file, name string, data any) error {
	var b bytes.Buffer
	if err := pages.ExecuteTemplate(&b, name, data); err != nil {
		return fmt.Errorf("htmlreport: %s: %w", name, err)
	}
	if err := os.MkdirAll(filepath.Dir(file), 0o755); err != nil {
		return fmt.Errorf("htmlreport: %w", err)
	}
	if err := os.WriteFile(file, b.Bytes(), 0o644); err != nil {
		return fmt.Errorf("htmlreport: %w", err)
	}
	return nil
}

func anySimulated(runs []*results.Run) bool {
	return slices.ContainsFunc(runs, func(r *results.Run) bool { return r.Tuple.SimulatedWorkers })
}

type navData struct {
	Up    string // "" on top-level pages, "../" on run pages
	Bench bool
}

type indexPage struct {
	Nav       navData
	Generated time.Time
	Counts    results.Counts
	Overall   results.Status
	Simulated bool
	Rows      []matrixRow
}

// tupleGroup is every run of one matrix key, oldest first.
type tupleGroup struct {
	Key    string // results.Tuple.CaseID and the kind of workers
	Anchor string
	Tuple  results.Tuple // the latest run's
	Runs   []*results.Run
}

// key is the matrix key: the case and the kind of workers, so a run on
// simulated workers never stands in for one on an engine.
func key(t results.Tuple) string { return t.CaseID() + " (" + results.WorkersKind(t) + ")" }

func group(runs []*results.Run) []*tupleGroup {
	by := map[string]*tupleGroup{}
	var out []*tupleGroup
	for _, r := range runs {
		k := key(r.Tuple)
		g := by[k]
		if g == nil {
			g = &tupleGroup{Key: k, Anchor: "t-" + anchor(k)}
			by[k] = g
			out = append(out, g)
		}
		g.Runs = append(g.Runs, r)
	}
	for _, g := range out {
		sort.SliceStable(g.Runs, func(i, j int) bool { return g.Runs[i].Started.Before(g.Runs[j].Started) })
		g.Tuple = g.Runs[len(g.Runs)-1].Tuple
	}
	sort.Slice(out, func(i, j int) bool {
		a, b := out[i].Tuple, out[j].Tuple
		for _, c := range [][2]string{{a.Engine, b.Engine}, {a.Profile, b.Profile}, {a.Mode, b.Mode}, {a.Topology, b.Topology}} {
			if c[0] != c[1] {
				return c[0] < c[1]
			}
		}
		return out[i].Key < out[j].Key
	})
	return out
}

// anchor keeps the id-safe bytes of s.
func anchor(s string) string {
	return strings.Map(func(r rune) rune {
		if r < 0x80 && (r == '-' || r == '_' || r >= '0' && r <= '9' || r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z') {
			return r
		}
		return '_'
	}, s)
}

type matrixRow struct {
	Tuple   results.Tuple
	Latest  *results.Run
	Reason  string
	Lanes   []results.Status
	Count   int
	Anchor  string
	Verdict results.Status
}

func (g *tupleGroup) matrixRow() matrixRow {
	last := g.Runs[len(g.Runs)-1]
	sum := last.Summary()
	return matrixRow{Tuple: last.Tuple, Latest: last, Reason: sum.ReasonCode, Lanes: last.Lanes.List(),
		Count: len(g.Runs), Anchor: g.Anchor, Verdict: sum.Verdict}
}

type trendsPage struct {
	Nav    navData
	Groups []*tupleGroup
}

// Cells are the trend strip's squares, one per run, oldest first.
func (g *tupleGroup) Cells() []trendCell {
	out := make([]trendCell, len(g.Runs))
	for i, r := range g.Runs {
		out[i] = trendCell{X: i * 18, Run: r, Verdict: r.Verdict.Norm()}
	}
	return out
}

// Width is the trend strip's width in pixels.
func (g *tupleGroup) Width() int { return len(g.Runs)*18 + 2 }

type trendCell struct {
	X       int
	Run     *results.Run
	Verdict results.Status
}

// Fill is the square's colour (SVG has no CSS class lookup in every
// viewer, so the colour is given).
func (c trendCell) Fill() string {
	switch c.Verdict {
	case results.StatusPass:
		return "#2e7d32"
	case results.StatusFail:
		return "#c62828"
	case results.StatusBlocked:
		return "#ef8f00"
	}
	return "#9e9e9e"
}

type runPage struct {
	Nav       navData
	Run       *results.Run
	Summary   results.RunSummary
	Lanes     []laneView
	Steps     []stepView
	Evidence  []*evidenceView
	Group     *tupleGroup
	Simulated bool
}

type laneView struct {
	Name   string
	Status results.Status
	Source string
}

type stepView struct {
	N        int
	Step     results.Step
	Duration string
	Evidence []*evidenceView
}

// evidenceView is one evidence file as a run page shows it.
type evidenceView struct {
	Path   string // relative to the run directory, as the run records it
	Anchor string
	Raw    string // link to the raw copy, relative to the run page
	Size   int64
	// Exactly one of the following is set (none: linked only, Note says
	// why).
	Exchange *exchangeView
	JSON     string
	Text     string
	Note     string
}

type exchangeView struct {
	Method, URL, Error string
	ReqHeaders         []kv
	ReqBody            string
	Status             int
	RespHeaders        []kv
	RespBody           string
}

type kv struct{ K, V string }

func runPageOf(site string, r *results.Run, runDir string, groups []*tupleGroup) (*runPage, error) {
	p := &runPage{Run: r, Summary: r.Summary(), Simulated: r.Tuple.SimulatedWorkers}
	for i, s := range r.Lanes.List() {
		n := results.LaneNames[i]
		p.Lanes = append(p.Lanes, laneView{Name: n, Status: s, Source: r.LaneSources[n]})
	}
	k := key(r.Tuple)
	for _, g := range groups {
		if g.Key == k {
			p.Group = g
		}
	}
	byPath := map[string]*evidenceView{}
	add := func(rel string, size int64) (*evidenceView, error) {
		if ev := byPath[rel]; ev != nil {
			return ev, nil
		}
		ev, err := copyEvidence(site, r.ID, runDir, rel)
		if err != nil {
			return nil, err
		}
		ev.Anchor = fmt.Sprintf("ev-%d", len(p.Evidence)+1)
		byPath[rel] = ev
		p.Evidence = append(p.Evidence, ev)
		return ev, nil
	}
	for i, st := range r.Steps {
		sv := stepView{N: i + 1, Step: st, Duration: st.DurationText()}
		for _, e := range st.Evidence {
			ev, err := add(e, -1)
			if err != nil {
				return nil, err
			}
			sv.Evidence = append(sv.Evidence, ev)
		}
		p.Steps = append(p.Steps, sv)
	}
	for _, a := range r.Artifacts { // files no step cites still belong to the run
		if _, err := add(a.Path, a.Size); err != nil {
			return nil, err
		}
	}
	return p, nil
}

// documentExt are the extensions a browser opens as a document (and would
// run scripts in); a raw copy with one gets ".txt" appended.
var documentExt = []string{".html", ".htm", ".xhtml", ".xht", ".svg", ".svgz", ".xml", ".xsl", ".xslt", ".mht", ".mhtml", ".shtml", ".pdf"}

// copyEvidence copies evidence rel of run id into the site and says how to
// show it. A path that is not a clean relative path inside the run
// directory, or that is not a regular file, is shown as such, never
// followed.
func copyEvidence(site, id, runDir, rel string) (*evidenceView, error) {
	ev := &evidenceView{Path: rel}
	if !filepath.IsLocal(filepath.FromSlash(rel)) || path.Clean(rel) != rel || strings.Contains(rel, `\`) {
		ev.Note = "not a path inside the run directory: not read"
		return ev, nil
	}
	src := filepath.Join(runDir, filepath.FromSlash(rel))
	st, err := os.Lstat(src)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		ev.Note = "missing from the run directory (see llmgw results verify)"
		return ev, nil
	case err != nil:
		return nil, fmt.Errorf("htmlreport: evidence %s: %w", rel, err)
	case !st.Mode().IsRegular():
		ev.Note = "not a regular file: not read"
		return ev, nil
	}
	data, err := os.ReadFile(src)
	if err != nil {
		return nil, fmt.Errorf("htmlreport: evidence %s: %w", rel, err)
	}
	ev.Size = int64(len(data))
	raw := rel
	if slices.Contains(documentExt, strings.ToLower(path.Ext(rel))) {
		raw += ".txt"
	}
	dst := filepath.Join(site, "runs", id, filepath.FromSlash(raw))
	if err := os.MkdirAll(filepath.Dir(dst), 0o755); err != nil {
		return nil, fmt.Errorf("htmlreport: %w", err)
	}
	if err := os.WriteFile(dst, data, 0o644); err != nil {
		return nil, fmt.Errorf("htmlreport: %w", err)
	}
	ev.Raw = id + "/" + raw
	switch {
	case len(data) > MaxRendered:
		ev.Note = fmt.Sprintf("%d bytes: too large to show here (over %d); open the raw file", len(data), MaxRendered)
	case strings.HasSuffix(rel, labkit.ExchangeSuffix) && exchange(data) != nil:
		ev.Exchange = exchange(data)
	case json.Valid(data):
		ev.JSON = pretty(data)
	case utf8.Valid(data):
		ev.Text = string(data)
	default:
		ev.Note = fmt.Sprintf("%d bytes of binary data: open the raw file", len(data))
	}
	return ev, nil
}

// exchange decodes an exchange evidence file (labkit.Exchange), or nil
// when it is not one.
func exchange(data []byte) *exchangeView {
	var ex labkit.Exchange
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	if dec.Decode(&ex) != nil || ex.Method == "" {
		return nil
	}
	v := &exchangeView{Method: ex.Method, URL: ex.URL, Error: ex.Error, Status: ex.Status,
		ReqHeaders: sortedKV(ex.ReqHeader), RespHeaders: sortedKV(ex.Header), RespBody: ex.Body}
	switch {
	case len(ex.ReqBody) > 0:
		v.ReqBody = pretty(ex.ReqBody)
	default:
		v.ReqBody = ex.ReqRaw
	}
	if json.Valid([]byte(ex.Body)) {
		v.RespBody = pretty([]byte(ex.Body))
	}
	return v
}

func sortedKV(m map[string]string) []kv {
	out := make([]kv, 0, len(m))
	for k, v := range m {
		out = append(out, kv{k, v})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].K < out[j].K })
	return out
}

func pretty(data []byte) string {
	var b bytes.Buffer
	if json.Indent(&b, bytes.TrimSpace(data), "", "  ") != nil {
		return string(data)
	}
	return b.String()
}
