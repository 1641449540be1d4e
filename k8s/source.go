// Package k8s connects the gateway to a Kubernetes cluster: Source
// discovers a rule's endpoints (endpoints_from) from EndpointSlices or
// labelled pods through client-go informers. The gateway package consumes
// it through gateway.EndpointSource and imports no client-go.
package k8s

import (
	"context"
	"errors"
	"fmt"
	"net"
	"slices"
	"strconv"
	"strings"
	"sync"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"

	"github.com/llmgw/llmgw/gateway/rule"
)

// AnnotationKVEvents on a pod sets its endpoints' kvEventsEndpoint (e.g.
// "tcp://10.0.0.7:5557"); without it the rule's convention applies
// (tcp://<pod IP>:<kvZmqPort>).
const AnnotationKVEvents = "llmgw.io/kv-events-endpoint"

// Source implements gateway.EndpointSource over a clientset. Each Watch
// runs its own list and watch per kind, filtered to the rule's namespace
// and labels, so a gateway lists and watches only what its rules name.
// Close waits for every watch's goroutines after their contexts end.
type Source struct {
	cs     kubernetes.Interface
	dyn    dynamic.Interface // InferencePools; nil: endpoints_from.inference_pool is refused
	health *Health
	wg     sync.WaitGroup
}

// NewSource returns a Source reading through cs; h counts and logs its
// watches' losses (nil: a Health of its own logging to slog.Default()).
func NewSource(cs kubernetes.Interface, h *Health) *Source {
	if h == nil {
		h = NewHealth(nil)
	}
	return &Source{cs: cs, health: h}
}

// WithDynamic lets the source read InferencePool objects through dyn
// (NewSourceFromConfig does it). It returns s.
func (s *Source) WithDynamic(dyn dynamic.Interface) *Source {
	s.dyn = dyn
	return s
}

// Health is what counts and logs the source's watch losses.
func (s *Source) Health() *Health { return s.health }

// Wait blocks until the goroutines of every watch whose context has ended
// have stopped.
func (s *Source) Wait() { s.wg.Wait() }

// podSpec watches the pods of ns matching sel ("" every pod).
func (s *Source) podSpec(ns, sel string, attrs []any) watchSpec {
	pods := s.cs.CoreV1().Pods(ns)
	return watchSpec{resource: "pods", expected: &corev1.Pod{}, attrs: attrs,
		list: func(ctx context.Context, o metav1.ListOptions) (runtime.Object, error) {
			o.LabelSelector = sel
			return pods.List(ctx, o)
		},
		watch: func(ctx context.Context, o metav1.ListOptions) (watch.Interface, error) {
			o.LabelSelector = sel
			return pods.Watch(ctx, o)
		}}
}

// sliceSpec watches the EndpointSlices of Service svc in ns.
func (s *Source) sliceSpec(ns, svc string, attrs []any) watchSpec {
	sel := labels.SelectorFromSet(labels.Set{discoveryv1.LabelServiceName: svc}).String()
	sl := s.cs.DiscoveryV1().EndpointSlices(ns)
	return watchSpec{resource: "endpointslices", expected: &discoveryv1.EndpointSlice{}, attrs: attrs,
		list: func(ctx context.Context, o metav1.ListOptions) (runtime.Object, error) {
			o.LabelSelector = sel
			return sl.List(ctx, o)
		},
		watch: func(ctx context.Context, o metav1.ListOptions) (watch.Interface, error) {
			o.LabelSelector = sel
			return sl.Watch(ctx, o)
		}}
}

