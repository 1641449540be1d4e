package cli

import (
	"bytes"
	"context"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/dynamic"
	"sigs.k8s.io/yaml"

	"github.com/llmgw/llmgw/engines"
	"github.com/llmgw/llmgw/engines/sim"
	"github.com/llmgw/llmgw/internal/k8stest"
	"github.com/llmgw/llmgw/k8s"
)

// TestServeFromKubernetes runs `llmgw serve --rules-from kubernetes
// --endpoints-source kubernetes` against a real API server: a Rule object
// whose endpoints are discovered pods is applied by the command (its status
// says Accepted with the effective rule), and the command stops cleanly.
func TestServeFromKubernetes(t *testing.T) {
	const ns = "serve"
	env, dyn := startRuleCluster(t, ns)
	s, err := sim.Start(context.Background(), sim.Config{Engine: engines.VLLM, Model: "m", Listen: "127.0.0.31:0", KVEvents: sim.KVEventsOff})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	_, portS, _ := net.SplitHostPort(s.Addrs().HTTP)
	port, _ := strconv.Atoi(portS)
	p, err := env.Client.CoreV1().Pods(ns).Create(t.Context(), &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "engine-0", Labels: map[string]string{"app": "engine"}},
		Spec:       corev1.PodSpec{Containers: []corev1.Container{{Name: "engine", Image: "llmgw-sim"}}},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	p.Status = corev1.PodStatus{Phase: corev1.PodRunning, PodIP: "127.0.0.31", PodIPs: []corev1.PodIP{{IP: "127.0.0.31"}},
		Conditions: []corev1.PodCondition{{Type: corev1.PodReady, Status: corev1.ConditionTrue}}}
	if _, err := env.Client.CoreV1().Pods(ns).UpdateStatus(t.Context(), p, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	createPoolRule(t, dyn, ns, port)

	ios, _, _ := TestIO()
	errOut := &lockedBuffer{}
	ios.ErrOut = errOut
	root := NewRootCmd(ios)
	root.SetArgs([]string{"serve", "--listen", "127.0.0.1:0", "--admin", "127.0.0.1:0", "--state-dir", t.TempDir(), "--log-level", "error",
		"--endpoints-source", "kubernetes", "--rules-from", "kubernetes", "--rules-namespace", ns, "--kubeconfig", env.Kubeconfig(t), "--drain-window", "0s"})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- root.ExecuteContext(ctx) }()
	waitCond(t, 30*time.Second, "the Rule accepted by serve", func() bool {
		u, err := dyn.Resource(k8s.RuleResource).Namespace(ns).Get(t.Context(), "pool", metav1.GetOptions{})
		if err != nil {
			return false
		}
		conds, _, _ := unstructured.NestedSlice(u.Object, "status", "conditions")
		ef, _, _ := unstructured.NestedString(u.Object, "status", "effective", "endpoints_from", "namespace")
		return len(conds) == 1 && conds[0].(map[string]any)["status"] == "True" && ef == ns
	})
	// One source of truth: the admin API refuses rule writes, naming the
	// Rule object.
	var admin string
	waitCond(t, 30*time.Second, "serve's start line", func() bool {
		m := regexp.MustCompile(`admin http://(\S+),`).FindStringSubmatch(errOut.String())
		if m != nil {
			admin = m[1]
		}
		return m != nil
	})
	req, _ := http.NewRequest(http.MethodDelete, "http://"+admin+"/v1/rules/pool", nil)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusConflict || !strings.Contains(string(body), "rules_managed") || !strings.Contains(string(body), "the Rule object serve/pool") {
		t.Errorf("DELETE /v1/rules/pool under --rules-from kubernetes: %s %s, want 409 rules_managed naming the Rule object serve/pool", resp.Status, body)
	}
	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("serve: %v", err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("serve did not stop after its context ended")
	}
}

// lockedBuffer is a bytes.Buffer safe for the command's writes and the
// test's reads.
type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// waitCond polls cond every 20 ms until it holds, failing after d.
func waitCond(t *testing.T, d time.Duration, what string, cond func() bool) {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), d)
	defer cancel()
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	for !cond() {
		select {
		case <-ctx.Done():
			t.Fatalf("timed out after %v waiting for %s", d, what)
		case <-tick.C:
		}
	}
}

// startRuleCluster starts a real API server with the chart's Rule CRD
// installed and namespace ns created.
func startRuleCluster(t *testing.T, ns string) (*k8stest.Env, dynamic.Interface) {
	t.Helper()
	env := k8stest.Start(t)
	dyn, err := dynamic.NewForConfig(env.Config)
	if err != nil {
		t.Fatal(err)
	}
	crdYAML, err := os.ReadFile(filepath.Join(k8stest.RepoRoot(t), "deploy", "helm", "llmgw", "crds", "rules.llmgw.io.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	crd := &unstructured.Unstructured{}
	if err := yaml.Unmarshal(crdYAML, &crd.Object); err != nil {
		t.Fatal(err)
	}
	crdGVR := schema.GroupVersionResource{Group: "apiextensions.k8s.io", Version: "v1", Resource: "customresourcedefinitions"}
	if _, err := dyn.Resource(crdGVR).Create(t.Context(), crd, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := env.Client.CoreV1().Namespaces().Create(t.Context(), &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	return env, dyn
}

// createPoolRule creates Rule "pool" in ns: model "m", its endpoints the
// pods labelled app=engine on port. It retries until the API server serves
// the just-installed CRD.
func createPoolRule(t *testing.T, dyn dynamic.Interface, ns string, port int) {
	t.Helper()
	obj := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "llmgw.io/v1alpha1", "kind": "Rule", "metadata": map[string]any{"name": "pool"},
		"spec": map[string]any{"model_name": "m", "probe": map[string]any{"disabled": true},
			"endpoints_from": map[string]any{"namespace": ns, "selector": map[string]any{"app": "engine"}, "target_ports": []any{int64(port)}}},
	}}
	waitCond(t, 30*time.Second, "the Rule object created", func() bool {
		_, err := dyn.Resource(k8s.RuleResource).Namespace(ns).Create(t.Context(), obj, metav1.CreateOptions{})
		return err == nil
	})
}
