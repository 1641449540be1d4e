package pd

import (
	"context"
	"crypto/rand"
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync"

	"github.com/llmgw/llmgw/engines"
	"github.com/llmgw/llmgw/runbook"
	"github.com/llmgw/llmgw/runbook/labkit"
)

// versions reads every worker's engine version beside the catalog's
// (labkit.RecordVersions).
func (s *state) versions(ctx context.Context, r *runbook.Run) (labkit.VersionCheck, runbook.Outcome, bool) {
	a, err := engines.For(engines.Kind(s.o.Engine))
	if err != nil {
		return labkit.VersionCheck{}, runbook.Fail("NO_ADAPTER", "%v", err), false
	}
	ver, _ := s.o.Catalog.Versions().For(s.o.Engine)
	ws := make([]runbook.Worker, len(s.workers))
	for i, w := range s.workers {
		ws[i] = w.Worker
	}
	return labkit.RecordVersions(ctx, r, s.client, ws, a, ver.Version, s.o.Launcher.Simulated(), s.o.AcceptVersionMismatch)
}

// directLeg is one leg of a direct (gateway-free) P/D probe, as evidence.
type directLeg struct {
	Worker   string          `json:"worker"`
	Role     string          `json:"role"`
	Exchange labkit.Exchange `json:"exchange"`
}

// pairFor is the engine-neutral pair of prefill p and decode d for request
// id rid, with a fresh nonce (SGLang's bootstrap room, TensorRT-LLM's
// disagg_request_id).
func pairFor(rid string, p, d Worker) (*engines.PDPair, error) {
	ph, pp, err := splitHostPort(p.HTTP)
	if err != nil {
		return nil, err
	}
	dh, dp, err := splitHostPort(d.HTTP)
	if err != nil {
		return nil, err
	}
	var b [8]byte
	if _, err := rand.Read(b[:]); err != nil {
		return nil, err
	}
	pair := &engines.PDPair{RequestID: rid, PrefillHost: ph, PrefillPort: pp, DecodeHost: dh, DecodePort: dp,
		Nonce: binary.BigEndian.Uint64(b[:]) >> 1}
	if p.Bootstrap != "" {
		if _, bp, err := splitHostPort(p.Bootstrap); err == nil {
			pair.BootstrapPort = bp
		}
	}
	return pair, nil
}

func splitHostPort(hp string) (string, int, error) {
	h, ps, err := net.SplitHostPort(hp)
	if err != nil {
		return "", 0, fmt.Errorf("pd: %q: %w", hp, err)
	}
	p, err := strconv.Atoi(ps)
	if err != nil {
		return "", 0, fmt.Errorf("pd: %q: port: %w", hp, err)
	}
	return h, p, nil
}

