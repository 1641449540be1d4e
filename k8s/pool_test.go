package k8s_test

import (
	"errors"
	"os"
	"path/filepath"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/client-go/dynamic"

	"github.com/llmgw/llmgw/gateway/rule"
	"github.com/llmgw/llmgw/internal/k8stest"
	"github.com/llmgw/llmgw/internal/wait"
	"github.com/llmgw/llmgw/k8s"
)

// installPoolCRD installs the Gateway API Inference Extension's
// InferencePool CRD as upstream ships it (k8s/testdata/gie, see PROVENANCE).
func installPoolCRD(t *testing.T, env *k8stest.Env) dynamic.Interface {
	t.Helper()
	dyn, err := dynamic.NewForConfig(env.Config)
	if err != nil {
		t.Fatal(err)
	}
	crd, err := os.ReadFile(filepath.Join("testdata", "gie", "inference.networking.k8s.io_inferencepools.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	installCRDs(t, dyn, chartObjects(t, crd))
	return dyn
}

func inferencePool(name string, sel map[string]any, ports ...int64) *unstructured.Unstructured {
	var tps []any
	for _, p := range ports {
		tps = append(tps, map[string]any{"number": p})
	}
	return &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "inference.networking.k8s.io/v1", "kind": "InferencePool",
		"metadata": map[string]any{"name": name},
		"spec": map[string]any{"selector": map[string]any{"matchLabels": sel}, "targetPorts": tps,
			"endpointPickerRef": map[string]any{"name": "epp", "port": map[string]any{"number": int64(9002)}}},
	}}
}

// testInferencePool: a rule's endpoints_from names an InferencePool of the
// upstream CRD; the pool's selector and targetPorts give the set, and a
// change to the pool (another selector, a second port) is followed.
func testInferencePool(t *testing.T, env *k8stest.Env) {
	const ns = "gie"
	cs := env.Client
	dyn := installPoolCRD(t, env)
	namespace(t, cs, ns)
	pa := pod("a-0", "192.0.2.70", true, nil)
	pa.Labels = map[string]string{"app": "a"}
	createPod(t, cs, ns, pa)
	pb := pod("b-0", "192.0.2.71", true, nil)
	pb.Labels = map[string]string{"app": "b"}
	createPod(t, cs, ns, pb)
	src, err := k8s.NewSourceFromConfig(env.Config, nil)
	if err != nil {
		t.Fatal(err)
	}
	gw := startGateway(t, src)
	r, err := rule.Decode([]byte("name: pool\nmodel_name: m\nprobe: {disabled: true}\nendpoints_from: {namespace: " + ns + ", inference_pool: llama}\n"))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := gw.Apply(r, false); !errors.Is(err, &rule.AdmissionError{Code: rule.CodeNoReadyEndpoint}) {
		t.Fatalf("apply before the pool exists: %v, want %s", err, rule.CodeNoReadyEndpoint)
	}
	pools := dyn.Resource(k8s.InferencePoolResource).Namespace(ns)
	if _, err := pools.Create(t.Context(), inferencePool("llama", map[string]any{"app": "a"}, 8000), metav1.CreateOptions{FieldValidation: "Strict"}); err != nil {
		t.Fatalf("an InferencePool of the upstream CRD: %v", err)
	}
	if _, err := gw.Apply(r, false); err != nil {
		t.Fatal(err)
	}
	if got := endpointIDs(gw, "pool"); got != "a-0=192.0.2.70:8000" {
		t.Fatalf("set %s, want a-0=192.0.2.70:8000", got)
	}
	u, err := pools.Get(t.Context(), "llama", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	u.Object["spec"] = inferencePool("llama", map[string]any{"app": "b"}, 8000, 8001).Object["spec"]
	if _, err := pools.Update(t.Context(), u, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	want := "b-0:8000=192.0.2.71:8000,b-0:8001=192.0.2.71:8001"
	wait.For(t, 20*time.Second, "the set of the changed pool "+want, func() bool { return endpointIDs(gw, "pool") == want })
}
