package overhead

import (
	"bytes"
	"context"
	"errors"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/llmgw/llmgw/bench/loadgen"
	"github.com/llmgw/llmgw/internal/golden"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m,
		// Process-wide fasthttp housekeeping (the server date ticker is
		// started once and never stopped) and pools that end on their own
		// after their owners close.
		goleak.IgnoreAnyFunction("github.com/valyala/fasthttp.updateServerDate.func1"),
		goleak.IgnoreAnyFunction("github.com/valyala/fasthttp.(*HostClient).connsCleaner"),
		goleak.IgnoreAnyFunction("github.com/valyala/fasthttp.(*workerPool).Start.func2"),
		goleak.IgnoreAnyFunction("github.com/valyala/fasthttp.(*TCPDialer).tcpAddrsClean"),
	)
}

func baseConfig() Config {
	return Config{Mode: ClosedLoop, RPS: 200, Concurrency: 4, Duration: 300 * time.Millisecond, MaxRequests: 200,
		Warmup: 10, PromptBytes: 900, MaxTokens: 16, Targets: []string{LLMGWEmbedded}}
}

// TestShortRunOnLoopback runs every load shape against the simulator
// directly and through the embedded gateway (and the reference proxies
// when installed) and checks the accounting, not the speed.
func TestShortRunOnLoopback(t *testing.T) {
	cases := []struct {
		name   string
		mutate func(*Config)
	}{
		{"closed loop", func(*Config) {}},
		{"open loop", func(c *Config) { c.Mode = OpenLoop }},
		{"streaming", func(c *Config) { c.Stream = true; c.DecodePerToken = 50 * time.Microsecond; c.MaxRequests = 40 }},
		{"with reference proxies", func(c *Config) { c.Targets = AllTargets(); c.MaxRequests = 60 }},
		{"interleaved slices", func(c *Config) { c.Slice = 50 * time.Millisecond; c.MaxRequests = 1000 }},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			cfg := baseConfig()
			tc.mutate(&cfg)
			rep, err := Run(t.Context(), cfg)
			if err != nil {
				t.Fatalf("Run: %v", err)
			}
			if got := rep.Results[0].Target; got != Direct {
				t.Errorf("first target %q; want the direct baseline", got)
			}
			measured := 0
			for _, r := range rep.Results {
				if r.Skipped != "" {
					t.Logf("%s skipped: %s", r.Target, r.Skipped)
					continue
				}
				measured++
				if r.Errors != 0 || r.Requests == 0 {
					t.Errorf("%s: %d ok, %d errors (first: %s); want some and no errors", r.Target, r.Requests, r.Errors, r.FirstError)
				}
				if r.Requests > cfg.MaxRequests {
					t.Errorf("%s: %d requests above the bound %d", r.Target, r.Requests, cfg.MaxRequests)
				}
				if r.Latency.Count != r.Requests || r.Latency.P50 <= 0 || r.Latency.P50 > r.Latency.P99 {
					t.Errorf("%s: latency summary %+v inconsistent with %d requests", r.Target, r.Latency, r.Requests)
				}
				if cfg.Stream && r.Chunks.Count <= r.Requests {
					t.Errorf("%s: %d chunks for %d streamed requests; want several per request", r.Target, r.Chunks.Count, r.Requests)
				}
			}
			if measured < 2 {
				t.Errorf("measured %d targets; want at least direct and llmgw", measured)
			}
			if cfg.Slice > 0 {
				// Several rounds: each target's slices, and llmgw
				// compared with direct round by round.
				for _, r := range rep.Results {
					if r.Skipped == "" && len(r.SliceRPS) < 2 {
						t.Errorf("%s: slice throughputs %v; want one per round, several rounds", r.Target, r.SliceRPS)
					}
				}
				var p *PairedRatio
				for i := range rep.Paired {
					if rep.Paired[i].A == LLMGWEmbedded && rep.Paired[i].B == Direct {
						p = &rep.Paired[i]
					}
				}
				if p == nil || p.Turns < 2 || p.Median <= 0 || (p.Low != 0 && !(p.Low <= p.Median && p.Median <= p.High)) {
					t.Errorf("paired ratios %+v; want llmgw-embedded / direct over several rounds, its interval around its median", rep.Paired)
				}
			}
			var md bytes.Buffer
			if err := WriteMarkdown(&md, rep); err != nil || !strings.Contains(md.String(), "| llmgw-embedded |") {
				t.Errorf("markdown %q (err %v); want an llmgw-embedded row", md.String(), err)
			}
		})
	}
}

