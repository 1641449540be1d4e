package pd

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/llmgw/llmgw/engines"
	"github.com/llmgw/llmgw/engines/kvhash"
	"github.com/llmgw/llmgw/engines/sim"
	"github.com/llmgw/llmgw/gateway"
	"github.com/llmgw/llmgw/gateway/rule"
	"github.com/llmgw/llmgw/runbook"
	"github.com/llmgw/llmgw/runbook/labkit"
)

// ---- 1. select tuple -------------------------------------------------------

func (s *state) selectTuple(_ context.Context, r *runbook.Run) runbook.Outcome {
	o := s.o
	kvMode := map[bool]int{true: 1, false: 0}[o.KVExact]
	sel, fail, ok := labkit.Select(r, o.Catalog, labkit.Tuple{
		Engine: o.Engine, Profile: o.Profile, Topology: Topology, Launcher: o.Launcher, Workers: o.Prefill + o.Decode, KVEvents: o.KVExact,
		Extra: map[string]any{"kv_exact_mode": kvMode, "prefill": o.Prefill, "decode": o.Decode},
	})
	s.profile = sel.Profile
	if !ok {
		return fail
	}
	s.spec, s.seed = sel.Spec, sel.Spec.HashSeed
	p := sel.Profile
	return runbook.Pass("%s %s × %s (%s), P/D %d prefill + %d decode, kvExactMode %d, %s workers", o.Engine, sel.Version.Version, p.ID,
		p.Model.ServedName, o.Prefill, o.Decode, kvMode, o.Launcher.Name()).With("tuple.json", labkit.MustJSON(sel.Info))
}

// ---- 2. launch workers -----------------------------------------------------

func (s *state) launch(ctx context.Context, r *runbook.Run) runbook.Outcome {
	o := s.o
	s.client = labkit.NewClient(r)
	// Registered before the launch: Stop cleans up a half-done launch too.
	r.Defer("stop workers", func(ctx context.Context) error { return s.stopWorkers(ctx) })
	ws, err := o.Launcher.LaunchPD(ctx, s.spec, o.Prefill, o.Decode)
	if err != nil {
		return labkit.LaunchFailed(ctx, o.Launcher.Name(), err)
	}
	s.workers = ws
	out := runbook.Outcome{}.With("workers.json", labkit.MustJSON(ws))
	type health struct {
		Worker string `json:"worker"`
		Role   string `json:"role"`
		Last   string `json:"last,omitempty"`
	}
	var report []health
	for _, w := range ws {
		last, err := labkit.WaitFor(ctx, o.HealthTimeout, func() (bool, string, error) {
			p := labkit.ProbeServing(ctx, s.client, w.Worker)
			if p.Last != "" {
				return false, p.Last, nil
			}
			if !strings.Contains(p.Models.Body, strconv.Quote(s.spec.Model)) {
				return false, fmt.Sprintf("/v1/models does not list %s: %.200s", s.spec.Model, p.Models.Body), nil
			}
			return true, "healthy, serving " + s.spec.Model, nil
		})
		report = append(report, health{Worker: w.ID, Role: w.Role, Last: last})
		if err != nil {
			code := "ENGINE_NOT_READY"
			if strings.HasPrefix(last, "/v1/models does not list") {
				code = "WRONG_MODEL"
			}
			return labkit.WithEvidence(labkit.FailErr(ctx, code, fmt.Errorf("%s worker %s (%s) not ready within %v: %s", w.Role, w.ID, w.HTTP, o.HealthTimeout, last)), out.With("health.json", labkit.MustJSON(report)))
		}
	}
	out = out.With("health.json", labkit.MustJSON(report))
	vc, fail, ok := s.versions(ctx, r)
	if !ok {
		return labkit.WithEvidence(fail, out)
	}
	out = out.With("versions.json", labkit.MustJSON(vc))
	return labkit.WithEvidence(runbook.Pass("%d prefill (%s) and %d decode (%s) workers healthy and serving %s; %s", o.Prefill, strings.Join(s.ids(RolePrefill), ","),
		o.Decode, strings.Join(s.ids(RoleDecode), ","), s.spec.Model, vc.Note()), out)
}

