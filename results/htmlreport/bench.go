package htmlreport

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"time"

	"github.com/llmgw/llmgw/bench/overhead"
	"github.com/llmgw/llmgw/bench/routing"
)

// Bench is the benchmark reports a site shows: what `llmgw bench routing
// --out DIR` writes as routing.json and `llmgw bench overhead --json FILE`
// writes.
type Bench struct {
	Routing  []benchRouting
	Overhead []benchOverhead
}

type benchRouting struct {
	Source  string
	Reports []*routing.Report
}

type benchOverhead struct {
	Source string
	Report *overhead.Report
}

func (b Bench) empty() bool { return len(b.Routing) == 0 && len(b.Overhead) == 0 }

// ErrNoBench: a --bench path held no benchmark report.
var ErrNoBench = errors.New("htmlreport: no benchmark report")

// LoadBench reads benchmark reports from paths: a directory contributes
// its routing.json and every overhead*.json; a file is read as a routing
// report (a JSON list) or an overhead report (a JSON object). A path that
// gives no report is an error wrapping ErrNoBench.
func LoadBench(paths []string) (Bench, error) {
	var b Bench
	for _, p := range paths {
		st, err := os.Stat(p)
		if err != nil {
			return b, fmt.Errorf("htmlreport: --bench: %w", err)
		}
		files := []string{p}
		if st.IsDir() {
			files = nil
			if _, err := os.Stat(filepath.Join(p, "routing.json")); err == nil {
				files = append(files, filepath.Join(p, "routing.json"))
			}
			more, _ := filepath.Glob(filepath.Join(p, "overhead*.json"))
			sort.Strings(more)
			files = append(files, more...)
			if len(files) == 0 {
				return b, fmt.Errorf("%w in %s (want routing.json or overhead*.json)", ErrNoBench, p)
			}
		}
		for _, f := range files {
			if err := b.add(f); err != nil {
				return b, err
			}
		}
	}
	return b, nil
}

func (b *Bench) add(file string) error {
	data, err := os.ReadFile(file)
	if err != nil {
		return fmt.Errorf("htmlreport: --bench: %w", err)
	}
	data = bytes.TrimSpace(data)
	switch {
	case bytes.HasPrefix(data, []byte("[")):
		var reps []*routing.Report
		if err := json.Unmarshal(data, &reps); err != nil || len(reps) == 0 {
			return fmt.Errorf("%w: %s is not a bench routing report: %v", ErrNoBench, file, err)
		}
		b.Routing = append(b.Routing, benchRouting{Source: filepath.Base(file), Reports: reps})
	case bytes.HasPrefix(data, []byte("{")):
		var rep overhead.Report
		if err := json.Unmarshal(data, &rep); err != nil || len(rep.Results) == 0 {
			return fmt.Errorf("%w: %s is not a bench overhead report: %v", ErrNoBench, file, err)
		}
		b.Overhead = append(b.Overhead, benchOverhead{Source: filepath.Base(file), Report: &rep})
	default:
		return fmt.Errorf("%w: %s is not JSON", ErrNoBench, file)
	}
	return nil
}

type benchPage struct {
	Nav      navData
	Routing  []routingView
	Overhead []overheadView
}

type routingView struct {
	Source   string
	Chart    string // relative to bench.html
	Markdown string
}

type overheadView struct {
	Source   string
	Markdown string
	Bars     []bar
	Height   int
	Scale    string // the longest bar's value
}

// bar is one target's added latency (p50 and p99 over direct) in the
// overhead chart.
type bar struct {
	Target   string
	Y        int
	W50, W99 int
	P50, P99 string
}

// chartWidth is the overhead chart's bar area in pixels.
const chartWidth = 420

// page renders the charts: routing's own PNG (routing.WritePNG, the chart
// `bench routing --out` draws) into bench/, and overhead's added latency
// as inline SVG beside the report's Markdown table.
func (b Bench) page(site string) (*benchPage, error) {
	p := &benchPage{}
	if len(b.Routing) > 0 {
		if err := os.MkdirAll(filepath.Join(site, "bench"), 0o755); err != nil && !errors.Is(err, fs.ErrExist) {
			return nil, fmt.Errorf("htmlreport: %w", err)
		}
	}
	for i, r := range b.Routing {
		var png, md bytes.Buffer
		if err := routing.WritePNG(&png, r.Reports); err != nil {
			return nil, fmt.Errorf("htmlreport: routing chart of %s: %w", r.Source, err)
		}
		if err := routing.WriteMarkdown(&md, r.Reports); err != nil {
			return nil, err
		}
		name := fmt.Sprintf("bench/routing-%d.png", i+1)
		if err := os.WriteFile(filepath.Join(site, filepath.FromSlash(name)), png.Bytes(), 0o644); err != nil {
			return nil, fmt.Errorf("htmlreport: %w", err)
		}
		p.Routing = append(p.Routing, routingView{Source: r.Source, Chart: name, Markdown: md.String()})
	}
	for _, o := range b.Overhead {
		var md bytes.Buffer
		if err := overhead.WriteMarkdown(&md, o.Report); err != nil {
			return nil, err
		}
		v := overheadView{Source: o.Source, Markdown: md.String()}
		var top time.Duration
		for _, r := range o.Report.Results {
			if r.Target != overhead.Direct && r.Skipped == "" {
				top = max(top, r.AddedP50, r.AddedP99)
			}
		}
		for _, r := range o.Report.Results {
			if r.Target == overhead.Direct || r.Skipped != "" {
				continue
			}
			v.Bars = append(v.Bars, bar{Target: r.Target, Y: len(v.Bars) * 34,
				W50: width(r.AddedP50, top), W99: width(r.AddedP99, top), P50: label(r.AddedP50), P99: label(r.AddedP99)})
		}
		v.Height = len(v.Bars)*34 + 4
		v.Scale = label(top)
		p.Overhead = append(p.Overhead, v)
	}
	return p, nil
}

// width is d's bar length against top (negative additions, which a noisy
// run can give, draw no bar; the label still says them).
func width(d, top time.Duration) int {
	if d <= 0 || top <= 0 {
		return 0
	}
	return max(1, int(float64(d)/float64(top)*chartWidth))
}

// label is a duration as the chart prints it (to the microsecond).
func label(d time.Duration) string { return d.Round(time.Microsecond).String() }
