package cli

import (
	"context"
	"encoding/json"
	"image/png"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/spf13/cobra"
)

// benchRoot builds the command tree with the bench subcommands' run
// functions replaced by captures of their parsed options.
func benchRoot(ios *IOStreams, ov **BenchOverheadOptions, rt **BenchRoutingOptions) *cobra.Command {
	root := NewRootCmd(ios)
	for _, c := range root.Commands() {
		if c.Name() == "bench" {
			root.RemoveCommand(c)
		}
	}
	bench := &cobra.Command{Use: "bench"}
	bench.AddCommand(
		newBenchOverheadCmd(ios, func(_ context.Context, o *BenchOverheadOptions) error { *ov = o; return nil }),
		newBenchRoutingCmd(ios, func(_ context.Context, o *BenchRoutingOptions) error { *rt = o; return nil }),
	)
	root.AddCommand(bench)
	return root
}

func TestBenchFlags(t *testing.T) {
	cases := []struct {
		name  string
		args  string
		check func(*BenchOverheadOptions, *BenchRoutingOptions) string
	}{
		{"overhead defaults", "bench overhead", func(o *BenchOverheadOptions, _ *BenchRoutingOptions) string {
			if o.Mode != "closed" || o.RPS != 5000 || o.Concurrency != 32 || o.Duration != 5*time.Second || o.Slice != time.Second || o.Targets != "llmgw,nginx,haproxy" || o.Stream {
				return "defaults"
			}
			return ""
		}},
		{"overhead open loop streaming", "bench overhead --mode open --rps 200 --duration 2s --requests 50 --stream --decode-per-token 200us --targets llmgw",
			func(o *BenchOverheadOptions, _ *BenchRoutingOptions) string {
				if o.Mode != "open" || o.RPS != 200 || o.Duration != 2*time.Second || o.Requests != 50 || !o.Stream || o.DecodePerToken != 200*time.Microsecond || o.Targets != "llmgw" {
					return "flags not parsed"
				}
				return ""
			}},
		{"routing defaults", "bench routing", func(_ *BenchOverheadOptions, r *BenchRoutingOptions) string {
			if r.Workload != "shared-prefix" || r.Policies != "all" || r.Seed != 42 || r.Endpoints != 4 || r.CacheBlocks != 256 || r.PrefillPerToken != 50*time.Microsecond {
				return "defaults"
			}
			return ""
		}},
		{"routing all flags", "bench routing --workload all --policies rr,oracle --requests 10 --seed 7 --endpoints 3 --concurrency 2 --cache-blocks 64 --prefill-per-token 10us --decode-per-token 1us --sim-concurrency 0 --max-tokens 2 --out /tmp/x --format json",
			func(_ *BenchOverheadOptions, r *BenchRoutingOptions) string {
				if r.Workload != "all" || r.Policies != "rr,oracle" || r.Requests != 10 || r.Seed != 7 || r.Endpoints != 3 || r.Concurrency != 2 ||
					r.CacheBlocks != 64 || r.PrefillPerToken != 10*time.Microsecond || r.DecodePerToken != time.Microsecond || r.SimConcurrency != 0 ||
					r.MaxTokens != 2 || r.OutDir != "/tmp/x" || r.Format != "json" {
					return "flags not parsed"
				}
				return ""
			}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			ios, _, _ := TestIO()
			var ov *BenchOverheadOptions
			var rt *BenchRoutingOptions
			root := benchRoot(ios, &ov, &rt)
			root.SetArgs(strings.Fields(tc.args))
			if err := root.ExecuteContext(context.Background()); err != nil {
				t.Fatal(err)
			}
			if ov == nil {
				ov = &BenchOverheadOptions{}
			}
			if rt == nil {
				rt = &BenchRoutingOptions{}
			}
			if msg := tc.check(ov, rt); msg != "" {
				t.Errorf("%s: got overhead %+v routing %+v", msg, *ov, *rt)
			}
		})
	}
}

