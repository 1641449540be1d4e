package converged

import (
	"errors"

	"context"
	"fmt"
	"github.com/llmgw/llmgw/engines"
	"net/http"
	"slices"
	"strings"

	"github.com/llmgw/llmgw/engines/sim"
	"github.com/llmgw/llmgw/runbook"
	"github.com/llmgw/llmgw/runbook/labkit"
)

func (s *state) gatewayURL() string { return "http://" + s.dataAddr + labkit.CompletionPath(s.chat()) }

func (s *state) workerIDs() []string {
	ids := make([]string, len(s.workers))
	for i, w := range s.workers {
		ids[i] = w.ID
	}
	return ids
}

// ---- 6. deliver through the gateway ----------------------------------------

// errNotDelivered ends an observation whose request the gateway did not
// answer well (the outcome says why).
var errNotDelivered = errors.New("converged: request not delivered")

// evidenceSource is the lane label of the workers' sources, with the
// gateway's decision log when it was cross-checked.
func (s *state) evidenceSource(decisions bool) string {
	src := s.wit.Source()
	if decisions {
		src += "+" + labkit.SourceDecisions
	}
	return src
}

func (s *state) deliver(ctx context.Context, r *runbook.Run) runbook.Outcome {
	out := runbook.Outcome{}.For(runbook.LaneGatewayDelivery)
	if b, blocked := s.wit.Blocked(); blocked {
		// Routing needs the same evidence: its lane says so too, not only
		// "blocked by" this step.
		return b.For(runbook.LaneGatewayDelivery, runbook.LaneRoutingEvidence).From(runbook.LaneGatewayDelivery, "none").From(runbook.LaneRoutingEvidence, "none")
	}
	receipts := s.wit.Receipts()
	var lines []string
	var rts []routed
	for _, stream := range []bool{false, true} {
		kind, rid := labkit.Kind(stream), r.ID+"-deliver-"+labkit.Kind(stream)
		var ex labkit.Exchange
		fail := out
		servers, err := s.wit.Observe(ctx, rid, s.o.ReadyTimeout, func() error {
			var ok bool
			ex, fail, ok = labkit.Deliver(ctx, s.client, s.gatewayURL(), rid, labkit.RequestBody(s.chat(), s.spec.Model, "Delivery check ("+kind+") for run "+r.ID+".", rid, stream), stream, out)
			if !ok {
				return errNotDelivered
			}
			return nil
		})
		if errors.Is(err, errNotDelivered) {
			return fail
		}
		out = fail
		if err != nil {
			return labkit.WithEvidence(labkit.FailErr(ctx, "EVIDENCE_READ_FAILED", err), out)
		}
		ep := ex.Get("X-Llmgw-Endpoint")
		if !slices.Contains(s.workerIDs(), ep) {
			return labkit.WithEvidence(runbook.Fail("DELIVERY_NO_ENDPOINT", "%s answer names endpoint %q, not one of %v", kind, ep, s.workerIDs()), out)
		}
		switch {
		case len(servers) == 0:
			return labkit.WithEvidence(runbook.Fail("DELIVERY_NO_RECEIPT", "the gateway answered %s request %s from %s, but no worker's evidence source (%s) shows it: read-back and a 2xx are not delivery proof", kind, rid, ep, s.wit.Source()), out)
		case len(servers) > 1 || servers[0] != ep:
			return labkit.WithEvidence(runbook.Fail("DELIVERY_WRONG_WORKER", "%s request %s: the gateway names %s but the evidence (%s) is on %v", kind, rid, ep, s.wit.Source(), servers), out)
		}
		if receipts {
			all, err := s.allReceipts(ctx)
			if err != nil {
				return labkit.WithEvidence(labkit.FailErr(ctx, "NO_RECEIPT_SOURCE", err), out)
			}
			rec, _ := labkit.ReceiptFor(all[ep], rid)
			if rec.Stream != stream {
				return labkit.WithEvidence(runbook.Fail("DELIVERY_MODE", "%s request %s reached %s with stream=%v", kind, rid, ep, rec.Stream), out)
			}
			out = out.With(kind+"-receipt.json", labkit.MustJSON(rec))
		}
		if o, ok := s.checkEcho(ex, rid, stream, out); !ok {
			return o
		}
		rts = append(rts, routed{RID: rid, Status: ex.Status, Endpoint: ep, Receipt: servers[0]})
		lines = append(lines, fmt.Sprintf("%s→%s", kind, ep))
	}

	// Negative requests: each must be refused by the gateway itself and
	// reach no worker. Every positive request's evidence was awaited above,
	// so a rise now is the negatives'.
	out, ok := labkit.NegativesLeaveNoWork(ctx, s.client, s.wit, s.gatewayURL(), r.ID, s.chat(), s.spec.Model, out)
	if !ok {
		return out
	}
	checked, o, ok := s.checkDecisions(ctx, rts, out)
	if !ok {
		return o
	}
	out = o
	out.Status = "PASS"
	out.Reason = fmt.Sprintf("JSON and SSE delivered (%s), each attributed to exactly one worker by %s; unknown model (404) and malformed body (400) reached no worker", strings.Join(lines, ", "), s.wit.Source())
	if checked > 0 {
		out.Reason += fmt.Sprintf("; the gateway's decision log agrees on %d/%d", checked, len(rts))
	}
	return out.From(runbook.LaneGatewayDelivery, s.evidenceSource(checked > 0))
}

