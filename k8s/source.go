// Package k8s connects the gateway to a Kubernetes cluster: Source
// discovers a rule's endpoints (endpoints_from) from EndpointSlices or
// labelled pods through client-go informers. The gateway package consumes
// it through gateway.EndpointSource and imports no client-go.
package k8s

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"

	"github.com/llmgw/llmgw/gateway/rule"
)

// AnnotationKVEvents on a pod sets its endpoints' kvEventsEndpoint (e.g.
// "tcp://10.0.0.7:5557"); without it the rule's convention applies
// (tcp://<pod IP>:<kvZmqPort>).
const AnnotationKVEvents = "llmgw.io/kv-events-endpoint"

// Source implements gateway.EndpointSource over a clientset. Each Watch runs
// its own informers, filtered to the rule's namespace and labels, so a
// gateway lists and watches only what its rules name. Close waits for every
// watch's goroutines after their contexts end.
type Source struct {
	cs kubernetes.Interface
	wg sync.WaitGroup
}

// NewSource returns a Source reading through cs.
func NewSource(cs kubernetes.Interface) *Source { return &Source{cs: cs} }

// Wait blocks until the goroutines of every watch whose context has ended
// have stopped.
func (s *Source) Wait() { s.wg.Wait() }

// Watch implements gateway.EndpointSource.
func (s *Source) Watch(ctx context.Context, from rule.EndpointsFrom, update func([]rule.Endpoint)) ([]rule.Endpoint, error) {
	filtered := func(sel string) informers.SharedInformerFactory {
		return informers.NewSharedInformerFactoryWithOptions(s.cs, 0, informers.WithNamespace(from.Namespace),
			informers.WithTweakListOptions(func(o *metav1.ListOptions) { o.LabelSelector = sel }))
	}
	var podInf, sliceInf cache.SharedIndexInformer
	if from.Service != "" {
		// Every pod of the namespace: an EndpointSlice's targetRef names
		// the pod whose annotation may set its KV-events address.
		podInf = filtered("").Core().V1().Pods().Informer()
		sliceInf = filtered(labels.SelectorFromSet(labels.Set{discoveryv1.LabelServiceName: from.Service}).String()).Discovery().V1().EndpointSlices().Informer()
	} else {
		podInf = filtered(labels.SelectorFromSet(from.Selector).String()).Core().V1().Pods().Informer()
	}
	changed := make(chan struct{}, 1)
	kick := func() {
		select {
		case changed <- struct{}{}:
		default:
		}
	}
	h := cache.ResourceEventHandlerFuncs{
		AddFunc:    func(any) { kick() },
		UpdateFunc: func(any, any) { kick() },
		DeleteFunc: func(any) { kick() },
	}
	if _, err := podInf.AddEventHandler(h); err != nil {
		return nil, fmt.Errorf("k8s: pod handler: %w", err)
	}
	if sliceInf != nil {
		if _, err := sliceInf.AddEventHandler(h); err != nil {
			return nil, fmt.Errorf("k8s: EndpointSlice handler: %w", err)
		}
	}
	wctx, cancel := context.WithCancel(ctx)
	var run sync.WaitGroup
	run.Add(1)
	go func() { defer run.Done(); podInf.RunWithContext(wctx) }()
	synced := []cache.InformerSynced{podInf.HasSynced}
	if sliceInf != nil {
		run.Add(1)
		go func() { defer run.Done(); sliceInf.RunWithContext(wctx) }()
		synced = append(synced, sliceInf.HasSynced)
	}
	compute := func() []rule.Endpoint {
		if sliceInf != nil {
			return fromSlices(sliceInf.GetStore().List(), podInf.GetStore(), from)
		}
		return fromPods(podInf.GetStore().List(), from)
	}
	if !cache.WaitForCacheSync(wctx.Done(), synced...) {
		cancel()
		run.Wait()
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		return nil, errors.New("k8s: informers did not sync")
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
func fromSlices(objs []any, pods cache.Store, from rule.EndpointsFrom) []rule.Endpoint {
	var out []rule.Endpoint
	seen := map[string]bool{}
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
				key := addr + ":" + strconv.Itoa(port)
				if seen[key] {
					continue
				}
				seen[key] = true
				ep := rule.Endpoint{ID: key, EndpointIP: addr, TargetPort: port}
				if ref := e.TargetRef; ref != nil && ref.Kind == "Pod" {
					if len(e.Addresses) == 1 {
						ep.ID = ref.Name
					}
					if po, ok, _ := pods.GetByKey(sl.Namespace + "/" + ref.Name); ok {
						ep.KVEventsEndpoint = po.(*corev1.Pod).Annotations[AnnotationKVEvents]
					}
				}
				out = append(out, ep)
			}
		}
	}
	slices.SortFunc(out, func(a, b rule.Endpoint) int { return cmpString(a.ID, b.ID) })
	return out
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
	s := NewSource(cs)
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
