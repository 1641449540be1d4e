package routing

import (
	"encoding/json"
	"fmt"
	"image/color"
	"io"
	"strings"
	"time"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"
	"gonum.org/v1/plot/vg/vgimg"
)

// WriteJSON writes reports as one indented JSON array.
func WriteJSON(w io.Writer, reports []*Report) error {
	b, err := json.MarshalIndent(reports, "", "  ")
	if err != nil {
		return fmt.Errorf("routing: encode json: %w", err)
	}
	if _, err := w.Write(append(b, '\n')); err != nil {
		return fmt.Errorf("routing: write json: %w", err)
	}
	return nil
}

// WriteMarkdown writes one table per report: the engine-reported prefix
// cache hit ratio, client-measured TTFT on streaming requests, throughput
// and load imbalance per policy.
func WriteMarkdown(w io.Writer, reports []*Report) error {
	var b strings.Builder
	for i, r := range reports {
		if i > 0 {
			b.WriteByte('\n')
		}
		fmt.Fprintf(&b, "### %s\n\n", r.Workload)
		fmt.Fprintf(&b, "%d requests, seed %d, %d endpoints × %d cache blocks, concurrency %d, prefill %v/token, decode %v/token, %d engine slots, max_tokens %d",
			r.Shape.Requests, r.Seed, r.Endpoints, r.CacheBlocks, r.Concurrency, r.PrefillPerToken, r.DecodePerToken, r.SimConcurrency, r.MaxTokens)
		if r.Partial {
			b.WriteString(" — **partial: interrupted**")
		}
		b.WriteString(".\n\n")
		b.WriteString("| policy | hit ratio | TTFT p50 | TTFT p99 | requests/s | imbalance | errors |\n")
		b.WriteString("|---|---:|---:|---:|---:|---:|---:|\n")
		for _, res := range r.Results {
			fmt.Fprintf(&b, "| %s | %.3f | %s | %s | %.0f | %.2f | %d |\n", res.Policy, res.HitRatio,
				fmtMS(res.TTFT.P50), fmtMS(res.TTFT.P99), res.Throughput, res.Imbalance, res.Errors)
		}
		if kv, or := r.Result(KVExact), r.BestOracle(); kv != nil && or != nil && or.HitRatio > 0 {
			fmt.Fprintf(&b, "\nkv-exact / %s hit ratio: %.3f", or.Policy, kv.HitRatio/or.HitRatio)
			if rr := r.Result(RoundRobin); rr != nil && rr.TTFT.P50 > 0 {
				fmt.Fprintf(&b, "; kv-exact / rr TTFT p50: %.3f", float64(kv.TTFT.P50)/float64(rr.TTFT.P50))
			}
			b.WriteString(".\n")
		}
	}
	if _, err := io.WriteString(w, b.String()); err != nil {
		return fmt.Errorf("routing: write markdown: %w", err)
	}
	return nil
}

func fmtMS(d time.Duration) string {
	return fmt.Sprintf("%.2f ms", float64(d)/float64(time.Millisecond))
}

// policyColors gives each policy a fixed colour across charts.
var policyColors = map[Policy]color.Color{
	RoundRobin:    color.RGBA{R: 0x99, G: 0x99, B: 0x99, A: 0xff},
	LeastInFlight: color.RGBA{R: 0x4c, G: 0x72, B: 0xb0, A: 0xff},
	CHWBL:         color.RGBA{R: 0xdd, G: 0x84, B: 0x52, A: 0xff},
	KVExact:       color.RGBA{R: 0x55, G: 0xa8, B: 0x68, A: 0xff},
	OraclePolicy:  color.RGBA{R: 0x81, G: 0x72, B: 0xb2, A: 0xff},
	OraclePrefix:  color.RGBA{R: 0xc4, G: 0xad, B: 0xe0, A: 0xff},
}

// WritePNG draws two grouped bar charts, one group per workload and one bar
// per policy: the prefix-cache hit ratio on top, TTFT p50 below.
func WritePNG(w io.Writer, reports []*Report) error {
	if len(reports) == 0 {
		return fmt.Errorf("%w: no report to chart", ErrParams)
	}
	seen := map[Policy]bool{}
	var names []string
	for _, r := range reports {
		names = append(names, string(r.Workload))
		for _, res := range r.Results {
			seen[res.Policy] = true
		}
	}
	var policies []Policy
	for _, p := range Policies() {
		if seen[p] {
			policies = append(policies, p)
		}
	}
	hit, err := barChart("Prefix-cache hit ratio (engine-reported)", "hit ratio", names, policies, reports,
		func(res *Result) float64 { return res.HitRatio })
	if err != nil {
		return err
	}
	ttft, err := barChart("TTFT p50 (client-measured, streaming)", "ms", names, policies, reports,
		func(res *Result) float64 { return float64(res.TTFT.P50) / float64(time.Millisecond) })
	if err != nil {
		return err
	}
	width := vg.Length(max(6, 1.6*float64(len(reports)))) * vg.Inch
	height := 8 * vg.Inch
	img := vgimg.New(width, height)
	dc := draw.New(img)
	tiles := draw.Tiles{Rows: 2, Cols: 1, PadX: vg.Millimeter, PadY: 4 * vg.Millimeter, PadTop: 2 * vg.Millimeter, PadBottom: 2 * vg.Millimeter, PadLeft: 2 * vg.Millimeter, PadRight: 2 * vg.Millimeter}
	canvases := plot.Align([][]*plot.Plot{{hit}, {ttft}}, tiles, dc)
	hit.Draw(canvases[0][0])
	ttft.Draw(canvases[1][0])
	png := vgimg.PngCanvas{Canvas: img}
	if _, err := png.WriteTo(w); err != nil {
		return fmt.Errorf("routing: write png: %w", err)
	}
	return nil
}

func barChart(title, ylabel string, groups []string, policies []Policy, reports []*Report, value func(*Result) float64) (*plot.Plot, error) {
	p := plot.New()
	p.Title.Text = title
	p.Y.Label.Text = ylabel
	p.Y.Min = 0
	barWidth := vg.Points(min(60, 300/float64(len(policies)*len(groups))))
	peak := 0.0
	for i, pol := range policies {
		vals := make(plotter.Values, len(reports))
		for j, r := range reports {
			if res := r.Result(pol); res != nil {
				vals[j] = value(res)
				peak = max(peak, vals[j])
			}
		}
		bars, err := plotter.NewBarChart(vals, barWidth)
		if err != nil {
			return nil, fmt.Errorf("routing: chart %s: %w", pol, err)
		}
		bars.LineStyle.Width = 0
		bars.Color = policyColors[pol]
		bars.Offset = vg.Length(float64(i)-float64(len(policies)-1)/2) * barWidth
		p.Add(bars)
		p.Legend.Add(string(pol), bars)
	}
	// Headroom above the tallest bar keeps the legend off the bars.
	p.Y.Max = max(peak, 1e-9) * (1.15 + 0.12*float64(len(policies)))
	p.Legend.Top = true
	p.NominalX(groups...)
	return p, nil
}
