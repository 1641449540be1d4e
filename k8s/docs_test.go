package k8s_test

import (
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/client-go/discovery/cached/memory"
	"k8s.io/client-go/restmapper"

	"github.com/llmgw/llmgw/internal/k8stest"
	"github.com/llmgw/llmgw/internal/wait"
	"github.com/llmgw/llmgw/k8s"
)

// docYAML returns the ```yaml blocks of a doc page.
func docYAML(t *testing.T, page string) [][]byte {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(k8stest.RepoRoot(t), "docs", page))
	if err != nil {
		t.Fatal(err)
	}
	var out [][]byte
	for _, m := range regexp.MustCompile("(?s)```yaml\n(.*?)```").FindAllSubmatch(b, -1) {
		out = append(out, m[1])
	}
	return out
}

// testDocExamples: every YAML block of docs/kubernetes.md is applied to the
// API server (strict field validation, with the CRDs installed), and each
// Rule among them is accepted by a gateway once a Ready pod matches its
// selector or its InferencePool's.
func testDocExamples(t *testing.T, env *k8stest.Env) {
	blocks := docYAML(t, "kubernetes.md")
	if len(blocks) == 0 {
		t.Fatal("docs/kubernetes.md has no yaml block")
	}
	cs := env.Client
	dyn := installRuleCRD(t, env)
	installPoolCRD(t, env)
	mapper := restmapper.NewDeferredDiscoveryRESTMapper(memory.NewMemCacheClient(cs.Discovery()))
	var rules, pools []*unstructured.Unstructured
	namespaces := map[string]bool{}
	for i, blk := range blocks {
		for _, o := range chartObjects(t, blk) {
			ns := o.GetNamespace()
			if ns != "" && !namespaces[ns] {
				namespaces[ns] = true
				if _, err := cs.CoreV1().Namespaces().Get(t.Context(), ns, metav1.GetOptions{}); apierrors.IsNotFound(err) {
					namespace(t, cs, ns)
				}
			}
			gvk := o.GroupVersionKind()
			m, err := mapper.RESTMapping(gvk.GroupKind(), gvk.Version)
			if err != nil {
				t.Fatalf("block %d: %s %s: %v", i+1, gvk, o.GetName(), err)
			}
			c := dyn.Resource(m.Resource).Namespace(ns)
			if m.Scope.Name() != meta.RESTScopeNameNamespace {
				t.Fatalf("block %d: %s is not namespaced", i+1, gvk)
			}
			if _, err := c.Create(t.Context(), o, metav1.CreateOptions{FieldValidation: "Strict"}); err != nil {
				t.Fatalf("block %d: %s %s refused by the API server: %v", i+1, gvk.Kind, o.GetName(), err)
			}
			switch {
			case gvk.Group == k8s.RuleResource.Group && gvk.Kind == "Rule":
				rules = append(rules, o)
			case gvk.Group == k8s.InferencePoolResource.Group && gvk.Kind == "InferencePool":
				pools = append(pools, o)
			}
		}
	}
	if len(rules) == 0 {
		t.Fatal("the examples hold no Rule")
	}
	// A Ready pod for each Rule's and each InferencePool's selector, so
	// discovery finds one.
	n := 0
	addPod := func(ns string, sel map[string]string) {
		if len(sel) == 0 {
			return
		}
		n++
		p := pod(fmt.Sprintf("doc-pod-%d", n), fmt.Sprintf("192.0.2.%d", 60+n), true, nil)
		p.Labels = sel
		createPod(t, cs, ns, p)
	}
	for _, r := range rules {
		sel, _, _ := unstructured.NestedStringMap(r.Object, "spec", "endpoints_from", "selector")
		ns, _, _ := unstructured.NestedString(r.Object, "spec", "endpoints_from", "namespace")
		addPod(ns, sel)
	}
	for _, p := range pools {
		sel, _, _ := unstructured.NestedStringMap(p.Object, "spec", "selector", "matchLabels")
		addPod(p.GetNamespace(), sel)
	}
	src, err := k8s.NewSourceFromConfig(env.Config, nil)
	if err != nil {
		t.Fatal(err)
	}
	gw := startGateway(t, src)
	for ns := range namespaces {
		runRuleSync(t, dyn, ns, gw, src, nil, slog.New(slog.NewTextHandler(io.Discard, nil)))
	}
	for _, r := range rules {
		wait.For(t, 20*time.Second, "the example Rule "+r.GetName()+" given a verdict", func() bool {
			st, _, _, _, _ := accepted(t, dyn, r.GetNamespace(), r.GetName())
			return st != ""
		})
		if st, reason, msg, _, _ := accepted(t, dyn, r.GetNamespace(), r.GetName()); st != "True" {
			t.Errorf("the example Rule %s: Accepted=%s %s: %s", r.GetName(), st, reason, strings.TrimSpace(msg))
		}
	}
}

// testServerVersion: the API server make kube-apiserver builds reports the
// k8s.io/kubernetes module version of tools/kube-apiserver/go.mod (the
// Makefile stamps it; an unstamped build says v0.0.0-master+$Format:%H$).
func testServerVersion(t *testing.T, env *k8stest.Env) {
	b, err := os.ReadFile(filepath.Join(k8stest.RepoRoot(t), "tools", "kube-apiserver", "go.mod"))
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile(`(?m)^\s*k8s\.io/kubernetes (v\S+)`).FindSubmatch(b)
	if m == nil {
		t.Fatal("tools/kube-apiserver/go.mod requires no k8s.io/kubernetes")
	}
	v, err := env.Client.Discovery().ServerVersion()
	if err != nil {
		t.Fatal(err)
	}
	if v.GitVersion != string(m[1]) {
		t.Errorf("the API server reports %s, want %s (rebuild it with make kube-apiserver)", v.GitVersion, m[1])
	}
}