func TestValidate(t *testing.T) {
	cases := []struct {
		name    string
		mutate  func(*Config)
		wantSub string
	}{
		{"valid", func(*Config) {}, ""},
		{"bad mode", func(c *Config) { c.Mode = "burst" }, "mode \"burst\""},
		{"open loop without rate", func(c *Config) { c.Mode = OpenLoop; c.RPS = 0 }, "rps must be"},
		{"zero concurrency", func(c *Config) { c.Concurrency = 0 }, "concurrency must be"},
		{"too short", func(c *Config) { c.Duration = time.Millisecond }, "duration must be"},
		{"too long", func(c *Config) { c.Duration = time.Hour }, "duration must be"},
		{"no requests", func(c *Config) { c.MaxRequests = 0 }, "max requests must be"},
		{"negative warmup", func(c *Config) { c.Warmup = -1 }, "warmup"},
		{"negative slice", func(c *Config) { c.Slice = -time.Second }, "slice must not be negative"},
		{"empty prompt", func(c *Config) { c.PromptBytes = 0 }, "prompt bytes"},
		{"unknown target", func(c *Config) { c.Targets = []string{"envoy"} }, "unknown target \"envoy\""},
		{"remote upstream", func(c *Config) { c.Upstream = "10.0.0.1:8000" }, "loopback only"},
		{"upstream without port", func(c *Config) { c.Upstream = "127.0.0.1" }, "upstream \"127.0.0.1\""},
		{"loopback upstream", func(c *Config) { c.Upstream = "127.0.0.1:8000" }, ""},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			c := baseConfig()
			tc.mutate(&c)
			err := c.Validate()
			if tc.wantSub == "" {
				if err != nil {
					t.Fatalf("Validate() = %v; want nil", err)
				}
				return
			}
			if !errors.Is(err, ErrParams) || !strings.Contains(err.Error(), tc.wantSub) {
				t.Errorf("Validate() = %v; want ErrParams containing %q", err, tc.wantSub)
			}
		})
	}
}

// TestUnreachableUpstreamSendsNoLoad points the benchmark at a port that
// was just closed and at a server that answers 500: both end before any
// load with ErrUnreachable.
func TestUnreachableUpstreamSendsNoLoad(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	closed := ln.Addr().String()
	ln.Close()

	bad, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer bad.Close()
	accepted := make(chan int, 1)
	go func() {
		n := 0
		defer func() { accepted <- n }()
		for {
			c, err := bad.Accept()
			if err != nil {
				return
			}
			n++
			buf := make([]byte, 4096)
			_, _ = c.Read(buf)
			_, _ = c.Write([]byte("HTTP/1.1 500 Internal Server Error\r\nContent-Length: 4\r\nConnection: close\r\n\r\nboom"))
			c.Close()
		}
	}()
	cases := []struct {
		name, upstream string
	}{
		{"closed port", closed},
		{"server error", bad.Addr().String()},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			cfg := baseConfig()
			cfg.Upstream = tc.upstream
			rep, err := Run(t.Context(), cfg)
			if !errors.Is(err, ErrUnreachable) || rep != nil {
				t.Fatalf("Run = %v, %v; want ErrUnreachable and no report", rep, err)
			}
		})
	}
	bad.Close()
	if n := <-accepted; n != 1 {
		t.Errorf("the failing server saw %d connections; want exactly the probe", n)
	}
}

// TestInterruptedRunReportsPartialResults cancels the run once the second
// target's load has started: the direct baseline is complete, llmgw's is
// partial, and the report says so.
func TestInterruptedRunReportsPartialResults(t *testing.T) {
	cfg := baseConfig()
	cfg.Duration = 10 * time.Minute
	cfg.MaxRequests = 400
	cfg.DecodePerToken = 100 * time.Microsecond
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	cfg.Progress = func(target string) {
		if target == LLMGWEmbedded {
			cancel()
		}
	}
	rep, err := Run(ctx, cfg)
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("Run error %v; want context.Canceled", err)
	}
	if rep == nil || !rep.Partial || len(rep.Results) != 2 {
		t.Fatalf("report %+v; want a partial report with direct and llmgw", rep)
	}
	if d := rep.Results[0]; d.Target != Direct || d.Requests != cfg.MaxRequests {
		t.Errorf("direct baseline %d requests; want the full %d", d.Requests, cfg.MaxRequests)
	}
	if g := rep.Results[1]; g.Target != LLMGWEmbedded || g.Requests >= cfg.MaxRequests {
		t.Errorf("llmgw %d requests after cancel; want fewer than %d", g.Requests, cfg.MaxRequests)
	}
	var md bytes.Buffer
	if err := WriteMarkdown(&md, rep); err != nil || !strings.Contains(md.String(), "partial: interrupted") {
		t.Errorf("markdown %q (err %v); want it marked partial", md.String(), err)
	}
}

