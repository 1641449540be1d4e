package gateway

import (
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/llmgw/llmgw/internal/wait"
)

// getReady asks the admin API's /readyz (with query q, e.g. "?model=m1").
func getReady(t *testing.T, s *Server, q string) (int, map[string]any) {
	t.Helper()
	c := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{DisableKeepAlives: true}}
	resp, err := c.Get("http://" + s.AdminAddr() + "/readyz" + q)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	var m map[string]any
	if err := json.Unmarshal(b, &m); err != nil {
		t.Fatalf("/readyz%s body %q: %v", q, b, err)
	}
	return resp.StatusCode, m
}

// TestReadyzWithOneEmptyPool (issue 42): one model whose discovered pool
// has gone empty must not take the gateway out of its Service. /readyz
// stays 200 while another rule serves and names the empty one;
// ?model= answers per model; --readyz-strict keeps the old form; the
// rule's status names the empty pool.
func TestReadyzWithOneEmptyPool(t *testing.T) {
	tests := []struct {
		name       string
		strict     bool
		q          string
		wantCode   int
		wantRules  string // the rules listed, sorted, "name=ready"
		notServed  bool
		wantNamed  bool // "d" in rules_not_ready
		wantReason string
	}{
		{"any rule serving: ready", false, "", 200, "d=false,up=true", false, true, "endpoint pool empty"},
		{"strict: not ready", true, "", 503, "d=false,up=true", false, true, "endpoint pool empty"},
		{"the empty pool's model: not ready", false, "?model=m1", 503, "d=false", false, true, "endpoint pool empty"},
		{"the serving model: ready", false, "?model=m-up", 200, "up=true", false, false, ""},
		{"the serving model, strict: ready", true, "?model=m-up", 200, "up=true", false, false, ""},
		{"a model no rule serves: not ready", false, "?model=nope", 503, "", true, false, ""},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			a, b := newBackend(t, "a", nil), newBackend(t, "b", nil)
			src := &pushSource{initial: epsOf(b)}
			t.Cleanup(src.wg.Wait)
			gw := startGateway(t, "", func(c *Config) {
				c.EndpointSource = src
				c.ReadyzStrict = tc.strict
			})
			mustApply(t, gw, ruleYAML("up", "m-up", "probe: {disabled: true}", a))
			mustApply(t, gw, discoveredRule)
			src.push(nil) // every pod of "d" gone
			wait.For(t, 5*time.Second, "rule d's pool empty", func() bool {
				st, err := gw.Rule("d")
				return err == nil && st.Status.PoolEmpty && !st.Status.Ready
			})
			code, body := getReady(t, gw, tc.q)
			if code != tc.wantCode || body["ready"] != (tc.wantCode == 200) {
				t.Errorf("/readyz%s = %d %v; want %d", tc.q, code, body, tc.wantCode)
			}
			rules, _ := body["rules"].(map[string]any)
			var got []string
			for _, n := range []string{"d", "up"} {
				if v, ok := rules[n]; ok {
					got = append(got, n+"="+strings.TrimSpace(toJSON(v)))
				}
			}
			if g := strings.Join(got, ","); g != tc.wantRules || len(rules) != len(got) {
				t.Errorf("rules %v; want %s", rules, tc.wantRules)
			}
			nr, _ := body["rules_not_ready"].(map[string]any)
			why, named := nr["d"].(string)
			if named != tc.wantNamed || !strings.Contains(why, tc.wantReason) {
				t.Errorf("rules_not_ready %v; want d named: %v, reason containing %q", nr, tc.wantNamed, tc.wantReason)
			}
			if _, ok := nr["up"]; ok {
				t.Errorf("rules_not_ready names the serving rule: %v", nr)
			}
			if ns, _ := body["model_not_served"].(bool); ns != tc.notServed {
				t.Errorf("model_not_served = %v; want %v", body["model_not_served"], tc.notServed)
			}
			st, err := gw.Rule("d")
			if err != nil {
				t.Fatal(err)
			}
			if !strings.Contains(st.Status.NotReady, "endpoint pool empty") {
				t.Errorf("rule d status not_ready %q; want the empty pool named", st.Status.NotReady)
			}
		})
	}
}

func toJSON(v any) string {
	b, _ := json.Marshal(v)
	return string(b)
}

// TestReadyzNamesWhyARuleCannotServe: a rule whose endpoints are all held
// back is named with the count of each cause; a server without rules is
// ready (no rule fails).
func TestReadyzNamesWhyARuleCannotServe(t *testing.T) {
	gw := startGateway(t, "", nil)
	if code, body := getReady(t, gw, ""); code != 200 {
		t.Errorf("/readyz with no rules = %d %v; want 200", code, body)
	}
	a, b := newBackend(t, "a", nil), newBackend(t, "b", nil)
	mustApply(t, gw, ruleYAML("r", "m1", "probe: {disabled: true}", a, b))
	for _, id := range []string{"w1", "w2"} {
		if err := gw.SetDraining("r", id, true); err != nil {
			t.Fatal(err)
		}
	}
	code, body := getReady(t, gw, "")
	nr, _ := body["rules_not_ready"].(map[string]any)
	if want := "no endpoint available (2 endpoints: 0 down, 2 draining, 0 breaker-open)"; code != 503 || nr["r"] != want {
		t.Errorf("/readyz = %d %v; want 503 naming r: %q", code, body, want)
	}
}

// TestReadyzHoldsUntilInitialRules: with AwaitInitialRules, /readyz says
// 503 "starting" after Start, even with a rule installed, until the caller
// says the rules given at start are in.
func TestReadyzHoldsUntilInitialRules(t *testing.T) {
	gw := startGateway(t, "", func(c *Config) { c.AwaitInitialRules = true })
	mustApply(t, gw, ruleYAML("r", "m1", "probe: {disabled: true}", newBackend(t, "a", nil)))
	if code, body := getReady(t, gw, ""); code != 503 || body["starting"] == nil {
		t.Errorf("/readyz before InitialRulesInstalled = %d %v; want 503 starting", code, body)
	}
	gw.InitialRulesInstalled()
	if code, body := getReady(t, gw, ""); code != 200 {
		t.Errorf("/readyz after InitialRulesInstalled = %d %v; want 200", code, body)
	}
}
