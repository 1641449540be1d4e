package pd

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/llmgw/llmgw/engines/sim"
	"github.com/llmgw/llmgw/results"
	"github.com/llmgw/llmgw/runbook"
	"github.com/llmgw/llmgw/runbook/gates"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m,
		// fasthttp and zmq4 housekeeping goroutines that end on their own
		// after their pools close.
		goleak.IgnoreAnyFunction("github.com/valyala/fasthttp.(*HostClient).connsCleaner"),
		goleak.IgnoreAnyFunction("github.com/valyala/fasthttp.(*workerPool).Start.func2"),
		goleak.IgnoreAnyFunction("github.com/valyala/fasthttp.(*TCPDialer).tcpAddrsClean"),
		goleak.IgnoreAnyFunction("github.com/valyala/fasthttp.updateServerDate.func1"),
		goleak.IgnoreAnyFunction("github.com/go-zeromq/zmq4.(*pubMWriter).run"),
	)
}

func run(t *testing.T, ctx context.Context, o *Options) (runbook.Report, string) {
	t.Helper()
	if err := o.Validate(); err != nil {
		t.Fatal(err)
	}
	out := t.TempDir()
	store, err := results.Open(out)
	if err != nil {
		t.Fatal(err)
	}
	rep, err := Execute(ctx, o, store, out, nil)
	if err != nil {
		t.Fatalf("Execute: %v", err)
	}
	return rep, out
}

func stepLines(rep runbook.Report) string {
	var b strings.Builder
	for _, s := range rep.Steps {
		b.WriteString(s.Name + "=" + string(s.Status) + " " + s.ReasonCode + ": " + s.Reason + "\n")
	}
	return b.String()
}

func step(rep runbook.Report, name string) results.Step {
	for _, s := range rep.Steps {
		if s.Name == name {
			return s
		}
	}
	return results.Step{}
}

func TestPDPassPathOnSims(t *testing.T) {
	cases := []struct {
		name, engine string
		kvExact      bool
	}{
		{"vllm", "vllm", false},
		{"sglang", "sglang", false},
		{"trtllm", "trtllm", false},
		{"vllm kv-exact", "vllm", true},
		{"sglang kv-exact", "sglang", true},
		{"trtllm kv-exact", "trtllm", true},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			o := &Options{Engine: tc.engine, KVExact: tc.kvExact, Launcher: &Sim{}, HealthTimeout: 10 * time.Second, ReadyTimeout: 10 * time.Second}
			rep, out := run(t, t.Context(), o)
			if rep.Summary.Verdict != results.StatusPass {
				t.Fatalf("verdict = %s; want PASS\n%s", rep.Summary.Verdict, stepLines(rep))
			}
			wantParity := results.StatusSkipped
			if tc.kvExact {
				wantParity = results.StatusPass
			}
			if got := step(rep, StepParity).Status; got != wantParity {
				t.Errorf("hash parity step %s; want %s", got, wantParity)
			}
			lanes := rep.Summary.Lanes
			if lanes.DirectWorker != results.StatusPass || lanes.GatewayDelivery != results.StatusPass || lanes.RoutingEvidence != results.StatusPass {
				t.Errorf("lanes %+v; want direct, delivery and routing PASS", lanes)
			}
			if tc.kvExact && (lanes.HashParity != results.StatusPass || lanes.CacheReuse != results.StatusPass) {
				t.Errorf("lanes %+v; want parity and cache PASS with kv-exact", lanes)
			}
			// The hand-off evidence files are in the run, with every check true.
			ho := step(rep, StepHandOff)
			for _, kind := range []string{"json", "sse"} {
				i := slices.IndexFunc(ho.Evidence, func(p string) bool { return strings.HasSuffix(p, "handoff-"+kind+".json") })
				if i < 0 {
					t.Fatalf("no handoff-%s.json among %v", kind, ho.Evidence)
				}
				b, err := os.ReadFile(filepath.Join(out, "runs", rep.Summary.ID, ho.Evidence[i]))
				if err != nil {
					t.Fatal(err)
				}
				var h HandOff
				if err := json.Unmarshal(b, &h); err != nil {
					t.Fatal(err)
				}
				if len(h.Checks) < 4 || h.PrefillRx.RequestID != h.DecodeRx.RequestID {
					t.Errorf("%s hand-off: %d checks, request ids %q/%q", kind, len(h.Checks), h.PrefillRx.RequestID, h.DecodeRx.RequestID)
				}
			}
			if os.Getenv("V") != "" {
				t.Log(stepLines(rep))
			}
		})
	}
}

