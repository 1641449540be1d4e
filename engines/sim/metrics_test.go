package sim

import (
	"bytes"
	"fmt"
	"net/http"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus/testutil/promlint"

	"github.com/llmgw/llmgw/engines"
)

// lintException is a promlint problem the real engine's own exposition
// has, kept so that the persona's series stay the engine's.
type lintException struct {
	metric, text string // promlint's Problem, matched exactly
	reason       string
}

// metricsLintExceptions are, per persona, the only promlint problems its
// /metrics may show. Each is the real engine's name or type as its
// fixture records it; renaming it would make the simulator disagree with
// the engine it stands in for. Beside these, promlint's "should not
// contain ':'" is allowed on every name in the engine's own namespace
// (vllm:, sglang:, llamacpp:): those are the engines' real names, and ':'
// is valid in the exposition format (promtool only advises against it).
var metricsLintExceptions = map[engines.Kind][]lintException{
	engines.LlamaCpp: {
		{
			metric: "llamacpp:n_busy_slots_per_decode",
			text:   `counter metrics should have "_total" suffix`,
			reason: "llama-server declares it a counter without _total (server.cpp handle_metrics; " +
				"captured in engines/llamacpp/testdata/cases/metrics_enabled_*.http)",
		},
	},
}

// colonProblem is promlint's text for a name with ':'
// (validations.LintReservedChars in client_golang v1.25.0).
const colonProblem = "metric names should not contain ':'"

// TestMetricsPromlint runs promlint, the linter behind `promtool check
// metrics`, over every persona's /metrics after one request: the output
// parses as Prometheus text and shows no problem but the listed
// exceptions, each of which must still occur.
func TestMetricsPromlint(t *testing.T) {
	for _, kind := range append(append([]engines.Kind{}, sourceEngines...), engines.LlamaCpp) {
		t.Run(string(kind), func(t *testing.T) {
			t.Parallel()
			s := startSim(t, Config{Engine: kind, KVEvents: KVEventsOff, EnableMetrics: true})
			c := client(t)
			base := "http://" + s.Addrs().HTTP
			chat := fmt.Sprintf(`{"model":%q,"messages":[{"role":"user","content":"hello there"}],"max_tokens":4}`, s.cfg.Model)
			if r := do(t, c, http.MethodPost, base+"/v1/chat/completions", chat); r.status != http.StatusOK {
				t.Fatalf("chat: status %d: %s", r.status, r.body)
			}
			path := engines.MustFor(kind).Surfaces().Metrics
			r := do(t, c, http.MethodGet, base+path, "")
			if r.status != http.StatusOK || r.err != nil {
				t.Fatalf("%s: status %d, err %v: %s", path, r.status, r.err, r.body)
			}
			// An empty or foreign body would lint clean: the series the
			// lab reads must be there.
			names := engines.MustFor(kind).Metrics()
			for _, name := range []string{names.PromptTokens, names.RunningRequests} {
				if name != "" && !bytes.Contains(r.body, []byte("\n# TYPE "+name+" ")) {
					t.Errorf("%s: no family %q", path, name)
				}
			}
			problems, err := promlint.New(bytes.NewReader(r.body)).Lint()
			if err != nil {
				t.Fatalf("promlint: %v\n%s", err, r.body)
			}
			allowed := map[promlint.Problem]bool{}
			for _, e := range metricsLintExceptions[kind] {
				allowed[promlint.Problem{Metric: e.metric, Text: e.text}] = false
			}
			colon := string(kind) + ":"
			for _, p := range problems {
				if p.Text == colonProblem && strings.HasPrefix(p.Metric, colon) {
					continue
				}
				seen, ok := allowed[p]
				if !ok {
					t.Errorf("promlint: %s: %s", p.Metric, p.Text)
					continue
				}
				if seen {
					t.Errorf("promlint: %s: %s reported twice", p.Metric, p.Text)
				}
				allowed[p] = true
			}
			for p, seen := range allowed {
				if !seen {
					t.Errorf("exception %s: %q no longer reported: drop it from metricsLintExceptions", p.Metric, p.Text)
				}
			}
			if t.Failed() {
				t.Logf("/metrics:\n%s", strings.TrimSpace(string(r.body)))
			}
		})
	}
}
