//go:build faults

package reliability

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/llmgw/llmgw/reliability/harness"
)

// versionedRule is a rule whose model_name carries its writer and version,
// so that read-back shows exactly which write is in effect.
func versionedRule(name, model, simPort string) string {
	return fmt.Sprintf("name: %s\nmodel_name: %s\nprobe: {disabled: true}\nendpoints:\n  - {id: w1, endpointIP: 127.0.0.1, targetPort: %s}\n", name, model, simPort)
}

// ruleModels reads every rule back through GET /v1/rules as name -> model.
func ruleModels(t *testing.T, g *harness.Gateway) map[string]string {
	t.Helper()
	resp, err := http.Get(g.AdminURL() + "/v1/rules")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var list struct {
		Rules []struct {
			Rule struct {
				Name  string `json:"name"`
				Model string `json:"model_name"`
			} `json:"rule"`
		} `json:"rules"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&list); err != nil {
		t.Fatalf("list rules: %v", err)
	}
	out := map[string]string{}
	for _, r := range list.Rules {
		out[r.Rule.Name] = r.Rule.Model
	}
	return out
}

// getModel reads one rule through GET /v1/rules/{name}.
func getModel(t *testing.T, g *harness.Gateway, name string) (string, bool) {
	t.Helper()
	b, err := g.GetRule(t.Context(), name)
	if err != nil {
		return "", false
	}
	var st struct {
		Rule struct {
			Model string `json:"model_name"`
		} `json:"rule"`
	}
	if err := json.Unmarshal(b, &st); err != nil {
		t.Fatalf("get %s: %v", name, err)
	}
	return st.Rule.Model, true
}

// TestGatewayKill9KeepsRules: writers update their own rules version after
// version while the gateway is killed with SIGKILL at an arbitrary moment.
// After a restart on the same state directory, every rule holds its last
// acknowledged version (or the one in flight at the kill, never an older
// one), acknowledged deletes stay deleted, and the data plane routes by the
// restored rules.
func TestGatewayKill9KeepsRules(t *testing.T) {
	cases := []struct {
		name    string
		writers int
		rules   int // per writer
		killAt  int // total acknowledged writes before the kill
	}{
		{"kill during 4 concurrent writers", 4, 3, 60},
		{"kill right after a single writer's ack", 1, 2, 15},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			s := startSim(t, "w1", "--kv-events", "off")
			simPort := port(t, s.Addrs.HTTP)
			state := t.TempDir()
			g := startGW(t, state)
			type ack struct {
				version int
				deleted bool
			}
			var mu sync.Mutex
			acked := map[string]ack{} // last acknowledged write per rule
			var total atomic.Int64
			ctx, stop := context.WithCancel(t.Context())
			defer stop()
			var wg sync.WaitGroup
			for w := range tc.writers {
				wg.Add(1)
				go func() {
					defer wg.Done()
					for v := 1; ctx.Err() == nil; v++ {
						for r := range tc.rules {
							name := fmt.Sprintf("w%d-r%d", w, r)
							var err error
							deleted := v%5 == 0 && r == 0 // every fifth round deletes r0
							if deleted {
								err = deleteRule(ctx, g, name)
							} else {
								err = g.PutRule(ctx, name, versionedRule(name, fmt.Sprintf("%s-v%d", name, v), simPort))
							}
							if err != nil {
								return // the gateway died: this write is unacknowledged
							}
							mu.Lock()
							acked[name] = ack{version: v, deleted: deleted}
							mu.Unlock()
							if total.Add(1) == int64(tc.killAt) {
								g.Kill()
							}
						}
					}
				}()
			}
			<-g.Done()
			stop()
			wg.Wait()
			g2 := startGW(t, state)
			got := ruleModels(t, g2)
			mu.Lock()
			defer mu.Unlock()
			checked := 0
			for name, a := range acked {
				model, ok := got[name]
				switch {
				case a.deleted:
					// Deleted, unless the next version's PUT was in flight.
					if ok && model != fmt.Sprintf("%s-v%d", name, a.version+1) {
						t.Errorf("rule %s: acknowledged delete, found %q after restart", name, model)
					}
				case !ok:
					t.Errorf("rule %s: acknowledged version %d lost after kill -9", name, a.version)
				default:
					var v int
					if _, err := fmt.Sscanf(model[len(name):], "-v%d", &v); err != nil || v < a.version || v > a.version+1 {
						t.Errorf("rule %s: model %q after restart; want version %d (or %d in flight)", name, model, a.version, a.version+1)
					}
				}
				checked++
			}
			if checked == 0 || total.Load() < int64(tc.killAt) {
				t.Fatalf("%d acknowledged writes, %d rules checked; the kill did not happen under load", total.Load(), checked)
			}
			// The data plane routes by every restored rule: the request for
			// its model reaches its endpoint (the sim itself serves only
			// model "m", so it answers 404 for the others; that answer is
			// relayed, which proves the route).
			c := newClient(t, 10*time.Second)
			for name, model := range got {
				body := fmt.Sprintf(`{"model":%q,"max_tokens":2,"messages":[{"role":"user","content":"hi"}]}`, model)
				if r := chat(t.Context(), c, g2.URL(), body); r.err != nil || r.endpoint != "w1" {
					t.Errorf("restored rule %s (model %s) not routed: status %d endpoint %q err %v %s", name, model, r.status, r.endpoint, r.err, r.body)
				}
			}
			t.Logf("%d acknowledged writes before SIGKILL; %d rules checked after restart", total.Load(), checked)
		})
	}
}

func deleteRule(ctx context.Context, g *harness.Gateway, name string) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodDelete, g.AdminURL()+"/v1/rules/"+name, nil)
	if err != nil {
		return err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return err
	}
	resp.Body.Close()
	if resp.StatusCode/100 != 2 && resp.StatusCode != http.StatusNotFound {
		return fmt.Errorf("delete %s: %d", name, resp.StatusCode)
	}
	return nil
}

// TestConcurrentAdminWritesConsistent: many writers create, update and
// delete rules at once through the admin API, some racing on one shared
// rule. Afterwards the list and the per-rule reads agree, every writer's own
// rules hold its last write, the shared rule holds one of the written
// versions, and a clean restart reads back the same state.
func TestConcurrentAdminWritesConsistent(t *testing.T) {
	s := startSim(t, "w1", "--kv-events", "off")
	simPort := port(t, s.Addrs.HTTP)
	state := t.TempDir()
	g := startGW(t, state)
	const writers, rounds = 8, 12
	var wg sync.WaitGroup
	var mu sync.Mutex
	last := map[string]string{} // own rules: last written model ("" = deleted)
	shared := map[string]bool{} // every model written to the shared rule
	errs := make(chan error, writers)
	for w := range writers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for v := 1; v <= rounds; v++ {
				for r := range 2 {
					name := fmt.Sprintf("own-w%d-r%d", w, r)
					model := fmt.Sprintf("%s-v%d", name, v)
					var err error
					if r == 1 && v%4 == 0 {
						model = ""
						err = deleteRule(t.Context(), g, name)
					} else {
						err = g.PutRule(t.Context(), name, versionedRule(name, model, simPort))
					}
					if err != nil {
						errs <- err
						return
					}
					mu.Lock()
					last[name] = model
					mu.Unlock()
				}
				model := fmt.Sprintf("shared-w%d-v%d", w, v)
				mu.Lock()
				shared[model] = true
				mu.Unlock()
				if err := g.PutRule(t.Context(), "shared", versionedRule("shared", model, simPort)); err != nil {
					errs <- err
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatalf("admin write failed: %v", err)
	}
	check := func(g *harness.Gateway, when string) map[string]string {
		list := ruleModels(t, g)
		for name, model := range last {
			got, ok := list[name]
			if model == "" && ok || model != "" && got != model {
				t.Errorf("%s: rule %s reads %q (present %v); want %q", when, name, got, ok, model)
			}
		}
		if !shared[list["shared"]] {
			t.Errorf("%s: shared rule reads %q, which no writer wrote", when, list["shared"])
		}
		for name, model := range list {
			if got, ok := getModel(t, g, name); !ok || got != model {
				t.Errorf("%s: GET %s = %q, list says %q", when, name, got, model)
			}
		}
		return list
	}
	before := check(g, "live")
	g.Stop()
	g2 := startGW(t, state)
	after := check(g2, "after restart")
	if len(before) != len(after) {
		t.Errorf("%d rules before the restart, %d after", len(before), len(after))
	}
	t.Logf("%d writers x %d rounds; %d rules read back consistently, shared = %s", writers, rounds, len(after), after["shared"])
}