// directRoleAware proves every worker answers directly, as its role needs
// it: a real prefill does not answer a plain completion usefully (a vLLM
// prefill answers max_tokens 1, a SGLang prefill waits for its decode), so
// each prefill is driven with a decode in the engine's own P/D shape,
// through its adapter (engines.PDProtocol): sequential (vLLM: the prefill's
// answer carries the hand-off the decode consumes), concurrent (SGLang:
// both legs at once, joined by a bootstrap triple), context then generation
// (TensorRT-LLM). Pairs cycle through the workers until every prefill and
// every decode answered. The decode's completion must carry text; the
// prefill's answer must be a well-formed completion with the hand-off the
// shape needs.
func (s *state) directRoleAware(ctx context.Context, r *runbook.Run) runbook.Outcome {
	out := runbook.Outcome{}.For(runbook.LaneDirectWorker)
	a, err := engines.For(engines.Kind(s.o.Engine))
	if err != nil {
		return runbook.Fail("NO_ADAPTER", "%v", err)
	}
	proto := a.PD()
	if proto == nil {
		return runbook.Fail("NO_PD_PROTOCOL", "%s has no prefill/decode protocol", a.Display())
	}
	s.adapter = a
	ps, ds := s.byRole(RolePrefill), s.byRole(RoleDecode)
	n := max(len(ps), len(ds))
	legIDs := map[string]string{} // worker → request id of its direct leg
	var lines []string
	for i := 0; i < n; i++ {
		p, d := ps[i%len(ps)], ds[i%len(ds)]
		rid := fmt.Sprintf("%s-direct-%s-%s", r.ID, p.ID, d.ID)
		pair, err := pairFor(rid, p, d)
		if err != nil {
			return labkit.WithEvidence(runbook.Fail("DIRECT_REQUEST_FAILED", "%v", err), out)
		}
		body := labkit.RequestBody(s.chat(), s.spec.Model, "Direct P/D check of "+p.ID+" and "+d.ID+" in run "+r.ID+".", rid, false)
		legs, o, ok := s.directPair(ctx, proto, pair, p, d, body)
		out = out.With(p.ID+"-"+d.ID+"-legs.json", labkit.MustJSON(legs))
		if !ok {
			return labkit.WithEvidence(o, out)
		}
		legID := proto.LegRequestID(pair)
		legIDs[p.ID], legIDs[d.ID] = legID, legID
		lines = append(lines, p.ID+"→"+d.ID)
	}
	for _, w := range s.workers {
		if _, ok := legIDs[w.ID]; !ok {
			return labkit.WithEvidence(runbook.Fail("DIRECT_WORKER_UNPROVEN", "%s worker %s answered no direct leg", w.Role, w.ID), out)
		}
	}
	ws := make([]runbook.Worker, len(s.workers))
	for i, w := range s.workers {
		ws[i] = w.Worker
	}
	s.wit = labkit.ChooseWitnesses(ctx, s.client, ws, a)
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
		all, err := s.allReceipts(ctx)
		if err != nil {
			return labkit.WithEvidence(labkit.FailErr(ctx, "NO_RECEIPT_SOURCE", err), out)
		}
		for _, w := range s.workers {
			rec, ok := labkit.ReceiptFor(all[w.ID], legIDs[w.ID])
			if !ok || rec.Status != http.StatusOK || rec.Role != w.Role {
				return labkit.WithEvidence(runbook.Fail("DIRECT_NO_RECEIPT", "worker %s answered but has no 200 receipt for %s in role %s (found %v: %+v)", w.ID, legIDs[w.ID], w.Role, ok, rec), out)
			}
			out = out.With(w.ID+"-receipt.json", labkit.MustJSON(rec))
		}
		src += "+" + labkit.SourceReceipts
	}
	reason := fmt.Sprintf("%d prefill and %d decode workers answered directly in their roles (%s, %s shape: %s)", len(ps), len(ds), src, proto.Shape(), strings.Join(lines, ", "))
	if _, blocked := s.wit.Blocked(); blocked {
		reason += fmt.Sprintf("; evidence source missing on %d worker(s), the gateway lanes will be BLOCKED", len(s.wit.Missing))
	} else {
		reason += "; evidence source: " + s.wit.Source()
	}
	return labkit.WithEvidence(runbook.Pass("%s", reason), out).From(runbook.LaneDirectWorker, src)
}

