package k8s

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"reflect"
	"sync"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/util/workqueue"

	"github.com/llmgw/llmgw/gateway"
	"github.com/llmgw/llmgw/gateway/rule"
)

// RuleResource is the Rule custom resource (deploy/helm/llmgw/crds): spec
// is an llmgw rule without its name, the object's name is the rule's name.
// A CRD rather than a ConfigMap: each rule is its own object with its own
// status subresource (the admission verdict and the effective read-back),
// RBAC can grant rules apart from other configuration, and kubectl get
// rules lists them.
var RuleResource = schema.GroupVersionResource{Group: "llmgw.io", Version: "v1alpha1", Resource: "rules"}

// ConditionAccepted is the status condition saying whether the gateway
// admitted the rule's current generation.
const ConditionAccepted = "Accepted"

// RuleGateway is what RuleSync drives: *gateway.Server.
type RuleGateway interface {
	Apply(r *rule.Rule, create bool) (*rule.Rule, error)
	Delete(name string, drain time.Duration) (int64, error)
	Rules() []*gateway.RuleStatus
}

// RuleSync applies the Rule objects of one namespace to a gateway, with the
// gateway's own strict admission, and writes each verdict and effective
// rule to the object's status. A rule deleted from the cluster is deleted
// from the gateway; at start, rules the gateway holds that the cluster does
// not are deleted too (the cluster is the source of truth).
//
// A verdict is final for the object's current spec: a rule the gateway
// refuses is not tried again until the object changes, except that a rule
// refused because discovery found no ready endpoint (no_ready_endpoint)
// waits on its endpoints_from and is applied again as soon as the set is
// not empty. Only failures that are not the rule's (the API server or the
// gateway could not be reached, a listener could not bind) are retried,
// with a rate-limited backoff.
type RuleSync struct {
	dyn       dynamic.Interface
	namespace string
	gw        RuleGateway
	src       gateway.EndpointSource
	health    *Health
	log       *slog.Logger
	// Drain is how long a deleted rule's in-flight requests may finish.
	Drain time.Duration

	q       workqueue.TypedRateLimitingInterface[string]
	ctx     context.Context
	wg      sync.WaitGroup // waiters
	mu      sync.Mutex
	waiting map[string]*waiter
}

// waiter is a rule waiting for its first ready endpoint.
type waiter struct {
	from   rule.EndpointsFrom
	cancel context.CancelFunc
}

// NewRuleSync returns a RuleSync for namespace. src is the endpoint source
// the gateway discovers with (nil when it has none), which a rule waiting
// for its first ready endpoint watches; h counts and logs the loss of the
// Rule watch (nil: a Health of its own).
func NewRuleSync(dyn dynamic.Interface, namespace string, gw RuleGateway, src gateway.EndpointSource, h *Health, log *slog.Logger) *RuleSync {
	if log == nil {
		log = slog.Default()
	}
	if h == nil {
		h = NewHealth(log)
	}
	return &RuleSync{dyn: dyn, namespace: namespace, gw: gw, src: src, health: h, log: log, Drain: 10 * time.Second, waiting: map[string]*waiter{}}
}

