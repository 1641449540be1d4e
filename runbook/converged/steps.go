package converged

import (
	"context"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/llmgw/llmgw/engines"
	"github.com/llmgw/llmgw/engines/kvhash"
	"github.com/llmgw/llmgw/gateway"
	"github.com/llmgw/llmgw/gateway/rule"
	"github.com/llmgw/llmgw/runbook"
	"github.com/llmgw/llmgw/runbook/labkit"
)

// ---- 1. select tuple -------------------------------------------------------

func (s *state) selectTuple(_ context.Context, r *runbook.Run) runbook.Outcome {
	o := s.o
	ver, _ := o.Catalog.Versions().For(o.Engine)
	sel, fail, ok := labkit.Select(r, o.Catalog, labkit.Tuple{
		Engine: o.Engine, Profile: o.Profile, Topology: "converged", Launcher: o.Launcher, Workers: o.Workers, KVEvents: o.Mode == "exact",
		Extra: map[string]any{"contract": ver.Contract, "mode": o.Mode, "workers": o.Workers},
	})
	s.profile = sel.Profile
	if !ok {
		return fail
	}
	s.launchSpec, s.spec, s.seed = sel.Launch, sel.Spec, sel.Spec.HashSeed
	p := sel.Profile
	return runbook.Pass("%s %s × %s (%s), mode %s, %d %s workers", o.Engine, ver.Version, p.ID, p.Model.ServedName, o.Mode, o.Workers, o.Launcher.Name()).
		With("tuple.json", labkit.MustJSON(sel.Info))
}

// ---- 2. launch workers -----------------------------------------------------

func (s *state) launch(ctx context.Context, r *runbook.Run) runbook.Outcome {
	o := s.o
	s.client = labkit.NewClient(r)
	a, err := engines.For(engines.Kind(o.Engine))
	if err != nil {
		return runbook.Fail("NO_ADAPTER", "%v", err)
	}
	s.adapter = a
	// Registered before Launch: Stop is idempotent and cleans up a launch
	// that failed half-way.
	r.Defer("stop workers", func(ctx context.Context) error { return s.stopWorkers(ctx) })
	ws, err := o.Launcher.Launch(ctx, s.spec)
	if err != nil {
		return labkit.LaunchFailed(ctx, o.Launcher.Name(), err)
	}
	s.workers = ws
	out := runbook.Pass("")
	out = out.With("workers.json", labkit.MustJSON(ws))
	type health struct {
		Worker string   `json:"worker"`
		Health int      `json:"health_status"`
		Models []string `json:"models"`
		Error  string   `json:"error,omitempty"`
	}
	var report []health
	for _, w := range ws {
		h := health{Worker: w.ID}
		last, err := labkit.WaitFor(ctx, o.HealthTimeout, func() (bool, string, error) {
			p := labkit.ProbeServing(ctx, s.client, w)
			if p.HealthErr != nil {
				h.Error = p.HealthErr.Error()
				return false, p.Last, nil
			}
			h.Health, h.Error = p.Health, ""
			if p.Last != "" {
				return false, p.Last, nil
			}
			h.Models = labkit.ModelIDs(p.Models.Body)
			if !slices.Contains(h.Models, s.spec.Model) {
				return false, fmt.Sprintf("/v1/models lists %v, not %s", h.Models, s.spec.Model), nil
			}
			return true, "", nil
		})
		report = append(report, h)
		if err != nil {
			code := "ENGINE_NOT_READY"
			if strings.HasPrefix(last, "/v1/models lists") {
				code = "WRONG_MODEL"
			}
			r.Logf("worker %s not ready: %s", w.ID, last)
			return labkit.FailErr(ctx, code, fmt.Errorf("worker %s (%s) not ready within %v: %s", w.ID, w.HTTP, o.HealthTimeout, last)).
				With("workers.json", labkit.MustJSON(ws)).With("health.json", labkit.MustJSON(report))
		}
	}
	out = out.With("health.json", labkit.MustJSON(report))
	ver, _ := o.Catalog.Versions().For(o.Engine)
	vc, fail, ok := labkit.RecordVersions(ctx, r, s.client, ws, s.adapter, ver.Version, o.Launcher.Simulated(), o.AcceptVersionMismatch)
	if !ok {
		return labkit.WithEvidence(fail, out)
	}
	out = out.With("versions.json", labkit.MustJSON(vc))
	out.Reason = fmt.Sprintf("%d workers healthy and serving %s (%s); %s", len(ws), s.spec.Model, ws[0].Owner, vc.Note())
	return out
}