func TestMarkdownGolden(t *testing.T) {
	lat := func(p50, p99 time.Duration) loadgen.Summary {
		return loadgen.Summary{Count: 1000, Mean: p50, P50: p50, P90: p99, P99: p99, Max: p99}
	}
	rep := &Report{Mode: OpenLoop, RPS: 5000, Concurrency: 64, Duration: 5 * time.Second, Slice: time.Second, MaxRequests: 100000, PromptBytes: 900, ProxyWorkers: ProxyWorkers,
		Upstream: "sim 127.0.0.1:1", Started: time.Date(2026, 11, 30, 1, 0, 0, 0, time.UTC),
		Results: []TargetResult{
			{Target: Direct, Requests: 25000, Throughput: 5000, Latency: lat(80*time.Microsecond, 300*time.Microsecond), ResponseBytes: 610},
			{Target: LLMGW, Requests: 25000, Throughput: 4998, Latency: lat(110*time.Microsecond, 700*time.Microsecond), ResponseBytes: 610,
				AddedP50: 30 * time.Microsecond, AddedP99: 400 * time.Microsecond},
			{Target: Nginx, Requests: 25000, Throughput: 4990, Latency: lat(150*time.Microsecond, 12*time.Millisecond), ResponseBytes: 610,
				AddedP50: 70 * time.Microsecond, AddedP99: 11700 * time.Microsecond, Dropped: 3},
			{Target: HAProxy, Skipped: "not installed (make bench-deps)"},
		}}
	// Six rounds of 1 s: the per-slice figures, and llmgw against the
	// others round by round (nginx's last round was cut short, so five
	// rounds: no interval).
	rep.Results[0].SliceRPS = []float64{5100, 5000, 4900, 5050, 4950, 5000}
	rep.Results[1].SliceRPS = []float64{4950, 4800, 4850, 4900, 4890, 4870}
	rep.Results[2].SliceRPS = []float64{4800, 4700, 4650, 4720, 4760, 10}
	rep.Paired = []PairedRatio{
		{A: LLMGW, B: Direct, Turns: 6, Median: 0.975, Low: 0.9706, High: 0.9880},
		{A: LLMGW, B: Nginx, Turns: 5, Median: 1.0313},
	}
	rep.AddedByRound = []AddedByRound{
		{Target: LLMGW, Turns: 6, P50: MedianCI{Median: 31 * time.Microsecond, Low: 28 * time.Microsecond, High: 35 * time.Microsecond},
			P99: MedianCI{Median: 380 * time.Microsecond, Low: 250 * time.Microsecond, High: 2100 * time.Microsecond}},
		{Target: Nginx, Turns: 5, P50: MedianCI{Median: 72 * time.Microsecond}, P99: MedianCI{Median: 11 * time.Millisecond}},
	}
	stream := *rep
	stream.Paired, stream.AddedByRound = nil, nil
	stream.Mode, stream.Concurrency, stream.Stream, stream.DecodePerToken = ClosedLoop, 8, true, 100*time.Microsecond
	stream.Results = []TargetResult{
		{Target: Direct, Requests: 500, Throughput: 400, Latency: lat(3*time.Millisecond, 4*time.Millisecond), Chunks: lat(1500*time.Microsecond, 3*time.Millisecond)},
		{Target: LLMGW, Requests: 500, Throughput: 390, Latency: lat(3030*time.Microsecond, 4100*time.Microsecond), Chunks: lat(1530*time.Microsecond, 3*time.Millisecond),
			AddedP50: 30 * time.Microsecond, AddedP99: 100 * time.Microsecond, AddedChunkP50: 30 * time.Microsecond},
	}
	stream.Partial = true
	var got bytes.Buffer
	for _, r := range []*Report{rep, &stream} {
		if err := WriteMarkdown(&got, r); err != nil {
			t.Fatal(err)
		}
		got.WriteString("\n---\n\n")
		if err := WriteJSON(&got, r); err != nil {
			t.Fatal(err)
		}
		got.WriteString("\n---\n\n")
	}
	golden.File(t, "report.golden", got.Bytes())
}

func TestConfigFiles(t *testing.T) {
	cases := []struct {
		name, got string
		want      []string
	}{
		{"nginx", nginxConf("/d", "127.0.0.1:1", "127.0.0.1:2"), []string{"server 127.0.0.1:1;", "listen 127.0.0.1:2;", "proxy_buffering off", "keepalive 256"}},
		{"nginx without upstream keep-alive", nginxConfPool("/d", "127.0.0.1:1", "127.0.0.1:2", false), []string{"upstream w { server 127.0.0.1:1; }", "location / { proxy_pass http://w; proxy_buffering off; }"}},
		{"llmgw rule names the engine", benchRule("127.0.0.1", "1", "llamacpp"), []string{"kvEngineType: llamacpp\n", "targetPort: 1}"}},
		{"haproxy", haproxyConf("127.0.0.1:1", "127.0.0.1:2"), []string{"server w1 127.0.0.1:1\n", "bind 127.0.0.1:2\n", "http-reuse always", "mode http"}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			for _, w := range tc.want {
				if !strings.Contains(tc.got, w) {
					t.Errorf("config lacks %q:\n%s", w, tc.got)
				}
			}
		})
	}
}