// checkEcho: an engine that builds its answer id from X-Request-Id proves,
// through the gateway, that the request id reached it unchanged.
func (s *state) checkEcho(ex labkit.Exchange, rid string, stream bool, out runbook.Outcome) (runbook.Outcome, bool) {
	echo, ok := s.adapter.(engines.RequestIDEcho)
	if !ok {
		return out, true
	}
	var c labkit.Completion
	var err error
	if stream {
		c, err = labkit.ParseSSE(ex.Body)
	} else {
		c, err = labkit.ParseCompletion(ex.Body)
	}
	if want := echo.ResponseID(rid, s.chat()); err != nil || c.ID != want {
		return labkit.WithEvidence(runbook.Fail("DELIVERY_REQUEST_ID_LOST", "request %s: the answer's id is %q, want %q (%s builds it from X-Request-Id)", rid, c.ID, want, s.adapter.Display()), out), false
	}
	return out, true
}

// checkDecisions cross-checks the gateway's decision log: a decision
// recorded for a request must name the endpoint the worker-side evidence
// showed. It returns how many requests had a decision.
func (s *state) checkDecisions(ctx context.Context, rs []routed, out runbook.Outcome) (int, runbook.Outcome, bool) {
	raw, err := s.admin.Decisions(ctx, s.ruleName)
	if err != nil {
		return 0, labkit.WithEvidence(labkit.FailErr(ctx, "DECISIONS_READ_FAILED", err), out), false
	}
	dec, err := labkit.ParseDecisions(raw)
	if err != nil {
		return 0, labkit.WithEvidence(labkit.FailErr(ctx, "DECISIONS_READ_FAILED", err), out.With("decisions.json", raw)), false
	}
	n := 0
	for _, x := range rs {
		ep, ok := dec[x.RID]
		if !ok {
			continue
		}
		n++
		if ep != x.Receipt {
			return n, labkit.WithEvidence(runbook.Fail("DECISION_MISMATCH", "request %s: the gateway's decision log names %s, the evidence shows %s", x.RID, ep, x.Receipt), out.With("decisions.json", raw)), false
		}
	}
	return n, out, true
}

// ---- 7. routing evidence ---------------------------------------------------

// routed is one request sent for routing evidence.
type routed struct {
	RID      string `json:"request_id"`
	Status   int    `json:"status"`
	Endpoint string `json:"endpoint"`
	Route    string `json:"route"`
	Cached   int    `json:"engine_cached_tokens"`
	Prompt   int    `json:"engine_prompt_tokens"`
	// Receipt is the worker whose evidence source shows the request ("" =
	// none; several joined by "+").
	Receipt string `json:"receipt_on"`
}