// directPair drives one pair in the engine's shape.
func (s *state) directPair(ctx context.Context, proto engines.PDProtocol, pair *engines.PDPair, p, d Worker, body []byte) ([]directLeg, runbook.Outcome, bool) {
	path := labkit.CompletionPath(s.chat())
	hdr := map[string]string{"X-Request-Id": proto.LegRequestID(pair)}
	pBody, err := proto.PrefillBody(body, pair)
	if err != nil {
		return nil, runbook.Fail("DIRECT_REQUEST_FAILED", "prefill body: %v", err), false
	}
	post := func(w Worker, b []byte) directLeg {
		ex, err := labkit.Do(ctx, s.client, http.MethodPost, "http://"+w.HTTP+path, b, hdr)
		if err != nil && ex.Error == "" {
			ex.Error = err.Error()
		}
		return directLeg{Worker: w.ID, Role: w.Role, Exchange: ex}
	}
	var pl, dl directLeg
	if proto.Shape().Concurrent() {
		dBody, err := proto.DecodeBody(body, pair, engines.HandOff{})
		if err != nil {
			return nil, runbook.Fail("DIRECT_REQUEST_FAILED", "decode body: %v", err), false
		}
		// Both legs at once: each waits for its peer at the bootstrap room.
		var wg sync.WaitGroup
		wg.Add(2)
		go func() { defer wg.Done(); pl = post(p, pBody) }()
		go func() { defer wg.Done(); dl = post(d, dBody) }()
		wg.Wait()
		if o, ok := legAnswered(pl, false); !ok {
			return []directLeg{pl, dl}, o, false
		}
	} else {
		pl = post(p, pBody)
		if o, ok := legAnswered(pl, false); !ok {
			return []directLeg{pl}, o, false
		}
		h := proto.HandOff([]byte(pl.Exchange.Body), pair)
		switch {
		case h.Final != nil:
			return []directLeg{pl}, runbook.Fail("DIRECT_DECODE_UNPROVEN", "prefill %s finished request %s itself (early exit): decode %s was not exercised", p.ID, pair.RequestID, d.ID), false
		case h.Missing != "" && !h.OutOfBand:
			return []directLeg{pl}, runbook.Fail("DIRECT_NO_HANDOFF", "prefill %s answered without the hand-off its shape needs (%s)", p.ID, h.Missing), false
		}
		dBody, err := proto.DecodeBody(body, pair, h)
		if err != nil {
			return []directLeg{pl}, runbook.Fail("DIRECT_REQUEST_FAILED", "decode body: %v", err), false
		}
		dl = post(d, dBody)
	}
	if o, ok := legAnswered(dl, true); !ok {
		return []directLeg{pl, dl}, o, false
	}
	return []directLeg{pl, dl}, runbook.Outcome{}, true
}

// legAnswered checks one direct leg: a 200 well-formed completion, with
// text when it is the decode's.
func legAnswered(l directLeg, needText bool) (runbook.Outcome, bool) {
	ex := l.Exchange
	if ex.Error != "" {
		return runbook.Fail("DIRECT_REQUEST_FAILED", "%s worker %s: %s", l.Role, l.Worker, ex.Error), false
	}
	if ex.Status != http.StatusOK {
		return runbook.Fail("DIRECT_REQUEST_FAILED", "%s worker %s answered %d: %.200s", l.Role, l.Worker, ex.Status, ex.Body), false
	}
	c, err := labkit.ParseCompletion(ex.Body)
	if err != nil || (needText && c.Text == "") {
		return runbook.Fail("DIRECT_BAD_COMPLETION", "%s worker %s: no well-formed completion (text %q, %v)", l.Role, l.Worker, c.Text, err), false
	}
	return runbook.Outcome{}, true
}

// ---- gateway lanes on engine-native evidence --------------------------------

// legs splits the workers an evidence source saw into prefills and decodes.
func (s *state) legs(servers []string) (prefill, decode []string) {
	for _, id := range servers {
		if slices.Contains(s.ids(RolePrefill), id) {
			prefill = append(prefill, id)
		} else {
			decode = append(decode, id)
		}
	}
	return prefill, decode
}

func onePerRole(s *state) func([]string) bool {
	return func(got []string) bool {
		p, d := s.legs(got)
		return len(p) >= 1 && len(d) >= 1
	}
}

var errNotDelivered = errors.New("pd: request not delivered")

