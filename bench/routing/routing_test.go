package routing

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"image/png"
	"net/http"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/llmgw/llmgw/bench/loadgen"
	"github.com/llmgw/llmgw/engines"
	"github.com/llmgw/llmgw/engines/sim"
	"github.com/llmgw/llmgw/engines/tokenizer"
	"github.com/llmgw/llmgw/internal/golden"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m,
		// Process-wide housekeeping goroutines of fasthttp (its server
		// date ticker, started once and never stopped) and pools that end
		// on their own after their owners close.
		goleak.IgnoreAnyFunction("github.com/valyala/fasthttp.updateServerDate.func1"),
		goleak.IgnoreAnyFunction("github.com/valyala/fasthttp.(*HostClient).connsCleaner"),
		goleak.IgnoreAnyFunction("github.com/valyala/fasthttp.(*workerPool).Start.func2"),
		goleak.IgnoreAnyFunction("github.com/valyala/fasthttp.(*TCPDialer).tcpAddrsClean"),
		goleak.IgnoreAnyFunction("github.com/go-zeromq/zmq4.(*pubMWriter).run"),
	)
}

// TestOracleModelMatchesSimReceipts replays workloads one request at a time
// (so the engine's lookup order is the dispatch order) through the oracle
// against real simulators with small caches, and checks that the oracle's
// predicted cached tokens equal what each engine reports in its receipt,
// evictions included.
func TestOracleModelMatchesSimReceipts(t *testing.T) {
	cases := []struct {
		name        string
		workload    Workload
		shape       Shape
		cacheBlocks int
	}{
		{"shared prefix, no eviction", SharedPrefix, Shape{Requests: 40, Prefixes: 5, PrefixWords: 80, SuffixWords: 10}, 4096},
		{"shared prefix, LRU eviction", SharedPrefix, Shape{Requests: 60, Prefixes: 8, PrefixWords: 120, SuffixWords: 12}, 40},
		{"multi-turn, eviction", MultiTurn, Shape{Requests: 36, Prefixes: 6, PrefixWords: 40, SuffixWords: 20}, 48},
		{"long doc", LongDoc, Shape{Requests: 20, Prefixes: 3, PrefixWords: 300, SuffixWords: 8}, 96},
		{"hot prefix", HotPrefix, Shape{Requests: 40, Prefixes: 6, PrefixWords: 60, SuffixWords: 8}, 64},
		{"random", Random, Shape{Requests: 20, Prefixes: 1, PrefixWords: 50, SuffixWords: 5}, 32},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			const n = 3
			var sims []*sim.Sim
			for i := 0; i < n; i++ {
				s, err := sim.Start(t.Context(), sim.Config{Engine: engines.VLLM, Model: "m", KVEvents: sim.KVEventsOff, CacheBlocks: tc.cacheBlocks})
				if err != nil {
					t.Fatal(err)
				}
				t.Cleanup(func() { s.Close() })
				sims = append(sims, s)
			}
			o, err := NewOracle(n, blockSize, tc.cacheBlocks, 0)
			if err != nil {
				t.Fatal(err)
			}
			sessions, err := Generate(tc.workload, tc.shape, 7)
			if err != nil {
				t.Fatal(err)
			}
			client := &http.Client{}
			defer client.CloseIdleConnections()
			hits, i := 0, 0
			for _, s := range sessions {
				for _, req := range s {
					d, err := o.Pick(req.Messages)
					if err != nil {
						t.Fatal(err)
					}
					postChat(t, client, sims[d.Endpoint].Addrs().HTTP, req)
					o.Done(d.Endpoint)
					recs := sims[d.Endpoint].Receipts()
					got := recs[len(recs)-1]
					if got.PromptTokens != d.PromptTokens || got.CachedTokens != d.PredictedCached {
						t.Fatalf("request %d on endpoint %d: engine reported %d cached of %d prompt tokens; oracle predicted %d of %d",
							i, d.Endpoint, got.CachedTokens, got.PromptTokens, d.PredictedCached, d.PromptTokens)
					}
					if d.PredictedCached > 0 {
						hits++
					}
					i++
				}
			}
			if tc.workload != Random && hits == 0 {
				t.Errorf("no request hit the cache: the comparison proved nothing")
			}
			if tc.workload == Random && hits != 0 {
				t.Errorf("random control had %d cache hits; want 0", hits)
			}
		})
	}
}

