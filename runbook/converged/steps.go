package converged

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"os"
	"slices"
	"strings"
	"time"

	"github.com/llmgw/llmgw/engines/sim"
	"github.com/llmgw/llmgw/gateway"
	"github.com/llmgw/llmgw/gateway/rule"
	"github.com/llmgw/llmgw/profiles"
	"github.com/llmgw/llmgw/runbook"
)

// interrupted turns a cancelled context into the step's outcome; other
// errors get code.
func failErr(ctx context.Context, code string, err error) runbook.Outcome {
	if ctx.Err() != nil {
		return runbook.Fail("INTERRUPTED", "interrupted: %v", err)
	}
	return runbook.Fail(code, "%v", err)
}

// ---- 1. select tuple -------------------------------------------------------

func (s *state) selectTuple(_ context.Context, r *runbook.Run) runbook.Outcome {
	o := s.o
	p, err := o.Catalog.Get(o.Profile)
	if err != nil {
		return runbook.Fail("UNKNOWN_PROFILE", "%v", err)
	}
	s.profile = p
	ver, _ := o.Catalog.Versions().For(o.Engine)
	info := map[string]any{
		"engine": o.Engine, "engine_version": ver.Version, "engine_image": ver.Image, "contract": ver.Contract,
		"backend": ver.Backend, "profile": p.ID, "model": p.Model.Repo, "revision": p.Model.Revision,
		"served_name": p.Model.ServedName, "api_mode": p.APIMode, "mode": o.Mode, "topology": "converged",
		"workers": o.Workers, "launcher": o.Launcher.Name(), "simulated_workers": o.Launcher.Simulated(),
		"kv_hash_seed": o.Catalog.KVHashSeed(),
	}
	if code, detail, blocked := o.Catalog.Blocked(o.Engine, o.Profile); blocked {
		info["blocked"] = map[string]string{"code": code, "detail": detail}
		return runbook.Blocked(code, "%s on %s %s: %s; nothing launched", p.ID, o.Engine, ver.Version, detail).
			With("tuple.json", mustJSON(info))
	}
	es, err := p.Engine(o.Engine)
	if err != nil {
		return runbook.Fail("UNKNOWN_ENGINE", "%v", err).With("tuple.json", mustJSON(info))
	}
	launch, err := p.Launch(o.Engine)
	if err != nil {
		return runbook.Fail("PROFILE_NO_LAUNCH", "%v", err).With("tuple.json", mustJSON(info))
	}
	s.launchSpec = launch
	s.seed = o.Catalog.KVHashSeed()
	info["block_size"], info["hash_algo"] = es.BlockSize, es.HashAlgo
	encoding := ""
	switch o.Engine {
	case profiles.EngineVLLM:
		encoding = sim.EncodingMap
	case profiles.EngineSGLang:
		encoding = sim.EncodingArray
	}
	s.spec = runbook.LaunchSpec{
		RunID: r.ID, Engine: o.Engine, Profile: p, Launch: launch, Model: p.Model.ServedName, Workers: o.Workers,
		BlockSize: es.BlockSize, HashSeed: s.seed, EventEncoding: encoding, KVEvents: o.Mode == "exact",
		Ledger: ledgerOf(r),
	}
	return runbook.Pass("%s %s × %s (%s), mode %s, %d %s workers", o.Engine, ver.Version, p.ID, p.Model.ServedName, o.Mode, o.Workers, o.Launcher.Name()).
		With("tuple.json", mustJSON(info))
}

// ---- 2. launch workers -----------------------------------------------------