func (s *state) stopWorkers(ctx context.Context) error {
	// Our idle keep-alive connections would hold each worker's shutdown.
	s.client.CloseIdleConnections()
	if err := s.o.Launcher.Stop(ctx); err != nil {
		return err
	}
	// Prove it: a launched worker no longer answers. Attached workers are
	// not ours and keep running.
	for _, w := range s.workers {
		if w.Owner == "attach" {
			continue
		}
		err := labkit.WaitClosed(ctx, w.HTTP, 10*time.Second)
		if err != nil {
			return fmt.Errorf("converged: worker %s at %s still listening after stop: %w", w.ID, w.HTTP, err)
		}
	}
	return nil
}

// ---- request shapes --------------------------------------------------------

// chat reports whether the profile is served through chat completions.
func (s *state) chat() bool { return s.profile.APIMode == "chat" }

// longPrompt is a prompt of many KV blocks (longer than CHWBL's default
// 2048 prefix bytes) whose text is unique to the run
// and topic, so no earlier request warmed it by chance.
func (s *state) longPrompt(runID, topic string) string {
	var b strings.Builder
	// The run's random suffix comes first: the first block must be new to
	// every worker (a block an engine cached before the gateway subscribed
	// is unknown to the gateway, and a prefix match starts at block 0).
	fmt.Fprintf(&b, "Run %s, %s. ", labkit.ShortID(runID), topic)
	for i := 0; i < 24; i++ {
		fmt.Fprintf(&b, "Section %d of %s (%s): the gateway sends each request to the worker that already holds its prefix. ", i, topic, runID)
	}
	return b.String()
}

// ---- 3. prove direct inference ---------------------------------------------