// Run syncs until ctx ends. It returns once the Rule objects are listed
// and the gateway holds the cluster's rules (each applied once), leaving a
// goroutine that follows changes; wg is done when it has stopped.
func (s *RuleSync) Run(ctx context.Context, wg *sync.WaitGroup) error {
	s.q = workqueue.NewTypedRateLimitingQueue(workqueue.NewTypedItemExponentialFailureRateLimiter[string](500*time.Millisecond, 30*time.Second))
	ictx, cancel := context.WithCancel(ctx)
	s.ctx = ictx
	var run sync.WaitGroup
	rules := s.dyn.Resource(RuleResource).Namespace(s.namespace)
	w := s.health.run(ictx, &run, watchSpec{resource: "rules", expected: &unstructured.Unstructured{}, attrs: []any{"namespace", s.namespace},
		list: func(ctx context.Context, o metav1.ListOptions) (runtime.Object, error) { return rules.List(ctx, o) },
		watch: func(ctx context.Context, o metav1.ListOptions) (watch.Interface, error) {
			return rules.Watch(ctx, o)
		},
	}, func(keys []string) {
		for _, k := range keys {
			s.q.Add(k)
		}
	})
	stop := func() {
		cancel()
		s.q.ShutDown()
		run.Wait()
		s.wg.Wait()
	}
	if !waitSynced(ictx, w) {
		stop()
		return ctx.Err()
	}
	// The cluster is the source of truth: rules the gateway kept on disk
	// that no longer exist as objects go.
	for _, st := range s.gw.Rules() {
		if _, ok, _ := w.store.GetByKey(s.namespace + "/" + st.Rule.Name); !ok {
			if _, err := s.gw.Delete(st.Rule.Name, 0); err != nil && !errors.Is(err, gateway.ErrRuleNotFound) {
				s.log.Error("deleting a rule not in the cluster", "rule", st.Rule.Name, "err", err)
			}
		}
	}
	// Apply what is there before returning, so a replica is ready with the
	// cluster's rules.
	for s.q.Len() > 0 {
		s.next(ctx, w.store)
	}
	run.Add(1)
	go func() { defer run.Done(); <-ictx.Done(); s.q.ShutDown() }()
	wg.Add(1)
	go func() {
		defer wg.Done()
		defer stop()
		for s.next(ctx, w.store) {
		}
	}()
	return nil
}

// next handles one queued key; false when the queue has shut down.
func (s *RuleSync) next(ctx context.Context, store cache.Store) bool {
	key, shutdown := s.q.Get()
	if shutdown {
		return false
	}
	defer s.q.Done(key)
	if err := s.sync(ctx, key, store); err != nil {
		s.log.Warn("rule sync failed; retrying", "rule", key, "err", err)
		s.q.AddRateLimited(key)
		return true
	}
	s.q.Forget(key)
	return true
}

// sync brings the gateway's rule for key in line with the object.
func (s *RuleSync) sync(ctx context.Context, key string, store cache.Store) error {
	_, name, err := cache.SplitMetaNamespaceKey(key)
	if err != nil {
		return nil
	}
	obj, ok, err := store.GetByKey(key)
	if err != nil {
		return err
	}
	if !ok {
		s.stopWaiting(key)
		if _, err := s.gw.Delete(name, s.Drain); err != nil && !errors.Is(err, gateway.ErrRuleNotFound) {
			return err
		}
		return nil
	}
	u := obj.(*unstructured.Unstructured)
	written, eff, applyErr := s.apply(u)
	if errors.Is(applyErr, &rule.AdmissionError{Code: rule.CodeNoReadyEndpoint}) && written != nil && written.EndpointsFrom != nil {
		s.waitFor(key, *written.EndpointsFrom)
	} else {
		s.stopWaiting(key)
	}
	if err := s.writeStatus(ctx, u, eff, applyErr); err != nil {
		return err
	}
	var adm *rule.AdmissionError
	var fe *rule.FieldError
	if applyErr != nil && !errors.As(applyErr, &adm) && !errors.As(applyErr, &fe) && !errors.Is(applyErr, rule.ErrSyntax) {
		return applyErr // not the rule's fault: try again
	}
	return nil // applied, or refused until the object (or, waiting, its endpoints) change
}

// waitFor watches from until it has a ready endpoint, then queues key
// again. A waiter for the same endpoints_from is kept.
func (s *RuleSync) waitFor(key string, from rule.EndpointsFrom) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if w := s.waiting[key]; w != nil {
		if reflect.DeepEqual(w.from, from) {
			return
		}
		w.cancel()
	}
	if s.src == nil {
		s.log.Error("rule waits for a ready endpoint, but this rule sync has no endpoint source to watch; it is applied again only when the object changes", "rule", key)
		return
	}
	ctx, cancel := context.WithCancel(s.ctx)
	s.waiting[key] = &waiter{from: from, cancel: cancel}
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		eps, err := s.src.Watch(ctx, from, func(eps []rule.Endpoint) {
			if len(eps) > 0 {
				s.q.Add(key)
			}
		})
		if err != nil {
			if ctx.Err() == nil {
				s.log.Error("watching a waiting rule's endpoints", "rule", key, "err", err)
			}
			return
		}
		if len(eps) > 0 {
			s.q.Add(key) // ready between the gateway's look and ours
		}
	}()
}

