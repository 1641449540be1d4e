package cli

import (
	"strings"
	"testing"

	"github.com/llmgw/llmgw/gateway"
	"github.com/llmgw/llmgw/gateway/rule"
)

// TestRuleGetShowsKVWindowAndDegraded: `llmgw rule get` (table) prints a
// KV-exact rule's recent effectiveness and, whole even on a narrow
// terminal, why it is degraded.
func TestRuleGetShowsKVWindowAndDegraded(t *testing.T) {
	const warning = "kv_tokenize: 10 of the last 10 KV-exact decisions could not tokenize the prompt (tokenize_engine 10) and fell back to the rule's policy"
	cases := []struct {
		name     string
		width    int
		status   gateway.RuleLiveStatus
		want     []string
		wantNone string
	}{
		{
			name: "degraded on a narrow terminal", width: 40,
			status: gateway.RuleLiveStatus{Ready: true, Degraded: warning,
				KVWindow: &gateway.KVWindowStatus{Size: 100, Decisions: 10, Misses: map[string]int{"tokenize_engine": 10}}},
			want: []string{"kv-exact: 0 hits of the last 10", "degraded: " + warning + "\n"},
		},
		{
			name:     "healthy",
			status:   gateway.RuleLiveStatus{Ready: true, KVWindow: &gateway.KVWindowStatus{Size: 100, Decisions: 4, Hits: 3, HitShare: 0.75, Misses: map[string]int{"no_match": 1}}},
			want:     []string{"kv-exact: 3 hits of the last 4 decisions (75%); misses no_match 1; parity 0 mismatched of 0 checked\n"},
			wantNone: "degraded",
		},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			ios, out, _ := TestIO()
			ios.Width = tc.width
			st := &gateway.RuleStatus{Rule: &rule.Rule{Name: "kv", ModelName: "m"}, Status: tc.status}
			if err := writeRuleStatus(ios, outputTable, st); err != nil {
				t.Fatal(err)
			}
			for _, w := range tc.want {
				if !strings.Contains(out.String(), w) {
					t.Errorf("output %q lacks %q", out.String(), w)
				}
			}
			if tc.wantNone != "" && strings.Contains(out.String(), tc.wantNone) {
				t.Errorf("output %q mentions %q", out.String(), tc.wantNone)
			}
		})
	}
}
