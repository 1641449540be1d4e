package k8s_test

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/llmgw/llmgw/engines"
	"github.com/llmgw/llmgw/engines/sim"
	"github.com/llmgw/llmgw/gateway"
	"github.com/llmgw/llmgw/gateway/rule"
	"github.com/llmgw/llmgw/internal/k8stest"
	"github.com/llmgw/llmgw/internal/wait"
	"github.com/llmgw/llmgw/k8s"
)

// TestCluster runs every test that needs the real API server against one
// control plane (starting it takes tens of seconds on two busy cores).
func TestCluster(t *testing.T) {
	env := k8stest.Start(t)
	t.Run("pods scale 2 to 4 and back under load", func(t *testing.T) { testPodsScale(t, env) })
	t.Run("service EndpointSlices", func(t *testing.T) { testServiceSlices(t, env) })
	t.Run("chart objects pass API validation", func(t *testing.T) { testChartValidates(t, env) })
	t.Run("helm install into a restricted namespace", func(t *testing.T) { testHelmInstall(t, env) })
	t.Run("rules from Rule objects", func(t *testing.T) { testRuleSync(t, env) })
	t.Run("two replicas agree on discovered pods", func(t *testing.T) { testReplicasAgree(t, env) })
	t.Run("a rule waiting for pods goes live when one is Ready", func(t *testing.T) { testLatePod(t, env) })
	t.Run("dual-stack EndpointSlices", func(t *testing.T) { testDualStack(t, env) })
	t.Run("endpoints from an InferencePool", func(t *testing.T) { testInferencePool(t, env) })
	t.Run("the API server reports its version", func(t *testing.T) { testServerVersion(t, env) })
	t.Run("the docs' examples apply", func(t *testing.T) { testDocExamples(t, env) })
	// Last: it stops and restarts the API server.
	t.Run("changes after an API server outage", func(t *testing.T) { testOutage(t, env) })
}

func namespace(t *testing.T, cs kubernetes.Interface, name string) {
	t.Helper()
	if _, err := cs.CoreV1().Namespaces().Create(t.Context(), &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
}

// startGateway runs a gateway whose endpoint source is src.
func startGateway(t *testing.T, src *k8s.Source) *gateway.Server {
	t.Helper()
	gw, err := gateway.New(gateway.Config{Listen: "127.0.0.1:0", Admin: "127.0.0.1:0", StateDir: t.TempDir(),
		EndpointSource: src, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	if err := gw.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		gw.Close()
		src.Wait()
	})
	return gw
}

// endpointIDs is the rule's current endpoint set, as its read-back says.
func endpointIDs(gw *gateway.Server, name string) string {
	st, err := gw.Rule(name)
	if err != nil {
		return err.Error()
	}
	var ids []string
	for _, e := range st.Rule.Endpoints {
		ids = append(ids, e.ID+"="+net.JoinHostPort(e.EndpointIP, strconv.Itoa(e.TargetPort))+e.KVEventsEndpoint)
	}
	return strings.Join(ids, ",")
}

func pod(name, ip string, ready bool, ann map[string]string) *corev1.Pod {
	p := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{"app": "sim"}, Annotations: ann},
		Spec:       corev1.PodSpec{Containers: []corev1.Container{{Name: "engine", Image: "llmgw-sim"}}},
	}
	setReady(p, ip, ready)
	return p
}

func setReady(p *corev1.Pod, ip string, ready bool) {
	st := corev1.ConditionFalse
	if ready {
		st = corev1.ConditionTrue
	}
	p.Status.PodIP, p.Status.PodIPs = ip, []corev1.PodIP{{IP: ip}}
	p.Status.Phase = corev1.PodRunning
	p.Status.Conditions = []corev1.PodCondition{{Type: corev1.PodReady, Status: st}}
}