// deliverWitnessed is the deliver step on the workers' engine-native
// evidence: each positive request must show on exactly one prefill and on
// the decode the gateway names; the negatives on none.
func (s *state) deliverWitnessed(ctx context.Context, r *runbook.Run) runbook.Outcome {
	out := runbook.Outcome{}.For(runbook.LaneGatewayDelivery)
	if b, blocked := s.wit.Blocked(); blocked {
		return b.For(runbook.LaneGatewayDelivery, runbook.LaneRoutingEvidence).From(runbook.LaneGatewayDelivery, "none").From(runbook.LaneRoutingEvidence, "none")
	}
	s.delivered = map[string]string{}
	var lines []string
	for _, stream := range []bool{false, true} {
		kind, rid := labkit.Kind(stream), r.ID+"-deliver-"+labkit.Kind(stream)
		var ex labkit.Exchange
		fail := out
		servers, err := s.wit.ObserveUntil(ctx, rid, s.o.ReadyTimeout, func() error {
			var ok bool
			ex, fail, ok = labkit.Deliver(ctx, s.client, s.gatewayURL(), rid, labkit.RequestBody(s.chat(), s.spec.Model, "P/D delivery check ("+kind+") for run "+r.ID+".", rid, stream), stream, out)
			if !ok {
				return errNotDelivered
			}
			return nil
		}, onePerRole(s))
		if errors.Is(err, errNotDelivered) {
			return fail
		}
		out = fail
		if err != nil {
			return labkit.WithEvidence(labkit.FailErr(ctx, "EVIDENCE_READ_FAILED", err), out)
		}
		d := ex.Get("X-Llmgw-Endpoint")
		if !slices.Contains(s.ids(RoleDecode), d) {
			return labkit.WithEvidence(runbook.Fail("DELIVERY_NOT_DECODE", "%s answer names endpoint %q, not a decode endpoint %v (route %q)", kind, d, s.ids(RoleDecode), ex.Get("X-Llmgw-Route")), out)
		}
		ph, dh := s.legs(servers)
		if len(ph) != 1 || len(dh) != 1 || dh[0] != d {
			return labkit.WithEvidence(runbook.Fail("DELIVERY_NO_RECEIPT", "%s request %s: the gateway names decode %s; the evidence (%s) shows prefill work on %v and decode work on %v (want exactly one each, the decode the named one)",
				kind, rid, d, s.wit.Source(), ph, dh), out)
		}
		s.delivered[kind] = rid
		lines = append(lines, fmt.Sprintf("%s→%s+%s", kind, ph[0], d))
	}
	out, ok := labkit.NegativesLeaveNoWork(ctx, s.client, s.wit, s.gatewayURL(), r.ID, s.chat(), s.spec.Model, out)
	if !ok {
		return out
	}
	return labkit.WithEvidence(runbook.Pass("JSON and SSE delivered by a decode endpoint (%s), each shown on exactly one prefill and the named decode by %s; unknown model (404) and malformed body (400) reached no worker", strings.Join(lines, ", "), s.wit.Source()), out).
		From(runbook.LaneGatewayDelivery, s.wit.Source())
}

// handOffWitnessed: the hand-off fields of the gateway's legs are visible
// only in a receipt log (the gateway relays the decode's answer, not the
// prefill's). The direct step proved each pair's hand-off on the engines'
// own answers, and the routing step proves each leg's worker.
func (s *state) handOffWitnessed(context.Context, *runbook.Run) runbook.Outcome {
	return runbook.Skip("no receipt log: the gateway's leg bodies cannot be inspected on %s; the direct step proved the %s hand-off on each pair's own answers and routing proves each leg's worker by %s",
		s.adapter.Display(), s.adapter.PD().Shape(), s.wit.Source())
}

