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
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/dynamic/dynamicinformer"
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
type RuleSync struct {
	dyn       dynamic.Interface
	namespace string
	gw        RuleGateway
	log       *slog.Logger
	// Drain is how long a deleted rule's in-flight requests may finish.
	Drain time.Duration
}

// NewRuleSync returns a RuleSync for namespace.
func NewRuleSync(dyn dynamic.Interface, namespace string, gw RuleGateway, log *slog.Logger) *RuleSync {
	if log == nil {
		log = slog.Default()
	}
	return &RuleSync{dyn: dyn, namespace: namespace, gw: gw, log: log, Drain: 10 * time.Second}
}

// Run syncs until ctx ends. It returns once the informer has synced and
// the gateway holds the cluster's rules (each applied once), leaving a
// goroutine that follows changes; wg is done when it has stopped.
func (s *RuleSync) Run(ctx context.Context, wg *sync.WaitGroup) error {
	f := dynamicinformer.NewFilteredDynamicSharedInformerFactory(s.dyn, 0, s.namespace, nil)
	inf := f.ForResource(RuleResource).Informer()
	q := workqueue.NewTypedRateLimitingQueue(workqueue.NewTypedItemExponentialFailureRateLimiter[string](500*time.Millisecond, 30*time.Second))
	enqueue := func(obj any) {
		if k, err := cache.DeletionHandlingMetaNamespaceKeyFunc(obj); err == nil {
			q.Add(k)
		}
	}
	if _, err := inf.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc: enqueue, UpdateFunc: func(_, o any) { enqueue(o) }, DeleteFunc: enqueue,
	}); err != nil {
		return fmt.Errorf("k8s: rule handler: %w", err)
	}
	ictx, cancel := context.WithCancel(ctx)
	var run sync.WaitGroup
	run.Add(1)
	go func() { defer run.Done(); inf.RunWithContext(ictx) }()
	stop := func() { cancel(); q.ShutDown(); run.Wait() }
	if !cache.WaitForCacheSync(ictx.Done(), inf.HasSynced) {
		stop()
		if err := ctx.Err(); err != nil {
			return err
		}
		return errors.New("k8s: rule informer did not sync")
	}
	// The cluster is the source of truth: rules the gateway kept on disk
	// that no longer exist as objects go.
	for _, st := range s.gw.Rules() {
		if _, ok, _ := inf.GetStore().GetByKey(s.namespace + "/" + st.Rule.Name); !ok {
			if _, err := s.gw.Delete(st.Rule.Name, 0); err != nil && !errors.Is(err, gateway.ErrRuleNotFound) {
				s.log.Error("deleting a rule not in the cluster", "rule", st.Rule.Name, "err", err)
			}
		}
	}
	// Apply what is there before returning, so a replica is ready with the
	// cluster's rules.
	for q.Len() > 0 {
		s.next(ctx, q, inf.GetStore())
	}
	run.Add(1)
	go func() { defer run.Done(); <-ictx.Done(); q.ShutDown() }()
	wg.Add(1)
	go func() {
		defer wg.Done()
		defer stop()
		for s.next(ctx, q, inf.GetStore()) {
		}
	}()
	return nil
}

// next handles one queued key; false when the queue has shut down.
func (s *RuleSync) next(ctx context.Context, q workqueue.TypedRateLimitingInterface[string], store cache.Store) bool {
	key, shutdown := q.Get()
	if shutdown {
		return false
	}
	defer q.Done(key)
	if err := s.sync(ctx, key, store); err != nil {
		s.log.Warn("rule sync failed; retrying", "rule", key, "err", err)
		q.AddRateLimited(key)
		return true
	}
	q.Forget(key)
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
		if _, err := s.gw.Delete(name, s.Drain); err != nil && !errors.Is(err, gateway.ErrRuleNotFound) {
			return err
		}
		return nil
	}
	u := obj.(*unstructured.Unstructured)
	eff, applyErr := s.apply(u)
	if err := s.writeStatus(ctx, u, eff, applyErr); err != nil {
		return err
	}
	var adm *rule.AdmissionError
	var fe *rule.FieldError
	if applyErr != nil && !errors.As(applyErr, &adm) && !errors.As(applyErr, &fe) && !errors.Is(applyErr, rule.ErrSyntax) {
		return applyErr // not the rule's fault: try again
	}
	if adm != nil && adm.Code == rule.CodeEndpointsFrom {
		return applyErr // discovery may find endpoints later
	}
	return nil
}

// apply decodes the object's spec with the gateway's strict decoder and
// applies it. The rule's name is the object's name.
func (s *RuleSync) apply(u *unstructured.Unstructured) (*rule.Rule, error) {
	spec, ok := u.Object["spec"].(map[string]any)
	if !ok {
		return nil, &rule.FieldError{Path: "spec", Message: "missing; a Rule needs a spec"}
	}
	if n, has := spec["name"]; has && n != u.GetName() {
		return nil, &rule.FieldError{Path: "spec.name", Message: fmt.Sprintf("%v differs from metadata.name %q; leave it out (the object's name is the rule's name)", n, u.GetName())}
	}
	body := make(map[string]any, len(spec)+1)
	for k, v := range spec {
		body[k] = v
	}
	body["name"] = u.GetName()
	js, err := json.Marshal(body)
	if err != nil {
		return nil, err
	}
	r, err := rule.Decode(js)
	if err != nil {
		return nil, err
	}
	return s.gw.Apply(r, false)
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