// send sends one request through the gateway and attributes it to the
// worker whose evidence source shows it.
func (s *state) send(ctx context.Context, rid, prompt string) (routed, labkit.Exchange, error) {
	var ex labkit.Exchange
	var rt routed
	servers, err := s.wit.Observe(ctx, rid, s.o.ReadyTimeout, func() error {
		var err error
		ex, err = labkit.Do(ctx, s.client, http.MethodPost, s.gatewayURL(), labkit.RequestBody(s.chat(), s.spec.Model, prompt, rid, false), map[string]string{"X-Request-Id": rid})
		rt = routed{RID: rid, Status: ex.Status, Endpoint: ex.Get("X-Llmgw-Endpoint"), Route: ex.Get("X-Llmgw-Route"), Cached: -1}
		if err != nil {
			return err
		}
		if ex.Status != http.StatusOK {
			return fmt.Errorf("request %s answered %d: %.200s", rid, ex.Status, ex.Body)
		}
		return nil
	})
	if err != nil {
		return rt, ex, err
	}
	rt.Receipt = strings.Join(servers, "+")
	if c, err := labkit.ParseCompletion(ex.Body); err == nil {
		rt.Prompt = c.PromptTokens
	}
	if n, ok := s.cachedTokens([]byte(ex.Body)); ok {
		rt.Cached = n
	}
	return rt, ex, nil
}

// cacheReportFix names the launch flag that makes the engine report cached
// tokens, when its adapter knows one.
func (s *state) cacheReportFix() string {
	if ev, ok := engines.EvidenceOf(s.adapter); ok && ev.Evidence().CacheReportFlag != "" {
		return fmt.Sprintf(": start %s with %s", s.adapter.Display(), ev.Evidence().CacheReportFlag)
	}
	return ""
}

// cachedTokens reads the engine-reported cached tokens through the adapter.
func (s *state) cachedTokens(body []byte) (int, bool) {
	if ev, ok := engines.EvidenceOf(s.adapter); ok {
		return ev.CachedTokens(body)
	}
	c, err := labkit.ParseCompletion(string(body))
	return c.CachedTokens, err == nil && c.CachedTokens >= 0
}

func mismatch(rs []routed) string {
	for _, x := range rs {
		if x.Receipt != x.Endpoint {
			return fmt.Sprintf("request %s: gateway names %q, evidence on %q", x.RID, x.Endpoint, x.Receipt)
		}
	}
	return ""
}

func (s *state) routing(ctx context.Context, r *runbook.Run) runbook.Outcome {
	switch s.o.Mode {
	case "rr":
		return s.routeRR(ctx, r)
	case "chwbl":
		return s.routeCHWBL(ctx, r)
	default:
		return s.routeExact(ctx, r)
	}
}

func (s *state) routeRR(ctx context.Context, r *runbook.Run) runbook.Outcome {
	out := runbook.Outcome{}.For(runbook.LaneRoutingEvidence)
	if b, blocked := s.wit.Blocked(); blocked {
		return b.For(runbook.LaneRoutingEvidence).From(runbook.LaneRoutingEvidence, "none")
	}
	if len(s.workers) < 2 {
		return runbook.Skip("one worker: round robin has no choice to show")
	}
	var rs []routed
	for i := 0; i < 2*len(s.workers); i++ {
		rt, _, err := s.send(ctx, fmt.Sprintf("%s-rr-%d", r.ID, i), fmt.Sprintf("Round robin probe %d of run %s.", i, r.ID))
		rs = append(rs, rt)
		if err != nil {
			return labkit.WithEvidence(labkit.FailErr(ctx, "ROUTING_REQUEST_FAILED", err), out.With("requests.json", labkit.MustJSON(rs)))
		}
	}
	out = out.With("requests.json", labkit.MustJSON(rs))
	if m := mismatch(rs); m != "" {
		return labkit.WithEvidence(runbook.Fail("ROUTING_RECEIPT_MISMATCH", "%s", m), out)
	}
	checked, out, ok := s.checkDecisions(ctx, rs, out)
	if !ok {
		return out
	}
	count := map[string]int{}
	for _, x := range rs {
		count[x.Receipt]++
		if !strings.HasPrefix(x.Route, "rr") {
			return labkit.WithEvidence(runbook.Fail("ROUTING_WRONG_POLICY", "request %s routed by %q, want rr", x.RID, x.Route), out)
		}
	}
	for _, id := range s.workerIDs() {
		if count[id] == 0 {
			return labkit.WithEvidence(runbook.Fail("ROUTING_NOT_SPREAD", "round robin: worker %s received none of %d requests (receipts per worker: %v)", id, len(rs), count), out)
		}
	}
	out.Status, out.Reason = "PASS", fmt.Sprintf("round robin spread %d requests over every worker (requests per worker, by %s: %v; decision log agrees on %d)", len(rs), s.wit.Source(), count, checked)
	return out.From(runbook.LaneRoutingEvidence, s.evidenceSource(checked > 0))
}