// A prefill publishing with another hash seed: delivery and the hand-off
// still work (the split does not depend on hashes), the parity gate and
// the cache-reuse lane fail.
func TestPDMismatchedSeedFailsParityNotDelivery(t *testing.T) {
	o := &Options{Engine: "vllm", KVExact: true, Launcher: &Sim{HashSeed: "4242"}, HealthTimeout: 10 * time.Second, ReadyTimeout: 2 * time.Second}
	rep, _ := run(t, t.Context(), o)
	l := rep.Summary.Lanes
	if rep.Summary.Verdict != results.StatusFail {
		t.Fatalf("verdict %s; want FAIL\n%s", rep.Summary.Verdict, stepLines(rep))
	}
	if l.GatewayDelivery != results.StatusPass || l.DirectWorker != results.StatusPass {
		t.Errorf("delivery %s, direct %s; want PASS: a seed mismatch does not break delivery", l.GatewayDelivery, l.DirectWorker)
	}
	if got := step(rep, StepParity); got.Status != results.StatusFail || got.ReasonCode != gates.CodeParityMiss {
		t.Errorf("parity step %s %s; want FAIL %s", got.Status, got.ReasonCode, gates.CodeParityMiss)
	}
	if l.HashParity != results.StatusFail || l.CacheReuse != results.StatusFail {
		t.Errorf("lanes parity %s cache %s; want both FAIL\n%s", l.HashParity, l.CacheReuse, stepLines(rep))
	}
}

