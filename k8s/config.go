package k8s

import (
	"fmt"

	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
)

// RESTConfig loads the client configuration: kubeconfig when given, else
// $KUBECONFIG or ~/.kube/config when present, else the pod's in-cluster
// service account (what the Helm chart's RBAC grants).
func RESTConfig(kubeconfig string) (*rest.Config, error) {
	rules := clientcmd.NewDefaultClientConfigLoadingRules()
	if kubeconfig != "" {
		rules.ExplicitPath = kubeconfig
	}
	cfg, err := clientcmd.NewNonInteractiveDeferredLoadingClientConfig(rules, &clientcmd.ConfigOverrides{}).ClientConfig()
	if err != nil {
		return nil, fmt.Errorf("k8s: client configuration: %w", err)
	}
	return cfg, nil
}

// NewSourceFromConfig returns a Source over a clientset for cfg, its
// watches counted and logged by h.
func NewSourceFromConfig(cfg *rest.Config, h *Health) (*Source, error) {
	cs, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return nil, fmt.Errorf("k8s: clientset: %w", err)
	}
	dyn, err := dynamic.NewForConfig(cfg)
	if err != nil {
		return nil, fmt.Errorf("k8s: dynamic client: %w", err)
	}
	return NewSource(cs, h).WithDynamic(dyn), nil
}
