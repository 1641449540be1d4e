package gateway

import (
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil/promlint"

	"github.com/llmgw/llmgw/engines"
	"github.com/llmgw/llmgw/engines/sim"
	"github.com/llmgw/llmgw/internal/wait"
)

// TestKVExactDegradedIsVisible: tokenize failures or parity mismatches past
// the documented threshold mark the rule degraded in its status, on
// /metrics (llmgw_rule_degraded, the window gauges, promlint-clean) and on
// /readyz as a warning: the verdict and the status code are unchanged.
// Below the threshold nothing is marked.
func TestKVExactDegradedIsVisible(t *testing.T) {
	cases := []struct {
		name     string
		cause    string
		setup    func(t *testing.T) string // the rule
		requests int                       // before the mark; one more raises it
		reason   string                    // the window's miss reason, "" to skip
	}{
		{name: "tokenize failures", cause: degradedKVTokenize, requests: kvDegradeMinSamples - 1, reason: "tokenize_engine", setup: func(t *testing.T) string {
			srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				if r.URL.Path == "/tokenize" {
					http.Error(w, `{"error":"boom"}`, http.StatusInternalServerError)
					return
				}
				w.Header().Set("Content-Type", "application/json")
				fmt.Fprint(w, `{"id":"x","object":"chat.completion","created":1,"model":"m","choices":[{"index":0,"message":{"role":"assistant","content":"ok"},"finish_reason":"stop"}],"usage":{"prompt_tokens":1,"completion_tokens":1,"total_tokens":2}}`)
			}))
			t.Cleanup(srv.Close)
			h, p := hostPort(t, strings.TrimPrefix(srv.URL, "http://"))
			return fmt.Sprintf("name: kv\nmodel_name: m\nsel: 8\nkvEngineType: vllm\nkvExactMode: 3\nkvTokenizer: engine\nprobe: {disabled: true}\nendpoints:\n  - {id: w1, endpointIP: %s, targetPort: %d, kvEventsEndpoint: \"tcp://127.0.0.1:9\"}\n", h, p)
		}},
		{name: "parity mismatches", cause: degradedKVParity, requests: parityThreshold, setup: func(t *testing.T) string {
			// The engine hashes with another seed: the gateway never
			// predicts what the engine reuses.
			s, err := sim.Start(t.Context(), sim.Config{Engine: engines.VLLM, Model: "m", KVEvents: "tcp://127.0.0.1:0", HashSeed: "1", PrefillPerToken: time.Microsecond})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { s.Close() })
			return kvRule(t, "kv", "vllm", 16, []*sim.Sim{s})
		}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			gw := startGateway(t, "", nil)
			mustApply(t, gw, tc.setup(t))
			rt := gw.rules["kv"]
			if tc.cause == degradedKVParity {
				wait.For(t, 10*time.Second, "stream", func() bool { _, a, _ := rt.kv.ready(0); return a })
			}
			c := newClient(t)
			url := "http://" + gw.Addr() + "/v1/chat/completions"
			system := kvPrompt("degraded", 8)
			send := func(i int) {
				if resp, out := post(t, c, url, chatBodyFor(system, fmt.Sprint("question ", i))); resp.StatusCode != 200 {
					t.Fatalf("%d %s", resp.StatusCode, out)
				}
			}
			// In the parity case the first request warms the worker: its
			// response has nothing cached and is neutral, so the streak
			// reaches parityThreshold only with request n+1.
			n := tc.requests
			for i := 0; i < n; i++ {
				send(i)
			}
			st, _ := gw.Rule("kv")
			if st.Status.Degraded != "" {
				t.Fatalf("degraded below the threshold after %d requests: %s", n, st.Status.Degraded)
			}
			send(n)
			st, _ = gw.Rule("kv")
			if st.Status.DegradedCauses[tc.cause] == "" || !strings.Contains(st.Status.Degraded, tc.cause+": ") {
				t.Fatalf("not degraded for %s after %d requests: %q %+v %+v", tc.cause, n+1, st.Status.Degraded, st.Status.KVWindow, st.Status.KVParity)
			}
			if !st.Status.Ready {
				t.Errorf("a degraded rule is no longer ready: degradation is a warning")
			}
			if w := st.Status.KVWindow; tc.reason != "" && (w.Decisions != n+1 || w.Misses[tc.reason] != n+1 || w.HitShare != 0) {
				t.Errorf("window %+v; want %d decisions, all %s", w, n+1, tc.reason)
			}
			if got := gw.metricValue(t, "llmgw_rule_degraded", "kv", tc.cause); got != 1 {
				t.Errorf("llmgw_rule_degraded{cause=%q} = %v; want 1", tc.cause, got)
			}
			resp, err := c.Get("http://" + gw.AdminAddr() + "/readyz")
			if err != nil {
				t.Fatal(err)
			}
			var body struct {
				Ready    bool              `json:"ready"`
				Degraded map[string]string `json:"degraded"`
			}
			err = json.NewDecoder(resp.Body).Decode(&body)
			resp.Body.Close()
			if err != nil || resp.StatusCode != 200 || !body.Ready || !strings.Contains(body.Degraded["kv"], tc.cause) {
				t.Errorf("/readyz %d %+v (%v); want 200, ready, and the rule degraded for %s", resp.StatusCode, body, err, tc.cause)
			}
			lintMetrics(t, gw)
		})
	}
}

// lintMetrics runs promlint over the gateway's /metrics.
func lintMetrics(t *testing.T, gw *Server) {
	t.Helper()
	resp, err := newClient(t).Get("http://" + gw.AdminAddr() + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	problems, err := promlint.New(resp.Body).Lint()
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range problems {
		t.Errorf("%s: %s", p.Metric, p.Text)
	}
}

// TestKVWindowKnowsEveryReason: every miss reason the decision path can
// give is an outcome of the window (else it would not be counted).
func TestKVWindowKnowsEveryReason(t *testing.T) {
	src, err := os.ReadFile("kvexact.go")
	if err != nil {
		t.Fatal(err)
	}
	tok, err := os.ReadFile("kvtokens.go")
	if err != nil {
		t.Fatal(err)
	}
	re := regexp.MustCompile(`(?:reason = |return -1, |tokenizeErr\()"([a-z_]+)"`)
	found := 0
	for _, m := range re.FindAllSubmatch(append(src, tok...), -1) {
		found++
		if _, ok := kvOutcomeIndex[string(m[1])]; !ok {
			t.Errorf("miss reason %q is not in kvOutcomes", m[1])
		}
	}
	if found < 8 {
		t.Fatalf("found only %d reasons: the pattern is stale", found)
	}
}