func (s *state) direct(ctx context.Context, r *runbook.Run) runbook.Outcome {
	out := runbook.Pass("").For(runbook.LaneDirectWorker)
	echo, _ := s.adapter.(engines.RequestIDEcho)
	for _, w := range s.workers {
		nonce := r.ID + "-direct-" + w.ID
		ex, err := labkit.Do(ctx, s.client, http.MethodPost, "http://"+w.HTTP+labkit.CompletionPath(s.chat()),
			labkit.RequestBody(s.chat(), s.spec.Model, "Direct check of worker "+w.ID+" in run "+r.ID+": reply with one word.", nonce, false),
			map[string]string{"X-Request-Id": nonce})
		out = out.With(w.ID+labkit.ExchangeSuffix, ex.JSON())
		if err != nil {
			return labkit.FailErr(ctx, "DIRECT_REQUEST_FAILED", fmt.Errorf("worker %s: %w", w.ID, err)).With(w.ID+labkit.ExchangeSuffix, ex.JSON())
		}
		if ex.Status != http.StatusOK {
			return labkit.WithEvidence(runbook.Fail("DIRECT_REQUEST_FAILED", "worker %s answered %d: %.200s", w.ID, ex.Status, ex.Body), out)
		}
		c, err := labkit.ParseCompletion(ex.Body)
		if err != nil || c.Text == "" {
			return labkit.WithEvidence(runbook.Fail("DIRECT_BAD_COMPLETION", "worker %s: no generated text (%v)", w.ID, err), out)
		}
		if echo != nil {
			if want := echo.ResponseID(nonce, s.chat()); c.ID != want {
				return labkit.WithEvidence(runbook.Fail("DIRECT_REQUEST_ID_LOST", "worker %s answered id %q, want %q (%s builds it from X-Request-Id)", w.ID, c.ID, want, s.adapter.Display()), out)
			}
		}
	}
	// The answers are the direct proof; the evidence sources are for the
	// lanes after this one.
	s.wit = labkit.ChooseWitnesses(ctx, s.client, s.workers, s.adapter)
	sources := map[string]string{}
	for _, w := range s.workers {
		if wt, ok := s.wit.ByWorker[w.ID]; ok {
			sources[w.ID] = wt.Source()
		} else {
			sources[w.ID] = "none: " + s.wit.Missing[w.ID].Error()
		}
	}
	out = out.With("evidence-sources.json", labkit.MustJSON(sources))
	src := labkit.SourceAnswer
	if s.wit.Receipts() {
		// A simulator's receipt must record the very request.
		all, err := s.allReceipts(ctx)
		if err != nil {
			return labkit.WithEvidence(labkit.FailErr(ctx, "NO_RECEIPT_SOURCE", err), out)
		}
		for _, w := range s.workers {
			nonce := r.ID + "-direct-" + w.ID
			rec, ok := labkit.ReceiptFor(all[w.ID], nonce)
			if !ok || rec.Nonce != nonce || rec.Status != http.StatusOK {
				return labkit.WithEvidence(runbook.Fail("DIRECT_NO_RECEIPT", "worker %s answered but its receipt log has no 200 receipt for request %s (nonce %s)", w.ID, nonce, nonce), out)
			}
			out = out.With(w.ID+"-receipt.json", labkit.MustJSON(rec))
		}
		src += "+" + labkit.SourceReceipts
	}
	out = out.From(runbook.LaneDirectWorker, src)
	out.Reason = fmt.Sprintf("%d/%d workers answered a nonce request directly with a well-formed completion (%s)", len(s.workers), len(s.workers), src)
	if echo != nil {
		out.Reason += ", each answer id carrying its X-Request-Id"
	}
	if _, blocked := s.wit.Blocked(); blocked {
		out.Reason += fmt.Sprintf("; evidence source missing on %d worker(s), the gateway lanes will be BLOCKED", len(s.wit.Missing))
	} else {
		out.Reason += "; evidence source: " + s.wit.Source()
	}
	return out
}

// ---- 4. apply rule ---------------------------------------------------------

// buildRule is the rule for the mode over the launched workers.
func (s *state) buildRule(name string) *rule.Rule {
	o := s.o
	r := &rule.Rule{
		Name: name, ModelName: s.spec.Model, KVEngineType: o.Engine,
		Probe: labkit.ProbeConfig(s.workers[0].HealthPath),
	}
	switch o.Mode {
	case "rr":
		r.Sel = 0
	case "chwbl":
		r.Sel = 8
	case "exact":
		r.Sel = 8 // CHWBL is the fallback on a KV miss
		r.KVExactMode = 3
		r.KVTokenizer = s.kvTokenizer
		r.KVBlockSize = s.spec.BlockSize
		if kv := engines.KVOf(engines.Kind(o.Engine)); kv != nil && kvhash.Algo(kv.HashAlgo).Seeded() {
			seed := s.seed
			r.KVHashSeed = &seed
		}
	}
	for _, w := range s.workers {
		ep := labkit.Endpoint(w.ID, w.HTTP)
		if o.Mode == "exact" && engines.KVOf(engines.Kind(o.Engine)).PublishesZMQ() {
			ep.KVEventsEndpoint, ep.KVReplayEndpoint = w.Events, w.Replay
			if w.Events == "" {
				ep.KVReplayEndpoint = ""
			}
		}
		r.Endpoints = append(r.Endpoints, ep)
	}
	return r
}

