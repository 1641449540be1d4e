package gateway

import (
	"errors"
	"fmt"
	"net"
	"sort"
	"strconv"
	"time"

	"github.com/llmgw/llmgw/engines"
	"github.com/llmgw/llmgw/gateway/rule"
)

// ErrRuleNotFound is returned for operations on a rule name that does not
// exist (admin API: 404).
var ErrRuleNotFound = errors.New("gateway: rule not found")

// ErrEndpointNotFound is returned for an endpoint id the rule does not have.
var ErrEndpointNotFound = errors.New("gateway: endpoint not found")

// ErrRuleExists is returned by Create for a name already in use (409).
var ErrRuleExists = errors.New("gateway: rule already exists")

// Apply admits r, persists it, and installs it, replacing a rule of the same
// name. create=true refuses an existing name (POST semantics). It returns the
// effective rule. Nothing changes when any step fails: a rule that is not
// persisted is not served, and a rule that cannot be served (its listener
// cannot bind) is not persisted.
func (s *Server) Apply(r *rule.Rule, create bool) (*rule.Rule, error) {
	// Checked before the lock: a kvTokenizer path is read while the rule is
	// installed (under s.mu), so it must be a bounded regular file.
	if err := checkTokenizerPath(r.KVTokenizer); err != nil {
		return nil, err
	}
	if err := checkTemplatePath(r.KVChatTemplate); err != nil {
		return nil, err
	}
	// A discovered rule's endpoints are resolved before the lock (the
	// source's first sync takes s.mu-free time); its field checks run
	// first so that a malformed rule starts no watch.
	var w *epWatch
	run := r
	if r.EndpointsFrom != nil {
		if err := rule.Admit(r, nil, nil); err != nil {
			return nil, err
		}
		var eps []rule.Endpoint
		var err error
		if w, eps, err = s.startWatch(r); err != nil {
			return nil, err
		}
		committed := false
		defer func() {
			if !committed {
				w.cancel()
			}
		}()
		var static *rule.Rule
		run, static = discovered(r, eps)
		s.mu.Lock()
		defer s.mu.Unlock()
		eff, err := s.applyLocked(r, static, run, create)
		if err != nil {
			return nil, err
		}
		s.registerWatchLocked(w)
		committed = true
		return eff, nil
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	eff, err := s.applyLocked(r, r, r, create)
	if err != nil {
		return nil, err
	}
	s.stopWatchLocked(r.Name)
	return eff, nil
}

// applyLocked admits written (and, for a discovered rule, static: the
// discovered set as a static rule), persists written and installs run.
// For a static rule all three are the same. Caller holds s.mu.
func (s *Server) applyLocked(r, static, run *rule.Rule, create bool) (*rule.Rule, error) {
	var existing *rule.Rule
	if rt := s.rules[r.Name]; rt != nil {
		if create {
			return nil, fmt.Errorf("%w: %q (use PUT to update it)", ErrRuleExists, r.Name)
		}
		existing = rt.rule
	}
	others := make([]*rule.Rule, 0, len(s.rules))
	for name, rt := range s.rules {
		if name != r.Name {
			others = append(others, rt.rule)
		}
	}
	if err := rule.Admit(r, existing, others); err != nil {
		return nil, err
	}
	if static != r {
		if err := rule.Admit(static, existing, others); err != nil {
			return nil, err
		}
	}
	eff := run.Effective()
	if err := trtConsumerConflict(eff, others); err != nil {
		return nil, err
	}
	// Bind a new dedicated listener before persisting: a rule that cannot be
	// served must not be acknowledged.
	key := rule.ListenKey(eff.Listen)
	_, hadListener := s.listeners[key]
	if _, err := s.ensureListener(key); err != nil {
		return nil, err
	}
	if err := s.store.Put(r); err != nil {
		if !hadListener {
			s.dropListenerLocked(key)
		}
		return nil, fmt.Errorf("gateway: persisting rule %q: %w", r.Name, err)
	}
	if err := s.installLocked(run); err != nil {
		// Admission passed, so this is a gateway fault; keep the stored copy
		// consistent with what runs. A failed rollback leaves the store
		// holding a rule that does not run (it would come back on restart):
		// it is logged and returned with the install error.
		var rerr error
		if existing != nil {
			rerr = s.store.Put(existing)
		} else {
			rerr = s.store.Delete(r.Name)
		}
		if !hadListener {
			s.dropListenerLocked(key)
		}
		if rerr != nil {
			s.log.Error("rule install failed and the stored copy could not be rolled back", "rule", r.Name, "install_err", err, "rollback_err", rerr)
			return nil, errors.Join(err, fmt.Errorf("gateway: rolling back stored rule %q: %w", r.Name, rerr))
		}
		return nil, err
	}
	s.publishLocked()
	s.log.Info("rule applied", "rule", r.Name, "model", eff.ModelName, "sel", eff.Sel, "endpoints", len(eff.Endpoints))
	return eff.Clone(), nil
}

func (s *Server) dropListenerLocked(key string) {
	if l := s.listeners[key]; l != nil && key != "" {
		delete(s.listeners, key)
		if l.loop != nil {
			l.loop.close(timeoutCtx(0))
		}
		_ = l.ln.Close()
	}
}

// installLocked builds and starts the runtime for r (as stored, before
// defaults), replacing any runtime of the same name. Caller holds s.mu and
// publishes afterwards.
func (s *Server) installLocked(r *rule.Rule) error {
	eff := r.Effective()
	if _, err := s.ensureListener(rule.ListenKey(eff.Listen)); err != nil {
		return err
	}
	prev := s.rules[eff.Name]
	rt, err := s.buildRuntime(eff, prev)
	if err != nil {
		return err
	}
	// Stop the old runtime's background work first: a TensorRT-LLM event
	// endpoint has exactly one consumer. The old runtime keeps serving
	// requests until the table is republished.
	if prev != nil {
		prev.stop()
	}
	rt.start(s)
	s.rules[eff.Name] = rt
	return nil
}

// Delete removes rule name. With drain > 0 its endpoints stop taking new
// requests first and Delete waits, up to drain, for in-flight requests to
// finish; it reports how many were still running when it gave up.
func (s *Server) Delete(name string, drain time.Duration) (abandoned int64, err error) {
	s.mu.Lock()
	rt := s.rules[name]
	s.mu.Unlock()
	if rt == nil {
		return 0, fmt.Errorf("%w: %q", ErrRuleNotFound, name)
	}
	if drain > 0 {
		for _, ep := range rt.eps {
			ep.SetDraining(true)
		}
		deadline := time.Now().Add(drain)
		tick := time.NewTicker(20 * time.Millisecond)
		for rt.inFlight() > 0 && time.Now().Before(deadline) {
			select {
			case <-tick.C:
			case <-s.ctx.Done():
				tick.Stop()
				return rt.inFlight(), s.ctx.Err()
			}
		}
		tick.Stop()
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.rules[name] != rt {
		return 0, fmt.Errorf("gateway: rule %q changed while draining; not deleted", name)
	}
	if err := s.store.Delete(name); err != nil {
		return 0, fmt.Errorf("gateway: deleting rule %q: %w", name, err)
	}
	s.stopWatchLocked(name)
	delete(s.rules, name)
	s.publishLocked()
	rt.stop()
	s.metrics.dropRule(name)
	s.log.Info("rule deleted", "rule", name)
	return rt.inFlight(), nil
}

// SetDraining drains (true) or undrains one endpoint of a rule, or every
// endpoint when id is "".
func (s *Server) SetDraining(name, id string, drain bool) error {
	s.mu.Lock()
	rt := s.rules[name]
	s.mu.Unlock()
	if rt == nil {
		return fmt.Errorf("%w: %q", ErrRuleNotFound, name)
	}
	if id == "" {
		for _, ep := range rt.eps {
			ep.SetDraining(drain)
		}
		return nil
	}
	ep := rt.byID[id]
	if ep == nil {
		return fmt.Errorf("%w: %q in rule %q", ErrEndpointNotFound, id, name)
	}
	ep.SetDraining(drain)
	s.log.Info("endpoint drain", "rule", name, "endpoint", id, "draining", drain)
	return nil
}

// RuleStatus is a rule's effective configuration plus live state, as the
// admin API returns it.
type RuleStatus struct {
	Rule   *rule.Rule     `json:"rule"`
	Status RuleLiveStatus `json:"status"`
}

// RuleLiveStatus is the live part of a RuleStatus.
type RuleLiveStatus struct {
	Address   string           `json:"address"`
	Ready     bool             `json:"ready"`
	InFlight  int64            `json:"in_flight"`
	Endpoints []EndpointStatus `json:"endpoints"`
	// KVReady: at least one endpoint meets every KV-exact readiness
	// condition (KV-exact rules only). Until then requests are routed by the
	// fallback policy.
	KVReady *bool `json:"kv_ready,omitempty"`
	// KVParity is the KV-exact self-check (KV-exact rules only).
	KVParity *ParityStatus `json:"kv_parity,omitempty"`
	// KVWindow is KV-exact effectiveness over the rule's recent decisions
	// (KV-exact rules only).
	KVWindow *KVWindowStatus `json:"kv_window,omitempty"`
	// Degraded says why the rule serves degraded, a warning and not an
	// outage (Ready is unchanged): "cause: sentence", causes joined by
	// "; " (kv_tokenize, kv_parity: see kvhealth.go); empty when it does
	// not. DegradedCauses holds the same by cause.
	Degraded       string            `json:"degraded,omitempty"`
	DegradedCauses map[string]string `json:"degraded_causes,omitempty"`
	// NotReady says why the rule cannot serve ("" while Ready): its
	// discovered pool is empty, or how many endpoints are down, draining
	// or breaker-open, or which P/D pool has nothing available.
	NotReady string `json:"not_ready,omitempty"`
	// PoolEmpty: the rule's discovered endpoint set (endpoints_from) is
	// empty; the endpoints listed are the previous set, drained.
	PoolEmpty bool `json:"pool_empty,omitempty"`
}

// EndpointStatus is one endpoint's live state.
type EndpointStatus struct {
	ID        string `json:"id"`
	Address   string `json:"address"`
	Role      int    `json:"ep_role"`
	Available bool   `json:"available"`
	Healthy   bool   `json:"healthy"`
	Breaker   string `json:"breaker"`
	Draining  bool   `json:"draining"`
	InFlight  int64  `json:"in_flight"`
	// KV is the endpoint's KV-exact state; nil when it is not scored.
	KV *EndpointKVStatus `json:"kv,omitempty"`
}

// EndpointKVStatus shows each KV-exact readiness condition separately, with
// the event stream's counters.
type EndpointKVStatus struct {
	Ready            bool   `json:"ready"`
	Healthy          bool   `json:"healthy"`
	EventsConnected  bool   `json:"events_connected"`
	InventoryOrProof bool   `json:"inventory_or_canary"`
	InventoryBlocks  int    `json:"inventory_blocks"`
	Admission        string `json:"admission,omitempty"`
	LastSeq          int64  `json:"last_seq"`
	Events           uint64 `json:"events"`
	Resyncs          uint64 `json:"resyncs"`
	LastResyncReason string `json:"last_resync_reason,omitempty"`
	Malformed        uint64 `json:"malformed"`
	MalformedEvents  uint64 `json:"malformed_events"`
	Dropped          uint64 `json:"dropped"`
	// Polls counts the event drains sent (TensorRT-LLM); absent otherwise.
	Polls uint64 `json:"polls,omitempty"`
}

// Rule returns rule name's effective configuration and live status.
func (s *Server) Rule(name string) (*RuleStatus, error) {
	s.mu.Lock()
	rt := s.rules[name]
	var addr string
	empty := false
	if rt != nil {
		if l := s.listeners[rt.listenKey]; l != nil {
			addr = l.ln.Addr().String()
		}
		if w := s.watches[name]; w != nil {
			empty = w.emptied
		}
	}
	s.mu.Unlock()
	if rt == nil {
		return nil, fmt.Errorf("%w: %q", ErrRuleNotFound, name)
	}
	st := rt.status(addr)
	if empty {
		st.Status.PoolEmpty = true
		if !st.Status.Ready {
			st.Status.NotReady = fmt.Sprintf("endpoint pool empty: endpoints_from finds no ready endpoint (the %d listed are the previous set, drained)", len(st.Status.Endpoints))
		}
	}
	return st, nil
}

// Rules returns every rule's status, sorted by name.
func (s *Server) Rules() []*RuleStatus {
	s.mu.Lock()
	names := make([]string, 0, len(s.rules))
	for n := range s.rules {
		names = append(names, n)
	}
	s.mu.Unlock()
	sort.Strings(names)
	out := make([]*RuleStatus, 0, len(names))
	for _, n := range names {
		if st, err := s.Rule(n); err == nil {
			out = append(out, st)
		}
	}
	return out
}

func (rt *ruleRuntime) status(addr string) *RuleStatus {
	st := &RuleStatus{Rule: rt.rule.Clone(), Status: RuleLiveStatus{Address: addr}}
	for _, ep := range rt.eps {
		es := EndpointStatus{
			ID: ep.ID, Address: ep.Addr, Role: int(ep.Role),
			Available: ep.Available(), Healthy: !ep.Down(), Draining: ep.Draining(),
			InFlight: ep.InFlight(), Breaker: "disabled",
		}
		if b := ep.Breaker(); b != nil {
			es.Breaker = b.State().String()
		}
		if es.Available {
			st.Status.Ready = true
		}
		st.Status.InFlight += es.InFlight
		st.Status.Endpoints = append(st.Status.Endpoints, es)
	}
	if rt.pd != nil {
		// A P/D rule serves only with a prefill and a decode available.
		st.Status.Ready = rt.pd.ready()
	}
	if !st.Status.Ready {
		st.Status.NotReady = notReadyReason(rt, st.Status.Endpoints)
	}
	if kv := rt.kv; kv != nil {
		anyReady := false
		for i, ep := range kv.pool {
			ks := kv.endpointStatus(i)
			anyReady = anyReady || ks.Ready
			for j := range st.Status.Endpoints {
				if st.Status.Endpoints[j].ID == ep.ID {
					st.Status.Endpoints[j].KV = ks
				}
			}
		}
		ps := kv.parity.status()
		ws := kv.health.status()
		st.Status.KVReady, st.Status.KVParity, st.Status.KVWindow = &anyReady, &ps, &ws
		if causes := degraded(ws, ps); len(causes) > 0 {
			st.Status.Degraded, st.Status.DegradedCauses = degradedText(causes), causes
		}
	}
	return st
}

// notReadyReason says why a rule with no way to serve cannot: which P/D
// pool has nothing available, or what holds its endpoints back.
func notReadyReason(rt *ruleRuntime, eps []EndpointStatus) string {
	if rt.pd != nil {
		switch {
		case !anyAvailable(rt.pd.prefill):
			return "no prefill endpoint available"
		case !anyAvailable(rt.pd.decode):
			return "no decode endpoint available"
		}
	}
	if len(eps) == 0 {
		return "endpoint pool empty"
	}
	var down, draining, open int
	for _, e := range eps {
		switch {
		case !e.Healthy:
			down++
		case e.Draining:
			draining++
		case !e.Available:
			open++
		}
	}
	return fmt.Sprintf("no endpoint available (%d endpoints: %d down, %d draining, %d breaker-open)", len(eps), down, draining, open)
}

// destructiveEvents reports whether a rule consumes KV events that reading
// removes (the adapter's KV().Destructive: TensorRT-LLM's
// /kv_cache_events).
func destructiveEvents(r *rule.Rule) bool {
	if r.KVExactMode == 0 {
		return false
	}
	a, err := engines.For(engines.Kind(r.KVEngineType))
	return err == nil && a.KV() != nil && a.KV().Destructive
}

// trtConsumerConflict refuses a KV-exact rule on an engine whose events are
// drained when read (TensorRT-LLM) that would poll an endpoint another rule
// already polls: a second consumer would steal events from the first and
// both inventories would silently diverge from the engine.
func trtConsumerConflict(eff *rule.Rule, others []*rule.Rule) error {
	if !destructiveEvents(eff) {
		return nil
	}
	a := engines.MustFor(engines.Kind(eff.KVEngineType))
	polled := func(r *rule.Rule) map[string]bool {
		m := map[string]bool{}
		for _, e := range r.Endpoints {
			if r.KVExactMode == 1 && e.EPRole != 1 {
				continue
			}
			m[net.JoinHostPort(e.EndpointIP, strconv.Itoa(e.TargetPort))] = true
		}
		return m
	}
	mine := polled(eff)
	for _, o := range others {
		oe := o.Effective()
		if !destructiveEvents(oe) || oe.KVEngineType != eff.KVEngineType {
			continue
		}
		for addr := range polled(oe) {
			if mine[addr] {
				return &rule.AdmissionError{Code: "trtllm_event_consumer_conflict", Field: "endpoints", Conflict: true,
					Message: fmt.Sprintf("rule %q already polls %s KV events at %s; %s is drained when read, so only one rule may consume it (use one rule, or kvExactMode 0 here)", oe.Name, a.Display(), addr, a.KV().PollPath)}
			}
		}
	}
	return nil
}