func (s *state) routeCHWBL(ctx context.Context, r *runbook.Run) runbook.Outcome {
	out := runbook.Outcome{}.For(runbook.LaneRoutingEvidence)
	if b, blocked := s.wit.Blocked(); blocked {
		return b.For(runbook.LaneRoutingEvidence).From(runbook.LaneRoutingEvidence, "none")
	}
	if len(s.workers) < 2 {
		return runbook.Skip("one worker: affinity has no choice to show")
	}
	prefix := s.longPrompt(r.ID, "affinity")
	var rs []routed
	for i := 0; i < 6; i++ {
		rt, _, err := s.send(ctx, fmt.Sprintf("%s-chwbl-%d", r.ID, i), prefix+fmt.Sprintf(" Question %d?", i))
		rs = append(rs, rt)
		if err != nil {
			return labkit.WithEvidence(labkit.FailErr(ctx, "ROUTING_REQUEST_FAILED", err), out.With("requests.json", labkit.MustJSON(rs)))
		}
	}
	out = out.With("requests.json", labkit.MustJSON(rs))
	if m := mismatch(rs); m != "" {
		return labkit.WithEvidence(runbook.Fail("ROUTING_RECEIPT_MISMATCH", "%s", m), out)
	}
	checked, out, ok := s.checkDecisions(ctx, rs, out)
	if !ok {
		return out
	}
	home := rs[0].Receipt
	for _, x := range rs {
		if x.Receipt != home {
			return labkit.WithEvidence(runbook.Fail("ROUTING_NOT_STICKY", "CHWBL: requests sharing one prefix landed on %s and %s (%s: route %q)", home, x.Receipt, x.RID, x.Route), out)
		}
	}
	for _, x := range rs {
		if !strings.HasPrefix(x.Route, "chwbl") {
			return labkit.WithEvidence(runbook.Fail("ROUTING_WRONG_POLICY", "request %s routed by %q, want chwbl", x.RID, x.Route), out)
		}
	}
	s.warmID = home
	out.Status, out.Reason = "PASS", fmt.Sprintf("CHWBL: %d requests sharing a prefix all landed on %s (route %q; by %s, decision log agrees on %d)", len(rs), home, rs[len(rs)-1].Route, s.wit.Source(), checked)
	return out.From(runbook.LaneRoutingEvidence, s.evidenceSource(checked > 0))
}