func (s *state) stopWorkers(ctx context.Context) error {
	if err := s.o.Launcher.Stop(ctx); err != nil {
		return err
	}
	// Absence is part of the cleanup: a launched worker no longer accepts
	// connections. Attached workers are not ours.
	for _, w := range s.workers {
		if w.Owner == "attach" {
			continue
		}
		if err := labkit.WaitClosed(ctx, w.HTTP, 10*time.Second); err != nil {
			return fmt.Errorf("pd: worker %s at %s still listening after stop: %w", w.ID, w.HTTP, err)
		}
	}
	return nil
}

// ---- request shapes --------------------------------------------------------

func (s *state) chat() bool { return s.profile.APIMode == "chat" }

// longPrompt spans many KV blocks and is unique to the run and topic.
func longPrompt(runID, topic string) string {
	var b strings.Builder
	for i := 0; i < 16; i++ {
		fmt.Fprintf(&b, "Part %d of %s (%s): the prefill computes the prompt once and hands its KV to the decode. ", i, topic, runID)
	}
	return b.String()
}

// holders returns the workers of role whose receipts hold rid, sorted.
func (s *state) holders(all map[string][]sim.Receipt, role, rid string) []string {
	var out []string
	for _, w := range s.byRole(role) {
		if _, ok := labkit.ReceiptFor(all[w.ID], rid); ok {
			out = append(out, w.ID)
		}
	}
	return out
}

// ---- 3. prove direct inference ---------------------------------------------

// direct is role-aware and chooses each worker's evidence source
// (evidence.go).
func (s *state) direct(ctx context.Context, r *runbook.Run) runbook.Outcome {
	return s.directRoleAware(ctx, r)
}

// ---- 4. apply rule ---------------------------------------------------------

func (s *state) buildRule(name string) *rule.Rule {
	o := s.o
	hp := s.workers[0].HealthPath
	r := &rule.Rule{
		Name: name, ModelName: s.spec.Model, KVEngineType: o.Engine, PDDisaggMode: true,
		Probe: labkit.ProbeConfig(hp),
	}
	kv := engines.MustFor(engines.Kind(o.Engine)).KV()
	if o.KVExact {
		r.KVExactMode = 1
		r.KVTokenizer = s.kvTokenizer
		r.KVBlockSize = s.spec.BlockSize
		if kv != nil && kvhash.Algo(kv.HashAlgo).Seeded() {
			seed := s.seed
			r.KVHashSeed = &seed
		}
	}
	for _, w := range s.workers {
		ep := labkit.Endpoint(w.ID, w.HTTP)
		ep.EPRole = 2
		if w.Role == RolePrefill {
			ep.EPRole = 1
			if w.Bootstrap != "" {
				_, bp, _ := net.SplitHostPort(w.Bootstrap)
				ep.BootstrapPort, _ = strconv.Atoi(bp)
			}
			if o.KVExact && kv.PublishesZMQ() && w.Events != "" {
				ep.KVEventsEndpoint, ep.KVReplayEndpoint = w.Events, w.Replay
			}
		}
		r.Endpoints = append(r.Endpoints, ep)
	}
	return r
}

func (s *state) apply(ctx context.Context, r *runbook.Run) runbook.Outcome {
	o := s.o
	s.ruleName = "pd-" + labkit.ShortID(r.ID)
	if o.KVExact {
		tok, err := runbook.KVTokenizer(o.Launcher.Simulated(), o.Tokenizer, filepath.Join(os.TempDir(), "llmgw-tokenizers"))
		if err != nil {
			return runbook.Fail("tokenizer", "KV-exact needs the model's tokenizer: %v", err)
		}
		s.kvTokenizer = tok
	}
	a, out, ok := labkit.Apply(ctx, r, labkit.ApplyOptions{
		AdminURL: o.GatewayAdmin, Token: o.GatewayToken, TokenFile: o.GatewayTokenFile, DirPattern: "llmgw-runbook-pd-gw-", Logger: o.Logger, Client: s.client,
		Name: s.ruleName, Build: s.buildRule, Hook: o.RuleHook, MarkEmbedded: true,
	})
	s.gw, s.admin, s.applied = a.Gateway, a.Admin, a.Rule
	if !ok {
		return out
	}
	return labkit.WithEvidence(runbook.Pass("rule %s created on %s: pd_disagg_mode, kvExactMode %d, prefill %s, decode %s", s.ruleName, s.admin.Base(), s.applied.KVExactMode,
		strings.Join(s.ids(RolePrefill), ","), strings.Join(s.ids(RoleDecode), ",")), out)
}