// Watch implements gateway.EndpointSource.
func (s *Source) Watch(ctx context.Context, from rule.EndpointsFrom, update func([]rule.Endpoint)) ([]rule.Endpoint, error) {
	if from.InferencePool != "" {
		return s.watchPool(ctx, from, update)
	}
	changed, kick := changeSignal()
	wctx, cancel := context.WithCancel(ctx)
	var run sync.WaitGroup
	var pods, sl *watched
	if from.Service != "" {
		attrs := []any{"namespace", from.Namespace, "service", from.Service}
		// Every pod of the namespace: an EndpointSlice's targetRef names
		// the pod whose annotation may set its KV-events address.
		pods = s.health.run(wctx, &run, s.podSpec(from.Namespace, "", attrs), kick)
		sl = s.health.run(wctx, &run, s.sliceSpec(from.Namespace, from.Service, attrs), kick)
	} else {
		sel := labels.SelectorFromSet(from.Selector).String()
		pods = s.health.run(wctx, &run, s.podSpec(from.Namespace, sel, []any{"namespace", from.Namespace, "selector", sel}), kick)
	}
	compute := func() []rule.Endpoint {
		if sl != nil {
			return fromSlices(sl.store.List(), pods.store, from)
		}
		return fromPods(pods.store.List(), from)
	}
	ws := []*watched{pods}
	if sl != nil {
		ws = append(ws, sl)
	}
	if !waitSynced(wctx, ws...) {
		cancel()
		run.Wait()
		return nil, ctx.Err()
	}
	cur := compute()
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		defer run.Wait()
		defer cancel()
		for {
			select {
			case <-wctx.Done():
				return
			case <-changed:
			}
			next := compute()
			if !slices.EqualFunc(cur, next, sameEndpoint) {
				cur = next
				update(slices.Clone(next))
			}
		}
	}()
	return slices.Clone(cur), nil
}

func sameEndpoint(a, b rule.Endpoint) bool {
	return a.ID == b.ID && a.EndpointIP == b.EndpointIP && a.TargetPort == b.TargetPort && a.KVEventsEndpoint == b.KVEventsEndpoint
}

// podReady is the readiness gate: a pod serves when it has an IP, is not
// being deleted and its Ready condition is True (the kubelet sets it from
// the readiness probe and the pod's readiness gates).
func podReady(p *corev1.Pod) bool {
	if p.Status.PodIP == "" || p.DeletionTimestamp != nil {
		return false
	}
	for _, c := range p.Status.Conditions {
		if c.Type == corev1.PodReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}

// fromPods lists the endpoints of ready pods, one per target port, sorted
// by id.
func fromPods(objs []any, from rule.EndpointsFrom) []rule.Endpoint {
	var out []rule.Endpoint
	for _, o := range objs {
		p, ok := o.(*corev1.Pod)
		if !ok || !podReady(p) {
			continue
		}
		for _, port := range from.TargetPorts {
			id := p.Name
			if len(from.TargetPorts) > 1 {
				id = p.Name + ":" + strconv.Itoa(port)
			}
			out = append(out, rule.Endpoint{ID: id, EndpointIP: p.Status.PodIP, TargetPort: port, KVEventsEndpoint: p.Annotations[AnnotationKVEvents]})
		}
	}
	slices.SortFunc(out, func(a, b rule.Endpoint) int { return cmpString(a.ID, b.ID) })
	return out
}

// fromSlices lists the ready addresses of a Service's EndpointSlices on the
// chosen port, sorted by id. An endpoint's pod (targetRef) names it and
// may carry the KV-events annotation; an address without a pod is named
// <ip>:<port>. EndpointSlices may list an address twice while they are
// being rebalanced: the first wins.
//
// A dual-stack Service has an IPv4 and an IPv6 slice listing the same
// pods: a pod is one endpoint, on its IPv4 address when it has one
// (preferIPv4), so a worker is counted, balanced and named once.
func fromSlices(objs []any, pods cache.Store, from rule.EndpointsFrom) []rule.Endpoint {
	var out []rule.Endpoint
	seen := map[string]int{} // id -> index in out
	for _, o := range objs {
		sl, ok := o.(*discoveryv1.EndpointSlice)
		if !ok {
			continue
		}
		port, ok := slicePort(sl, from.PortName)
		if !ok {
			continue
		}
		for _, e := range sl.Endpoints {
			// The API's contract: a nil ready condition means ready.
			if e.Conditions.Ready != nil && !*e.Conditions.Ready {
				continue
			}
			if e.Conditions.Terminating != nil && *e.Conditions.Terminating {
				continue
			}
			for _, addr := range e.Addresses {
				ep := rule.Endpoint{ID: rule.EndpointID(addr, port), EndpointIP: addr, TargetPort: port}
				if ref := e.TargetRef; ref != nil && ref.Kind == "Pod" {
					if len(e.Addresses) == 1 {
						ep.ID = ref.Name
					}
					if po, ok, _ := pods.GetByKey(sl.Namespace + "/" + ref.Name); ok {
						ep.KVEventsEndpoint = po.(*corev1.Pod).Annotations[AnnotationKVEvents]
					}
				}
				if i, dup := seen[ep.ID]; dup {
					if preferIPv4(out[i].EndpointIP, addr) {
						out[i] = ep
					}
					continue
				}
				seen[ep.ID] = len(out)
				out = append(out, ep)
			}
		}
	}
	slices.SortFunc(out, func(a, b rule.Endpoint) int { return cmpString(a.ID, b.ID) })
	return out
}

// preferIPv4 says whether next replaces have for one pod: only an IPv4
// address replaces an IPv6 one, so the pick does not depend on the order
// the slices are listed in.
func preferIPv4(have, next string) bool {
	h, n := net.ParseIP(have), net.ParseIP(next)
	return h != nil && n != nil && h.To4() == nil && n.To4() != nil
}

// slicePort picks the EndpointSlice port named name, or its only port.
func slicePort(sl *discoveryv1.EndpointSlice, name string) (int, bool) {
	var found []int
	for _, p := range sl.Ports {
		if p.Port == nil {
			continue
		}
		pn := ""
		if p.Name != nil {
			pn = *p.Name
		}
		if name == "" || pn == name {
			found = append(found, int(*p.Port))
		}
	}
	if len(found) != 1 {
		return 0, false
	}
	return found[0], true
}

func cmpString(a, b string) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}