func postChat(t *testing.T, c *http.Client, addr string, req Request) {
	t.Helper()
	body := chatBody{Model: "m", MaxTokens: 1}
	for _, m := range req.Messages {
		body.Messages = append(body.Messages, wireMessage(m))
	}
	raw, _ := json.Marshal(body)
	resp, err := c.Post("http://"+addr+"/v1/chat/completions", "application/json", bytes.NewReader(raw))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != 200 {
		t.Fatalf("status %d", resp.StatusCode)
	}
}

func TestGenerateIsSeeded(t *testing.T) {
	for _, w := range Workloads() {
		t.Run(string(w), func(t *testing.T) {
			shape := DefaultShape(w, 50)
			a, err := Generate(w, shape, 1)
			if err != nil {
				t.Fatal(err)
			}
			b, _ := Generate(w, shape, 1)
			c, _ := Generate(w, shape, 2)
			ja, _ := json.Marshal(a)
			jb, _ := json.Marshal(b)
			jc, _ := json.Marshal(c)
			if !bytes.Equal(ja, jb) {
				t.Errorf("equal seeds gave different workloads")
			}
			if bytes.Equal(ja, jc) {
				t.Errorf("different seeds gave the same workload")
			}
			total := 0
			for _, s := range a {
				total += len(s)
			}
			if total != 50 {
				t.Errorf("generated %d requests; want 50", total)
			}
		})
	}
}

func TestConfigValidate(t *testing.T) {
	good := gateConfig(SharedPrefix, RoundRobin)
	cases := []struct {
		name    string
		mutate  func(*Config)
		wantSub string
	}{
		{"valid", func(*Config) {}, ""},
		{"unknown workload", func(c *Config) { c.Workload = "chat" }, "unknown workload \"chat\""},
		{"zero requests", func(c *Config) { c.Shape.Requests = 0 }, "requests must be at least 1"},
		{"zero prefixes", func(c *Config) { c.Shape.Prefixes = 0 }, "prefixes must be at least 1"},
		{"huge prompt", func(c *Config) { c.Shape.PrefixWords = 9000 }, "above the 8000 limit"},
		{"one endpoint", func(c *Config) { c.Endpoints = 1 }, "endpoints must be 2..64"},
		{"no concurrency", func(c *Config) { c.Concurrency = 0 }, "concurrency must be 1..4096"},
		{"no cache", func(c *Config) { c.CacheBlocks = 0 }, "cache blocks must be at least 1"},
		{"negative prefill", func(c *Config) { c.PrefillPerToken = -1 }, "must not be negative"},
		{"zero max tokens", func(c *Config) { c.MaxTokens = 0 }, "max tokens must be 1..4096"},
		{"no policy", func(c *Config) { c.Policies = nil }, "no policy"},
		{"bad policy", func(c *Config) { c.Policies = []Policy{"random"} }, "unknown policy \"random\""},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			c := good
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

func TestParsePolicies(t *testing.T) {
	cases := []struct {
		name    string
		in      string
		want    []Policy
		wantErr bool
	}{
		{"empty is all", "", Policies(), false},
		{"all", "all", Policies(), false},
		{"list with spaces and duplicates", "rr, kv-exact,rr", []Policy{RoundRobin, KVExact}, false},
		{"unknown", "rr,magic", nil, true},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			got, err := ParsePolicies(tc.in)
			if (err != nil) != tc.wantErr {
				t.Fatalf("ParsePolicies(%q) error %v; want error %v", tc.in, err, tc.wantErr)
			}
			if strings.Join(toStrings(got), ",") != strings.Join(toStrings(tc.want), ",") {
				t.Errorf("ParsePolicies(%q) = %v; want %v", tc.in, got, tc.want)
			}
		})
	}
}