// ---- 5. read back ----------------------------------------------------------

func (s *state) readBack(ctx context.Context, _ *runbook.Run) runbook.Outcome {
	st, raw, err := s.admin.Rule(ctx, s.ruleName)
	out := runbook.Outcome{}.With("readback.json", raw)
	if err != nil {
		return labkit.WithEvidence(labkit.FailErr(ctx, "READBACK_FAILED", err), out)
	}
	diffs, _ := labkit.DiffJSON(s.applied.Effective(), st.Rule)
	if len(diffs) > 0 {
		out = out.With("readback-diff.txt", []byte(strings.Join(diffs, "\n")+"\n"))
		return labkit.WithEvidence(runbook.Fail("READBACK_MISMATCH", "effective rule differs from what was applied: %s", strings.Join(diffs, "; ")), out)
	}
	last, addr, out, ok := labkit.AwaitReady(ctx, s.admin, s.ruleName, s.o.ReadyTimeout, s.ready, out)
	if !ok {
		return out
	}
	s.dataAddr = addr
	reason := fmt.Sprintf("effective rule equals the applied one; %d endpoints healthy and available with roles %d prefill / %d decode", len(last.Status.Endpoints), s.o.Prefill, s.o.Decode)
	if s.o.KVExact {
		reason += "; every prefill's KV event stream connected"
	}
	return labkit.WithEvidence(runbook.Pass("%s", reason), out)
}

func (s *state) ready(st *gateway.RuleStatus) (bool, string) {
	if !st.Status.Ready {
		return false, "rule not ready"
	}
	roles := map[string]int{}
	for _, w := range s.workers {
		roles[w.ID] = map[string]int{RolePrefill: 1, RoleDecode: 2}[w.Role]
	}
	for _, ep := range st.Status.Endpoints {
		switch {
		case !ep.Healthy || !ep.Available:
			return false, fmt.Sprintf("endpoint %s healthy=%v available=%v", ep.ID, ep.Healthy, ep.Available)
		case ep.Role != roles[ep.ID]:
			return false, fmt.Sprintf("endpoint %s has ep_role %d, want %d", ep.ID, ep.Role, roles[ep.ID])
		case s.o.KVExact && ep.Role == 1 && (ep.KV == nil || !ep.KV.EventsConnected):
			return false, fmt.Sprintf("prefill %s: KV event stream not connected", ep.ID)
		}
	}
	return true, ""
}

// ---- 6. deliver through the gateway ----------------------------------------

func (s *state) gatewayURL() string { return "http://" + s.dataAddr + labkit.CompletionPath(s.chat()) }

