package cli

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// TestServeWithInadmissibleRuleExitsPromptly starts `serve --rules` with a
// KV-exact rule that admission refuses, many times: every run must return
// the admission error, never hang (a start-up race once left serve in
// Server.Close with its data port still accepting and SIGTERM ignored).
func TestServeWithInadmissibleRuleExitsPromptly(t *testing.T) {
	dir := t.TempDir()
	rules := filepath.Join(dir, "rules.yaml")
	// llamacpp refuses kvExactMode (DESIGN §4).
	bad := "name: bad\nmodel_name: m\nkvEngineType: llamacpp\nkvExactMode: 3\nendpoints:\n  - {id: w1, endpointIP: 127.0.0.1, targetPort: 9}\n"
	if err := os.WriteFile(rules, []byte(bad), 0o600); err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 25; i++ {
		ios, _, _ := TestIO()
		root := NewRootCmd(ios)
		root.SetArgs([]string{"serve", "--listen", "127.0.0.1:0", "--admin", "127.0.0.1:0", "--state-dir", filepath.Join(dir, "state"), "--rules", rules, "--log-level", "error"})
		done := make(chan error, 1)
		go func() { done <- root.ExecuteContext(context.Background()) }()
		select {
		case err := <-done:
			if i == 0 {
				t.Logf("serve: %v", err)
			}
			if err == nil || !strings.Contains(err.Error(), `rule "bad"`) {
				t.Fatalf("run %d: serve returned %v; want the admission error for rule \"bad\"", i, err)
			}
		case <-time.After(30 * time.Second):
			t.Fatalf("run %d: serve with an inadmissible rule did not exit", i)
		}
	}
}
