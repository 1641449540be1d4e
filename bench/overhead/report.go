package overhead

import (
	"encoding/json"
	"fmt"
	"io"
	"strconv"
	"strings"
	"time"
)

// WriteJSON writes the report as indented JSON.
func WriteJSON(w io.Writer, r *Report) error {
	b, err := json.MarshalIndent(r, "", "  ")
	if err != nil {
		return fmt.Errorf("overhead: encode json: %w", err)
	}
	if _, err := w.Write(append(b, '\n')); err != nil {
		return fmt.Errorf("overhead: write json: %w", err)
	}
	return nil
}

// WriteMarkdown writes the report as a Markdown table, with the ratios to
// the reference proxies measured in the same run.
func WriteMarkdown(w io.Writer, r *Report) error {
	var b strings.Builder
	load := fmt.Sprintf("closed loop, %d clients", r.Concurrency)
	if r.Mode == OpenLoop {
		load = fmt.Sprintf("open loop, %d requests/s (at most %d outstanding)", r.RPS, r.Concurrency)
	}
	kind := "non-streaming"
	if r.Stream {
		kind = fmt.Sprintf("streaming (decode %v/token)", r.DecodePerToken)
	}
	fmt.Fprintf(&b, "%s, %s, %d-byte prompts, ≤ %v or %d requests per target, upstream %s", load, kind, r.PromptBytes, r.Duration, r.MaxRequests, r.Upstream)
	if r.Slice > 0 {
		fmt.Fprintf(&b, ", targets interleaved in %v slices", r.Slice)
	}
	fmt.Fprintf(&b, "; load generator on CPUs %s", orUnknown(r.LoadCPUs))
	if r.Pin.Targets != "" {
		fmt.Fprintf(&b, ", targets pinned to CPUs %s", r.Pin.Targets)
	}
	if r.ProxyWorkers > 0 {
		fmt.Fprintf(&b, "; %d workers per proxy process (nginx worker_processes, HAProxy nbthread, llmgw --procs)", r.ProxyWorkers)
	}
	if len(r.AwakeCPUs) > 0 {
		fmt.Fprintf(&b, "; CPUs %s kept from halting (a SCHED_IDLE spinner on each)", intList(r.AwakeCPUs))
	}
	if r.Partial {
		b.WriteString(" — **partial: interrupted**")
	}
	b.WriteString(".\n\n")
	b.WriteString(header(r) + "\n|---|")
	for range strings.Count(header(r), "|") - 2 {
		b.WriteString("---:|")
	}
	b.WriteString("\n")
	for _, res := range r.Results {
		if res.Skipped != "" {
			fmt.Fprintf(&b, "| %s | %s |\n", res.Target, res.Skipped)
			continue
		}
		added50, added99 := fmtDur(res.AddedP50), fmtDur(res.AddedP99)
		if res.Target == Direct {
			added50, added99 = "—", "—"
		}
		fmt.Fprintf(&b, "| %s | %.0f | %s | %s | %s | %s | %s |", res.Target, res.Throughput,
			fmtDur(res.Latency.P50), fmtDur(res.Latency.P90), fmtDur(res.Latency.P99), added50, added99)
		if r.Stream {
			chunk := fmtDur(res.AddedChunkP50)
			if res.Target == Direct {
				chunk = "—"
			}
			fmt.Fprintf(&b, " %s | %s |", fmtDur(res.Chunks.P50), chunk)
		} else {
			fmt.Fprintf(&b, " %d |", res.ResponseBytes)
		}
		if r.Mode == OpenLoop {
			fmt.Fprintf(&b, " %s |", fmtDur(res.Lag.P99))
		}
		cpu, rss := "in-process", "in-process"
		if res.CPUPer100k > 0 {
			cpu = fmt.Sprintf("%.2f", res.CPUPer100k)
		}
		if res.RSS > 0 {
			rss = fmt.Sprintf("%.1f MB", float64(res.RSS)/1e6)
		}
		cpus := res.CPUs
		if cpus == "" {
			cpus = "load's"
		}
		fmt.Fprintf(&b, " %s | %s | %s | %d | %d |\n", cpu, rss, cpus, res.Errors, res.Dropped)
	}
	var ratios []string
	for _, name := range []string{LLMGW, LLMGWEmbedded} {
		gw := r.Result(name)
		for _, ref := range []string{Nginx, NginxNoKeepAlive, HAProxy} {
			if p := r.Result(ref); gw != nil && p != nil && p.Throughput > 0 && gw.Throughput > 0 {
				ratio := fmt.Sprintf("%s / %s throughput = %.2fx", name, ref, gw.Throughput/p.Throughput)
				if gw.CPUPer100k > 0 && p.CPUPer100k > 0 {
					ratio += fmt.Sprintf(", CPU per request = %.2fx", gw.CPUPer100k/p.CPUPer100k)
				}
				ratios = append(ratios, ratio)
			}
		}
	}
	if len(ratios) > 0 {
		fmt.Fprintf(&b, "\n%s (same run).\n", strings.Join(ratios, "; "))
	}
	if len(r.Paired) > 0 {
		var ps []string
		for _, p := range r.Paired {
			if p.Turns >= minTurnsForCI {
				ps = append(ps, fmt.Sprintf("%s / %s median %.2fx, 95%% CI %.2f–%.2fx over %d rounds", p.A, p.B, p.Median, p.Low, p.High, p.Turns))
			} else {
				ps = append(ps, fmt.Sprintf("%s / %s median %.2fx over %d rounds (too few for a 95%% interval: %d needed)", p.A, p.B, p.Median, p.Turns, minTurnsForCI))
			}
		}
		fmt.Fprintf(&b, "\nThroughput round by round (each round's slices compared; the interval is the median's, distribution-free): %s.\n", strings.Join(ps, "; "))
	}
	if len(r.AddedByRound) > 0 {
		var ps []string
		for _, a := range r.AddedByRound {
			ps = append(ps, fmt.Sprintf("%s p50 %s, p99 %s over %d rounds", a.Target, fmtCI(a.P50, a.Turns), fmtCI(a.P99, a.Turns), a.Turns))
		}
		fmt.Fprintf(&b, "\nAdded latency round by round (each round's quantile less direct's in the same round; the median over the rounds, its interval distribution-free, none below %d rounds): %s.\n", minTurnsForCI, strings.Join(ps, "; "))
	}
	if _, err := io.WriteString(w, b.String()); err != nil {
		return fmt.Errorf("overhead: write markdown: %w", err)
	}
	return nil
}