// TestBenchBadInput: every invalid parameter ends with exit 2 and a message
// naming the problem, before any simulator starts or load is sent.
func TestBenchBadInput(t *testing.T) {
	cases := []struct {
		name     string
		args     string
		wantCode ExitCode
		wantErr  string
	}{
		{"bench alone", "bench", ExitUsage, "bench needs a subcommand"},
		{"overhead bad mode", "bench overhead --mode burst", ExitUsage, `mode "burst": want open or closed`},
		{"overhead zero rps", "bench overhead --mode open --rps 0", ExitUsage, "rps must be 1..100000"},
		{"overhead zero duration", "bench overhead --duration 0s", ExitUsage, "duration must be 10ms..10m"},
		{"overhead unknown target", "bench overhead --targets envoy", ExitUsage, `unknown target "envoy"`},
		{"overhead no target", "bench overhead --targets direct", ExitUsage, "name at least one of"},
		{"overhead remote upstream", "bench overhead --upstream 192.0.2.1:80", ExitUsage, "loopback only"},
		{"overhead bad output", "bench overhead -o csv", ExitUsage, `-o "csv": want table, json, yaml`},
		{"overhead deprecated bad format", "bench overhead --format csv", ExitUsage, "--format is deprecated; use -o csv"},
		{"overhead bad duration syntax", "bench overhead --duration soon", ExitUsage, "invalid argument"},
		{"overhead negative slice", "bench overhead --slice -1s", ExitUsage, "slice must not be negative"},
		{"routing unknown workload", "bench routing --workload chat", ExitUsage, `unknown workload "chat"`},
		{"routing unknown policy", "bench routing --policies rr,random", ExitUsage, `unknown policy "random"`},
		{"routing zero requests", "bench routing --requests 0", ExitUsage, "requests must be at least 1"},
		{"routing one endpoint", "bench routing --endpoints 1", ExitUsage, "endpoints must be 2..64"},
		{"routing zero cache", "bench routing --cache-blocks 0", ExitUsage, "cache blocks must be at least 1"},
		{"routing negative prefill", "bench routing --prefill-per-token -1us", ExitUsage, "must not be negative"},
		{"routing bad format", "bench routing --format csv", ExitUsage, `-o "csv": want table, json, yaml`},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			code, out, errOut := runCLI(t, false, strings.Fields(tc.args)...)
			if code != tc.wantCode {
				t.Errorf("exit %d; want %d (stderr %q)", code, tc.wantCode, errOut)
			}
			if !strings.Contains(errOut, tc.wantErr) {
				t.Errorf("stderr %q; want it to contain %q", errOut, tc.wantErr)
			}
			if out != "" {
				t.Errorf("stdout %q; want nothing (no load, no report)", out)
			}
		})
	}
}

func TestBenchOverheadUnreachableUpstream(t *testing.T) {
	// Port 1 on loopback: nothing listens there in a test environment.
	code, out, errOut := runCLI(t, false, "bench", "overhead", "--upstream", "127.0.0.1:1", "--targets", "llmgw", "--duration", "100ms")
	if code != ExitError || !strings.Contains(errOut, "target unreachable") || out != "" {
		t.Errorf("exit %d stdout %q stderr %q; want exit 1, no report, a message naming the unreachable target", code, out, errOut)
	}
}

// TestBenchCommandsEndToEnd runs both commands at a tiny scale on loopback.
func TestBenchCommandsEndToEnd(t *testing.T) {
	dir := t.TempDir()
	jsonFile := filepath.Join(dir, "overhead.json")
	cases := []struct {
		name    string
		args    []string
		wantOut []string
		files   []string
	}{
		{"overhead", []string{"bench", "overhead", "--targets", "llmgw-embedded", "--duration", "200ms", "--requests", "100", "--warmup", "5", "--concurrency", "2", "--json", jsonFile},
			[]string{"| direct |", "| llmgw-embedded |", "added p50", "CPU s/100k"}, []string{jsonFile}},
		{"routing", []string{"bench", "routing", "--workload", "shared-prefix", "--policies", "rr,oracle", "--requests", "20", "--prefill-per-token", "1us", "--decode-per-token", "1us", "--out", dir},
			[]string{"### shared-prefix", "| rr |", "| oracle |"}, []string{"routing.json", "routing.md", "routing.png"}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			code, out, errOut := runCLI(t, false, tc.args...)
			if code != ExitOK {
				t.Fatalf("exit %d; stderr %s", code, errOut)
			}
			for _, w := range tc.wantOut {
				if !strings.Contains(out, w) {
					t.Errorf("stdout lacks %q:\n%s", w, out)
				}
			}
			for _, f := range tc.files {
				if !filepath.IsAbs(f) {
					f = filepath.Join(dir, f)
				}
				b, err := os.ReadFile(f)
				if err != nil {
					t.Errorf("output file: %v", err)
					continue
				}
				switch filepath.Ext(f) {
				case ".json":
					if !json.Valid(b) {
						t.Errorf("%s is not valid JSON", f)
					}
				case ".png":
					if _, err := png.Decode(strings.NewReader(string(b))); err != nil {
						t.Errorf("%s is not a PNG: %v", f, err)
					}
				}
			}
		})
	}
}

func TestBenchRoutingInterruptedPrintsPartialResults(t *testing.T) {
	// Ctrl-C half a second in: each request models ≥ 0.5 s of prefill, so
	// the run is surely mid-way (and could not finish in under a minute).
	ctx, cancel := context.WithTimeout(context.Background(), 500*time.Millisecond)
	defer cancel()
	ios, out, errOut := TestIO()
	code := Main(ctx, []string{"bench", "routing", "--policies", "oracle,rr", "--requests", "200", "--concurrency", "2", "--prefill-per-token", "1ms"}, ios)
	if code != ExitCancelled && code != ExitError {
		t.Errorf("exit %d; want an interrupted run (stderr %s)", code, errOut)
	}
	if !strings.Contains(out.String(), "partial: interrupted") || !strings.Contains(out.String(), "| oracle |") {
		t.Errorf("stdout %q; want the oracle's partial results marked as interrupted", out)
	}
	if !strings.Contains(errOut.String(), "interrupted") {
		t.Errorf("stderr %q; want it to say the run was interrupted", errOut)
	}
}