func (s *state) deliver(ctx context.Context, r *runbook.Run) runbook.Outcome {
	if !s.wit.Receipts() {
		return s.deliverWitnessed(ctx, r)
	}
	out := runbook.Outcome{}.For(runbook.LaneGatewayDelivery)
	s.delivered = map[string]string{}
	type sent struct {
		kind, rid string
		stream    bool
		ex        labkit.Exchange
	}
	var positive []sent
	for _, stream := range []bool{false, true} {
		kind, rid := labkit.Kind(stream), r.ID+"-deliver-"+labkit.Kind(stream)
		ex, o, ok := labkit.Deliver(ctx, s.client, s.gatewayURL(), rid, labkit.RequestBody(s.chat(), s.spec.Model, "P/D delivery check ("+kind+") for run "+r.ID+".", rid, stream), stream, out)
		if out = o; !ok {
			return out
		}
		if ep := ex.Get("X-Llmgw-Endpoint"); !slices.Contains(s.ids(RoleDecode), ep) {
			return labkit.WithEvidence(runbook.Fail("DELIVERY_NOT_DECODE", "%s answer names endpoint %q, not a decode endpoint %v (route %q)", kind, ep, s.ids(RoleDecode), ex.Get("X-Llmgw-Route")), out)
		}
		positive = append(positive, sent{kind: kind, rid: rid, stream: stream, ex: ex})
	}
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
		d := p.ex.Get("X-Llmgw-Endpoint")
		ph, dh := s.holders(all, RolePrefill, p.rid), s.holders(all, RoleDecode, p.rid)
		if len(ph) != 1 || len(dh) != 1 || dh[0] != d {
			out = out.With("receipts.json", labkit.MustJSON(all))
			return labkit.WithEvidence(runbook.Fail("DELIVERY_NO_RECEIPT", "%s request %s: the gateway names decode %s; prefill receipts on %v, decode receipts on %v (want exactly one each, the decode the named one): read-back and a 2xx are not delivery proof",
				p.kind, p.rid, d, ph, dh), out)
		}
		dr, _ := labkit.ReceiptFor(all[d], p.rid)
		if dr.Stream != p.stream {
			return labkit.WithEvidence(runbook.Fail("DELIVERY_MODE", "%s request %s reached decode %s with stream=%v", p.kind, p.rid, d, dr.Stream), out)
		}
		s.delivered[p.kind] = p.rid
		lines = append(lines, fmt.Sprintf("%s→%s+%s", p.kind, ph[0], d))
	}
	for _, rid := range negRIDs {
		if h := append(s.holders(all, RolePrefill, rid), s.holders(all, RoleDecode, rid)...); len(h) > 0 {
			out = out.With("receipts.json", labkit.MustJSON(all))
			return labkit.WithEvidence(runbook.Fail("NEGATIVE_LEFT_RECEIPT", "negative request %s was refused but left a receipt on %v", rid, h), out)
		}
	}
	return labkit.WithEvidence(runbook.Pass("JSON and SSE delivered by a decode endpoint (%s), each with exactly one prefill and one decode receipt; unknown model (404) and malformed body (400) left no receipt", strings.Join(lines, ", ")), out).
		From(runbook.LaneGatewayDelivery, labkit.SourceReceipts)
}

// ---- 7. hand-off evidence --------------------------------------------------

// HandOff is one delivered request's two legs and the checks made on them
// (evidence file handoff-<kind>.json).
type HandOff struct {
	RequestID string      `json:"request_id"`
	Prefill   string      `json:"prefill"`
	Decode    string      `json:"decode"`
	PrefillRx sim.Receipt `json:"prefill_receipt"`
	DecodeRx  sim.Receipt `json:"decode_receipt"`
	Checks    []Check     `json:"checks"`
}

// Check is one hand-off assertion and its result.
type Check struct {
	Name string `json:"name"`
	OK   bool   `json:"ok"`
	Saw  string `json:"saw"`
}

// CheckHandOff evaluates the engine's hand-off on one request's prefill
// and decode receipts. bootstrap is the chosen prefill's bootstrap server
// (SGLang; host:port). It returns the checks, all of which must hold.
func CheckHandOff(engine string, rid string, p, d sim.Receipt, bootstrap string) []Check {
	var cs []Check
	add := func(name string, ok bool, format string, a ...any) {
		cs = append(cs, Check{Name: name, OK: ok, Saw: fmt.Sprintf(format, a...)})
	}
	add("one request id on both legs", p.RequestID == rid && d.RequestID == rid, "prefill %q, decode %q, sent %q", p.RequestID, d.RequestID, rid)
	add("roles", p.Role == RolePrefill && d.Role == RoleDecode, "prefill leg on a %q worker, decode leg on a %q worker", p.Role, d.Role)
	add("both legs answered", p.Status == http.StatusOK && d.Status == http.StatusOK, "prefill %d, decode %d", p.Status, d.Status)
	a, err := engines.For(engines.Kind(engine))
	if err != nil || a.PD() == nil {
		add("the engine has a prefill/decode protocol", false, "%s", engine)
		return cs
	}
	proto := a.PD()
	if proto.Shape() == engines.PDConcurrent {
		add("bootstrap triple on both legs", p.Bootstrap != nil && d.Bootstrap != nil, "prefill %+v, decode %+v", p.Bootstrap, d.Bootstrap)
		if p.Bootstrap != nil && d.Bootstrap != nil {
			add("the rooms matched (same bootstrap triple)", *p.Bootstrap == *d.Bootstrap, "prefill %+v, decode %+v", *p.Bootstrap, *d.Bootstrap)
			_, port, _ := net.SplitHostPort(bootstrap)
			add("bootstrap port is the chosen prefill's", strconv.FormatInt(p.Bootstrap.Port, 10) == port, "triple port %d, prefill bootstrap server %s", p.Bootstrap.Port, bootstrap)
		}
		add("decode received the prompt's KV", d.RemotePrefillTokens > 0, "remote prefill tokens %d", d.RemotePrefillTokens)
		return cs
	}
	// The sequential shapes: the prefill leg is rewritten as the adapter
	// rewrites it, answers with a hand-off, and the decode carries it.
	if capped := prefillCap(proto); capped > 0 {
		add(fmt.Sprintf("prefill leg max_tokens %d", capped), p.MaxTokens == capped, "max_tokens %d", p.MaxTokens)
	}
	pl, perr := proto.ParseHandOff(p.HandOff)
	add("prefill leg asked to hand off", perr == nil && pl.Role == engines.PDLegPrefill, "%s", p.HandOff)
	add("prefill answered with its hand-off", len(p.HandOffOut) > 0, "%s", p.HandOffOut)
	dl, derr := proto.ParseHandOff(d.HandOff)
	want := proto.CarryParams(p.HandOffOut)
	add("decode leg carried the prefill's hand-off", derr == nil && dl.Role == engines.PDLegDecode && sameJSON(d.HandOff, want), "decode got %s, want %s (%v)", d.HandOff, want, derr)
	add("decode pulled the prompt's KV instead of recomputing", d.RemotePrefillTokens > 0, "remote prefill tokens %d", d.RemotePrefillTokens)
	return cs
}

