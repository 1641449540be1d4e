package gateway

import (
	"io"
	"net/http"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus/testutil/promlint"
)

// TestMetricsLintClean runs promtool's linter (promlint, the library
// `promtool check metrics` uses) over the gateway's /metrics after traffic,
// so every family has samples.
func TestMetricsLintClean(t *testing.T) {
	a := newBackend(t, "a", nil)
	s := startGateway(t, "", nil)
	mustApply(t, s, ruleYAML("lint", "m-lint", "", a))
	c := newClient(t)
	for _, body := range []string{`{"model":"m-lint","messages":[{"role":"user","content":"hi"}]}`, `{"model":"nope"}`, `not json`} {
		_, _ = post(t, c, "http://"+s.Addr()+"/v1/chat/completions", body)
	}
	resp, err := c.Get("http://" + s.AdminAddr() + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	text, err := io.ReadAll(resp.Body)
	if err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("GET /metrics: %d %v", resp.StatusCode, err)
	}
	problems, err := promlint.New(strings.NewReader(string(text))).Lint()
	if err != nil {
		t.Fatalf("lint: %v", err)
	}
	for _, p := range problems {
		t.Errorf("%s: %s", p.Metric, p.Text)
	}
}
