//go:build faults

package reliability

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/llmgw/llmgw/internal/testfix"
	"github.com/llmgw/llmgw/internal/wait"
	"github.com/llmgw/llmgw/reliability/harness"
)

// inventory is the part of GET /v1/rules/{name}/inventory the suite reads.
type inventory struct {
	Endpoints []struct {
		ID              string   `json:"id"`
		EventsConnected bool     `json:"events_connected"`
		InventoryBlocks int      `json:"inventory_blocks"`
		Resyncs         uint64   `json:"resyncs"`
		LastResync      string   `json:"last_resync_reason"`
		Sample          []uint64 `json:"sample_keys"`
	} `json:"endpoints"`
}

func readInventory(t *testing.T, g *harness.Gateway, rule string) inventory {
	t.Helper()
	resp, err := http.Get(g.AdminURL() + "/v1/rules/" + rule + "/inventory?sample=100000")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("inventory: %d %s", resp.StatusCode, b)
	}
	var inv inventory
	if err := json.Unmarshal(b, &inv); err != nil {
		t.Fatalf("inventory: %v", err)
	}
	return inv
}

func (inv inventory) keys(id string) map[uint64]bool {
	out := map[uint64]bool{}
	for _, e := range inv.Endpoints {
		if e.ID == id {
			for _, k := range e.Sample {
				out[k] = true
			}
		}
	}
	return out
}

func (inv inventory) endpoint(id string) (blocks int, resyncs uint64, reason string) {
	for _, e := range inv.Endpoints {
		if e.ID == id {
			return e.InventoryBlocks, e.Resyncs, e.LastResync
		}
	}
	return 0, 0, ""
}

func longSystem(topic string) string {
	var b strings.Builder
	for i := range 10 {
		fmt.Fprintf(&b, "Paragraph %d about %s: the gateway routes each request to the worker that holds its prefix. ", i, topic)
	}
	return b.String()
}

func kvChat(system, user string) string {
	return fmt.Sprintf(`{"model":"m","max_tokens":4,"messages":[{"role":"system","content":%q},{"role":"user","content":%q}]}`, system, user)
}

const kvBlock = 16

// checkNoPhantomHits is the no-phantom-routing invariant: every request the
// gateway routed as a KV-exact hit of N blocks reached an engine that
// reported at least the tokens of those blocks as cached (capped, as the
// gateway's prediction is, by the last prompt token, which is never reused).
func checkNoPhantomHits(t *testing.T, rs []result, sims map[string]*harness.Sim) (hits int) {
	t.Helper()
	receipts := map[string]map[string]harness.Receipt{}
	for id, s := range sims {
		list, err := s.Receipts(t.Context())
		if err != nil {
			t.Fatal(err)
		}
		receipts[id] = map[string]harness.Receipt{}
		for _, r := range list {
			receipts[id][r.RequestID] = r
		}
	}
	for _, r := range rs {
		var n, total int
		if _, err := fmt.Sscanf(r.route, "kv-exact hit=%d/%d", &n, &total); err != nil || n == 0 {
			continue
		}
		hits++
		rec, ok := receipts[r.endpoint][r.requestID]
		if !ok {
			t.Errorf("request %s routed as %q to %s has no receipt there", r.requestID, r.route, r.endpoint)
			continue
		}
		want := min(n, (rec.PromptTokens-1)/kvBlock) * kvBlock
		if rec.CachedTokens < want {
			t.Errorf("phantom hit: request %s routed as %q to %s, engine reused %d tokens; want >= %d", r.requestID, r.route, r.endpoint, rec.CachedTokens, want)
		}
	}
	return hits
}