// TestLLMGWProcessTarget builds the llmgw binary and measures it as a child
// process next to the embedded gateway.
func TestLLMGWProcessTarget(t *testing.T) {
	goBin, err := exec.LookPath("go")
	if err != nil {
		t.Fatalf("the go tool is needed to build llmgw: %v", err)
	}
	bin := filepath.Join(t.TempDir(), "llmgw")
	build := exec.Command(goBin, "build", "-o", bin, "github.com/llmgw/llmgw/cmd/llmgw")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	cases := []struct {
		name   string
		mutate func(*Config)
	}{
		{"simulator backend", func(*Config) {}},
		{"fixed backend, pinned", func(c *Config) { c.Backend = BackendFixed; c.Pin = Placement{Targets: "0", Load: "0"} }},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			cfg := baseConfig()
			cfg.Targets = []string{LLMGWEmbedded, LLMGW}
			cfg.MaxRequests = 100
			cfg.GatewayBinary = bin
			tc.mutate(&cfg)
			rep, err := Run(t.Context(), cfg)
			if errors.Is(err, ErrNotInstalled) && os.Getenv("CI") != "true" {
				t.Skipf("fixed backend: %v (make bench-deps)", err)
			}
			if err != nil {
				t.Fatal(err)
			}
			r := rep.Result(LLMGW)
			if r == nil || r.Skipped != "" || r.Requests != cfg.MaxRequests || r.Errors != 0 {
				t.Fatalf("llmgw result %+v; want %d requests without errors", r, cfg.MaxRequests)
			}
			// Charged to its own process: CPU time (at least one 10 ms
			// tick is not guaranteed for 100 requests, so only RSS is
			// required) and where it ran.
			if r.RSS <= 0 || r.CPUs == "" {
				t.Errorf("llmgw process usage RSS %d CPUs %q; want both", r.RSS, r.CPUs)
			}
			if e := rep.Result(LLMGWEmbedded); e.RSS != 0 || e.CPUPer100k != 0 {
				t.Errorf("embedded gateway charged RSS %d CPU %v; it has no process of its own", e.RSS, e.CPUPer100k)
			}
			if cfg.Pin.Targets != "" && r.CPUs != cfg.Pin.Targets {
				t.Errorf("llmgw ran on CPUs %q; want pinned to %q", r.CPUs, cfg.Pin.Targets)
			}
			if cfg.Backend == BackendFixed {
				if d := rep.Result(Direct); d.ResponseBytes != FixedAnswerBytes || d.RSS <= 0 {
					t.Errorf("fixed backend answered %d bytes, RSS %d; want %d bytes and its process charged", d.ResponseBytes, d.RSS, FixedAnswerBytes)
				}
			}
		})
	}
}

// TestStopLeavesNoProxyProcess starts each installed reference proxy and
// checks that stop leaves no process of its group: nginx forks workers that
// outlive a master killed alone, holding the port.
func TestStopLeavesNoProxyProcess(t *testing.T) {
	for _, kind := range []string{"nginx", "haproxy"} {
		t.Run(kind, func(t *testing.T) {
			p, err := startProxy(context.Background(), kind, "127.0.0.1:1", Placement{})
			if errors.Is(err, ErrNotInstalled) {
				if os.Getenv("CI") == "true" {
					t.Fatalf("%s not installed under CI=true (make bench-deps)", kind)
				}
				t.Skipf("%s not installed (make bench-deps)", kind)
			}
			if err != nil {
				t.Fatal(err)
			}
			pgid := p.cmd.Process.Pid
			p.stop()
			if members := groupMembers(pgid); len(members) > 0 {
				t.Fatalf("%s left processes of group %d after stop: %v", kind, pgid, members)
			}
			if c, err := net.Dial("tcp", p.addr); err == nil {
				c.Close()
				t.Fatalf("%s still accepts on %s after stop", kind, p.addr)
			}
		})
	}
}

// groupMembers lists the live (non-zombie) processes of group pgid.
func groupMembers(pgid int) []string {
	var out []string
	stats, _ := filepath.Glob("/proc/[0-9]*/stat")
	for _, path := range stats {
		b, err := os.ReadFile(path)
		if err != nil {
			continue
		}
		i := bytes.LastIndexByte(b, ')')
		if i < 0 {
			continue
		}
		f := bytes.Fields(b[i+1:])
		if len(f) >= 3 && string(f[0]) != "Z" && string(f[2]) == strconv.Itoa(pgid) {
			out = append(out, string(b[:i+1]))
		}
	}
	return out
}