// header is the table's header row, for the separator's column count.
func header(r *Report) string {
	h := "| target | requests/s | p50 | p90 | p99 | added p50 | added p99 | response bytes |"
	if r.Stream {
		h = "| target | requests/s | p50 | p90 | p99 | added p50 | added p99 | chunk p50 | added per chunk p50 |"
	}
	if r.Mode == OpenLoop {
		h += " send lag p99 |"
	}
	return h + " CPU s/100k | RSS | CPUs | errors | dropped |"
}

func orUnknown(s string) string {
	if s == "" {
		return "?"
	}
	return s
}

// fmtDur prints µs below 10 ms and ms above, signed (an added latency can
// be negative within noise).
func fmtDur(d time.Duration) string {
	if d > -10*time.Millisecond && d < 10*time.Millisecond {
		return fmt.Sprintf("%.1f µs", float64(d)/float64(time.Microsecond))
	}
	return fmt.Sprintf("%.2f ms", float64(d)/float64(time.Millisecond))
}

// fmtCI writes a median and, over enough rounds, its interval.
func fmtCI(m MedianCI, turns int) string {
	if turns < minTurnsForCI {
		return fmtDur(m.Median)
	}
	return fmt.Sprintf("%s [%s – %s]", fmtDur(m.Median), fmtDur(m.Low), fmtDur(m.High))
}

// intList writes CPUs as "0,1,3".
func intList(v []int) string {
	s := make([]string, len(v))
	for i, n := range v {
		s[i] = strconv.Itoa(n)
	}
	return strings.Join(s, ",")
}
