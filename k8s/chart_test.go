package k8s_test

import (
	"bytes"
	"context"
	"errors"
	"flag"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"k8s.io/client-go/discovery/cached/memory"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/restmapper"

	"github.com/llmgw/llmgw/internal/k8stest"
	"github.com/llmgw/llmgw/internal/wait"
)

var update = flag.Bool("update", false, "rewrite golden files (our own rendered output only)")

const chartNamespace = "llmgw-chart"

// renderChart runs helm template on deploy/helm/llmgw with its CRDs. The
// admin-token Secret's random value is replaced by a fixed marker (base64 of "RANDOM", so it still
// validates) so the
// output can be compared.
func renderChart(t *testing.T) []byte {
	t.Helper()
	helm := k8stest.Helm(t)
	root := k8stest.RepoRoot(t)
	cmd := exec.Command(helm, "template", "llmgw", filepath.Join(root, "deploy", "helm", "llmgw"), "--namespace", chartNamespace, "--include-crds")
	cmd.Env = append(os.Environ(), "HELM_CACHE_HOME="+t.TempDir(), "HELM_CONFIG_HOME="+t.TempDir(), "HELM_DATA_HOME="+t.TempDir())
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("helm template: %v\n%s", err, stderr.Bytes())
	}
	return regexp.MustCompile(`(?m)^(  token: ).*$`).ReplaceAll(out, []byte("${1}UkFORE9N")) // base64 "RANDOM"
}

// TestChartTemplate keeps helm template's output for the default values in
// testdata/helm-template.yaml (run with -update after a chart change).
func TestChartTemplate(t *testing.T) {
	got := renderChart(t)
	golden := filepath.Join("testdata", "helm-template.yaml")
	if *update {
		if err := os.WriteFile(golden, got, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	want, err := os.ReadFile(golden)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, want) {
		t.Errorf("helm template output differs from %s (run go test ./k8s -run TestChartTemplate -update after a chart change)\n%s", golden, got)
	}
}

// chartObjects splits rendered YAML into objects.
func chartObjects(t *testing.T, y []byte) []*unstructured.Unstructured {
	t.Helper()
	dec := utilyaml.NewYAMLOrJSONDecoder(bytes.NewReader(y), 4096)
	var objs []*unstructured.Unstructured
	for {
		var m map[string]any
		if err := dec.Decode(&m); err != nil {
			if errors.Is(err, io.EOF) {
				return objs
			}
			t.Fatal(err)
		}
		if len(m) == 0 {
			continue
		}
		objs = append(objs, &unstructured.Unstructured{Object: m})
	}
}

var crdGVR = schema.GroupVersionResource{Group: "apiextensions.k8s.io", Version: "v1", Resource: "customresourcedefinitions"}

// installCRDs creates the chart's CRDs for real and waits until they are
// established, so objects of their kinds can be created.
func installCRDs(t *testing.T, dyn dynamic.Interface, objs []*unstructured.Unstructured) {
	t.Helper()
	for _, o := range objs {
		if o.GetKind() != "CustomResourceDefinition" {
			continue
		}
		if _, err := dyn.Resource(crdGVR).Create(t.Context(), o, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
			t.Fatalf("create CRD %s: %v", o.GetName(), err)
		}
		wait.For(t, 30*time.Second, "CRD "+o.GetName()+" established", func() bool {
			got, err := dyn.Resource(crdGVR).Get(t.Context(), o.GetName(), metav1.GetOptions{})
			if err != nil {
				return false
			}
			conds, _, _ := unstructured.NestedSlice(got.Object, "status", "conditions")
			for _, c := range conds {
				if m, ok := c.(map[string]any); ok && m["type"] == "Established" && m["status"] == "True" {
					return true
				}
			}
			return false
		})
	}
}

// testChartValidates: every object helm renders passes the API server's
// validation (a server-side dry-run create), after the chart's CRDs are
// installed.
func testChartValidates(t *testing.T, env *k8stest.Env) {
	objs := chartObjects(t, renderChart(t))
	dyn, err := dynamic.NewForConfig(env.Config)
	if err != nil {
		t.Fatal(err)
	}
	namespace(t, env.Client, chartNamespace)
	installCRDs(t, dyn, objs)
	mapper := restmapper.NewDeferredDiscoveryRESTMapper(memory.NewMemCacheClient(env.Client.Discovery()))
	kinds := map[string]bool{}
	for _, o := range objs {
		kinds[o.GetKind()] = true
		if o.GetKind() == "CustomResourceDefinition" {
			continue
		}
		gvk := o.GroupVersionKind()
		m, err := mapper.RESTMapping(gvk.GroupKind(), gvk.Version)
		if err != nil {
			t.Fatalf("%s %s: %v", gvk, o.GetName(), err)
		}
		ri := dyn.Resource(m.Resource)
		var c dynamic.ResourceInterface = ri
		if m.Scope.Name() == meta.RESTScopeNameNamespace {
			c = ri.Namespace(chartNamespace)
		}
		ctx, cancel := context.WithTimeout(t.Context(), 20*time.Second)
		_, err = c.Create(ctx, o, metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}, FieldValidation: "Strict"})
		cancel()
		if err != nil {
			t.Errorf("%s %s refused by the API server: %v", gvk.Kind, o.GetName(), err)
		}
	}
	for _, k := range []string{"CustomResourceDefinition", "Deployment", "Service", "ServiceAccount", "ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding", "Secret", "PodDisruptionBudget"} {
		if !kinds[k] {
			t.Errorf("chart renders no %s", k)
		}
	}
	if kinds["ServiceMonitor"] {
		t.Error("the chart renders a ServiceMonitor by default (it needs the Prometheus Operator's CRD)")
	}
	if t.Failed() {
		t.Logf("kinds rendered: %s", strings.Join(keys(kinds), ", "))
	}
}