// TestKVInventoryResync: an engine's KV event stream loses continuity — its
// publisher restarts with an empty cache, a batch skips sequence numbers, or
// batches are lost — and the gateway must clear that endpoint's inventory,
// rebuild it from later events, and never route a request as a KV-exact hit
// on blocks the engine does not hold.
func TestKVInventoryResync(t *testing.T) {
	simFault := func(patch map[string]any) func(t *testing.T, s *harness.Sim) *harness.Sim {
		return func(t *testing.T, s *harness.Sim) *harness.Sim {
			if err := s.SetFaults(t.Context(), patch); err != nil {
				t.Fatal(err)
			}
			return s
		}
	}
	cases := []struct {
		name string
		// fault breaks the stream of s and returns the sim now serving.
		fault func(t *testing.T, s *harness.Sim) *harness.Sim
		// reasons are the acceptable last_resync_reason values.
		reasons []string
		// quiet: the gateway must clear without any new event — the
		// publisher's socket closed and reopened, and the subscriber
		// learns of the restart from the replay buffer on reconnecting.
		quiet bool
		// repaired: the lost batches are still in the publisher's replay
		// buffer, so the subscriber fills the gap and nothing is cleared.
		repaired bool
	}{
		{name: "publisher restart, engine keeps serving", fault: simFault(map[string]any{"restart_publisher": true}),
			reasons: []string{"publisher_restart", "regression"}, quiet: true},
		{name: "sequence gap", fault: simFault(map[string]any{"seq_gap": 5}), reasons: []string{"gap"}},
		{name: "dropped event batches repaired from the replay buffer", fault: simFault(map[string]any{"drop_events": 2}), repaired: true},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			sims := map[string]*harness.Sim{}
			var rule strings.Builder
			fmt.Fprintf(&rule, "name: kv\nmodel_name: m\nsel: 8\nkvEngineType: vllm\nkvExactMode: 3\nkvTokenizer: %q\nkvBlockSize: 16\nprobe: {path: /health, interval: 200ms, timeout: 100ms}\nendpoints:\n", testfix.Qwen3Dir(t))
			for i := range 2 {
				id := fmt.Sprintf("w%d", i+1)
				s := startSim(t, id, "--prefill-us-per-token", "1")
				sims[id] = s
				fmt.Fprintf(&rule, "  - {id: %s, endpointIP: 127.0.0.1, targetPort: %s, kvEventsEndpoint: %q, kvReplayEndpoint: %q}\n", id, port(t, s.Addrs.HTTP), s.Addrs.Events, s.Addrs.Replay)
			}
			g := startGW(t, "")
			putRule(t, g, "kv", rule.String())
			wait.For(t, 10*time.Second, "both event streams connected", func() bool {
				inv := readInventory(t, g, "kv")
				return len(inv.Endpoints) == 2 && inv.Endpoints[0].EventsConnected && inv.Endpoints[1].EventsConnected
			})
			c := newClient(t, 10*time.Second)
			var all []result
			send := func(body string) result {
				r := chat(t.Context(), c, g.URL(), body)
				if r.failed() {
					t.Fatalf("request: status %d err %v %s", r.status, r.err, r.body)
				}
				all = append(all, r)
				return r
			}
			system := longSystem("routing")
			warm := send(kvChat(system, "first question"))
			x := warm.endpoint
			wait.For(t, 10*time.Second, "the warmed worker's inventory to fill", func() bool {
				b, _, _ := readInventory(t, g, "kv").endpoint(x)
				return b > 0
			})
			if r := send(kvChat(system, "second question")); r.endpoint != x || !strings.HasPrefix(r.route, "kv-exact hit=") {
				t.Fatalf("follow-up routed to %s as %q; want a kv-exact hit on %s", r.endpoint, r.route, x)
			}
			before := readInventory(t, g, "kv")
			warmKeys := before.keys(x)
			_, resyncs0, _ := before.endpoint(x)

			sims[x] = tc.fault(t, sims[x])
			// The warm prompt right after the fault. The engine still holds
			// its blocks after a gap; after a restart this request races
			// the transport noticing the closed socket, so it is sent only
			// once the restart is known (below).
			if !tc.quiet {
				r := send(kvChat(system, "question right after the fault"))
				t.Logf("right after the fault: routed to %s as %q", r.endpoint, r.route)
			}
			n := 0 // direct requests to the faulted engine
			if tc.quiet {
				took := wait.For(t, 10*time.Second, "a resync of "+x+" with no new events", func() bool {
					_, rs, _ := readInventory(t, g, "kv").endpoint(x)
					return rs > resyncs0
				})
				t.Logf("restart noticed %v after the fault, before any new event", took.Round(time.Millisecond))
			}
			direct := newClient(t, 10*time.Second)
			directChat := func(n int) harness.Receipt {
				r := chat(t.Context(), direct, sims[x].URL(), fmt.Sprintf(`{"model":"m","max_tokens":2,"messages":[{"role":"user","content":"unrelated zebra log line %d with enough words to fill a block or two of tokens"}]}`, n))
				if r.failed() {
					t.Fatalf("direct request: %d %v", r.status, r.err)
				}
				rs, err := sims[x].Receipts(t.Context())
				if err != nil || len(rs) == 0 {
					t.Fatalf("receipts: %v", err)
				}
				return rs[len(rs)-1]
			}
			var reason string
			if tc.repaired {
				// Three batches, the first two lost on the wire: the third
				// reveals the gap and the replay restores the two.
				blocks0, _, _ := before.endpoint(x)
				want := blocks0
				for i := range 3 {
					want += directChat(i).PromptTokens / kvBlock
					n++
				}
				wait.For(t, 10*time.Second, "the lost batches' blocks in the inventory", func() bool {
					b, _, _ := readInventory(t, g, "kv").endpoint(x)
					return b >= want
				})
				after := readInventory(t, g, "kv")
				_, rs, _ := after.endpoint(x)
				kept := 0
				for k := range after.keys(x) {
					if warmKeys[k] {
						kept++
					}
				}
				if rs != resyncs0 || kept != len(warmKeys) {
					t.Errorf("a repaired gap: %d resyncs (want %d), %d of %d pre-fault blocks kept (want all)", rs, resyncs0, kept, len(warmKeys))
				}
				reason = "none (gap repaired)"
			} else {
				// The stream's discontinuity shows when the engine next
				// publishes (unless already noticed): keep it busy directly
				// with unrelated prompts (no shared blocks with the warm
				// prompt), as live traffic would.
				wait.For(t, 10*time.Second, "a resync of "+x, func() bool {
					_, rs, _ := readInventory(t, g, "kv").endpoint(x)
					if rs > resyncs0 {
						return true
					}
					n++
					directChat(n)
					return false
				})
				after := readInventory(t, g, "kv")
				_, _, reason = after.endpoint(x)
				if !slices.Contains(tc.reasons, reason) {
					t.Errorf("last resync reason %q; want one of %q", reason, tc.reasons)
				}
				kept := 0
				for k := range after.keys(x) {
					if warmKeys[k] {
						kept++
					}
				}
				if kept != 0 {
					t.Errorf("%d of the %d pre-fault blocks of %s survived the resync; want the inventory cleared", kept, len(warmKeys), x)
				}
			}
			// The warm prompt again: wherever it goes, no phantom hit
			// (checked below for every request of the test).
			send(kvChat(system, "third question"))

			// Rebuilt: a new prompt's blocks enter the inventory and its
			// follow-up is a real hit.
			fresh := longSystem("recovery")
			first := send(kvChat(fresh, "one"))
			wait.For(t, 10*time.Second, "the inventory to rebuild", func() bool {
				b, _, _ := readInventory(t, g, "kv").endpoint(first.endpoint)
				return b > 0 && len(readInventory(t, g, "kv").keys(first.endpoint)) > 0
			})
			var hit result
			wait.For(t, 10*time.Second, "a kv-exact hit on the rebuilt inventory", func() bool {
				hit = send(kvChat(fresh, "two"))
				return strings.HasPrefix(hit.route, "kv-exact hit=")
			})
			if hits := checkNoPhantomHits(t, all, sims); hits < 2 {
				t.Errorf("only %d kv-exact hits checked; want the warm follow-up and the rebuilt one", hits)
			}
			t.Logf("%s on %s: resync %q after %d direct requests; %d pre-fault blocks; %d requests checked for phantom hits", tc.name, x, reason, n, len(warmKeys), len(all))
		})
	}
}