func (s *state) routeExact(ctx context.Context, r *runbook.Run) runbook.Outcome {
	out := runbook.Outcome{}.For(runbook.LaneRoutingEvidence, runbook.LaneCacheReuse, runbook.LaneHashParity)
	if b, blocked := s.wit.Blocked(); blocked {
		return b.For(runbook.LaneRoutingEvidence, runbook.LaneCacheReuse).From(runbook.LaneRoutingEvidence, "none").From(runbook.LaneCacheReuse, "none")
	}
	receipts := s.wit.Receipts()
	prefix := s.longPrompt(r.ID, "kv-exact")
	// Inventory before the warm request: a worker may already hold blocks
	// from the direct requests (TensorRT-LLM queues events until drained),
	// so only growth proves the warm prompt's blocks arrived.
	inv0, raw0, err := s.admin.Inventory(ctx, s.ruleName, 4)
	if err != nil {
		return labkit.FailErr(ctx, "READBACK_FAILED", err)
	}
	out = out.With("inventory-before-warm.json", raw0)
	base := map[string]int{}
	for _, ep := range inv0.Endpoints {
		base[ep.ID] = ep.InventoryBlocks
	}
	warm, _, err := s.send(ctx, r.ID+"-exact-warm", prefix+" First question?")
	rs := []routed{warm}
	if err != nil {
		return labkit.WithEvidence(labkit.FailErr(ctx, "ROUTING_REQUEST_FAILED", err), out.With("requests.json", labkit.MustJSON(rs)))
	}
	w := warm.Endpoint
	// The warm prompt's full blocks, from the engine's own count (its
	// receipt, else its answer's usage.prompt_tokens): the inventory must
	// hold at least that many, and have grown, before a follow-up can be
	// expected to hit (one event batch per request).
	want, prompt := 1, warm.Prompt
	if receipts {
		if all, err := s.allReceipts(ctx); err == nil {
			if rec, ok := labkit.ReceiptFor(all[w], warm.RID); ok {
				prompt = rec.PromptTokens
			}
		}
	}
	if s.spec.BlockSize > 0 {
		want = max(1, prompt/s.spec.BlockSize)
	}
	// The gateway learns the warmed blocks from the engine's own events.
	var blocks int
	var invRaw []byte
	why, err := labkit.WaitFor(ctx, s.o.ReadyTimeout, func() (bool, string, error) {
		inv, raw, err := s.admin.Inventory(ctx, s.ruleName, 4)
		if err != nil {
			return false, err.Error(), nil
		}
		invRaw = raw
		for _, ep := range inv.Endpoints {
			if ep.ID == w {
				blocks = ep.InventoryBlocks
			}
		}
		// base may shrink (a resync clears stale blocks), so ask for growth
		// and at least the warm prompt's blocks.
		return blocks > base[w] && blocks >= want, fmt.Sprintf("worker %s inventory %d blocks (%d before the warm request of %d blocks)", w, blocks, base[w], want), nil
	})
	out = out.With("inventory-after-warm.json", invRaw)
	if err != nil {
		return labkit.WithEvidence(labkit.FailErr(ctx, "ROUTING_NO_INVENTORY", fmt.Errorf("the warmed worker's KV events never reached the gateway: %s: %w", why, err)), out.With("requests.json", labkit.MustJSON(rs)))
	}
	// The engine's own prefix-cache hit counter on the warmed worker, when
	// its adapter names one: it must rise over the follow-ups.
	hitsURL, hitsName := "", s.adapter.Metrics().PrefixHits
	var wk runbook.Worker
	for _, x := range s.workers {
		if x.ID == w {
			wk = x
		}
	}
	if p := s.adapter.Surfaces().Metrics; p != "" && hitsName != "" && wk.HTTP != "" {
		hitsURL = "http://" + wk.HTTP + p
	}
	hits0, hitsErr := 0.0, fmt.Errorf("no prefix-hit counter")
	if hitsURL != "" {
		hits0, hitsErr = labkit.ReadCounter(ctx, s.client, hitsURL, hitsName)
	}
	for i := 1; i <= 3; i++ {
		rt, _, err := s.send(ctx, fmt.Sprintf("%s-exact-follow-%d", r.ID, i), prefix+fmt.Sprintf(" Follow-up question %d?", i))
		rs = append(rs, rt)
		if err != nil {
			return labkit.WithEvidence(labkit.FailErr(ctx, "ROUTING_REQUEST_FAILED", err), out.With("requests.json", labkit.MustJSON(rs)))
		}
	}
	out = out.With("requests.json", labkit.MustJSON(rs))
	if m := mismatch(rs); m != "" {
		return labkit.WithEvidence(runbook.Fail("ROUTING_RECEIPT_MISMATCH", "%s", m), out)
	}
	checked, out, ok := s.checkDecisions(ctx, rs, out)
	if !ok {
		return out
	}
	// Cache reuse, as the engine reports it: its receipts (simulators) or
	// the cached tokens in each answer (usage, llama.cpp timings).
	cacheSrc := labkit.SourceUsage
	warmCached := warm.Cached
	var all map[string][]sim.Receipt
	if receipts {
		var err error
		if all, err = s.allReceipts(ctx); err != nil {
			return labkit.WithEvidence(labkit.FailErr(ctx, "NO_RECEIPT_SOURCE", err), out)
		}
		warmRec, _ := labkit.ReceiptFor(all[w], warm.RID)
		warmCached, cacheSrc = warmRec.CachedTokens, labkit.SourceReceipts+"+"+labkit.SourceUsage
	}
	for _, x := range rs[1:] {
		if x.Receipt != w {
			return labkit.WithEvidence(runbook.Fail("ROUTING_NOT_ON_WARMED", "KV-exact: follow-up %s landed on %s (route %q), not on the warmed worker %s", x.RID, x.Receipt, x.Route, w), out)
		}
		if !strings.HasPrefix(x.Route, "kv-exact hit=") {
			return labkit.WithEvidence(runbook.Fail("ROUTING_NO_KV_HIT", "KV-exact: follow-up %s routed by %q, want a kv-exact hit", x.RID, x.Route), out)
		}
		if x.Cached < 0 {
			return labkit.WithEvidence(runbook.Blocked("engine_cache_unreported", "KV-exact: follow-up %s: the %s answer reports no cached tokens, so cache reuse cannot be shown%s", x.RID, s.adapter.Display(), s.cacheReportFix()), out).
				From(runbook.LaneRoutingEvidence, s.evidenceSource(checked > 0)).From(runbook.LaneCacheReuse, "none")
		}
		recCached := x.Cached
		if receipts {
			rec, _ := labkit.ReceiptFor(all[w], x.RID)
			recCached = rec.CachedTokens
		}
		if recCached <= warmCached || x.Cached <= warmCached {
			return labkit.WithEvidence(runbook.Fail("CACHE_NOT_REUSED", "KV-exact: follow-up %s: engine cached tokens %d (%s) / %d (usage), warm request %d: no rise", x.RID, recCached, cacheSrc, x.Cached, warmCached), out)
		}
	}
	if hitsErr == nil {
		// Counters may be updated a little after the answer: wait for the
		// rise rather than read once.
		var hits1 float64
		_, werr := labkit.WaitFor(ctx, s.o.ReadyTimeout, func() (bool, string, error) {
			v, err := labkit.ReadCounter(ctx, s.client, hitsURL, hitsName)
			if err != nil {
				return false, err.Error(), nil
			}
			hits1 = v
			return v > hits0, fmt.Sprintf("%s %v → %v", hitsName, hits0, v), nil
		})
		if werr != nil {
			return labkit.WithEvidence(runbook.Fail("CACHE_NOT_REUSED", "KV-exact: the warmed worker %s's %s did not rise over 3 same-prefix follow-ups (%v → %v)", w, hitsName, hits0, hits1), out)
		}
		cacheSrc += "+" + labkit.SourceMetrics + " " + hitsName
	}
	st, raw, err := s.admin.Rule(ctx, s.ruleName)
	out = out.With("status-after.json", raw)
	if err != nil {
		return labkit.WithEvidence(labkit.FailErr(ctx, "READBACK_FAILED", err), out)
	}
	if dec, err := s.admin.Decisions(ctx, s.ruleName); err == nil {
		out = out.With("decisions.json", dec)
	}
	if st.Status.KVReady == nil || !*st.Status.KVReady {
		return labkit.WithEvidence(runbook.Fail("KV_NOT_READY", "kv_ready is false after a warmed prefix"), out)
	}
	if p := st.Status.KVParity; p == nil || p.Broken || p.Agreements == 0 {
		return labkit.WithEvidence(runbook.Fail("HASH_PARITY_BROKEN", "the gateway's cached-token prediction did not agree with the engine: %+v", p), out)
	}
	last := rs[len(rs)-1]
	out.Status, out.Reason = "PASS", fmt.Sprintf("KV-exact: 3 same-prefix follow-ups landed on warmed %s (%s; by %s), engine cached tokens %d → %d (%s); kv_ready, parity agreements %d",
		w, last.Route, s.wit.Source(), warmCached, last.Cached, cacheSrc, st.Status.KVParity.Agreements)
	s.warmID = w
	return out.From(runbook.LaneRoutingEvidence, s.evidenceSource(checked > 0)).From(runbook.LaneCacheReuse, cacheSrc)
}