func (s *state) launch(ctx context.Context, r *runbook.Run) runbook.Outcome {
	o := s.o
	s.client = &http.Client{Timeout: 60 * time.Second, Transport: &http.Transport{MaxIdleConnsPerHost: 16}}
	r.Defer("close HTTP client", func(context.Context) error {
		s.client.CloseIdleConnections()
		return nil
	})
	// Registered before Launch: Stop is idempotent and cleans up a launch
	// that failed half-way.
	r.Defer("stop workers", func(ctx context.Context) error { return s.stopWorkers(ctx) })
	ws, err := o.Launcher.Launch(ctx, s.spec)
	if err != nil {
		if b := runbook.AsBlocked(err); b != nil {
			return runbook.Blocked(b.Code, "%s launcher: %s", o.Launcher.Name(), b.Detail).With("launch-error.txt", []byte(err.Error()+"\n"))
		}
		return failErr(ctx, "ENGINE_LAUNCH_FAILED", err).With("launch-error.txt", []byte(err.Error()+"\n"))
	}
	s.workers = ws
	out := runbook.Pass("")
	out = out.With("workers.json", mustJSON(ws))
	type health struct {
		Worker string   `json:"worker"`
		Health int      `json:"health_status"`
		Models []string `json:"models"`
		Error  string   `json:"error,omitempty"`
	}
	var report []health
	for _, w := range ws {
		h := health{Worker: w.ID}
		last, err := waitFor(ctx, o.HealthTimeout, func() (bool, string, error) {
			ex, err := s.do(ctx, http.MethodGet, "http://"+w.HTTP+w.HealthPath, nil, nil)
			if err != nil {
				h.Error = err.Error()
				return false, "health: " + err.Error(), nil
			}
			h.Health, h.Error = ex.Status, ""
			if ex.Status != http.StatusOK {
				return false, fmt.Sprintf("health answered %d", ex.Status), nil
			}
			ex, err = s.do(ctx, http.MethodGet, "http://"+w.HTTP+"/v1/models", nil, nil)
			if err != nil || ex.Status != http.StatusOK {
				return false, fmt.Sprintf("/v1/models answered %d", ex.Status), nil
			}
			var ml struct {
				Data []struct {
					ID string `json:"id"`
				} `json:"data"`
			}
			_ = json.Unmarshal([]byte(ex.Body), &ml)
			h.Models = h.Models[:0]
			for _, m := range ml.Data {
				h.Models = append(h.Models, m.ID)
			}
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
			return failErr(ctx, code, fmt.Errorf("worker %s (%s) not ready within %v: %s", w.ID, w.HTTP, o.HealthTimeout, last)).
				With("workers.json", mustJSON(ws)).With("health.json", mustJSON(report))
		}
	}
	out.Reason = fmt.Sprintf("%d workers healthy and serving %s (%s)", len(ws), s.spec.Model, ws[0].Owner)
	return out.With("health.json", mustJSON(report))
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
		_, err := waitFor(ctx, 10*time.Second, func() (bool, string, error) {
			c, err := net.DialTimeout("tcp", w.HTTP, time.Second)
			if err != nil {
				return true, "", nil
			}
			c.Close()
			return false, "still accepting connections", nil
		})
		if err != nil {
			return fmt.Errorf("converged: worker %s at %s still listening after stop: %w", w.ID, w.HTTP, err)
		}
	}
	return nil
}

// ---- request shapes --------------------------------------------------------

// chat reports whether the profile is served through chat completions.
func (s *state) chat() bool { return s.profile.APIMode == "chat" }

func (s *state) path() string {
	if s.chat() {
		return "/v1/chat/completions"
	}
	return "/v1/completions"
}

// body is a small completion request; the nonce travels in "user", which
// the simulators' receipts record.
func (s *state) body(model, prompt, nonce string, stream bool) []byte {
	m := map[string]any{"model": model, "max_tokens": 8, "temperature": 0, "user": nonce}
	if s.chat() {
		m["messages"] = []map[string]string{{"role": "user", "content": prompt}}
	} else {
		m["prompt"] = prompt
	}
	if stream {
		m["stream"] = true
		m["stream_options"] = map[string]bool{"include_usage": true}
	}
	b, _ := json.Marshal(m)
	return b
}

// longPrompt is a prompt of many KV blocks (longer than CHWBL's default
// 2048 prefix bytes) whose text is unique to the run
// and topic, so no earlier request warmed it by chance.
func (s *state) longPrompt(runID, topic string) string {
	var b strings.Builder
	// The run's random suffix comes first: the first block must be new to
	// every worker (a block an engine cached before the gateway subscribed
	// is unknown to the gateway, and a prefix match starts at block 0).
	fmt.Fprintf(&b, "Run %s, %s. ", shortID(runID), topic)
	for i := 0; i < 24; i++ {
		fmt.Fprintf(&b, "Section %d of %s (%s): the gateway sends each request to the worker that already holds its prefix. ", i, topic, runID)
	}
	return b.String()
}

// ---- 3. prove direct inference ---------------------------------------------

