package k8s_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/client-go/dynamic"

	"github.com/llmgw/llmgw/engines"
	"github.com/llmgw/llmgw/engines/sim"
	"github.com/llmgw/llmgw/gateway"
	"github.com/llmgw/llmgw/gateway/rule"
	"github.com/llmgw/llmgw/internal/k8stest"
	"github.com/llmgw/llmgw/internal/wait"
	"github.com/llmgw/llmgw/k8s"
)

// ruleObject is a Rule custom resource with spec given as YAML-ish JSON.
func ruleObject(name string, spec map[string]any) *unstructured.Unstructured {
	return &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "llmgw.io/v1alpha1", "kind": "Rule",
		"metadata": map[string]any{"name": name},
		"spec":     spec,
	}}
}

// accepted returns the Accepted condition's status, reason and message and
// the observed generation; "" before the gateway wrote any.
func accepted(t *testing.T, dyn dynamic.Interface, ns, name string) (status, reason, message string, gen int64, obj *unstructured.Unstructured) {
	u, err := dyn.Resource(k8s.RuleResource).Namespace(ns).Get(t.Context(), name, metav1.GetOptions{})
	if err != nil {
		return "", "", err.Error(), 0, nil
	}
	conds, _, _ := unstructured.NestedSlice(u.Object, "status", "conditions")
	for _, c := range conds {
		m, _ := c.(map[string]any)
		if m["type"] == k8s.ConditionAccepted {
			g, _, _ := unstructured.NestedInt64(u.Object, "status", "observedGeneration")
			return fmt.Sprint(m["status"]), fmt.Sprint(m["reason"]), fmt.Sprint(m["message"]), g, u
		}
	}
	return "", "", "", 0, u
}