// createPod creates p and writes its status (no kubelet does it here).
func createPod(t *testing.T, cs kubernetes.Interface, ns string, p *corev1.Pod) {
	t.Helper()
	status := p.Status
	got, err := cs.CoreV1().Pods(ns).Create(t.Context(), p, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	got.Status = status
	if _, err := cs.CoreV1().Pods(ns).UpdateStatus(t.Context(), got, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
}

func setPodReady(t *testing.T, cs kubernetes.Interface, ns, name string, ready bool) {
	t.Helper()
	p, err := cs.CoreV1().Pods(ns).Get(t.Context(), name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	setReady(p, p.Status.PodIP, ready)
	if _, err := cs.CoreV1().Pods(ns).UpdateStatus(t.Context(), p, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
}

// startSims starts n simulators on distinct loopback addresses
// (127.0.0.11, .12, ...) sharing one port, as pods of one InferencePool
// share their targetPorts. The first port is the kernel's choice.
func startSims(t *testing.T, n int) (ips []string, port int) {
	t.Helper()
	for i := 0; i < n; i++ {
		ip := "127.0.0." + strconv.Itoa(11+i)
		listen := net.JoinHostPort(ip, strconv.Itoa(port))
		s, err := sim.Start(context.Background(), sim.Config{Engine: engines.VLLM, Model: "m", Listen: listen, KVEvents: sim.KVEventsOff, PrefillPerToken: time.Microsecond})
		if err != nil {
			t.Fatalf("sim on %s: %v", listen, err)
		}
		t.Cleanup(func() { s.Close() })
		if port == 0 {
			_, p, _ := net.SplitHostPort(s.Addrs().HTTP)
			port, _ = strconv.Atoi(p)
		}
		ips = append(ips, ip)
	}
	return ips, port
}

// testPodsScale: a pool of pods selected by labels (the InferencePool
// shape) grows from 2 to 4 ready pods and shrinks back, by readiness and by
// deletion, while a client keeps sending requests; every request succeeds
// and every pod in the set serves.
func testPodsScale(t *testing.T, env *k8stest.Env) {
	const ns = "pods-scale"
	cs := env.Client
	namespace(t, cs, ns)
	ips, port := startSims(t, 4)
	for i := 0; i < 2; i++ {
		createPod(t, cs, ns, pod(fmt.Sprintf("sim-%d", i), ips[i], true, nil))
	}
	// A pod that never becomes ready stays out of the set.
	createPod(t, cs, ns, pod("sim-unready", "127.0.0.99", false, nil))
	gw := startGateway(t, k8s.NewSource(cs, nil))
	r, err := rule.Decode(fmt.Appendf(nil, "name: pool\nmodel_name: m\nsel: rr\nprobe: {disabled: true}\nendpoints_from: {namespace: %s, selector: {app: sim}, target_ports: [%d]}\n", ns, port))
	if err != nil {
		t.Fatal(err)
	}
	eff, err := gw.Apply(r, false)
	if err != nil {
		t.Fatal(err)
	}
	addr := func(i int) string { return net.JoinHostPort(ips[i], strconv.Itoa(port)) }
	want2 := fmt.Sprintf("sim-0=%s,sim-1=%s", addr(0), addr(1))
	if got := endpointIDs(gw, "pool"); got != want2 || len(eff.Endpoints) != 2 {
		t.Fatalf("initial set %s, want %s", got, want2)
	}

	// Load: requests back to back from two clients until told to stop.
	url := "http://" + gw.Addr() + "/v1/chat/completions"
	tr := &http.Transport{MaxIdleConnsPerHost: 8}
	defer tr.CloseIdleConnections()
	hc := &http.Client{Transport: tr, Timeout: 20 * time.Second}
	var mu sync.Mutex
	served := map[string]int{}
	var failures []string
	total := 0
	ctx, stop := context.WithCancel(t.Context())
	var wg sync.WaitGroup
	for c := 0; c < 2; c++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for ctx.Err() == nil {
				req, _ := http.NewRequest(http.MethodPost, url, strings.NewReader(`{"model":"m","max_tokens":2,"messages":[{"role":"user","content":"hi"}]}`))
				req.Header.Set("Content-Type", "application/json")
				resp, err := hc.Do(req)
				mu.Lock()
				total++
				if err != nil {
					failures = append(failures, err.Error())
				} else {
					_, _ = io.Copy(io.Discard, resp.Body)
					resp.Body.Close()
					if resp.StatusCode != http.StatusOK {
						failures = append(failures, resp.Status)
					}
					served[resp.Header.Get("X-Llmgw-Endpoint")]++
				}
				mu.Unlock()
			}
		}()
	}
	servedBy := func(ids ...string) func() bool {
		mu.Lock()
		base := map[string]int{}
		for _, id := range ids {
			base[id] = served[id]
		}
		mu.Unlock()
		return func() bool {
			mu.Lock()
			defer mu.Unlock()
			for _, id := range ids {
				if served[id] <= base[id] {
					return false
				}
			}
			return true
		}
	}
	wait.For(t, 20*time.Second, "the two first pods to serve", servedBy("sim-0", "sim-1"))

	// Scale up: two more ready pods.
	for i := 2; i < 4; i++ {
		createPod(t, cs, ns, pod(fmt.Sprintf("sim-%d", i), ips[i], true, nil))
	}
	want4 := fmt.Sprintf("%s,sim-2=%s,sim-3=%s", want2, addr(2), addr(3))
	wait.For(t, 20*time.Second, "4 endpoints", func() bool { return endpointIDs(gw, "pool") == want4 })
	wait.For(t, 20*time.Second, "all four pods to serve", servedBy("sim-0", "sim-1", "sim-2", "sim-3"))

	// Scale down: sim-3 stops being ready, sim-2 is deleted.
	setPodReady(t, cs, ns, "sim-3", false)
	if err := cs.CoreV1().Pods(ns).Delete(t.Context(), "sim-2", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	wait.For(t, 20*time.Second, "back to 2 endpoints", func() bool { return endpointIDs(gw, "pool") == want2 })
	// Requests after the change reach only the remaining pods.
	mu.Lock()
	before2, before3 := served["sim-2"], served["sim-3"]
	mu.Unlock()
	wait.For(t, 20*time.Second, "the remaining pods to serve after scale-down", servedBy("sim-0", "sim-1"))
	stop()
	wg.Wait()
	mu.Lock()
	defer mu.Unlock()
	if served["sim-2"] != before2 || served["sim-3"] != before3 {
		t.Errorf("removed pods served after the set shrank: sim-2 %d→%d, sim-3 %d→%d", before2, served["sim-2"], before3, served["sim-3"])
	}
	if len(failures) > 0 {
		t.Errorf("%d of %d requests failed during scaling, first: %s", len(failures), total, failures[0])
	}
	t.Logf("%d requests, served by %v", total, served)
}

// testServiceSlices: a Service's EndpointSlices give the set; readiness and
// termination conditions gate it, the pod annotation sets the KV-events
// address, and the set follows slice updates. The API server refuses
// loopback addresses in EndpointSlices (k8s.io/kubernetes
// pkg/apis/discovery/validation calls ValidateEndpointIP), so these
// endpoints are documentation addresses that serve nothing: this case
// checks the discovered set through the rule's read-back, with probes off.
func testServiceSlices(t *testing.T, env *k8stest.Env) {
	const ns = "svc-slices"
	cs := env.Client
	namespace(t, cs, ns)
	createPod(t, cs, ns, pod("engine-a", "192.0.2.10", true, map[string]string{k8s.AnnotationKVEvents: "tcp://192.0.2.10:6000"}))
	gw := startGateway(t, k8s.NewSource(cs, nil))
	apply := func() error {
		r, err := rule.Decode([]byte("name: svc\nmodel_name: m\nprobe: {disabled: true}\nendpoints_from: {namespace: " + ns + ", service: engines, port_name: http}\n"))
		if err != nil {
			t.Fatal(err)
		}
		_, err = gw.Apply(r, false)
		return err
	}
	if err := apply(); err == nil || !strings.Contains(err.Error(), "no ready endpoint") {
		t.Fatalf("apply with no EndpointSlice: err %v, want no ready endpoint", err)
	}
	yes, no := true, false
	http8000, metrics9000 := "http", "metrics"
	p8000, p9000 := int32(8000), int32(9000)
	slice := &discoveryv1.EndpointSlice{
		ObjectMeta:  metav1.ObjectMeta{Name: "engines-1", Labels: map[string]string{discoveryv1.LabelServiceName: "engines"}},
		AddressType: discoveryv1.AddressTypeIPv4,
		Ports:       []discoveryv1.EndpointPort{{Name: &http8000, Port: &p8000}, {Name: &metrics9000, Port: &p9000}},
		Endpoints: []discoveryv1.Endpoint{
			{Addresses: []string{"192.0.2.10"}, Conditions: discoveryv1.EndpointConditions{Ready: &yes}, TargetRef: &corev1.ObjectReference{Kind: "Pod", Name: "engine-a", Namespace: ns}},
			{Addresses: []string{"192.0.2.11"}}, // ready unset means ready
			{Addresses: []string{"192.0.2.12"}, Conditions: discoveryv1.EndpointConditions{Ready: &no}},
			{Addresses: []string{"192.0.2.13"}, Conditions: discoveryv1.EndpointConditions{Ready: &yes, Terminating: &yes}},
		},
	}
	sl, err := cs.DiscoveryV1().EndpointSlices(ns).Create(t.Context(), slice, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	// Another Service's slice is not watched.
	other := slice.DeepCopy()
	other.Name, other.Labels = "other-1", map[string]string{discoveryv1.LabelServiceName: "other"}
	if _, err := cs.DiscoveryV1().EndpointSlices(ns).Create(t.Context(), other, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := apply(); err != nil {
		t.Fatal(err)
	}
	want := "192.0.2.11:8000=192.0.2.11:8000,engine-a=192.0.2.10:8000tcp://192.0.2.10:6000"
	if got := endpointIDs(gw, "svc"); got != want {
		t.Fatalf("set %s, want %s", got, want)
	}
	// 192.0.2.12 becomes ready, 192.0.2.11 goes away.
	sl.Endpoints = append(sl.Endpoints[:1], discoveryv1.Endpoint{Addresses: []string{"192.0.2.12"}, Conditions: discoveryv1.EndpointConditions{Ready: &yes}})
	if _, err := cs.DiscoveryV1().EndpointSlices(ns).Update(t.Context(), sl, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	want = "192.0.2.12:8000=192.0.2.12:8000,engine-a=192.0.2.10:8000tcp://192.0.2.10:6000"
	wait.For(t, 20*time.Second, "the updated set "+want, func() bool { return endpointIDs(gw, "svc") == want })
}