// routingWitnessed is the routing step on engine-native evidence: the
// prefill the gateway names in X-Llmgw-Route is the one whose evidence
// shows the request, and the decode is the one it names. In kvExactMode 1
// the follow-ups must be kv-exact hits on the warmed prefill; cache reuse
// is not visible in the decode's relayed answer, so it is shown by the
// warmed prefill's cache counter (engines.Evidence.CacheCounter) where the
// engine exports one, else that lane is BLOCKED.
func (s *state) routingWitnessed(ctx context.Context, r *runbook.Run) runbook.Outcome {
	out := runbook.Outcome{}.For(runbook.LaneRoutingEvidence)
	if b, blocked := s.wit.Blocked(); blocked {
		return b.For(runbook.LaneRoutingEvidence).From(runbook.LaneRoutingEvidence, "none")
	}
	var rs []routed
	send := func(rid, prompt string) error {
		var rt routed
		servers, err := s.wit.ObserveUntil(ctx, rid, s.o.ReadyTimeout, func() error {
			var err error
			rt, err = s.send(ctx, rid, prompt)
			return err
		}, onePerRole(s))
		ph, _ := s.legs(servers)
		rt.Prefill = strings.Join(ph, "+")
		rs = append(rs, rt)
		return err
	}
	if !s.o.KVExact {
		for i := 0; i < 2*s.o.Prefill; i++ {
			if err := send(fmt.Sprintf("%s-route-%d", r.ID, i), fmt.Sprintf("P/D routing probe %d of run %s.", i, r.ID)); err != nil {
				return labkit.WithEvidence(labkit.FailErr(ctx, "ROUTING_REQUEST_FAILED", err), out.With("requests.json", labkit.MustJSON(rs)))
			}
		}
		out = out.With("requests.json", labkit.MustJSON(rs))
		for _, x := range rs {
			if x.Named == "" || x.Named != x.Prefill {
				return labkit.WithEvidence(runbook.Fail("PD_SPLIT_NOT_PROVEN", "request %s: the route %q names prefill %q, the evidence (%s) shows it on %q", x.RID, x.Route, x.Named, s.wit.Source(), x.Prefill), out)
			}
		}
		return labkit.WithEvidence(runbook.Pass("%d requests: the prefill the gateway names in X-Llmgw-Route is the one whose evidence (%s) shows the request, every time", len(rs), s.wit.Source()), out).
			From(runbook.LaneRoutingEvidence, s.wit.Source())
	}
	out = out.For(runbook.LaneCacheReuse)
	prefix := longPrompt(r.ID, "pd-kv-exact")
	// The inventory before the warm request: the warmed prefill's blocks
	// must grow past it (earlier steps' blocks are already there, and a
	// polled engine's events arrive a poll later).
	before := map[string]int{}
	if inv, _, err := s.admin.Inventory(ctx, s.ruleName, 4); err == nil {
		for _, ep := range inv.Endpoints {
			before[ep.ID] = ep.InventoryBlocks
		}
	}
	if err := send(r.ID+"-exact-warm", prefix+" First question?"); err != nil {
		return labkit.WithEvidence(labkit.FailErr(ctx, "ROUTING_REQUEST_FAILED", err), out.With("requests.json", labkit.MustJSON(rs)))
	}
	w := rs[0].Named
	if w == "" || w != rs[0].Prefill {
		return labkit.WithEvidence(runbook.Fail("PD_SPLIT_NOT_PROVEN", "warm request: route %q names prefill %q, the evidence shows %q", rs[0].Route, w, rs[0].Prefill), out.With("requests.json", labkit.MustJSON(rs)))
	}
	why, err := labkit.WaitFor(ctx, s.o.ReadyTimeout, func() (bool, string, error) {
		inv, _, err := s.admin.Inventory(ctx, s.ruleName, 4)
		if err != nil {
			return false, err.Error(), nil
		}
		for _, ep := range inv.Endpoints {
			if ep.ID == w {
				return ep.InventoryBlocks > before[w], fmt.Sprintf("prefill %s inventory %d blocks (%d before the warm request)", w, ep.InventoryBlocks, before[w]), nil
			}
		}
		return false, "warmed prefill not in the inventory", nil
	})
	if err != nil {
		return labkit.WithEvidence(labkit.FailErr(ctx, "ROUTING_NO_INVENTORY", fmt.Errorf("the warmed prefill's KV events never reached the gateway: %s: %w", why, err)), out.With("requests.json", labkit.MustJSON(rs)))
	}
	// Where the engine counts the tokens its prefix cache served, the
	// warmed prefill's counter is read around the follow-ups: its rise is
	// the cache reuse the relayed decode answer does not show.
	cacheURL, cacheCounter := s.cacheCounterOf(w)
	var cacheBefore float64
	if cacheCounter != "" {
		if cacheBefore, err = labkit.ReadCounter(ctx, s.client, cacheURL, cacheCounter); err != nil {
			cacheCounter = ""
		}
	}
	for i := 1; i <= 3; i++ {
		if err := send(fmt.Sprintf("%s-exact-follow-%d", r.ID, i), prefix+fmt.Sprintf(" Follow-up question %d?", i)); err != nil {
			return labkit.WithEvidence(labkit.FailErr(ctx, "ROUTING_REQUEST_FAILED", err), out.With("requests.json", labkit.MustJSON(rs)))
		}
	}
	out = out.With("requests.json", labkit.MustJSON(rs))
	for _, x := range rs[1:] {
		switch {
		case x.Prefill != w || x.Named != w:
			return labkit.WithEvidence(runbook.Fail("ROUTING_NOT_ON_WARMED", "follow-up %s: route %q, evidence on %q; want the warmed prefill %s", x.RID, x.Route, x.Prefill, w), out)
		case !strings.Contains(x.Route, "(kv-exact hit="):
			return labkit.WithEvidence(runbook.Fail("ROUTING_NO_KV_HIT", "follow-up %s routed by %q, want a kv-exact hit on the prefill", x.RID, x.Route), out)
		}
	}
	if cacheCounter != "" {
		after, err := labkit.ReadCounter(ctx, s.client, cacheURL, cacheCounter)
		switch {
		case err != nil:
			return labkit.WithEvidence(labkit.FailErr(ctx, "CACHE_COUNTER_UNREADABLE", err), out)
		case after <= cacheBefore:
			return labkit.WithEvidence(runbook.Fail("CACHE_NOT_REUSED", "kvExactMode 1: 3 same-prefix follow-ups picked the warmed prefill %s by a kv-exact hit, but its %s stayed at %g", w, cacheCounter, after), out)
		}
		return labkit.WithEvidence(runbook.Pass("kvExactMode 1: 3 same-prefix follow-ups picked the warmed prefill %s by a kv-exact hit (by %s); its %s rose %g → %g", w, s.wit.Source(), cacheCounter, cacheBefore, after), out).
			From(runbook.LaneRoutingEvidence, s.wit.Source()).From(runbook.LaneCacheReuse, labkit.SourceMetrics+" "+cacheCounter)
	}
	return labkit.WithEvidence(runbook.Blocked("engine_cache_unreported", "kvExactMode 1: 3 same-prefix follow-ups picked the warmed prefill %s by a kv-exact hit (by %s), but the prefill leg's cached tokens are not in the decode answer the gateway relays, so cache reuse cannot be shown without a receipt log", w, s.wit.Source()), out).
		From(runbook.LaneRoutingEvidence, s.wit.Source()).From(runbook.LaneCacheReuse, "none")
}

// cacheCounterOf is the metrics URL and cache counter of worker id, where
// its engine exports one ("" counter otherwise).
func (s *state) cacheCounterOf(id string) (url, counter string) {
	a := engines.MustFor(engines.Kind(s.o.Engine))
	e, ok := engines.EvidenceOf(a)
	if !ok || e.Evidence().CacheCounter == "" || a.Surfaces().Metrics == "" {
		return "", ""
	}
	for _, w := range s.workers {
		if w.ID == id {
			return "http://" + w.HTTP + a.Surfaces().Metrics, e.Evidence().CacheCounter
		}
	}
	return "", ""
}
