package converged

import (
	"context"
	"fmt"
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

func (s *state) deliver(ctx context.Context, r *runbook.Run) runbook.Outcome {
	out := runbook.Outcome{}.For(runbook.LaneGatewayDelivery)
	type sent struct {
		name, rid string
		stream    bool
		ex        labkit.Exchange
	}
	var positive []sent
	for _, stream := range []bool{false, true} {
		kind, rid := labkit.Kind(stream), r.ID+"-deliver-"+labkit.Kind(stream)
		ex, o, ok := labkit.Deliver(ctx, s.client, s.gatewayURL(), rid, labkit.RequestBody(s.chat(), s.spec.Model, "Delivery check ("+kind+") for run "+r.ID+".", rid, stream), stream, out)
		if out = o; !ok {
			return out
		}
		if ep := ex.Get("X-Llmgw-Endpoint"); !slices.Contains(s.workerIDs(), ep) {
			return labkit.WithEvidence(runbook.Fail("DELIVERY_NO_ENDPOINT", "%s answer names endpoint %q, not one of %v", kind, ep, s.workerIDs()), out)
		}
		positive = append(positive, sent{name: kind, rid: rid, stream: stream, ex: ex})
	}

	// Negative requests: each must be refused by the gateway itself and
	// reach no worker.
	negRIDs, out, ok := labkit.SendNegatives(ctx, s.client, s.gatewayURL(), r.ID, labkit.Negatives(s.chat(), r.ID, s.spec.Model), out)
	if !ok {
		return out
	}

	all, err := s.allReceipts(ctx)
	if err != nil {
		return labkit.WithEvidence(labkit.FailErr(ctx, "NO_RECEIPT_SOURCE", err), out)
	}
	var lines []string
	for _, p := range positive {
		ep := p.ex.Get("X-Llmgw-Endpoint")
		h := labkit.Holders(all, p.rid)
		switch {
		case len(h) == 0:
			out = out.With("receipts.json", labkit.MustJSON(all))
			return labkit.WithEvidence(runbook.Fail("DELIVERY_NO_RECEIPT", "the gateway answered %s request %s from %s, but no worker's receipt log records it: read-back and a 2xx are not delivery proof", p.name, p.rid, ep), out)
		case len(h) > 1 || h[0] != ep:
			out = out.With("receipts.json", labkit.MustJSON(all))
			return labkit.WithEvidence(runbook.Fail("DELIVERY_WRONG_WORKER", "%s request %s: the gateway names %s but receipts are on %v", p.name, p.rid, ep, h), out)
		}
		rec, _ := labkit.ReceiptFor(all[ep], p.rid)
		if rec.Stream != p.stream {
			return labkit.WithEvidence(runbook.Fail("DELIVERY_MODE", "%s request %s reached %s with stream=%v", p.name, p.rid, ep, rec.Stream), out)
		}
		out = out.With(p.name+"-receipt.json", labkit.MustJSON(rec))
		lines = append(lines, fmt.Sprintf("%s→%s", p.name, ep))
	}
	for _, rid := range negRIDs {
		if h := labkit.Holders(all, rid); len(h) > 0 {
			out = out.With("receipts.json", labkit.MustJSON(all))
			return labkit.WithEvidence(runbook.Fail("NEGATIVE_LEFT_RECEIPT", "negative request %s was refused but left a receipt on %v", rid, h), out)
		}
	}
	out.Status = "PASS"
	out.Reason = fmt.Sprintf("JSON and SSE delivered (%s), each correlated with exactly one worker receipt; unknown model (404) and malformed body (400) left no receipt", strings.Join(lines, ", "))
	return out
}

// ---- 7. routing evidence ---------------------------------------------------

// routed is one request sent for routing evidence.
type routed struct {
	RID      string `json:"request_id"`
	Status   int    `json:"status"`
	Endpoint string `json:"endpoint"`
	Route    string `json:"route"`
	Cached   int    `json:"engine_cached_tokens"`
	// Receipt is the worker that recorded the request ("" = none).
	Receipt string `json:"receipt_on"`
}

func (s *state) send(ctx context.Context, rid, prompt string) (routed, labkit.Exchange, error) {
	ex, err := labkit.Do(ctx, s.client, http.MethodPost, s.gatewayURL(), labkit.RequestBody(s.chat(), s.spec.Model, prompt, rid, false), map[string]string{"X-Request-Id": rid})
	rt := routed{RID: rid, Status: ex.Status, Endpoint: ex.Get("X-Llmgw-Endpoint"), Route: ex.Get("X-Llmgw-Route"), Cached: -1}
	if err != nil {
		return rt, ex, err
	}
	if ex.Status != http.StatusOK {
		return rt, ex, fmt.Errorf("request %s answered %d: %.200s", rid, ex.Status, ex.Body)
	}
	if c, err := labkit.ParseCompletion(ex.Body); err == nil {
		rt.Cached = c.CachedTokens
	}
	return rt, ex, nil
}

// attach fills each request's receipt holder and checks it agrees with the
// gateway's header.
func (s *state) attachReceipts(ctx context.Context, rs []routed) (map[string][]sim.Receipt, error) {
	all, err := s.allReceipts(ctx)
	if err != nil {
		return nil, err
	}
	for i := range rs {
		h := labkit.Holders(all, rs[i].RID)
		if len(h) == 1 {
			rs[i].Receipt = h[0]
		} else if len(h) > 1 {
			rs[i].Receipt = strings.Join(h, "+")
		}
	}
	return all, nil
}

func mismatch(rs []routed) string {
	for _, x := range rs {
		if x.Receipt != x.Endpoint {
			return fmt.Sprintf("request %s: gateway names %q, receipt on %q", x.RID, x.Endpoint, x.Receipt)
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
	if _, err := s.attachReceipts(ctx, rs); err != nil {
		return labkit.WithEvidence(labkit.FailErr(ctx, "NO_RECEIPT_SOURCE", err), out)
	}
	out = out.With("requests.json", labkit.MustJSON(rs))
	if m := mismatch(rs); m != "" {
		return labkit.WithEvidence(runbook.Fail("ROUTING_RECEIPT_MISMATCH", "%s", m), out)
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
	out.Status, out.Reason = "PASS", fmt.Sprintf("round robin spread %d requests over every worker (receipts per worker: %v)", len(rs), count)
	return out
}

func (s *state) routeCHWBL(ctx context.Context, r *runbook.Run) runbook.Outcome {
	out := runbook.Outcome{}.For(runbook.LaneRoutingEvidence)
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
	if _, err := s.attachReceipts(ctx, rs); err != nil {
		return labkit.WithEvidence(labkit.FailErr(ctx, "NO_RECEIPT_SOURCE", err), out)
	}
	out = out.With("requests.json", labkit.MustJSON(rs))
	if m := mismatch(rs); m != "" {
		return labkit.WithEvidence(runbook.Fail("ROUTING_RECEIPT_MISMATCH", "%s", m), out)
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
	out.Status, out.Reason = "PASS", fmt.Sprintf("CHWBL: %d requests sharing a prefix all landed on %s (route %q)", len(rs), home, rs[len(rs)-1].Route)
	return out
}

func (s *state) routeExact(ctx context.Context, r *runbook.Run) runbook.Outcome {
	out := runbook.Outcome{}.For(runbook.LaneRoutingEvidence, runbook.LaneCacheReuse, runbook.LaneHashParity)
	prefix := s.longPrompt(r.ID, "kv-exact")
	// Inventory before the warm request: a worker may already hold blocks
	// from the direct requests (TensorRT-LLM queues events until drained),
	// so only growth proves the warm prompt's blocks arrived.
	inv0, raw0, err := s.admin.Inventory(ctx, s.ruleName)
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
	// The warm prompt's full blocks, from the engine's own receipt: the
	// inventory must hold at least that many, and have grown, before a
	// follow-up can be expected to hit (one event batch per request).
	want := 1
	if all, err := s.allReceipts(ctx); err == nil {
		if rec, ok := labkit.ReceiptFor(all[w], warm.RID); ok && s.spec.BlockSize > 0 {
			want = max(1, rec.PromptTokens/s.spec.BlockSize)
		}
	}
	// The gateway learns the warmed blocks from the engine's own events.
	var blocks int
	var invRaw []byte
	why, err := labkit.WaitFor(ctx, s.o.ReadyTimeout, func() (bool, string, error) {
		inv, raw, err := s.admin.Inventory(ctx, s.ruleName)
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
	for i := 1; i <= 3; i++ {
		rt, _, err := s.send(ctx, fmt.Sprintf("%s-exact-follow-%d", r.ID, i), prefix+fmt.Sprintf(" Follow-up question %d?", i))
		rs = append(rs, rt)
		if err != nil {
			return labkit.WithEvidence(labkit.FailErr(ctx, "ROUTING_REQUEST_FAILED", err), out.With("requests.json", labkit.MustJSON(rs)))
		}
	}
	all, err := s.attachReceipts(ctx, rs)
	if err != nil {
		return labkit.WithEvidence(labkit.FailErr(ctx, "NO_RECEIPT_SOURCE", err), out)
	}
	out = out.With("requests.json", labkit.MustJSON(rs))
	if m := mismatch(rs); m != "" {
		return labkit.WithEvidence(runbook.Fail("ROUTING_RECEIPT_MISMATCH", "%s", m), out)
	}
	warmRec, _ := labkit.ReceiptFor(all[w], warm.RID)
	for _, x := range rs[1:] {
		if x.Receipt != w {
			return labkit.WithEvidence(runbook.Fail("ROUTING_NOT_ON_WARMED", "KV-exact: follow-up %s landed on %s (route %q), not on the warmed worker %s", x.RID, x.Receipt, x.Route, w), out)
		}
		if !strings.HasPrefix(x.Route, "kv-exact hit=") {
			return labkit.WithEvidence(runbook.Fail("ROUTING_NO_KV_HIT", "KV-exact: follow-up %s routed by %q, want a kv-exact hit", x.RID, x.Route), out)
		}
		rec, _ := labkit.ReceiptFor(all[w], x.RID)
		if rec.CachedTokens <= warmRec.CachedTokens || x.Cached <= warmRec.CachedTokens {
			return labkit.WithEvidence(runbook.Fail("CACHE_NOT_REUSED", "KV-exact: follow-up %s: engine cached tokens %d (receipt) / %d (usage), warm request %d: no rise", x.RID, rec.CachedTokens, x.Cached, warmRec.CachedTokens), out)
		}
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
	out.Status, out.Reason = "PASS", fmt.Sprintf("KV-exact: 3 same-prefix follow-ups landed on warmed %s (%s), engine cached tokens %d → %d; kv_ready, parity agreements %d",
		w, last.Route, warmRec.CachedTokens, last.Cached, st.Status.KVParity.Agreements)
	s.warmID = w
	return out
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
	before, err := s.allReceipts(ctx)
	if err != nil {
		return labkit.FailErr(ctx, "NO_RECEIPT_SOURCE", err)
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
	after, err := s.attachReceipts(ctx, rs)
	if err != nil {
		return labkit.WithEvidence(labkit.FailErr(ctx, "NO_RECEIPT_SOURCE", err), out)
	}
	out = out.With("requests.json", labkit.MustJSON(rs))
	if m := mismatch(rs); m != "" {
		return labkit.WithEvidence(runbook.Fail("ROUTING_RECEIPT_MISMATCH", "%s", m), out)
	}
	if n0, n1 := len(before[target]), len(after[target]); n1 != n0 {
		return labkit.WithEvidence(runbook.Fail("DRAIN_LEAK", "drained worker %s received %d new request(s)", target, n1-n0), out)
	}
	st, raw, err := s.admin.Rule(ctx, s.ruleName)
	if err == nil {
		out = out.With("status-after.json", raw)
		_ = st
	}
	out.Status, out.Reason = "PASS", fmt.Sprintf("%s drained: in-flight 0, and %d requests (same prefix) went elsewhere with no new receipt on it", target, len(rs))
	return out
}