func TestCheckHandOff(t *testing.T) {
	boot := &sim.BootstrapTriple{Host: "127.0.0.1", Port: 4000, Room: 7}
	other := &sim.BootstrapTriple{Host: "127.0.0.1", Port: 4000, Room: 8}
	state := "eyJjdHhfcmVxdWVzdF9pZCI6MX0="
	cases := []struct {
		name, engine string
		p, d         sim.Receipt
		bootstrap    string
		wantFail     []string
	}{
		{
			name: "vllm good", engine: "vllm",
			p: sim.Receipt{RequestID: "r", Role: "prefill", Status: 200, MaxTokens: 1, HandOff: json.RawMessage(`{"do_remote_decode":true}`), HandOffOut: json.RawMessage(`{"do_remote_prefill":true,"remote_block_ids":[1]}`)},
			d: sim.Receipt{RequestID: "r", Role: "decode", Status: 200, MaxTokens: 8, HandOff: json.RawMessage(`{"remote_block_ids":[1],"do_remote_prefill":true}`), RemotePrefillTokens: 30},
		},
		{
			name: "vllm prefill not capped", engine: "vllm",
			p:        sim.Receipt{RequestID: "r", Role: "prefill", Status: 200, MaxTokens: 8, HandOff: json.RawMessage(`{"do_remote_decode":true}`), HandOffOut: json.RawMessage(`{"do_remote_prefill":true}`)},
			d:        sim.Receipt{RequestID: "r", Role: "decode", Status: 200, HandOff: json.RawMessage(`{"do_remote_prefill":true}`), RemotePrefillTokens: 30},
			wantFail: []string{"prefill leg max_tokens 1"},
		},
		{
			name: "two request ids", engine: "vllm",
			p:        sim.Receipt{RequestID: "r", Role: "prefill", Status: 200, MaxTokens: 1, HandOff: json.RawMessage(`{"do_remote_decode":true}`), HandOffOut: json.RawMessage(`{"do_remote_prefill":true}`)},
			d:        sim.Receipt{RequestID: "other", Role: "decode", Status: 200, HandOff: json.RawMessage(`{"do_remote_prefill":true}`), RemotePrefillTokens: 3},
			wantFail: []string{"one request id on both legs"},
		},
		{
			name: "sglang rooms match", engine: "sglang", bootstrap: "127.0.0.1:4000",
			p: sim.Receipt{RequestID: "r", Role: "prefill", Status: 200, Bootstrap: boot},
			d: sim.Receipt{RequestID: "r", Role: "decode", Status: 200, Bootstrap: boot, RemotePrefillTokens: 12},
		},
		{
			name: "sglang rooms differ", engine: "sglang", bootstrap: "127.0.0.1:4000",
			p:        sim.Receipt{RequestID: "r", Role: "prefill", Status: 200, Bootstrap: boot},
			d:        sim.Receipt{RequestID: "r", Role: "decode", Status: 200, Bootstrap: other, RemotePrefillTokens: 12},
			wantFail: []string{"the rooms matched (same bootstrap triple)"},
		},
		{
			name: "sglang wrong bootstrap port", engine: "sglang", bootstrap: "127.0.0.1:5000",
			p:        sim.Receipt{RequestID: "r", Role: "prefill", Status: 200, Bootstrap: boot},
			d:        sim.Receipt{RequestID: "r", Role: "decode", Status: 200, Bootstrap: boot, RemotePrefillTokens: 12},
			wantFail: []string{"bootstrap port is the chosen prefill's"},
		},
		{
			name: "trtllm carried", engine: "trtllm",
			p: sim.Receipt{RequestID: "r", Role: "prefill", Status: 200, HandOff: json.RawMessage(`{"request_type":"context_only"}`), HandOffOut: json.RawMessage(`{"request_type":"context_only","encoded_opaque_state":"` + state + `"}`)},
			d: sim.Receipt{RequestID: "r", Role: "decode", Status: 200, HandOff: json.RawMessage(`{"request_type":"generation_only","encoded_opaque_state":"` + state + `"}`), RemotePrefillTokens: 9},
		},
		{
			name: "trtllm generation without state", engine: "trtllm",
			p:        sim.Receipt{RequestID: "r", Role: "prefill", Status: 200, HandOff: json.RawMessage(`{"request_type":"context_only"}`), HandOffOut: json.RawMessage(`{"request_type":"context_only","encoded_opaque_state":"` + state + `"}`)},
			d:        sim.Receipt{RequestID: "r", Role: "decode", Status: 200, HandOff: json.RawMessage(`{"request_type":"generation_only"}`), RemotePrefillTokens: 9},
			wantFail: []string{"decode leg carried the prefill's hand-off"},
		},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			var failed []string
			for _, c := range CheckHandOff(tc.engine, "r", tc.p, tc.d, tc.bootstrap) {
				if !c.OK {
					failed = append(failed, c.Name)
				}
			}
			if !slices.Equal(failed, tc.wantFail) {
				t.Errorf("failed checks %q; want %q", failed, tc.wantFail)
			}
		})
	}
}

func TestValidateRejectsBeforeLaunch(t *testing.T) {
	cases := []struct {
		name    string
		o       Options
		wantSub string
	}{
		{"llamacpp has no P/D", Options{Engine: "llamacpp", Launcher: &Sim{}}, "valid: vllm, sglang, trtllm"},
		{"unknown engine", Options{Engine: "tgi", Launcher: &Sim{}}, "valid: vllm, sglang, trtllm"},
		{"unknown profile", Options{Profile: "nope", Launcher: &Sim{}}, "qwen3-0.6b"},
		{"no launcher", Options{}, "no launcher"},
		{"too many prefills", Options{Prefill: 99, Launcher: &Sim{}}, "1..16"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			err := tc.o.Validate()
			if err == nil || !strings.Contains(err.Error(), tc.wantSub) {
				t.Fatalf("err = %v; want one mentioning %q", err, tc.wantSub)
			}
		})
	}
}

func TestBlockedTupleLaunchesNothing(t *testing.T) {
	l := &Sim{}
	o := &Options{Engine: "trtllm", Profile: "gemma-2-9b-it", Launcher: l}
	rep, _ := run(t, t.Context(), o)
	if rep.Summary.Verdict != results.StatusBlocked || rep.Summary.ReasonCode != "architecture_unsupported" {
		t.Fatalf("verdict %s %s; want BLOCKED architecture_unsupported\n%s", rep.Summary.Verdict, rep.Summary.ReasonCode, stepLines(rep))
	}
	if step(rep, StepLaunch).Status != results.StatusBlocked || len(l.sims) != 0 {
		t.Errorf("launch step %s, %d sims started; want BLOCKED and none", step(rep, StepLaunch).Status, len(l.sims))
	}
}