// prefillCap is the max_tokens the adapter's prefill rewrite imposes (0
// when it keeps the client's).
func prefillCap(proto engines.PDProtocol) int {
	const probe = 8
	b, err := proto.PrefillBody([]byte(fmt.Sprintf(`{"prompt":"x","max_tokens":%d}`, probe)), &engines.PDPair{})
	if err != nil {
		return 0
	}
	var v struct {
		MaxTokens int `json:"max_tokens"`
	}
	if json.Unmarshal(b, &v) != nil || v.MaxTokens == probe {
		return 0
	}
	return v.MaxTokens
}

func sameJSON(a, b json.RawMessage) bool {
	var x, y any
	if json.Unmarshal(a, &x) != nil || json.Unmarshal(b, &y) != nil {
		return false
	}
	diffs, _ := labkit.DiffJSON(x, y)
	return len(diffs) == 0
}

func (s *state) handOff(ctx context.Context, r *runbook.Run) runbook.Outcome {
	if !s.wit.Receipts() {
		return s.handOffWitnessed(ctx, r)
	}
	out := runbook.Outcome{}.For(runbook.LaneRoutingEvidence)
	all, err := s.allReceipts(ctx)
	if err != nil {
		return labkit.FailErr(ctx, "NO_RECEIPT_SOURCE", err)
	}
	boot := map[string]string{}
	for _, w := range s.byRole(RolePrefill) {
		boot[w.ID] = w.Bootstrap
	}
	var failed []string
	n := 0
	for _, kind := range []string{"json", "sse"} {
		rid := s.delivered[kind]
		ph, dh := s.holders(all, RolePrefill, rid), s.holders(all, RoleDecode, rid)
		if len(ph) != 1 || len(dh) != 1 {
			return labkit.WithEvidence(runbook.Fail("PD_SPLIT_NOT_PROVEN", "%s request %s: prefill receipts %v, decode receipts %v", kind, rid, ph, dh), out)
		}
		h := HandOff{RequestID: rid, Prefill: ph[0], Decode: dh[0]}
		h.PrefillRx, _ = labkit.ReceiptFor(all[ph[0]], rid)
		h.DecodeRx, _ = labkit.ReceiptFor(all[dh[0]], rid)
		h.Checks = CheckHandOff(s.o.Engine, rid, h.PrefillRx, h.DecodeRx, boot[ph[0]])
		out = out.With("handoff-"+kind+".json", labkit.MustJSON(h))
		for _, c := range h.Checks {
			n++
			if !c.OK {
				failed = append(failed, fmt.Sprintf("%s: %s (%s)", kind, c.Name, c.Saw))
			}
		}
	}
	if len(failed) > 0 {
		return labkit.WithEvidence(runbook.Fail("PD_HANDOFF_BROKEN", "%d of %d hand-off checks failed: %s", len(failed), n, strings.Join(failed, "; ")), out)
	}
	what := engines.MustFor(engines.Kind(s.o.Engine)).PD().Summary()
	return labkit.WithEvidence(runbook.Pass("%d hand-off checks hold on the JSON and SSE requests: one request id on both legs; %s", n, what), out).
		From(runbook.LaneRoutingEvidence, labkit.SourceReceipts)
}

