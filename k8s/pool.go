package k8s

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"sync"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/watch"

	"github.com/llmgw/llmgw/gateway/rule"
)

// InferencePoolResource is the Gateway API Inference Extension's
// InferencePool, at the version GIE ships as its stable API
// (kubernetes-sigs/gateway-api-inference-extension v1.6.0, 992e5c2:
// api/v1/inferencepool_types.go and
// config/crd/bases/inference.networking.k8s.io_inferencepools.yaml; the
// CRD is copied to k8s/testdata/gie for the tests). Only spec.selector
// (matchLabels) and spec.targetPorts[].number are read; the endpoint
// picker reference (endpointPickerRef) is not: llmgw picks endpoints
// itself.
var InferencePoolResource = schema.GroupVersionResource{Group: "inference.networking.k8s.io", Version: "v1", Resource: "inferencepools"}

// poolSpec is what an InferencePool says of its members.
type poolSpec struct {
	selector map[string]string
	ports    []int
}

// readPool reads spec.selector.matchLabels and spec.targetPorts[].number;
// ok is false when the object has no usable selector or port (the CRD
// requires both, so only a newer, different shape gets here).
func readPool(u *unstructured.Unstructured) (poolSpec, bool) {
	sel, _, _ := unstructured.NestedStringMap(u.Object, "spec", "selector", "matchLabels")
	tps, _, _ := unstructured.NestedSlice(u.Object, "spec", "targetPorts")
	var ports []int
	for _, tp := range tps {
		m, _ := tp.(map[string]any)
		if n, ok := m["number"].(int64); ok && n >= 1 && n <= 65535 {
			ports = append(ports, int(n))
		}
	}
	return poolSpec{selector: sel, ports: ports}, len(sel) > 0 && len(ports) > 0
}

// watchPool follows an InferencePool and the pods its selector names: a
// change of the pool's selector starts a pod watch for the new one, a
// change of its ports re-derives the set, and a pool that does not exist
// (yet, or any more) gives an empty set.
func (s *Source) watchPool(ctx context.Context, from rule.EndpointsFrom, update func([]rule.Endpoint)) ([]rule.Endpoint, error) {
	if s.dyn == nil {
		return nil, &rule.AdmissionError{Code: rule.CodeEndpointsFrom, Field: "endpoints_from.inference_pool",
			Message: "this endpoint source has no dynamic client to read InferencePools (k8s.NewSourceFromConfig gives it one)"}
	}
	changed, kick := changeSignal()
	wctx, cancel := context.WithCancel(ctx)
	var run sync.WaitGroup
	attrs := []any{"namespace", from.Namespace, "inference_pool", from.InferencePool}
	pools := s.dyn.Resource(InferencePoolResource).Namespace(from.Namespace)
	byName := fields.OneTermEqualSelector("metadata.name", from.InferencePool).String()
	pool := s.health.run(wctx, &run, watchSpec{resource: "inferencepools", expected: &unstructured.Unstructured{}, attrs: attrs,
		list: func(ctx context.Context, o metav1.ListOptions) (runtime.Object, error) {
			o.FieldSelector = byName
			return pools.List(ctx, o)
		},
		watch: func(ctx context.Context, o metav1.ListOptions) (watch.Interface, error) {
			o.FieldSelector = byName
			return pools.Watch(ctx, o)
		}}, kick)

	// The pod watch of the pool's current selector, replaced when it
	// changes.
	var pods *watched
	var podSel map[string]string
	var podCancel context.CancelFunc
	var podRun sync.WaitGroup
	stopPods := func() {
		if podCancel != nil {
			podCancel()
			podRun.Wait()
			pods, podSel, podCancel = nil, nil, nil
		}
	}
	// compute brings the pod watch in line with the pool and returns the
	// set; false when ctx ended while a new pod watch synced.
	compute := func() ([]rule.Endpoint, bool) {
		obj, ok, _ := pool.store.GetByKey(from.Namespace + "/" + from.InferencePool)
		var spec poolSpec
		if ok {
			if spec, ok = readPool(obj.(*unstructured.Unstructured)); !ok {
				s.health.log.Warn("InferencePool without spec.selector.matchLabels or spec.targetPorts; no endpoints", attrs...)
			}
		}
		if !ok {
			stopPods()
			return nil, true
		}
		if pods == nil || !maps.Equal(podSel, spec.selector) {
			stopPods()
			pctx, pcancel := context.WithCancel(wctx)
			sel := labels.SelectorFromSet(spec.selector).String()
			pods = s.health.run(pctx, &podRun, s.podSpec(from.Namespace, sel, append(slices.Clone(attrs), "selector", sel)), kick)
			podSel, podCancel = spec.selector, pcancel
			if !waitSynced(wctx, pods) {
				return nil, false
			}
		}
		return fromPods(pods.store.List(), rule.EndpointsFrom{Namespace: from.Namespace, TargetPorts: spec.ports}), true
	}
	fail := func() ([]rule.Endpoint, error) {
		cancel()
		stopPods()
		run.Wait()
		return nil, fmt.Errorf("k8s: InferencePool %s/%s: %w", from.Namespace, from.InferencePool, ctx.Err())
	}
	if !waitSynced(wctx, pool) {
		return fail()
	}
	cur, ok := compute()
	if !ok {
		return fail()
	}
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		defer run.Wait()
		defer stopPods()
		defer cancel()
		for {
			select {
			case <-wctx.Done():
				return
			case <-changed:
			}
			next, ok := compute()
			if !ok {
				return
			}
			if !slices.EqualFunc(cur, next, sameEndpoint) {
				cur = next
				update(slices.Clone(next))
			}
		}
	}()
	return slices.Clone(cur), nil
}
