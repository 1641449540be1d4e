package gateway

import (
	"context"
	"fmt"
	"slices"

	"github.com/llmgw/llmgw/gateway/rule"
)

// EndpointSource discovers the endpoints of rules that carry endpoints_from
// (package k8s implements it over client-go informers). The gateway itself
// knows nothing of where the endpoints come from.
type EndpointSource interface {
	// Watch returns the current endpoint set of from once the source has
	// synced, then calls update with each new set until ctx ends. update
	// runs on the source's goroutine and may be called before Watch
	// returns (the gateway keeps such a set until the rule is installed);
	// it is not called after ctx ends and Watch's goroutines have stopped,
	// and calls are not concurrent. Endpoints carry at least id,
	// endpointIP and targetPort.
	Watch(ctx context.Context, from rule.EndpointsFrom, update func([]rule.Endpoint)) ([]rule.Endpoint, error)
}

// epWatch is a discovered rule's live watch: the rule as the operator wrote
// it (endpoints_from, no endpoints) and the cancel of its source watch.
type epWatch struct {
	written *rule.Rule
	ctx     context.Context // ends when the watch is replaced, deleted or the server closes
	cancel  context.CancelFunc
	// emptied: the last set was empty and the endpoints were drained for
	// it; the next non-empty set undrains what it installs.
	emptied bool
	// pending is a set that arrived before the watch was registered (its
	// rule not yet installed); registration applies it.
	pending *[]rule.Endpoint
}

// discovered returns the rule written with eps as its endpoints, and the
// same rule with endpoints_from dropped, which is what the discovered set
// is admitted as: the rule written statically.
func discovered(written *rule.Rule, eps []rule.Endpoint) (run, static *rule.Rule) {
	run = written.Clone()
	run.Endpoints = slices.Clone(eps)
	static = run.Clone()
	static.EndpointsFrom = nil
	return run, static
}

// startWatch resolves a discovered rule's current endpoints and starts
// following them. It runs without s.mu: the source's first sync may take a
// while, and its updates take s.mu.
func (s *Server) startWatch(written *rule.Rule) (*epWatch, []rule.Endpoint, error) {
	if s.cfg.EndpointSource == nil {
		return nil, nil, &rule.AdmissionError{Code: rule.CodeEndpointsFrom, Field: "endpoints_from",
			Message: "this server has no endpoint source; start llmgw serve with --endpoints-source kubernetes, or list the endpoints"}
	}
	ctx, cancel := context.WithCancel(s.ctx)
	w := &epWatch{written: written.Clone(), ctx: ctx, cancel: cancel}
	eps, err := s.cfg.EndpointSource.Watch(ctx, *written.EndpointsFrom, func(eps []rule.Endpoint) {
		s.refreshEndpoints(w, eps)
	})
	if err != nil {
		cancel()
		return nil, nil, fmt.Errorf("gateway: rule %q: endpoints_from: %w", written.Name, err)
	}
	if len(eps) == 0 {
		cancel()
		return nil, nil, &rule.AdmissionError{Code: rule.CodeNoReadyEndpoint, Field: "endpoints_from",
			Message: "discovery found no ready endpoint; apply the rule again once a pod is ready (--rules-from kubernetes does so by itself)"}
	}
	return w, eps, nil
}

// refreshEndpoints installs a new discovered set for w's rule. The set is
// admitted as the rule written statically; a set that fails admission is
// logged and the previous set keeps serving. An empty set drains the
// previous endpoints instead of removing the rule.
func (s *Server) refreshEndpoints(w *epWatch, eps []rule.Endpoint) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if w.ctx.Err() != nil {
		return // replaced, deleted or shut down meanwhile
	}
	if s.watches[w.written.Name] != w {
		w.pending = &eps // not registered yet: registerWatchLocked applies it
		return
	}
	s.refreshLocked(w, eps)
}

// registerWatchLocked makes w its rule's watch, ending the one it
// replaces, and applies a set that arrived meanwhile. Caller holds s.mu and
// has installed the rule.
func (s *Server) registerWatchLocked(w *epWatch) {
	name := w.written.Name
	if old := s.watches[name]; old != nil && old != w {
		old.cancel()
	}
	s.watches[name] = w
	if p := w.pending; p != nil {
		w.pending = nil
		s.refreshLocked(w, *p)
	}
}

// refreshLocked installs eps for w's rule. Caller holds s.mu.
func (s *Server) refreshLocked(w *epWatch, eps []rule.Endpoint) {
	name := w.written.Name
	rt := s.rules[name]
	if rt == nil {
		return
	}
	if len(eps) == 0 {
		for _, ep := range rt.eps {
			ep.SetDraining(true)
		}
		w.emptied = true
		s.log.Warn("discovered endpoint set is empty; previous endpoints drained", "rule", name)
		return
	}
	run, static := discovered(w.written, eps)
	others := make([]*rule.Rule, 0, len(s.rules))
	for n, o := range s.rules {
		if n != name {
			others = append(others, o.rule)
		}
	}
	if err := rule.Admit(static, rt.rule, others); err != nil {
		s.log.Error("discovered endpoints refused; previous set kept", "rule", name, "err", err)
		return
	}
	if err := s.installLocked(run); err != nil {
		s.log.Error("discovered endpoints not installed; previous set kept", "rule", name, "err", err)
		return
	}
	if w.emptied {
		for _, ep := range s.rules[name].eps {
			ep.SetDraining(false)
		}
		w.emptied = false
	}
	s.publishLocked()
	s.log.Info("discovered endpoints changed", "rule", name, "endpoints", len(eps))
}

// stopWatchLocked ends rule name's watch, if any. Caller holds s.mu.
func (s *Server) stopWatchLocked(name string) {
	if w := s.watches[name]; w != nil {
		w.cancel()
		delete(s.watches, name)
	}
}
