package sim

import (
	"net/http"
	"testing"

	"github.com/llmgw/llmgw/engines"
)

// TestSilentServesNoControlEndpoints: a Silent simulator answers /_sim/*
// with its persona's 404, as the real engine would, and still serves.
func TestSilentServesNoControlEndpoints(t *testing.T) {
	for _, kind := range engines.Kinds() {
		t.Run(string(kind), func(t *testing.T) {
			s := startSim(t, Config{Engine: kind, Silent: true, KVEvents: KVEventsOff})
			c := client(t)
			base := "http://" + s.Addrs().HTTP
			for _, p := range []struct{ method, path string }{
				{http.MethodGet, "/_sim/receipts"}, {http.MethodGet, "/_sim/faults"},
				{http.MethodPost, "/_sim/faults"}, {http.MethodGet, "/_sim/addrs"}, {http.MethodPost, "/_sim/reset_cache"},
			} {
				if r := do(t, c, p.method, base+p.path, ""); r.status != http.StatusNotFound {
					t.Errorf("%s %s = %d; want 404", p.method, p.path, r.status)
				}
			}
			if r := do(t, c, http.MethodGet, base+"/health", ""); r.status != http.StatusOK {
				t.Errorf("GET /health = %d; want 200", r.status)
			}
			// The control surface really is the receipt log when not silent.
			loud := startSim(t, Config{Engine: kind, KVEvents: KVEventsOff})
			if r := do(t, c, http.MethodGet, "http://"+loud.Addrs().HTTP+"/_sim/receipts", ""); r.status != http.StatusOK {
				t.Errorf("non-silent GET /_sim/receipts = %d; want 200", r.status)
			}
		})
	}
}