func (s *state) direct(ctx context.Context, r *runbook.Run) runbook.Outcome {
	out := runbook.Pass("").For(runbook.LaneDirectWorker)
	for _, w := range s.workers {
		nonce := r.ID + "-direct-" + w.ID
		ex, err := s.do(ctx, http.MethodPost, "http://"+w.HTTP+s.path(),
			s.body(s.spec.Model, "Direct check of worker "+w.ID+" in run "+r.ID+": reply with one word.", nonce, false),
			map[string]string{"X-Request-Id": nonce})
		out = out.With(w.ID+"-exchange.json", ex.json())
		if err != nil {
			return failErr(ctx, "DIRECT_REQUEST_FAILED", fmt.Errorf("worker %s: %w", w.ID, err)).With(w.ID+"-exchange.json", ex.json())
		}
		if ex.Status != http.StatusOK {
			return withEvidence(runbook.Fail("DIRECT_REQUEST_FAILED", "worker %s answered %d: %.200s", w.ID, ex.Status, ex.Body), out)
		}
		c, err := parseCompletion(ex.Body)
		if err != nil || c.Text == "" {
			return withEvidence(runbook.Fail("DIRECT_BAD_COMPLETION", "worker %s: no generated text (%v)", w.ID, err), out)
		}
		recs, err := s.receipts(ctx, w)
		if err != nil {
			return withEvidence(failErr(ctx, "NO_RECEIPT_SOURCE", err), out)
		}
		rec, ok := receiptFor(recs, nonce)
		if !ok || rec.Nonce != nonce || rec.Status != http.StatusOK {
			return withEvidence(runbook.Fail("DIRECT_NO_RECEIPT", "worker %s answered but its receipt log has no 200 receipt for request %s (nonce %s)", w.ID, nonce, nonce), out)
		}
		out = out.With(w.ID+"-receipt.json", mustJSON(rec))
	}
	out.Reason = fmt.Sprintf("%d/%d workers answered a nonce request directly, each with its own receipt", len(s.workers), len(s.workers))
	return out
}

// withEvidence returns o carrying base's evidence (the step's files so far)
// and lanes.
func withEvidence(o, base runbook.Outcome) runbook.Outcome {
	o.Evidence = append(slices.Clone(base.Evidence), o.Evidence...)
	o.Lanes = base.Lanes
	return o
}

// ---- 4. apply rule ---------------------------------------------------------