// ---- 8. drain --------------------------------------------------------------

func (s *state) drain(ctx context.Context, r *runbook.Run) runbook.Outcome {
	out := runbook.Outcome{}
	if len(s.workers) < 2 {
		return runbook.Skip("one worker: draining it would leave no endpoint")
	}
	target := s.warmID
	if target == "" {
		target = s.workers[0].ID
	}
	if b, blocked := s.wit.Blocked(); blocked {
		return b
	}
	before, err := s.wit.Snapshot(ctx)
	if err != nil {
		return labkit.FailErr(ctx, "EVIDENCE_READ_FAILED", err)
	}
	raw, err := s.admin.SetDraining(ctx, s.ruleName, target, true)
	out = out.With("drain-response.json", raw)
	if err != nil {
		return labkit.WithEvidence(labkit.FailErr(ctx, "DRAIN_FAILED", err), out)
	}
	why, err := labkit.WaitFor(ctx, s.o.ReadyTimeout, func() (bool, string, error) {
		st, _, err := s.admin.Rule(ctx, s.ruleName)
		if err != nil {
			return false, err.Error(), nil
		}
		for _, ep := range st.Status.Endpoints {
			if ep.ID == target {
				return ep.Draining && ep.InFlight == 0, fmt.Sprintf("draining=%v in_flight=%d", ep.Draining, ep.InFlight), nil
			}
		}
		return false, "endpoint missing from status", nil
	})
	if err != nil {
		return labkit.WithEvidence(labkit.FailErr(ctx, "DRAIN_INFLIGHT_STUCK", fmt.Errorf("%s: %s: %w", target, why, err)), out)
	}
	// The same prefix that warmed the target would pull traffic to it; it
	// must go elsewhere now.
	prefix := s.longPrompt(r.ID, "kv-exact")
	if s.o.Mode == "chwbl" {
		prefix = s.longPrompt(r.ID, "affinity")
	}
	var rs []routed
	for i := 0; i < 4; i++ {
		rt, _, err := s.send(ctx, fmt.Sprintf("%s-drain-%d", r.ID, i), prefix+fmt.Sprintf(" After drain %d?", i))
		rs = append(rs, rt)
		if err != nil {
			return labkit.WithEvidence(labkit.FailErr(ctx, "DRAIN_REQUEST_FAILED", err), out.With("requests.json", labkit.MustJSON(rs)))
		}
	}
	after, err := s.wit.Snapshot(ctx)
	if err != nil {
		return labkit.WithEvidence(labkit.FailErr(ctx, "EVIDENCE_READ_FAILED", err), out)
	}
	out = out.With("requests.json", labkit.MustJSON(rs))
	if m := mismatch(rs); m != "" {
		return labkit.WithEvidence(runbook.Fail("ROUTING_RECEIPT_MISMATCH", "%s", m), out)
	}
	if w0, w1 := before[target].Work, after[target].Work; w1 != w0 {
		return labkit.WithEvidence(runbook.Fail("DRAIN_LEAK", "drained worker %s did new work after the drain (%s: %v → %v)", target, s.wit.ByWorker[target].Source(), w0, w1), out)
	}
	st, raw, err := s.admin.Rule(ctx, s.ruleName)
	if err == nil {
		out = out.With("status-after.json", raw)
		_ = st
	}
	out.Status, out.Reason = "PASS", fmt.Sprintf("%s drained: in-flight 0, and %d requests (same prefix) went elsewhere with no new work on it (%s)", target, len(rs), s.wit.Source())
	return out
}
