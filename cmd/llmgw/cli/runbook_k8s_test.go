package cli

import (
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/llmgw/llmgw/internal/k8stest"
)

// TestAttachEndpointsFrom: --endpoints-from resolves a Service's ready
// EndpointSlice addresses through a kubeconfig, against a real API server,
// and refuses malformed references before connecting.
func TestAttachEndpointsFrom(t *testing.T) {
	for _, tc := range []struct{ name, ref, want string }{
		{"no scheme", "llm/vllm", "want kubernetes:NAMESPACE/SERVICE"},
		{"no service", "kubernetes:llm", "want kubernetes:NAMESPACE/SERVICE"},
		{"bad namespace", "kubernetes:LLM/vllm", "namespace"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if _, _, err := attachFromCluster(tc.ref, "/nonexistent"); err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("err %v, want %q", err, tc.want)
			}
		})
	}
	env := k8stest.Start(t)
	cs := env.Client
	if _, err := cs.CoreV1().Namespaces().Create(t.Context(), &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "llm"}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	yes, no := true, false
	port := int32(8000)
	// Documentation addresses: the API server refuses loopback ones in
	// EndpointSlices, and nothing is dialled here.
	if _, err := cs.DiscoveryV1().EndpointSlices("llm").Create(t.Context(), &discoveryv1.EndpointSlice{
		ObjectMeta:  metav1.ObjectMeta{Name: "vllm-1", Labels: map[string]string{discoveryv1.LabelServiceName: "vllm"}},
		AddressType: discoveryv1.AddressTypeIPv4,
		Ports:       []discoveryv1.EndpointPort{{Port: &port}},
		Endpoints: []discoveryv1.Endpoint{
			{Addresses: []string{"192.0.2.20"}, Conditions: discoveryv1.EndpointConditions{Ready: &yes}},
			{Addresses: []string{"192.0.2.21"}, Conditions: discoveryv1.EndpointConditions{Ready: &no}},
			{Addresses: []string{"192.0.2.22"}},
		},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	eps, events, err := attachFromCluster("kubernetes:llm/vllm", env.Kubeconfig(t))
	if err != nil {
		t.Fatal(err)
	}
	if got := strings.Join(eps, ","); got != "192.0.2.20:8000,192.0.2.22:8000" || events != nil {
		t.Fatalf("endpoints %s events %v, want the two ready addresses and no events", got, events)
	}
	if _, _, err := attachFromCluster("kubernetes:llm/none", env.Kubeconfig(t)); err == nil || !strings.Contains(err.Error(), "no ready endpoint") {
		t.Fatalf("empty Service: err %v", err)
	}
}
