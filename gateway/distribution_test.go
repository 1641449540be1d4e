package gateway

import (
	"fmt"
	"testing"
)

// These tests check policy behaviour end to end, through real listeners:
// the policy package's own tests cover the arithmetic in detail.
func TestDistributionsThroughGateway(t *testing.T) {
	bs := []*backend{newBackend(t, "a", nil), newBackend(t, "b", nil), newBackend(t, "c", nil)}
	s := startGateway(t, "", nil)
	c := newClient(t)
	url := "http://" + s.Addr() + "/v1/chat/completions"
	count := func(model string, n int, body func(i int) string, hdr func(i int) []string) map[string]int {
		got := map[string]int{}
		for i := 0; i < n; i++ {
			resp, b := post(t, c, url, body(i), hdr(i)...)
			if resp.StatusCode != 200 {
				t.Fatalf("status %d %s", resp.StatusCode, b)
			}
			got[resp.Header.Get("X-Llmgw-Endpoint")]++
		}
		return got
	}
	noHdr := func(int) []string { return nil }

	t.Run("round robin spreads evenly", func(t *testing.T) {
		mustApply(t, s, ruleYAML("rr", "rr", "sel: 0\nprobe: {disabled: true}", bs...))
		got := count("rr", 30, func(int) string { return `{"model":"rr","messages":[{"role":"user","content":"x"}]}` }, noHdr)
		for _, id := range []string{"w1", "w2", "w3"} {
			if got[id] != 10 {
				t.Errorf("rr spread %v; want 10 each", got)
			}
		}
	})
	t.Run("weighted round robin follows weights", func(t *testing.T) {
		mustApply(t, s, fmt.Sprintf(`name: wrr
model_name: wrr
sel: 2
probe: {disabled: true}
endpoints:
  - {id: w1, endpointIP: 127.0.0.1, targetPort: %d, weight: 3}
  - {id: w2, endpointIP: 127.0.0.1, targetPort: %d, weight: 1}
`, bs[0].port(), bs[1].port()))
		got := count("wrr", 40, func(int) string { return `{"model":"wrr","messages":[{"role":"user","content":"x"}]}` }, noHdr)
		if got["w1"] != 30 || got["w2"] != 10 {
			t.Errorf("wrr %v; want 30:10", got)
		}
	})
	t.Run("chwbl keeps a prompt on one endpoint and spreads prompts", func(t *testing.T) {
		mustApply(t, s, ruleYAML("ch", "ch", "sel: 8\nprobe: {disabled: true}", bs...))
		same := count("ch", 20, func(int) string {
			return `{"model":"ch","messages":[{"role":"system","content":"shared system prompt"},{"role":"user","content":"same question"}]}`
		}, noHdr)
		if len(same) != 1 {
			t.Errorf("identical prompts spread over %v; want one endpoint", same)
		}
		diff := count("ch", 60, func(i int) string {
			return fmt.Sprintf(`{"model":"ch","messages":[{"role":"user","content":"question number %d"}]}`, i)
		}, noHdr)
		if len(diff) != 3 {
			t.Errorf("60 distinct prompts landed on %v; want all 3 endpoints used", diff)
		}
	})
	t.Run("session affinity sticks by header", func(t *testing.T) {
		mustApply(t, s, ruleYAML("sess", "sess", "sel: 3\nsession_header_name: X-Session-ID\nprobe: {disabled: true}", bs...))
		for _, sess := range []string{"alice", "bob", "carol"} {
			got := count("sess", 10, func(int) string { return `{"model":"sess","messages":[{"role":"user","content":"x"}]}` },
				func(int) []string { return []string{"X-Session-ID", sess} })
			if len(got) != 1 {
				t.Errorf("session %s spread over %v; want one endpoint", sess, got)
			}
		}
		// Without the header, the body's user is the key.
		got := count("sess", 10, func(int) string { return `{"model":"sess","user":"dave","messages":[{"role":"user","content":"x"}]}` }, noHdr)
		if len(got) != 1 {
			t.Errorf("user fallback spread over %v; want one endpoint", got)
		}
	})
}