// stopWaiting ends key's waiter, if any.
func (s *RuleSync) stopWaiting(key string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if w := s.waiting[key]; w != nil {
		w.cancel()
		delete(s.waiting, key)
	}
}

// apply decodes the object's spec with the gateway's strict decoder and
// applies it. The rule's name is the object's name. It returns the decoded
// rule (nil when it does not decode) and the effective one.
func (s *RuleSync) apply(u *unstructured.Unstructured) (written, eff *rule.Rule, err error) {
	spec, ok := u.Object["spec"].(map[string]any)
	if !ok {
		return nil, nil, &rule.FieldError{Path: "spec", Message: "missing; a Rule needs a spec"}
	}
	if n, has := spec["name"]; has && n != u.GetName() {
		return nil, nil, &rule.FieldError{Path: "spec.name", Message: fmt.Sprintf("%v differs from metadata.name %q; leave it out (the object's name is the rule's name)", n, u.GetName())}
	}
	body := make(map[string]any, len(spec)+1)
	for k, v := range spec {
		body[k] = v
	}
	body["name"] = u.GetName()
	js, err := json.Marshal(body)
	if err != nil {
		return nil, nil, err
	}
	r, err := rule.Decode(js)
	if err != nil {
		return nil, nil, err
	}
	eff, err = s.gw.Apply(r, false)
	return r, eff, err
}

// writeStatus records the verdict on the object's status subresource when
// it changed (a status write is itself an update event).
func (s *RuleSync) writeStatus(ctx context.Context, u *unstructured.Unstructured, eff *rule.Rule, applyErr error) error {
	cond := map[string]any{"type": ConditionAccepted, "status": "True", "reason": "Admitted", "message": "applied", "observedGeneration": u.GetGeneration()}
	status := map[string]any{"observedGeneration": u.GetGeneration()}
	if applyErr != nil {
		reason := "Invalid"
		var adm *rule.AdmissionError
		if errors.As(applyErr, &adm) {
			reason = adm.Code
		}
		cond["status"], cond["reason"], cond["message"] = "False", reason, applyErr.Error()
	} else {
		b, err := json.Marshal(eff)
		if err != nil {
			return err
		}
		var m map[string]any
		if err := json.Unmarshal(b, &m); err != nil {
			return err
		}
		if eff.EndpointsFrom != nil {
			// The discovered set changes without the object changing;
			// the admin API's read-back has the current one.
			delete(m, "endpoints")
		}
		status["effective"] = m
	}
	old, _, _ := unstructured.NestedMap(u.Object, "status")
	oldConds, _, _ := unstructured.NestedSlice(u.Object, "status", "conditions")
	cond["lastTransitionTime"] = metav1.Now().UTC().Format(time.RFC3339)
	if len(oldConds) == 1 {
		if oc, ok := oldConds[0].(map[string]any); ok && oc["status"] == cond["status"] && oc["reason"] == cond["reason"] {
			cond["lastTransitionTime"] = oc["lastTransitionTime"]
		}
	}
	status["conditions"] = []any{cond}
	if sameJSON(old, status) {
		return nil
	}
	patch, err := json.Marshal(map[string]any{"status": status})
	if err != nil {
		return err
	}
	_, err = s.dyn.Resource(RuleResource).Namespace(u.GetNamespace()).Patch(ctx, u.GetName(), types.MergePatchType, patch, metav1.PatchOptions{}, "status")
	if apierrors.IsNotFound(err) {
		return nil // deleted meanwhile; the delete event follows
	}
	return err
}

// sameJSON compares two values as their JSON forms (numbers from the API
// are int64, ours may be int).
func sameJSON(a, b any) bool {
	ja, err1 := json.Marshal(a)
	jb, err2 := json.Marshal(b)
	if err1 != nil || err2 != nil {
		return false
	}
	var va, vb any
	_ = json.Unmarshal(ja, &va)
	_ = json.Unmarshal(jb, &vb)
	return reflect.DeepEqual(va, vb)
}