// ---- 9. routing evidence ---------------------------------------------------

// prefillInRoute extracts the prefill (TensorRT-LLM: context) endpoint the
// gateway names in X-Llmgw-Route.
var prefillInRoute = regexp.MustCompile(`(?:prefill|context)=(\S+)`)

// routed is one request of the routing step.
type routed struct {
	RID     string `json:"request_id"`
	Route   string `json:"route"`
	Named   string `json:"prefill_named"`
	Decode  string `json:"decode"`
	Prefill string `json:"prefill_receipt_on"`
	Cached  int    `json:"prefill_cached_tokens"`
}

func (s *state) send(ctx context.Context, rid, prompt string) (routed, error) {
	ex, err := labkit.Do(ctx, s.client, http.MethodPost, s.gatewayURL(), labkit.RequestBody(s.chat(), s.spec.Model, prompt, rid, false), map[string]string{"X-Request-Id": rid})
	rt := routed{RID: rid, Route: ex.Get("X-Llmgw-Route"), Decode: ex.Get("X-Llmgw-Endpoint"), Cached: -1}
	if m := prefillInRoute.FindStringSubmatch(rt.Route); m != nil {
		rt.Named = m[1]
	}
	if err != nil {
		return rt, err
	}
	if ex.Status != http.StatusOK {
		return rt, fmt.Errorf("pd: request %s answered %d: %.200s", rid, ex.Status, ex.Body)
	}
	return rt, nil
}

// attach fills in, from the receipts, the prefill that served each request
// and its cached tokens.
func (s *state) attach(ctx context.Context, rs []routed) error {
	all, err := s.allReceipts(ctx)
	if err != nil {
		return err
	}
	for i := range rs {
		h := s.holders(all, RolePrefill, rs[i].RID)
		rs[i].Prefill = strings.Join(h, "+")
		if len(h) == 1 {
			rec, _ := labkit.ReceiptFor(all[h[0]], rs[i].RID)
			rs[i].Cached = rec.CachedTokens
		}
	}
	return nil
}

func (s *state) routing(ctx context.Context, r *runbook.Run) runbook.Outcome {
	if !s.wit.Receipts() {
		return s.routingWitnessed(ctx, r)
	}
	if s.o.KVExact {
		return s.routeExact(ctx, r)
	}
	out := runbook.Outcome{}.For(runbook.LaneRoutingEvidence)
	var rs []routed
	for i := 0; i < 2*s.o.Prefill; i++ {
		rt, err := s.send(ctx, fmt.Sprintf("%s-route-%d", r.ID, i), fmt.Sprintf("P/D routing probe %d of run %s.", i, r.ID))
		rs = append(rs, rt)
		if err != nil {
			return labkit.WithEvidence(labkit.FailErr(ctx, "ROUTING_REQUEST_FAILED", err), out.With("requests.json", labkit.MustJSON(rs)))
		}
	}
	if err := s.attach(ctx, rs); err != nil {
		return labkit.WithEvidence(labkit.FailErr(ctx, "NO_RECEIPT_SOURCE", err), out)
	}
	out = out.With("requests.json", labkit.MustJSON(rs))
	for _, x := range rs {
		if x.Named == "" || x.Named != x.Prefill {
			return labkit.WithEvidence(runbook.Fail("PD_SPLIT_NOT_PROVEN", "request %s: the route %q names prefill %q, the prefill receipt is on %q", x.RID, x.Route, x.Named, x.Prefill), out)
		}
	}
	return labkit.WithEvidence(runbook.Pass("%d requests: the prefill the gateway names in X-Llmgw-Route is the one whose receipt holds the request, every time", len(rs)), out).
		From(runbook.LaneRoutingEvidence, labkit.SourceReceipts)
}