// buildRule is the rule for the mode over the launched workers.
func (s *state) buildRule(name string) *rule.Rule {
	o := s.o
	r := &rule.Rule{
		Name: name, ModelName: s.spec.Model, KVEngineType: o.Engine,
		Probe: rule.ProbeConfig{Path: s.workers[0].HealthPath, Interval: rule.Duration(time.Second), Timeout: rule.Duration(500 * time.Millisecond)},
	}
	switch o.Mode {
	case "rr":
		r.Sel = 0
	case "chwbl":
		r.Sel = 8
	case "exact":
		r.Sel = 8 // CHWBL is the fallback on a KV miss
		r.KVExactMode = 3
		r.KVBlockSize = s.spec.BlockSize
		if o.Engine == profiles.EngineVLLM {
			seed := s.seed
			r.KVHashSeed = &seed
		}
	}
	for _, w := range s.workers {
		host, port, _ := net.SplitHostPort(w.HTTP)
		var p int
		fmt.Sscanf(port, "%d", &p)
		ep := rule.Endpoint{ID: w.ID, EndpointIP: host, TargetPort: p}
		if o.Mode == "exact" && o.Engine != profiles.EngineTRTLLM {
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
	led := ledgerOf(r)
	adminBase := o.GatewayAdmin
	if adminBase == "" {
		dir, err := os.MkdirTemp("", "llmgw-runbook-gw-")
		if err != nil {
			return runbook.Fail("GATEWAY_START_FAILED", "state dir: %v", err)
		}
		_ = led.Update(func(st *runbook.LedgerState) { st.Dirs = append(st.Dirs, dir) })
		gw, err := gateway.New(gateway.Config{Listen: "127.0.0.1:0", Admin: "127.0.0.1:0", StateDir: dir, Logger: o.Logger})
		if err == nil {
			// The gateway outlives this step; the cleanup closes it.
			err = gw.Start(context.WithoutCancel(ctx))
		}
		r.Defer("close embedded gateway", func(context.Context) error {
			if gw != nil && err == nil {
				gw.Close()
			}
			if rerr := os.RemoveAll(dir); rerr != nil {
				return rerr
			}
			return led.Update(func(st *runbook.LedgerState) {
				st.Dirs = slices.DeleteFunc(st.Dirs, func(d string) bool { return d == dir })
			})
		})
		if err != nil {
			return runbook.Fail("GATEWAY_START_FAILED", "%v", err)
		}
		s.gw = gw
		adminBase = "http://" + gw.AdminAddr()
	}
	admin, err := runbook.NewAdmin(adminBase, o.GatewayToken, s.client)
	if err != nil {
		return runbook.Fail("GATEWAY_URL", "%v", err)
	}
	s.admin = admin
	name := "rb-" + shortID(r.ID)
	s.ruleName = name
	rl := s.buildRule(name)
	if o.RuleHook != nil {
		o.RuleHook(rl)
	}
	s.applied = rl
	body := mustJSON(rl)
	_ = led.Update(func(st *runbook.LedgerState) {
		st.Rules = append(st.Rules, runbook.OwnedRule{Admin: admin.Base(), Name: name, Embedded: s.gw != nil})
	})
	r.Defer("delete rule "+name, func(ctx context.Context) error {
		if _, err := admin.Delete(ctx, name, 5*time.Second); err != nil {
			return err
		}
		// Absence is part of the cleanup: the rule must be gone.
		if _, _, err := admin.Rule(ctx, name); !isStatus(err, http.StatusNotFound) {
			return fmt.Errorf("converged: rule %s still readable after delete (%v)", name, err)
		}
		return led.Update(func(st *runbook.LedgerState) {
			st.Rules = slices.DeleteFunc(st.Rules, func(x runbook.OwnedRule) bool { return x.Name == name && x.Admin == admin.Base() })
		})
	})
	resp, err := admin.Create(ctx, body)
	out := runbook.Outcome{}.With("rule-request.json", body)
	if err != nil {
		out = out.With("rule-response.json", resp)
		var ae *runbook.AdminError
		if errors.As(err, &ae) {
			// A refusal must leave no state: prove it by reading back.
			_, rb, gerr := admin.Rule(ctx, name)
			out = out.With("readback-after-refusal.json", rb)
			if !isStatus(gerr, http.StatusNotFound) {
				return withEvidence(runbook.Fail("RULE_REJECTED_STATE_LEFT", "gateway refused the rule (%d %s) but a rule named %s is readable", ae.Status, ae.Code, name), out)
			}
			return withEvidence(runbook.Fail("RULE_REJECTED", "gateway refused the rule: %d %s: %s", ae.Status, ae.Code, errMessage(ae.Body)), out)
		}
		return withEvidence(failErr(ctx, "RULE_APPLY_FAILED", err), out)
	}
	out = out.With("rule-effective.json", resp)
	return withEvidence(runbook.Pass("rule %s created on %s: sel %d, kvExactMode %d, %d endpoints", name, admin.Base(), rl.Sel, rl.KVExactMode, len(rl.Endpoints)), out)
}

func isStatus(err error, code int) bool {
	var ae *runbook.AdminError
	return errors.As(err, &ae) && ae.Status == code
}

func errMessage(body []byte) string {
	var e struct {
		Error struct {
			Message string `json:"message"`
		} `json:"error"`
	}
	if json.Unmarshal(body, &e) == nil && e.Error.Message != "" {
		return e.Error.Message
	}
	return strings.TrimSpace(string(body))
}

// shortID is a rule-name friendly suffix of a run ID (its random tail).
func shortID(id string) string {
	if i := strings.LastIndexByte(id, '-'); i >= 0 && i+1 < len(id) {
		return strings.ToLower(id[i+1:])
	}
	return "run"
}

// ---- 5. read back ----------------------------------------------------------

func (s *state) readBack(ctx context.Context, _ *runbook.Run) runbook.Outcome {
	st, raw, err := s.admin.Rule(ctx, s.ruleName)
	out := runbook.Outcome{}.With("readback.json", raw)
	if err != nil {
		return withEvidence(failErr(ctx, "READBACK_FAILED", err), out)
	}
	want := s.applied.Effective()
	diffs, compared := diffRules(want, st.Rule)
	out = out.With("readback-diff.txt", []byte(diffText(diffs, compared)))
	if len(diffs) > 0 {
		return withEvidence(runbook.Fail("READBACK_MISMATCH", "effective rule differs from what was applied in %d field(s): %s", len(diffs), strings.Join(diffs, "; ")), out)
	}
	exact := s.applied.KVExactMode != 0
	var last *gateway.RuleStatus
	why, err := waitFor(ctx, s.o.ReadyTimeout, func() (bool, string, error) {
		st, _, err := s.admin.Rule(ctx, s.ruleName)
		if err != nil {
			return false, err.Error(), nil
		}
		last = st
		return readinessHolds(st, exact)
	})
	if last != nil {
		out = out.With("readiness.json", mustJSON(last.Status))
	}
	if err != nil {
		return withEvidence(failErr(ctx, "NOT_READY", fmt.Errorf("readiness conditions did not hold within %v: %s", s.o.ReadyTimeout, why)), out)
	}
	s.dataAddr = dataAddress(last.Status.Address, s.admin.Base())
	reason := fmt.Sprintf("effective rule equals the applied one (%d fields compared, defaults resolved); %d/%d endpoints healthy and available", compared, len(last.Status.Endpoints), len(s.workers))
	if exact {
		reason += "; every KV event stream connected (the inventory condition needs traffic: proved in routing evidence)"
	}
	return withEvidence(runbook.Pass("%s", reason), out)
}

// readinessHolds checks the readiness conditions a read-back can see.
func readinessHolds(st *gateway.RuleStatus, exact bool) (bool, string, error) {
	if !st.Status.Ready {
		return false, "rule not ready (no available endpoint)", nil
	}
	for _, ep := range st.Status.Endpoints {
		switch {
		case !ep.Healthy || !ep.Available:
			return false, fmt.Sprintf("endpoint %s healthy=%v available=%v", ep.ID, ep.Healthy, ep.Available), nil
		case ep.Draining:
			return false, fmt.Sprintf("endpoint %s is draining", ep.ID), nil
		case exact && ep.KV == nil:
			return false, fmt.Sprintf("endpoint %s has no KV status", ep.ID), nil
		case exact && !ep.KV.EventsConnected:
			return false, fmt.Sprintf("endpoint %s: KV event stream not connected (admission %q)", ep.ID, ep.KV.Admission), nil
		}
	}
	return true, "", nil
}

// dataAddress is the data-plane address to send traffic to: the rule's
// listener, with an unspecified host replaced by the admin API's host.
func dataAddress(addr, adminBase string) string {
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		return addr
	}
	if ip := net.ParseIP(host); host == "" || (ip != nil && ip.IsUnspecified()) {
		if u, err := url.Parse(adminBase); err == nil {
			host = u.Hostname()
		}
	}
	return net.JoinHostPort(host, port)
}

// diffRules compares two rules field by field through their JSON form and
// returns the differing paths; compared counts leaf fields.
func diffRules(want, got *rule.Rule) (diffs []string, compared int) {
	var a, b any
	ja, _ := json.Marshal(want)
	jb, _ := json.Marshal(got)
	_ = json.Unmarshal(ja, &a)
	_ = json.Unmarshal(jb, &b)
	var walk func(path string, x, y any)
	walk = func(path string, x, y any) {
		switch xv := x.(type) {
		case map[string]any:
			yv, ok := y.(map[string]any)
			if !ok {
				diffs = append(diffs, fmt.Sprintf("%s: applied %v, read back %v", path, x, y))
				return
			}
			keys := map[string]bool{}
			for k := range xv {
				keys[k] = true
			}
			for k := range yv {
				keys[k] = true
			}
			sorted := make([]string, 0, len(keys))
			for k := range keys {
				sorted = append(sorted, k)
			}
			slices.Sort(sorted)
			for _, k := range sorted {
				walk(joinPath(path, k), xv[k], yv[k])
			}
		case []any:
			yv, ok := y.([]any)
			if !ok || len(xv) != len(yv) {
				diffs = append(diffs, fmt.Sprintf("%s: applied %d items, read back %v", path, len(xv), y))
				return
			}
			for i := range xv {
				walk(fmt.Sprintf("%s[%d]", path, i), xv[i], yv[i])
			}
		default:
			compared++
			if fmt.Sprint(x) != fmt.Sprint(y) {
				diffs = append(diffs, fmt.Sprintf("%s: applied %v, read back %v", path, x, y))
			}
		}
	}
	walk("", a, b)
	return diffs, compared
}

func joinPath(p, k string) string {
	if p == "" {
		return k
	}
	return p + "." + k
}

func diffText(diffs []string, compared int) string {
	if len(diffs) == 0 {
		return fmt.Sprintf("%d fields compared; no difference\n", compared)
	}
	return fmt.Sprintf("%d fields compared; %d differ:\n%s\n", compared, len(diffs), strings.Join(diffs, "\n"))
}