// TestTRTSecondConsumerRefused: TensorRT-LLM's /kv_cache_events is a
// destructive drain, so two consumers would each see half the events. A
// second rule that would poll the same TRT worker is refused with 409, and
// the first keeps its inventory.
func TestTRTSecondConsumerRefused(t *testing.T) {
	s := startSim(t, "trt", "--engine", "trtllm")
	g := startGW(t, "")
	ruleY := func(name, model string) string {
		return fmt.Sprintf("name: %s\nmodel_name: %s\nsel: 8\nkvEngineType: trtllm\nkvExactMode: 3\nkvTokenizer: %q\nkvBlockSize: 32\nprobe: {disabled: true}\nendpoints:\n  - {id: w1, endpointIP: 127.0.0.1, targetPort: %s}\n", name, model, testfix.Qwen3Dir(t), port(t, s.Addrs.HTTP))
	}
	putRule(t, g, "trt-a", ruleY("trt-a", "m"))
	c := newClient(t, 10*time.Second)
	system := longSystem("trt")
	if r := chat(t.Context(), c, g.URL(), kvChat(system, "q")); r.failed() {
		t.Fatalf("request: %d %v %s", r.status, r.err, r.body)
	}
	wait.For(t, 10*time.Second, "the first consumer's inventory to fill", func() bool {
		b, _, _ := readInventory(t, g, "trt-a").endpoint("w1")
		return b > 0
	})
	err := g.PutRule(t.Context(), "trt-b", ruleY("trt-b", "m2"))
	var se *harness.StatusError
	if !errorsAs(err, &se) || se.Status != http.StatusConflict || !strings.Contains(se.Body, "trtllm_event_consumer_conflict") {
		t.Fatalf("second consumer: %v; want 409 trtllm_event_consumer_conflict", err)
	}
	if _, err := g.GetRule(t.Context(), "trt-b"); err == nil {
		t.Errorf("the refused rule trt-b exists")
	}
	if b, _, _ := readInventory(t, g, "trt-a").endpoint("w1"); b == 0 {
		t.Errorf("the first consumer lost its inventory after the refused second one")
	}
}