// Resolve returns the endpoint set of from once, as a rule's watch would
// start with it (llmgw runbook converged --endpoints-from uses it).
func Resolve(ctx context.Context, cs kubernetes.Interface, from rule.EndpointsFrom) ([]rule.Endpoint, error) {
	s := NewSource(cs, nil)
	wctx, cancel := context.WithCancel(ctx)
	defer s.Wait()
	defer cancel()
	return s.Watch(wctx, from, func([]rule.Endpoint) {})
}

// ParseServiceRef parses "kubernetes:NAMESPACE/SERVICE" into the
// endpoints_from of that Service's EndpointSlices, checked as admission
// checks a rule's.
func ParseServiceRef(s string) (rule.EndpointsFrom, error) {
	ref, ok := strings.CutPrefix(s, "kubernetes:")
	ns, svc, ok2 := strings.Cut(ref, "/")
	if !ok || !ok2 {
		return rule.EndpointsFrom{}, fmt.Errorf("k8s: %q: want kubernetes:NAMESPACE/SERVICE", s)
	}
	from := rule.EndpointsFrom{Namespace: ns, Service: svc}
	if err := rule.Admit(&rule.Rule{Name: "check", EndpointsFrom: &from}, nil, nil); err != nil {
		var adm *rule.AdmissionError
		if errors.As(err, &adm) {
			return rule.EndpointsFrom{}, fmt.Errorf("k8s: %q: %s", s, adm.Message)
		}
		return rule.EndpointsFrom{}, fmt.Errorf("k8s: %q: %w", s, err)
	}
	return from, nil
}

// changeSignal returns a channel of capacity one and a store callback that
// signals it without blocking: changes that come while one is pending
// coalesce into it, and the reader recomputes from the stores.
func changeSignal() (<-chan struct{}, func([]string)) {
	changed := make(chan struct{}, 1)
	return changed, func([]string) {
		select {
		case changed <- struct{}{}:
		default:
		}
	}
}