// helmCmd runs the Helm CLI with its own cache and config directories.
func helmCmd(t *testing.T, args ...string) ([]byte, error) {
	t.Helper()
	cmd := exec.Command(k8stest.Helm(t), args...)
	cmd.Env = append(os.Environ(), "HELM_CACHE_HOME="+t.TempDir(), "HELM_CONFIG_HOME="+t.TempDir(), "HELM_DATA_HOME="+t.TempDir())
	return cmd.CombinedOutput()
}

// TestChartServiceMonitor: the ServiceMonitor renders only when enabled
// and the cluster serves its kind; enabled without it, rendering fails
// with the reason.
func TestChartServiceMonitor(t *testing.T) {
	chart := filepath.Join(k8stest.RepoRoot(t), "deploy", "helm", "llmgw")
	out, err := helmCmd(t, "template", "llmgw", chart, "--set", "serviceMonitor.enabled=true")
	if err == nil || !strings.Contains(string(out), "ServiceMonitor CRD") {
		t.Errorf("enabled without the CRD: err %v, output %s; want a failure naming the CRD", err, out)
	}
	out, err = helmCmd(t, "template", "llmgw", chart, "--set", "serviceMonitor.enabled=true", "--api-versions", "monitoring.coreos.com/v1/ServiceMonitor")
	if err != nil || !strings.Contains(string(out), "kind: ServiceMonitor") {
		t.Errorf("enabled with the CRD: err %v; want a ServiceMonitor\n%s", err, out)
	}
}

// testHelmInstall: helm install of the chart as it is into the bare API
// server succeeds in a namespace that enforces the "restricted" Pod
// Security Standard, and a pod made from the Deployment's template passes
// admission there (a server-side dry run: no controller manager runs to
// create the ReplicaSet's pods).
func testHelmInstall(t *testing.T, env *k8stest.Env) {
	const ns = "llmgw-restricted"
	cs := env.Client
	if _, err := cs.CoreV1().Namespaces().Create(t.Context(), &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns,
		Labels: map[string]string{"pod-security.kubernetes.io/enforce": "restricted", "pod-security.kubernetes.io/enforce-version": "latest"}}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	chart := filepath.Join(k8stest.RepoRoot(t), "deploy", "helm", "llmgw")
	if out, err := helmCmd(t, "install", "gw", chart, "--namespace", ns, "--kubeconfig", env.Kubeconfig(t)); err != nil {
		t.Fatalf("helm install: %v\n%s", err, out)
	}
	dep, err := cs.AppsV1().Deployments(ns).Get(t.Context(), "gw-llmgw", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	p := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "gw-llmgw-template", Labels: dep.Spec.Template.Labels}, Spec: dep.Spec.Template.Spec}
	if _, err := cs.CoreV1().Pods(ns).Create(t.Context(), p, metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}}); err != nil {
		t.Fatalf("the Deployment's pod refused in a restricted namespace: %v", err)
	}
	if _, err := cs.PolicyV1().PodDisruptionBudgets(ns).Get(t.Context(), "gw-llmgw", metav1.GetOptions{}); err != nil {
		t.Errorf("the chart's PodDisruptionBudget: %v", err)
	}
}

func keys(m map[string]bool) []string {
	var out []string
	for k := range m {
		out = append(out, k)
	}
	return out
}
