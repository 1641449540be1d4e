package gateway

import (
	"net/http"
	"strings"
	"testing"

	"github.com/valyala/fasthttp"
)

// TestAdminRefusesManagedRuleWrites: with rules owned elsewhere
// (Config.RuleOwner, llmgw serve --rules-from kubernetes), the admin API
// refuses creating, replacing and deleting rules with 409 rules_managed
// naming the owning object; reading and draining still work, and the
// owner's own Apply (the rule sync) still writes.
func TestAdminRefusesManagedRuleWrites(t *testing.T) {
	b := newBackend(t, "b", func(ctx *fasthttp.RequestCtx) {})
	s := startGateway(t, "", func(c *Config) {
		c.RuleOwner = func(name string) string { return "the Rule object llm/" + name }
	})
	y := ruleYAML("r", "m", "", b)
	mustApply(t, s, y)
	base := "http://" + s.AdminAddr() + "/v1/rules"
	c := &http.Client{}
	for _, tc := range []struct{ name, method, url, body string }{
		{"create", http.MethodPost, base, strings.Replace(y, "name: r", "name: other", 1)},
		{"replace", http.MethodPut, base + "/r", y},
		{"delete", http.MethodDelete, base + "/r", ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			code, body := adminDo(t, c, tc.method, tc.url, tc.body, "")
			e, _ := body["error"].(map[string]any)
			if code != http.StatusConflict || e["code"] != "rules_managed" {
				t.Fatalf("%s: %d %v, want 409 rules_managed", tc.name, code, body)
			}
			if msg, _ := e["message"].(string); !strings.Contains(msg, "the Rule object llm/") || !strings.Contains(msg, "--allow-admin-rule-writes") {
				t.Errorf("message %q does not name the Rule object and the flag", msg)
			}
		})
	}
	if _, err := s.Rule("r"); err != nil {
		t.Fatalf("rule r after refused writes: %v", err)
	}
	if _, err := s.Rule("other"); err == nil {
		t.Error("the refused create installed rule other")
	}
	if code, body := adminDo(t, c, http.MethodGet, base+"/r", "", ""); code != http.StatusOK {
		t.Errorf("GET: %d %v", code, body)
	}
	if code, body := adminDo(t, c, http.MethodPost, base+"/r/drain", "", ""); code != http.StatusOK {
		t.Errorf("drain: %d %v", code, body)
	}
}