func toStrings(ps []Policy) []string {
	out := make([]string, len(ps))
	for i, p := range ps {
		out[i] = string(p)
	}
	return out
}

// TestRunInterruptedReturnsPartialResults cancels a run after a few
// requests have completed and checks the partial report.
func TestRunInterruptedReturnsPartialResults(t *testing.T) {
	cfg := gateConfig(SharedPrefix, OraclePolicy, RoundRobin)
	cfg.Shape.Requests = 2000
	cfg.Concurrency = 2
	cfg.PrefillPerToken = 200 * time.Microsecond
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan struct{})
	var rep *Report
	var err error
	go func() {
		defer close(done)
		rep, err = Run(ctx, cfg)
	}()
	// The run cannot finish on its own before the cancel: 2000 requests of
	// ≥ 0.1 s of modelled prefill each at concurrency 2.
	cancel()
	<-done
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("Run error %v; want context.Canceled", err)
	}
	if rep == nil || !rep.Partial || len(rep.Results) != 1 || rep.Results[0].Policy != OraclePolicy {
		t.Fatalf("partial report %+v; want the oracle's partial result only", rep)
	}
	if r := rep.Results[0]; r.Requests+r.Errors+r.Skipped != 2000 || r.Skipped == 0 {
		t.Errorf("accounting: %d done + %d errors + %d skipped; want 2000 with some skipped", r.Requests, r.Errors, r.Skipped)
	}
	var md bytes.Buffer
	if err := WriteMarkdown(&md, []*Report{rep}); err != nil || !strings.Contains(md.String(), "partial: interrupted") {
		t.Errorf("markdown of a partial report %q (err %v); want it marked partial", md.String(), err)
	}
}

// goldenReports is a fixed report set for the output format tests.
func goldenReports() []*Report {
	mk := func(p Policy, hit float64, p50, p99 time.Duration, rps, imb float64) Result {
		return Result{Policy: p, Requests: 100, PromptTokens: 1000, CachedTokens: int64(hit * 1000), HitRatio: hit,
			TTFT: loadgen.Summary{Count: 100, Mean: p50, P50: p50, P90: p99, P99: p99, Max: p99}, Throughput: rps,
			Wall: time.Second, MeanInFlight: []float64{1, imb}, Imbalance: imb, Samples: 10, Share: []int{50, 50}}
	}
	return []*Report{
		{Workload: SharedPrefix, Shape: DefaultShape(SharedPrefix, 100), Seed: 42, Endpoints: 2, Concurrency: 4, CacheBlocks: 256,
			PrefillPerToken: 20 * time.Microsecond, DecodePerToken: 200 * time.Microsecond, SimConcurrency: 4, MaxTokens: 4,
			Started: time.Date(2026, 11, 30, 1, 0, 0, 0, time.UTC),
			Results: []Result{
				mk(RoundRobin, 0.27, 15*time.Millisecond, 20*time.Millisecond, 550, 1.05),
				mk(KVExact, 0.6, 3400*time.Microsecond, 19*time.Millisecond, 850, 1.08),
				mk(OraclePolicy, 0.82, 2700*time.Microsecond, 16*time.Millisecond, 1200, 1.15),
			}},
		{Workload: Random, Shape: DefaultShape(Random, 100), Seed: 42, Endpoints: 2, Concurrency: 4, CacheBlocks: 256,
			PrefillPerToken: 20 * time.Microsecond, DecodePerToken: 200 * time.Microsecond, SimConcurrency: 4, MaxTokens: 4,
			Started: time.Date(2026, 11, 30, 1, 0, 1, 0, time.UTC), Partial: true,
			Results: []Result{mk(LeastInFlight, 0, 15*time.Millisecond, 21*time.Millisecond, 460, 1.01)}},
	}
}

