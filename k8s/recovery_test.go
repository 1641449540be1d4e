package k8s_test

import (
	"context"
	"io"
	"log/slog"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/dynamic"

	"github.com/llmgw/llmgw/gateway"
	"github.com/llmgw/llmgw/gateway/rule"
	"github.com/llmgw/llmgw/internal/k8stest"
	"github.com/llmgw/llmgw/internal/wait"
	"github.com/llmgw/llmgw/k8s"
)

// logRecorder is a slog handler keeping each record's message and its
// "rule" attribute, so a test can assert on what was logged.
type logRecorder struct {
	mu   sync.Mutex
	recs []string // message + " rule=" + rule
}

func (l *logRecorder) Enabled(context.Context, slog.Level) bool { return true }
func (l *logRecorder) WithAttrs([]slog.Attr) slog.Handler       { return l }
func (l *logRecorder) WithGroup(string) slog.Handler            { return l }
func (l *logRecorder) Handle(_ context.Context, r slog.Record) error {
	line := r.Message
	r.Attrs(func(a slog.Attr) bool {
		if a.Key == "rule" || a.Key == "resource" {
			line += " " + a.Key + "=" + a.Value.String()
		}
		return true
	})
	l.mu.Lock()
	l.recs = append(l.recs, line)
	l.mu.Unlock()
	return nil
}

// count is how many records contain every one of parts.
func (l *logRecorder) count(parts ...string) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	n := 0
next:
	for _, r := range l.recs {
		for _, p := range parts {
			if !strings.Contains(r, p) {
				continue next
			}
		}
		n++
	}
	return n
}

// countingGateway counts the rule applications a RuleSync makes.
type countingGateway struct {
	*gateway.Server
	mu      sync.Mutex
	applies map[string]int
}

func (c *countingGateway) Apply(r *rule.Rule, create bool) (*rule.Rule, error) {
	c.mu.Lock()
	c.applies[r.Name]++
	c.mu.Unlock()
	return c.Server.Apply(r, create)
}

func (c *countingGateway) count(name string) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.applies[name]
}