func (s *state) routeExact(ctx context.Context, r *runbook.Run) runbook.Outcome {
	out := runbook.Outcome{}.For(runbook.LaneRoutingEvidence, runbook.LaneCacheReuse)
	prefix := longPrompt(r.ID, "pd-kv-exact")
	warm, err := s.send(ctx, r.ID+"-exact-warm", prefix+" First question?")
	rs := []routed{warm}
	if err != nil {
		return labkit.WithEvidence(labkit.FailErr(ctx, "ROUTING_REQUEST_FAILED", err), out.With("requests.json", labkit.MustJSON(rs)))
	}
	w := warm.Named
	// The warmed prefill's events must reach the gateway before a
	// follow-up can be expected to hit: wait until its inventory holds the
	// warm prompt's blocks (at least prompt tokens / block size of them).
	all, err := s.allReceipts(ctx)
	if err != nil {
		return labkit.WithEvidence(labkit.FailErr(ctx, "NO_RECEIPT_SOURCE", err), out)
	}
	wr, ok := labkit.ReceiptFor(all[w], warm.RID)
	if !ok {
		return labkit.WithEvidence(runbook.Fail("PD_SPLIT_NOT_PROVEN", "warm request %s: route %q names prefill %q, which has no receipt for it", warm.RID, warm.Route, w), out.With("requests.json", labkit.MustJSON(rs)))
	}
	want := max(1, wr.PromptTokens/max(1, s.spec.BlockSize))
	var invRaw []byte
	why, err := labkit.WaitFor(ctx, s.o.ReadyTimeout, func() (bool, string, error) {
		inv, raw, err := s.admin.Inventory(ctx, s.ruleName, 4)
		if err != nil {
			return false, err.Error(), nil
		}
		invRaw = raw
		for _, ep := range inv.Endpoints {
			if ep.ID == w {
				return ep.InventoryBlocks >= want, fmt.Sprintf("prefill %s inventory %d blocks, warm prompt %d", w, ep.InventoryBlocks, want), nil
			}
		}
		return false, "warmed prefill not in the inventory", nil
	})
	out = out.With("inventory-after-warm.json", invRaw)
	if err != nil {
		return labkit.WithEvidence(labkit.FailErr(ctx, "ROUTING_NO_INVENTORY", fmt.Errorf("the warmed prefill's KV events never reached the gateway: %s: %w", why, err)), out.With("requests.json", labkit.MustJSON(rs)))
	}
	for i := 1; i <= 3; i++ {
		rt, err := s.send(ctx, fmt.Sprintf("%s-exact-follow-%d", r.ID, i), prefix+fmt.Sprintf(" Follow-up question %d?", i))
		rs = append(rs, rt)
		if err != nil {
			return labkit.WithEvidence(labkit.FailErr(ctx, "ROUTING_REQUEST_FAILED", err), out.With("requests.json", labkit.MustJSON(rs)))
		}
	}
	if err := s.attach(ctx, rs); err != nil {
		return labkit.WithEvidence(labkit.FailErr(ctx, "NO_RECEIPT_SOURCE", err), out)
	}
	out = out.With("requests.json", labkit.MustJSON(rs))
	for _, x := range rs[1:] {
		switch {
		case x.Prefill != w || x.Named != w:
			return labkit.WithEvidence(runbook.Fail("ROUTING_NOT_ON_WARMED", "follow-up %s: route %q, prefill receipt on %q; want the warmed prefill %s", x.RID, x.Route, x.Prefill, w), out)
		case !strings.Contains(x.Route, "(kv-exact hit="):
			return labkit.WithEvidence(runbook.Fail("ROUTING_NO_KV_HIT", "follow-up %s routed by %q, want a kv-exact hit on the prefill", x.RID, x.Route), out)
		case x.Cached <= rs[0].Cached:
			return labkit.WithEvidence(runbook.Fail("CACHE_NOT_REUSED", "follow-up %s: prefill %s cached tokens %d, warm request %d: no rise", x.RID, w, x.Cached, rs[0].Cached), out)
		}
	}
	if dec, err := s.admin.Decisions(ctx, s.ruleName); err == nil {
		out = out.With("decisions.json", dec)
	}
	last := rs[len(rs)-1]
	return labkit.WithEvidence(runbook.Pass("kvExactMode 1: 3 same-prefix follow-ups picked the warmed prefill %s by a kv-exact hit (%s); its cached tokens %d → %d", w, last.Route, rs[0].Cached, last.Cached), out).
		From(runbook.LaneRoutingEvidence, labkit.SourceReceipts).From(runbook.LaneCacheReuse, labkit.SourceReceipts)
}