func TestOutputGolden(t *testing.T) {
	cases := []struct {
		name  string
		file  string
		write func(*bytes.Buffer) error
	}{
		{"json", "report.json", func(b *bytes.Buffer) error { return WriteJSON(b, goldenReports()) }},
		{"markdown", "report.md", func(b *bytes.Buffer) error { return WriteMarkdown(b, goldenReports()) }},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			var got bytes.Buffer
			if err := tc.write(&got); err != nil {
				t.Fatal(err)
			}
			golden.File(t, tc.file, got.Bytes())
		})
	}
}

func TestWritePNG(t *testing.T) {
	var b bytes.Buffer
	if err := WritePNG(&b, goldenReports()); err != nil {
		t.Fatal(err)
	}
	img, err := png.Decode(&b)
	if err != nil {
		t.Fatalf("output is not a PNG: %v", err)
	}
	if got := img.Bounds().Dx(); got < 400 {
		t.Errorf("chart width %d px; want a readable chart (≥ 400)", got)
	}
	if err := WritePNG(&b, nil); !errors.Is(err, ErrParams) {
		t.Errorf("WritePNG(nil) = %v; want ErrParams", err)
	}
}

func TestRouteClass(t *testing.T) {
	cases := []struct{ name, in, want string }{
		{"hit with counts", "kv-exact hit=12/40", "kv-exact hit"},
		{"spill", "kv-exact spill hit=0/40", "kv-exact spill hit"},
		{"miss reason kept", "kv-exact miss=overloaded chwbl-home", "kv-exact miss=overloaded chwbl-home"},
		{"plain policy", "rr", "rr"},
		{"long header cut", strings.Repeat("x", 100), strings.Repeat("x", 64)},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			if got := routeClass(tc.in); got != tc.want {
				t.Errorf("routeClass(%q) = %q; want %q", tc.in, got, tc.want)
			}
		})
	}
}

func FuzzRouteHeaders(f *testing.F) {
	f.Add("kv-exact hit=3/9", "w2")
	f.Add("kv-exact miss=no_match chwbl-home", "w10")
	f.Add("=", "w0")
	f.Fuzz(func(t *testing.T, route, endpoint string) {
		if c := routeClass(route); len(c) > 64 || !strings.HasPrefix(route, c) {
			t.Fatalf("routeClass(%q) = %q: not a bounded prefix", route, c)
		}
		if i := endpointIndex(endpoint); i < -1 {
			t.Fatalf("endpointIndex(%q) = %d", endpoint, i)
		}
	})
}

func TestOraclePickRule(t *testing.T) {
	sys := func(s string) []tokenizer.Message {
		return []tokenizer.Message{{Role: "system", Content: strings.Repeat(s+" prompt text ", 20)}, {Role: "user", Content: "question"}}
	}
	cases := []struct {
		name  string
		slots int
		// steps: the prompt of each Pick, in order, none of them Done.
		steps []string
		want  []int
	}{
		{"unbounded slots follow the cache", 0, []string{"a", "a", "a"}, []int{0, 0, 0}},
		{"a new prompt goes to the least loaded", 0, []string{"a", "b"}, []int{0, 1}},
		{"a full holder is passed over", 2, []string{"a", "a", "a"}, []int{0, 0, 1}},
		{"all full: fewest in flight", 1, []string{"a", "b", "a"}, []int{0, 1, 0}},
		{"a free holder of a long prefix wins over an idle endpoint", 4, []string{"a", "a", "a"}, []int{0, 0, 0}},
		{"without a long prefix the least loaded wins", 4, []string{"a", "b", "c"}, []int{0, 1, 0}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			o, err := NewOracle(2, blockSize, 1024, tc.slots)
			if err != nil {
				t.Fatal(err)
			}
			for i, p := range tc.steps {
				d, err := o.Pick(sys(p))
				if err != nil {
					t.Fatal(err)
				}
				if d.Endpoint != tc.want[i] {
					t.Fatalf("pick %d (%s) = endpoint %d; want %d (in flight %v)", i, p, d.Endpoint, tc.want[i], o.InFlight())
				}
			}
		})
	}
	if _, err := NewOracle(0, blockSize, 1, 0); !errors.Is(err, ErrParams) {
		t.Errorf("NewOracle(0 endpoints) = %v; want ErrParams", err)
	}
}