func installRuleCRD(t *testing.T, env *k8stest.Env) dynamic.Interface {
	t.Helper()
	dyn, err := dynamic.NewForConfig(env.Config)
	if err != nil {
		t.Fatal(err)
	}
	crd, err := os.ReadFile(filepath.Join(k8stest.RepoRoot(t), "deploy", "helm", "llmgw", "crds", "rules.llmgw.io.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	installCRDs(t, dyn, chartObjects(t, crd))
	return dyn
}

// runRuleSync runs a RuleSync for ns until the test ends.
func runRuleSync(t *testing.T, dyn dynamic.Interface, ns string, gw k8s.RuleGateway, src gateway.EndpointSource, h *k8s.Health, log *slog.Logger) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	t.Cleanup(func() { cancel(); wg.Wait() })
	if err := k8s.NewRuleSync(dyn, ns, gw, src, h, log).Run(ctx, &wg); err != nil {
		t.Fatal(err)
	}
}

// testLatePod: a Rule applied before any of its pods is Ready waits on its
// endpoints instead of a retry backoff, and goes live within 1 s of the
// first pod becoming Ready, however long it waited and however often its
// object was touched meanwhile (each touch is a failed attempt: the old
// retry backoff grew to 30 s in a second of touches). A Rule with a permanent error (no
// target_ports) gets its condition and is not retried.
func testLatePod(t *testing.T, env *k8stest.Env) {
	const ns = "late-pod"
	cs := env.Client
	dyn := installRuleCRD(t, env)
	namespace(t, cs, ns)
	createPod(t, cs, ns, pod("late-0", "192.0.2.20", false, nil))
	src := k8s.NewSource(cs, nil)
	gw := startGateway(t, src)
	cg := &countingGateway{Server: gw, applies: map[string]int{}}
	rules := dyn.Resource(k8s.RuleResource).Namespace(ns)
	from := map[string]any{"namespace": ns, "selector": map[string]any{"app": "sim"}}
	withPorts := map[string]any{"namespace": ns, "selector": map[string]any{"app": "sim"}, "target_ports": []any{int64(8000)}}
	for name, spec := range map[string]map[string]any{
		"late":     {"model_name": "m", "probe": map[string]any{"disabled": true}, "endpoints_from": withPorts},
		"no-ports": {"model_name": "m2", "probe": map[string]any{"disabled": true}, "endpoints_from": from},
	} {
		if _, err := rules.Create(t.Context(), ruleObject(name, spec), metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	logs := &logRecorder{}
	runRuleSync(t, dyn, ns, cg, src, nil, slog.New(logs))

	for _, tc := range []struct{ name, reason, inMessage string }{
		{"late", rule.CodeNoReadyEndpoint, "no ready endpoint"},
		{"no-ports", rule.CodeEndpointsFrom, "target_ports"},
	} {
		wait.For(t, 20*time.Second, tc.name+" refused", func() bool { st, _, _, _, _ := accepted(t, dyn, ns, tc.name); return st == "False" })
		if _, reason, msg, _, _ := accepted(t, dyn, ns, tc.name); reason != tc.reason || !strings.Contains(msg, tc.inMessage) {
			t.Errorf("%s: reason %q message %q, want %q containing %q", tc.name, reason, msg, tc.reason, tc.inMessage)
		}
	}
	// The object is touched back to back for a second (as a GitOps
	// controller re-applying it does; the scenario's length, not a wait
	// for an event): each touch is synced, and refused, again. A retry
	// backoff would be at its longest by the end.
	touches := 0
	for start := time.Now(); touches < 6 || time.Since(start) < time.Second; touches++ {
		n := cg.count("late")
		patch := []byte(`{"metadata":{"annotations":{"touched":"` + strconv.Itoa(touches) + `"}}}`)
		if _, err := rules.Patch(t.Context(), "late", types.MergePatchType, patch, metav1.PatchOptions{}); err != nil {
			t.Fatal(err)
		}
		wait.For(t, 20*time.Second, "the touched rule synced again", func() bool { return cg.count("late") > n })
	}
	setPodReady(t, cs, ns, "late-0", true)
	took := wait.For(t, time.Second, "rule late live within 1 s of its first pod becoming Ready", func() bool {
		_, err := gw.Rule("late")
		return err == nil
	})
	t.Logf("rule late live %v after its pod became Ready (%d touches before)", took.Round(time.Millisecond), touches)
	wait.For(t, 20*time.Second, "late accepted", func() bool { st, _, _, _, _ := accepted(t, dyn, ns, "late"); return st == "True" })
	if got := endpointIDs(gw, "late"); got != "late-0=192.0.2.20:8000" {
		t.Errorf("late's endpoints %s, want late-0=192.0.2.20:8000", got)
	}
	for _, name := range []string{"late", "no-ports"} {
		if n := logs.count("retrying", "rule="+ns+"/"+name); n != 0 {
			t.Errorf("rule %s was retried %d times on a backoff; a refused rule waits for its object or its endpoints to change", name, n)
		}
	}
	if _, err := gw.Rule("no-ports"); err == nil {
		t.Error("no-ports is served")
	}
}

// testDualStack: a dual-stack Service has an IPv4 and an IPv6
// EndpointSlice naming the same pods; each pod is one endpoint, on its
// IPv4 address, and a pod only in the IPv6 slice keeps its IPv6 address.
func testDualStack(t *testing.T, env *k8stest.Env) {
	const ns = "dual-stack"
	cs := env.Client
	namespace(t, cs, ns)
	gw := startGateway(t, k8s.NewSource(cs, nil))
	yes := true
	http8000 := "http"
	p8000 := int32(8000)
	ref := func(name string) *corev1.ObjectReference {
		return &corev1.ObjectReference{Kind: "Pod", Name: name, Namespace: ns}
	}
	for _, sl := range []*discoveryv1.EndpointSlice{
		{
			ObjectMeta:  metav1.ObjectMeta{Name: "engines-v6", Labels: map[string]string{discoveryv1.LabelServiceName: "engines"}},
			AddressType: discoveryv1.AddressTypeIPv6,
			Ports:       []discoveryv1.EndpointPort{{Name: &http8000, Port: &p8000}},
			Endpoints: []discoveryv1.Endpoint{
				{Addresses: []string{"2001:db8::30"}, Conditions: discoveryv1.EndpointConditions{Ready: &yes}, TargetRef: ref("engine-a")},
				{Addresses: []string{"2001:db8::31"}, Conditions: discoveryv1.EndpointConditions{Ready: &yes}, TargetRef: ref("engine-b")},
				{Addresses: []string{"2001:db8::32"}, Conditions: discoveryv1.EndpointConditions{Ready: &yes}, TargetRef: ref("engine-v6only")},
			},
		},
		{
			ObjectMeta:  metav1.ObjectMeta{Name: "engines-v4", Labels: map[string]string{discoveryv1.LabelServiceName: "engines"}},
			AddressType: discoveryv1.AddressTypeIPv4,
			Ports:       []discoveryv1.EndpointPort{{Name: &http8000, Port: &p8000}},
			Endpoints: []discoveryv1.Endpoint{
				{Addresses: []string{"192.0.2.30"}, Conditions: discoveryv1.EndpointConditions{Ready: &yes}, TargetRef: ref("engine-a")},
				{Addresses: []string{"192.0.2.31"}, Conditions: discoveryv1.EndpointConditions{Ready: &yes}, TargetRef: ref("engine-b")},
			},
		},
	} {
		if _, err := cs.DiscoveryV1().EndpointSlices(ns).Create(t.Context(), sl, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	r, err := rule.Decode([]byte("name: dual\nmodel_name: m\nprobe: {disabled: true}\nendpoints_from: {namespace: " + ns + ", service: engines}\n"))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := gw.Apply(r, false); err != nil {
		t.Fatalf("a dual-stack Service's rule: %v", err)
	}
	want := "engine-a=192.0.2.30:8000,engine-b=192.0.2.31:8000,engine-v6only=[2001:db8::32]:8000"
	if got := endpointIDs(gw, "dual"); got != want {
		t.Errorf("set %s, want %s", got, want)
	}
}

// testOutage: the API server is down for 10 s; the watches' loss and
// restoration are logged and counted, and changes made once it answers
// again (a pod becoming Ready, a new Rule) reach the gateway within 5 s.
// It stops the shared API server, so it runs last.
func testOutage(t *testing.T, env *k8stest.Env) {
	const ns = "outage"
	const outage = 10 * time.Second // the outage's length: the scenario, not a wait for an event
	cs := env.Client
	dyn := installRuleCRD(t, env)
	namespace(t, cs, ns)
	createPod(t, cs, ns, pod("out-0", "192.0.2.40", true, nil))
	createPod(t, cs, ns, pod("out-1", "192.0.2.41", false, nil))
	logs := &logRecorder{}
	log := slog.New(logs)
	h := k8s.NewHealth(log)
	src := k8s.NewSource(cs, h)
	gw, err := gateway.New(gateway.Config{Listen: "127.0.0.1:0", Admin: "127.0.0.1:0", StateDir: t.TempDir(),
		EndpointSource: src, Collectors: h.Collectors(), Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	if err := gw.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { gw.Close(); src.Wait() })
	rules := dyn.Resource(k8s.RuleResource).Namespace(ns)
	if _, err := rules.Create(t.Context(), ruleObject("pool", map[string]any{"model_name": "m", "probe": map[string]any{"disabled": true},
		"endpoints_from": map[string]any{"namespace": ns, "selector": map[string]any{"app": "sim"}, "target_ports": []any{int64(8000)}}}), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	runRuleSync(t, dyn, ns, gw, src, h, log)
	if got := endpointIDs(gw, "pool"); got != "out-0=192.0.2.40:8000" {
		t.Fatalf("pool before the outage: %s", got)
	}

	down := time.Now()
	env.StopAPIServer(t)
	for _, res := range []string{"pods", "rules"} {
		wait.For(t, 20*time.Second, "the "+res+" watch lost", func() bool { lost, _ := h.Counts(res); return lost >= 1 })
	}
	select {
	case <-time.After(time.Until(down.Add(outage))):
	case <-t.Context().Done():
		return
	}
	env.StartAPIServer(t)
	back := time.Now()
	t.Logf("API server down for %v", back.Sub(down).Round(100*time.Millisecond))

	setPodReady(t, cs, ns, "out-1", true)
	if _, err := rules.Create(t.Context(), ruleObject("after", map[string]any{"model_name": "m-after", "probe": map[string]any{"disabled": true},
		"endpoints": []any{map[string]any{"endpointIP": "192.0.2.50", "targetPort": int64(8000)}}}), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	within := func() time.Duration { return time.Until(back.Add(5 * time.Second)) }
	wait.For(t, within(), "the pod made Ready after the outage in the pool within 5 s", func() bool {
		return endpointIDs(gw, "pool") == "out-0=192.0.2.40:8000,out-1=192.0.2.41:8000"
	})
	t.Logf("the pod change arrived %v after the API server returned", time.Since(back).Round(time.Millisecond))
	wait.For(t, within(), "the Rule created after the outage applied within 5 s", func() bool {
		_, err := gw.Rule("after")
		return err == nil
	})
	t.Logf("the Rule change arrived %v after the API server returned", time.Since(back).Round(time.Millisecond))
	for _, res := range []string{"pods", "rules"} {
		wait.For(t, 20*time.Second, "the "+res+" watch restored", func() bool { _, restored := h.Counts(res); return restored >= 1 })
		if logs.count("kubernetes watch lost", "resource="+res) == 0 || logs.count("kubernetes watch restored", "resource="+res) == 0 {
			t.Errorf("the %s watch's loss and restoration were not both logged", res)
		}
	}
	resp, err := http.Get("http://" + gw.AdminAddr() + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	for _, series := range []string{`llmgw_k8s_watch_lost_total{resource="pods"}`, `llmgw_k8s_watch_restored_total{resource="rules"}`, `llmgw_k8s_watches_lost{resource="pods"} 0`} {
		if !strings.Contains(string(body), series) {
			t.Errorf("/metrics has no %s", series)
		}
	}
}