func TestCancelKeepsRowsAndCleansUp(t *testing.T) {
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	l := &Sim{}
	o := &Options{Engine: "sglang", Launcher: l, HealthTimeout: 10 * time.Second, ReadyTimeout: 10 * time.Second,
		StepHook: func(s string) {
			if s == StepHandOff {
				cancel()
			}
		}}
	rep, out := run(t, ctx, o)
	if !rep.Interrupted {
		t.Fatalf("report not interrupted\n%s", stepLines(rep))
	}
	if got := step(rep, StepDeliver).Status; got != results.StatusPass {
		t.Errorf("deliver step %s; want PASS kept from before the interrupt", got)
	}
	if got := step(rep, StepCleanup).Status; got != results.StatusPass {
		t.Errorf("cleanup %s; want PASS", got)
	}
	if len(l.sims) != 0 {
		t.Errorf("%d sims still held by the launcher after cleanup", len(l.sims))
	}
	store, err := results.Open(out)
	if err != nil {
		t.Fatal(err)
	}
	runs, err := store.List()
	if err != nil || len(runs) != 1 {
		t.Fatalf("history: %d runs, %v; want the interrupted run recorded", len(runs), err)
	}
}

func FuzzParseReceipts(f *testing.F) {
	f.Add([]byte(`[{"seq":1,"request_id":"r","role":"prefill","max_tokens":1,"rendezvous":{"host":"h","port":1,"room":2}}]`))
	f.Add([]byte(`[]`))
	f.Add([]byte(`null`))
	f.Fuzz(func(t *testing.T, b []byte) {
		recs, err := ParseReceipts(b)
		if err == nil && recs == nil {
			t.Fatal("nil receipts without an error")
		}
	})
}

func FuzzParseSSE(f *testing.F) {
	f.Add("data: {\"choices\":[{\"delta\":{\"content\":\"hi\"}}]}\n\ndata: [DONE]\n\n")
	f.Add("data: [DONE]\n\n")
	f.Add("data: {\n")
	f.Fuzz(func(t *testing.T, body string) {
		_, n, err := ParseSSE(body)
		if err == nil && n == 0 {
			t.Fatal("accepted a stream without events")
		}
	})
}

// Attached simulators: the bootstrap and event addresses come from each
// worker's /_sim/addrs, nothing is stopped by the runbook.
func TestPDAttachToRunningSims(t *testing.T) {
	var prefill, decode []string
	for _, role := range []string{RolePrefill, RolePrefill, RoleDecode} {
		s, err := sim.Start(t.Context(), sim.Config{Engine: "sglang", Model: "Qwen/Qwen3-0.6B", Role: role, HashSeed: "0"})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { s.Close() })
		if role == RolePrefill {
			prefill = append(prefill, s.Addrs().HTTP)
		} else {
			decode = append(decode, s.Addrs().HTTP)
		}
	}
	o := &Options{Engine: "sglang", KVExact: true, Prefill: 2, Decode: 1, Launcher: &Attach{Prefill: prefill, Decode: decode, Simulator: true},
		HealthTimeout: 10 * time.Second, ReadyTimeout: 10 * time.Second}
	rep, _ := run(t, t.Context(), o)
	if rep.Summary.Verdict != results.StatusPass || rep.Summary.Tuple.Launcher != results.LauncherAttach {
		t.Fatalf("verdict %s launcher %s; want PASS attach\n%s", rep.Summary.Verdict, rep.Summary.Tuple.Launcher, stepLines(rep))
	}
	// The attached workers still run after the cleanup.
	for _, a := range append(prefill, decode...) {
		if _, ok := simAddrs(t.Context(), a); !ok {
			t.Errorf("attached worker %s stopped answering after the run", a)
		}
	}
}

func FuzzParseCompletion(f *testing.F) {
	f.Add(`{"choices":[{"text":"hi"}],"usage":{"prompt_tokens_details":{"cached_tokens":16}}}`)
	f.Add(`{"choices":[]}`)
	f.Add(`{"choices":[{"message":{"content":"x"}}]}`)
	f.Fuzz(func(t *testing.T, body string) {
		_, cached, err := ParseCompletion(body)
		if err != nil && cached != -1 {
			t.Fatalf("error %v with cached %d; want -1", err, cached)
		}
	})
}