// testRuleSync: Rule objects are applied with the gateway's strict
// admission, verdicts and effective rules land in status, updates and
// deletes follow, and a rule only the gateway's disk knew is dropped.
func testRuleSync(t *testing.T, env *k8stest.Env) {
	const ns = "rules-sync"
	dyn, err := dynamic.NewForConfig(env.Config)
	if err != nil {
		t.Fatal(err)
	}
	crd, err := os.ReadFile(filepath.Join(k8stest.RepoRoot(t), "deploy", "helm", "llmgw", "crds", "rules.llmgw.io.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	installCRDs(t, dyn, chartObjects(t, crd))
	namespace(t, env.Client, ns)
	var ports []int
	for i := 0; i < 2; i++ {
		s, err := sim.Start(context.Background(), sim.Config{Engine: engines.VLLM, Model: "m", KVEvents: sim.KVEventsOff, PrefillPerToken: time.Microsecond})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { s.Close() })
		var p int
		if _, err := fmt.Sscanf(s.Addrs().HTTP[strings.LastIndexByte(s.Addrs().HTTP, ':')+1:], "%d", &p); err != nil {
			t.Fatal(err)
		}
		ports = append(ports, p)
	}
	gw, err := gateway.New(gateway.Config{Listen: "127.0.0.1:0", Admin: "127.0.0.1:0", StateDir: t.TempDir(), Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	if err := gw.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { gw.Close() })
	// A rule on the gateway's disk that the cluster does not have.
	local, err := rule.Decode(fmt.Appendf(nil, `{"name":"local","model_name":"x","endpoints":[{"endpointIP":"127.0.0.1","targetPort":%d}]}`, ports[0]))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := gw.Apply(local, false); err != nil {
		t.Fatal(err)
	}
	ep := func(p int) map[string]any { return map[string]any{"endpointIP": "127.0.0.1", "targetPort": int64(p)} }
	rules := dyn.Resource(k8s.RuleResource).Namespace(ns)
	if _, err := rules.Create(t.Context(), ruleObject("good", map[string]any{"model_name": "m", "sel": "rr", "probe": map[string]any{"disabled": true}, "endpoints": []any{ep(ports[0])}}), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(t.Context())
	var wg sync.WaitGroup
	defer func() { cancel(); wg.Wait() }()
	if err := k8s.NewRuleSync(dyn, ns, gw, nil, nil, slog.New(slog.NewTextHandler(io.Discard, nil))).Run(ctx, &wg); err != nil {
		t.Fatal(err)
	}
	// Run returns with the cluster's rules applied and the local one gone.
	if _, err := gw.Rule("good"); err != nil {
		t.Fatalf("rule good not applied when Run returned: %v", err)
	}
	if _, err := gw.Rule("local"); !errors.Is(err, gateway.ErrRuleNotFound) {
		t.Fatalf("rule only on disk: %v, want deleted", err)
	}
	wait.For(t, 20*time.Second, "good accepted", func() bool { st, _, _, _, _ := accepted(t, dyn, ns, "good"); return st == "True" })
	_, _, _, _, u := accepted(t, dyn, ns, "good")
	if sel, _, _ := unstructured.NestedString(u.Object, "status", "effective", "sel_name"); sel != "rr" {
		t.Errorf("status.effective.sel_name %q, want rr (the effective read-back)", sel)
	}
	resp, err := http.Post("http://"+gw.Addr()+"/v1/chat/completions", "application/json", strings.NewReader(`{"model":"m","max_tokens":2,"messages":[{"role":"user","content":"hi"}]}`))
	if err != nil {
		t.Fatal(err)
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Errorf("request through the cluster's rule: %s", resp.Status)
	}

	refused := []struct {
		name, reason, inMessage string
		spec                    map[string]any
	}{
		{"bad-sel", "sel_unsupported", "sel 9", map[string]any{"model_name": "m2", "sel": int64(9), "endpoints": []any{ep(ports[0])}}},
		{"typo", "Invalid", "selx", map[string]any{"model_name": "m3", "selx": int64(1), "endpoints": []any{ep(ports[0])}}},
		{"name-mismatch", "Invalid", "metadata.name", map[string]any{"name": "other", "model_name": "m4", "endpoints": []any{ep(ports[0])}}},
	}
	for _, tc := range refused {
		t.Run(tc.name, func(t *testing.T) {
			if _, err := rules.Create(t.Context(), ruleObject(tc.name, tc.spec), metav1.CreateOptions{}); err != nil {
				t.Fatal(err)
			}
			wait.For(t, 20*time.Second, tc.name+" refused", func() bool { st, _, _, _, _ := accepted(t, dyn, ns, tc.name); return st == "False" })
			_, reason, msg, _, _ := accepted(t, dyn, ns, tc.name)
			if reason != tc.reason || !strings.Contains(msg, tc.inMessage) {
				t.Errorf("reason %q message %q, want %q containing %q", reason, msg, tc.reason, tc.inMessage)
			}
			if _, err := gw.Rule(tc.name); !errors.Is(err, gateway.ErrRuleNotFound) {
				t.Errorf("refused rule is served: %v", err)
			}
		})
	}

	// An update re-applies; the status follows the generation.
	u.Object["spec"].(map[string]any)["endpoints"] = []any{ep(ports[0]), ep(ports[1])}
	delete(u.Object, "status")
	if _, err := rules.Update(t.Context(), u, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	wait.For(t, 20*time.Second, "the update applied", func() bool {
		st, err := gw.Rule("good")
		return err == nil && len(st.Rule.Endpoints) == 2
	})
	wait.For(t, 20*time.Second, "status of generation 2", func() bool {
		st, _, _, gen, _ := accepted(t, dyn, ns, "good")
		return st == "True" && gen == 2
	})
	if err := rules.Delete(t.Context(), "good", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	wait.For(t, 30*time.Second, "the deleted rule gone", func() bool {
		_, err := gw.Rule("good")
		return errors.Is(err, gateway.ErrRuleNotFound)
	})
}
