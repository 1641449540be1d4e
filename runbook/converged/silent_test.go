package converged

import (
	"context"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/llmgw/llmgw/engines"
	"github.com/llmgw/llmgw/engines/sim"
	"github.com/llmgw/llmgw/results"
	"github.com/llmgw/llmgw/runbook/gates"
	"github.com/llmgw/llmgw/runbook/labkit"
	"github.com/llmgw/llmgw/runbook/launcher"
)

// startSilent starts n simulators of engine that serve no /_sim/*
// endpoints (as silent as a real engine) and returns their HTTP and KV
// event addresses.
func startSilent(t *testing.T, engine string, n int, events, metrics bool) (httpAddrs, eventAddrs []string) {
	t.Helper()
	kind, err := engines.ParseKind(engine)
	if err != nil {
		t.Fatal(err)
	}
	for i := 0; i < n; i++ {
		// EnableMetrics is llama-server's --metrics (other personas always
		// serve /metrics).
		cfg := sim.Config{Engine: kind, Silent: true, KVEvents: sim.KVEventsOff, EnableMetrics: metrics}
		if kind == engines.SGLang {
			cfg.BlockSize = 16 // as the catalog launches it (--page-size 16; SGLang's default is 1)
		}
		if events && (kind == engines.VLLM || kind == engines.SGLang) {
			cfg.KVEvents = "tcp://127.0.0.1:0"
		}
		s, err := sim.Start(context.WithoutCancel(t.Context()), cfg)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			if err := s.Close(); err != nil {
				t.Errorf("close sim: %v", err)
			}
		})
		a := s.Addrs()
		httpAddrs = append(httpAddrs, a.HTTP)
		eventAddrs = append(eventAddrs, a.Events)
	}
	return httpAddrs, eventAddrs
}

// TestAttachReceiptlessSims: the converged runbook PASSes against
// simulators that keep no receipts, on engine-native evidence alone, and
// every gateway lane names the source that proved it (never the receipts).
func TestAttachReceiptlessSims(t *testing.T) {
	cases := []struct {
		name, engine, mode string
		// wantSource is the evidence source the delivery and routing lanes
		// must name; wantCache the exact mode's cache lane source.
		wantSource, wantCache string
	}{
		{"vllm rr", "vllm", "rr", "engine_metrics vllm:request_success_total", ""},
		{"vllm exact", "vllm", "exact", "engine_metrics vllm:request_success_total", "engine_usage+engine_metrics vllm:prefix_cache_hits_total"},
		{"sglang rr", "sglang", "rr", "engine_metrics sglang:prompt_tokens_total", ""},
		{"sglang exact", "sglang", "exact", "engine_metrics sglang:prompt_tokens_total", "engine_usage+engine_metrics sglang:cached_tokens_total"},
		{"trtllm rr", "trtllm", "rr", "engine_metrics trtllm_request_success_total", ""},
		{"trtllm exact", "trtllm", "exact", "engine_metrics trtllm_request_success_total", "engine_usage"},
		{"llamacpp rr", "llamacpp", "rr", "engine_metrics llamacpp:prompt_tokens_total", ""},
		{"llamacpp chwbl", "llamacpp", "chwbl", "engine_metrics llamacpp:prompt_tokens_total", ""},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			eps, evs := startSilent(t, tc.engine, 3, tc.mode == "exact", true)
			att := &launcher.Attach{Endpoints: eps, Simulator: true}
			if tc.mode == "exact" && tc.engine != "trtllm" {
				att.Events = evs
			}
			o := &Options{Engine: tc.engine, Mode: tc.mode, Workers: 3, Launcher: att, HealthTimeout: 10 * time.Second, ReadyTimeout: 10 * time.Second}
			rep, _, _ := run(t, t.Context(), o)
			if rep.Summary.Verdict != results.StatusPass {
				t.Fatalf("verdict = %s; want PASS\n%s", rep.Summary.Verdict, stepLine(rep))
			}
			src := rep.Summary.LaneSources
			if src["direct"] != labkit.SourceAnswer {
				t.Errorf("direct lane source = %q; want %q (the worker's own answer)", src["direct"], labkit.SourceAnswer)
			}
			for _, lane := range []string{"delivery", "routing"} {
				if !strings.HasPrefix(src[lane], tc.wantSource) || strings.Contains(src[lane], labkit.SourceReceipts) {
					t.Errorf("%s lane source = %q; want %s (no receipts)", lane, src[lane], tc.wantSource)
				}
			}
			if tc.mode == "exact" && src["cache"] != tc.wantCache {
				t.Errorf("cache lane source = %q; want %s", src["cache"], tc.wantCache)
			}
			if tc.mode == "exact" && src["parity"] != gates.SourceKVEvents {
				t.Errorf("parity lane source = %q; want %s", src["parity"], gates.SourceKVEvents)
			}
			if os.Getenv("V") != "" {
				t.Log(stepLine(rep), src)
			}
		})
	}
}

// TestAttachReceiptlessNoMetrics: a llama-server started without --metrics
// (and without --slots) leaves nothing to witness its work: the direct lane
// still PASSes on the workers' own answers, the gateway lanes are BLOCKED
// with the fix, and the run is BLOCKED, not FAIL.
func TestAttachReceiptlessNoMetrics(t *testing.T) {
	eps, _ := startSilent(t, "llamacpp", 3, false, false)
	o := &Options{Engine: "llamacpp", Mode: "rr", Workers: 3, Launcher: &launcher.Attach{Endpoints: eps, Simulator: true}, HealthTimeout: 10 * time.Second, ReadyTimeout: 10 * time.Second}
	rep, _, _ := run(t, t.Context(), o)
	l := rep.Summary.Lanes
	if rep.Summary.Verdict != results.StatusBlocked || l.DirectWorker != results.StatusPass || l.GatewayDelivery != results.StatusBlocked || l.RoutingEvidence != results.StatusBlocked {
		t.Fatalf("verdict %s, lanes %+v; want BLOCKED with direct PASS, delivery and routing BLOCKED\n%s", rep.Summary.Verdict, l, stepLine(rep))
	}
	if rep.Summary.ReasonCode != "engine_metrics_disabled" || !strings.Contains(rep.Summary.Reason, "start llama.cpp with --metrics") {
		t.Errorf("reason %s %q; want engine_metrics_disabled naming --metrics", rep.Summary.ReasonCode, rep.Summary.Reason)
	}
}
