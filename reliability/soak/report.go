package main

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/llmgw/llmgw/results"
)

// trend compares the median of the first and last thirds of the samples
// taken under load (the first sample, before the load, and the last two,
// right after it and after the drain, excluded).
type trend struct {
	name                                      string
	rest0, first, last, max, restNow, drained float64
}

func trendOf(name string, ss []sample, v func(sample) float64) trend {
	t := trend{name: name}
	if len(ss) == 0 {
		return t
	}
	t.rest0 = v(ss[0])
	if len(ss) < 4 {
		return t
	}
	t.restNow, t.drained = v(ss[len(ss)-2]), v(ss[len(ss)-1])
	load := ss[1 : len(ss)-2]
	third := max(len(load)/3, 1)
	med := func(part []sample) float64 {
		xs := make([]float64, len(part))
		for i, s := range part {
			xs[i] = v(s)
		}
		slices.Sort(xs)
		return xs[len(xs)/2]
	}
	t.first, t.last = med(load[:third]), med(load[len(load)-third:])
	for _, s := range load {
		t.max = max(t.max, v(s))
	}
	return t
}

// flat holds when the last third's median is within 10 % (plus slack for
// small absolute values) of the first third's.
func (t trend) flat(slack float64) bool { return t.last <= t.first*1.10+slack }

func writeReport(o options, c *counters, ss []sample, elapsed time.Duration, d drainResult) error {
	if err := os.MkdirAll(o.out, 0o755); err != nil {
		return fmt.Errorf("soak: report dir: %w", err)
	}
	var csv strings.Builder
	csv.WriteString("elapsed_s,goroutines,heap_inuse_bytes,open_fds,rss_bytes,sent,ok,gateway_5xx,engine_5xx,transport_errors,broken_streams,p50_ms,p99_ms\n")
	for _, s := range ss {
		fmt.Fprintf(&csv, "%.0f,%.0f,%.0f,%.0f,%.0f,%d,%d,%d,%d,%d,%d,%.2f,%.2f\n", s.at.Seconds(), s.goroutines, s.heapInuse, s.openFDs, s.rss,
			s.sent, s.ok, s.gateway5xx, s.engine5xx, s.transport, s.broken, float64(s.p50.Microseconds())/1000, float64(s.p99.Microseconds())/1000)
	}
	if err := results.WriteFileAtomic(filepath.Join(o.out, "samples.csv"), []byte(csv.String())); err != nil {
		return fmt.Errorf("soak: write csv: %w", err)
	}
	trends := []struct {
		t     trend
		slack float64
		unit  string
	}{
		{trendOf("goroutines", ss, func(s sample) float64 { return s.goroutines }), 50, ""},
		{trendOf("heap in use", ss, func(s sample) float64 { return s.heapInuse / (1 << 20) }), 8, " MiB"},
		{trendOf("open fds", ss, func(s sample) float64 { return s.openFDs }), 50, ""},
		{trendOf("RSS", ss, func(s sample) float64 { return s.rss / (1 << 20) }), 16, " MiB"},
	}
	var md strings.Builder
	fmt.Fprintf(&md, "# Soak report\n\n")
	fmt.Fprintf(&md, "Command: `go run ./reliability/soak -duration %v -rps %d -stream-frac %.2f -engine-error-rate %g -max-tokens %d`  \n", o.duration, o.rps, o.streamFrac, o.errorRate, o.maxTokens)
	fmt.Fprintf(&md, "Finished %s; ran %v. Topology: one `llmgw serve` child, three `llmgw sim --engine vllm` children, one CHWBL rule (sel 8), all on 127.0.0.1. Samples every %v in `samples.csv`.\n\n",
		time.Now().UTC().Format(time.RFC3339), elapsed.Round(time.Second), o.sample)
	sent := c.sent.Load()
	fmt.Fprintf(&md, "## Requests\n\n| outcome | count |\n|---|---:|\n")
	fmt.Fprintf(&md, "| sent | %d (%.0f/s achieved) |\n| succeeded (2xx, streams ended with [DONE]) | %d |\n| streaming among sent | %d |\n", sent, float64(sent)/elapsed.Seconds(), c.ok.Load(), c.streams.Load())
	fmt.Fprintf(&md, "| **5xx caused by the gateway** (no X-Llmgw-Endpoint) | **%d** |\n| 5xx from the engine, relayed (injected error_rate on w3) | %d |\n", c.gateway5xx.Load(), c.engine5xx.Load())
	fmt.Fprintf(&md, "| 4xx | %d |\n| transport errors (connect, reset, timeout, bad body) | %d |\n| streams without [DONE] or with an error event | %d |\n| shed by the load generator (in-flight cap %d) | %d |\n\n",
		c.other4xx.Load(), c.transport.Load(), c.brokenStream.Load(), o.inflight, c.shed.Load())
	fmt.Fprintf(&md, "## Gateway resources (from its /metrics)\n\nFirst/last third = median of the samples under load. After the load: right away (the gateway still pools its worker connections: 4 s idle for engines with a 5 s keep-alive timeout, 90 s for an engine whose timeout is not known) and after the drain wait.\n\n")
	fmt.Fprintf(&md, "| series | before the load | first third | last third | max under load | right after | after the drain | flat |\n|---|---:|---:|---:|---:|---:|---:|---|\n")
	for _, tr := range trends {
		t := tr.t
		fmt.Fprintf(&md, "| %s | %.1f%s | %.1f%s | %.1f%s | %.1f%s | %.1f%s | %.1f%s | %v |\n", t.name, t.rest0, tr.unit, t.first, tr.unit, t.last, tr.unit, t.max, tr.unit, t.restNow, tr.unit, t.drained, tr.unit, yes(t.flat(tr.slack)))
	}
	if d.back {
		fmt.Fprintf(&md, "\nAfter the load, open fds and goroutines were back within 10 of their pre-load level in %v.\n", d.took.Round(time.Second))
	} else {
		fmt.Fprintf(&md, "\n**After the load, open fds and goroutines were NOT back within 10 of their pre-load level after %v.**\n", d.took.Round(time.Second))
	}
	fmt.Fprintf(&md, "\nFlat means the last third's median is within 10 %% of the first third's (plus a small absolute slack).\n\n## Timeline (one row a minute)\n\n")
	fmt.Fprintf(&md, "| t | goroutines | heap MiB | fds | sent | gw 5xx | engine 5xx | transport | broken streams | p50 ms | p99 ms |\n|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n")
	step := max(int(time.Minute/o.sample), 1)
	for i, s := range ss {
		if i%step != 0 && i != len(ss)-1 {
			continue
		}
		fmt.Fprintf(&md, "| %v | %.0f | %.1f | %.0f | %d | %d | %d | %d | %d | %.1f | %.1f |\n", s.at, s.goroutines, s.heapInuse/(1<<20), s.openFDs, s.sent, s.gateway5xx, s.engine5xx, s.transport, s.broken,
			float64(s.p50.Microseconds())/1000, float64(s.p99.Microseconds())/1000)
	}
	if err := results.WriteFileAtomic(filepath.Join(o.out, "report.md"), []byte(md.String())); err != nil {
		return fmt.Errorf("soak: write report: %w", err)
	}
	fmt.Print(md.String())
	return nil
}

func yes(b bool) string {
	if b {
		return "yes"
	}
	return "**no**"
}