func (s *state) apply(ctx context.Context, r *runbook.Run) runbook.Outcome {
	o := s.o
	s.ruleName = "rb-" + labkit.ShortID(r.ID)
	if o.Mode == "exact" {
		tok, err := runbook.KVTokenizer(o.Launcher.Simulated(), o.Tokenizer, filepath.Join(os.TempDir(), "llmgw-tokenizers"))
		if err != nil {
			return runbook.Fail("tokenizer", "KV-exact needs the model's tokenizer: %v", err)
		}
		s.kvTokenizer = tok
	}
	a, out, ok := labkit.Apply(ctx, r, labkit.ApplyOptions{
		AdminURL: o.GatewayAdmin, Token: o.GatewayToken, TokenFile: o.GatewayTokenFile, DirPattern: "llmgw-runbook-gw-", Logger: o.Logger, Client: s.client,
		Name: s.ruleName, Build: s.buildRule, Hook: o.RuleHook, MarkEmbedded: true,
	})
	s.gw, s.admin, s.applied = a.Gateway, a.Admin, a.Rule
	if !ok {
		return out
	}
	return labkit.WithEvidence(runbook.Pass("rule %s created on %s: sel %d, kvExactMode %d, %d endpoints", s.ruleName, s.admin.Base(), s.applied.Sel, s.applied.KVExactMode, len(s.applied.Endpoints)), out)
}

// ---- 5. read back ----------------------------------------------------------

func (s *state) readBack(ctx context.Context, _ *runbook.Run) runbook.Outcome {
	st, raw, err := s.admin.Rule(ctx, s.ruleName)
	out := runbook.Outcome{}.With("readback.json", raw)
	if err != nil {
		return labkit.WithEvidence(labkit.FailErr(ctx, "READBACK_FAILED", err), out)
	}
	want := s.applied.Effective()
	diffs, compared := labkit.DiffJSON(want, st.Rule)
	out = out.With("readback-diff.txt", []byte(diffText(diffs, compared)))
	if len(diffs) > 0 {
		return labkit.WithEvidence(runbook.Fail("READBACK_MISMATCH", "effective rule differs from what was applied in %d field(s): %s", len(diffs), strings.Join(diffs, "; ")), out)
	}
	exact := s.applied.KVExactMode != 0
	last, addr, out, ok := labkit.AwaitReady(ctx, s.admin, s.ruleName, s.o.ReadyTimeout, func(st *gateway.RuleStatus) (bool, string) { return readinessHolds(st, exact) }, out)
	if !ok {
		return out
	}
	s.dataAddr = addr
	reason := fmt.Sprintf("effective rule equals the applied one (%d fields compared, defaults resolved); %d/%d endpoints healthy and available", compared, len(last.Status.Endpoints), len(s.workers))
	if exact {
		reason += "; every KV event stream connected (the inventory condition needs traffic: proved in routing evidence)"
	}
	return labkit.WithEvidence(runbook.Pass("%s", reason), out)
}

// readinessHolds checks the readiness conditions a read-back can see.
func readinessHolds(st *gateway.RuleStatus, exact bool) (bool, string) {
	if !st.Status.Ready {
		return false, "rule not ready (no available endpoint)"
	}
	for _, ep := range st.Status.Endpoints {
		switch {
		case !ep.Healthy || !ep.Available:
			return false, fmt.Sprintf("endpoint %s healthy=%v available=%v", ep.ID, ep.Healthy, ep.Available)
		case ep.Draining:
			return false, fmt.Sprintf("endpoint %s is draining", ep.ID)
		case exact && ep.KV == nil:
			return false, fmt.Sprintf("endpoint %s has no KV status", ep.ID)
		case exact && !ep.KV.EventsConnected:
			return false, fmt.Sprintf("endpoint %s: KV event stream not connected (admission %q)", ep.ID, ep.KV.Admission)
		}
	}
	return true, ""
}

func diffText(diffs []string, compared int) string {
	if len(diffs) == 0 {
		return fmt.Sprintf("%d fields compared; no difference\n", compared)
	}
	return fmt.Sprintf("%d fields compared; %d differ:\n%s\n", compared, len(diffs), strings.Join(diffs, "\n"))
}
