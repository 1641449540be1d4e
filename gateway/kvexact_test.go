package gateway

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/llmgw/llmgw/engines"
	"github.com/llmgw/llmgw/engines/sim"
	"github.com/llmgw/llmgw/gateway/rule"
	"github.com/llmgw/llmgw/internal/testfix"
	"github.com/llmgw/llmgw/internal/wait"
)

// kvTokenizerLine matches the kvTokenizer line kvRule writes.
var kvTokenizerLine = regexp.MustCompile(`kvTokenizer: [^\n]*\n`)

// kvRule builds a KV-exact (kvExactMode 3, CHWBL fallback) rule over sims
// publishing KV events, with the real Qwen3 tokenizer (the sims' default).
func kvRule(t *testing.T, name, engine string, blockSize int, sims []*sim.Sim) string {
	var sb strings.Builder
	fmt.Fprintf(&sb, "name: %s\nmodel_name: m\nsel: 8\nkvEngineType: %s\nkvExactMode: 3\nkvTokenizer: %q\nkvBlockSize: %d\nprobe: {disabled: true}\nendpoints:\n", name, engine, testfix.Qwen3Dir(t), blockSize)
	for i, s := range sims {
		h, p := hostPort(t, s.Addrs().HTTP)
		line := fmt.Sprintf("  - {id: w%d, endpointIP: %s, targetPort: %d", i+1, h, p)
		if engine != "trtllm" {
			line += fmt.Sprintf(", kvEventsEndpoint: %q", s.Addrs().Events)
			if s.Addrs().Replay != "" {
				line += fmt.Sprintf(", kvReplayEndpoint: %q", s.Addrs().Replay)
			}
		}
		sb.WriteString(line + "}\n")
	}
	return sb.String()
}

func kvPrompt(topic string, n int) string {
	var b strings.Builder
	for i := 0; i < n; i++ {
		fmt.Fprintf(&b, "Paragraph %d about %s: the gateway routes each request to the worker that holds its prefix. ", i, topic)
	}
	return b.String()
}

func chatBodyFor(system, user string) string {
	return fmt.Sprintf(`{"model":"m","max_tokens":4,"messages":[{"role":"system","content":%q},{"role":"user","content":%q}]}`, system, user)
}

func TestKVExactEndToEnd(t *testing.T) {
	cases := []struct {
		name      string
		engine    engines.Kind
		encoding  string
		blockSize int
	}{
		{"vllm map events", engines.VLLM, sim.EncodingMap, 16},
		{"vllm array events", engines.VLLM, sim.EncodingArray, 16},
		{"sglang", engines.SGLang, sim.EncodingArray, 16},
		{"trtllm", engines.TRTLLM, "", 32},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			var sims []*sim.Sim
			for i := 0; i < 3; i++ {
				cfg := sim.Config{Engine: tc.engine, Model: "m", KVEvents: "tcp://127.0.0.1:0", EventEncoding: tc.encoding, BlockSize: tc.blockSize, PrefillPerToken: time.Microsecond}
				if tc.engine == engines.TRTLLM {
					cfg.KVEvents = ""
				}
				s, err := sim.Start(t.Context(), cfg)
				if err != nil {
					t.Fatal(err)
				}
				t.Cleanup(func() { s.Close() })
				sims = append(sims, s)
			}
			gw := startGateway(t, "", nil)
			mustApply(t, gw, kvRule(t, "kv", string(tc.engine), tc.blockSize, sims))
			rt := gw.rules["kv"]
			wait.For(t, 10*time.Second, "event streams to connect", func() bool {
				for i := range rt.kv.pool {
					if _, conn, _ := rt.kv.ready(i); !conn {
						return false
					}
				}
				return true
			})
			c := newClient(t)
			url := "http://" + gw.Addr() + "/v1/chat/completions"
			system := kvPrompt("routing", 12)

			// 1. Warm one worker.
			resp, out := post(t, c, url, chatBodyFor(system, "first question"))
			if resp.StatusCode != 200 {
				t.Fatalf("warm: %d %s", resp.StatusCode, out)
			}
			warmID := resp.Header.Get("X-Llmgw-Endpoint")
			warm := rt.byID[warmID]
			pos := -1
			for i, ep := range rt.kv.pool {
				if ep == warm {
					pos = i
				}
			}
			wait.For(t, 10*time.Second, "the warmed worker's inventory to fill", func() bool { return rt.kv.index.Blocks(pos) > 0 })

			// 2. A follow-up sharing the prefix lands there, and the engine
			// reports the reuse.
			resp, out = post(t, c, url, chatBodyFor(system, "second question"))
			route := resp.Header.Get("X-Llmgw-Route")
			if resp.StatusCode != 200 || resp.Header.Get("X-Llmgw-Endpoint") != warmID || !strings.HasPrefix(route, "kv-exact hit=") {
				t.Fatalf("follow-up: %d to %s route %q; want %s with a kv-exact hit (%s)", resp.StatusCode, resp.Header.Get("X-Llmgw-Endpoint"), route, warmID, out)
			}
			found := false
			for _, d := range gw.decisions.list("kv", time.Time{}) {
				if d.Endpoint == warmID && d.MatchedBlocks != nil && *d.MatchedBlocks > 0 && *d.TotalBlocks >= *d.MatchedBlocks {
					found = true
				}
			}
			if !found {
				t.Errorf("the decisions API does not show the kv-exact hit with its matched blocks")
			}
			simX := sims[pos]
			recs := simX.Receipts()
			if last := recs[len(recs)-1]; last.CachedTokens == 0 {
				t.Errorf("the warmed worker reported no cached tokens for the follow-up: %+v", last)
			}
			var usage struct {
				Usage struct {
					Details struct {
						Cached int `json:"cached_tokens"`
					} `json:"prompt_tokens_details"`
				} `json:"usage"`
			}
			json.Unmarshal([]byte(out), &usage)
			st, _ := gw.Rule("kv")
			if st.Status.KVParity == nil || st.Status.KVParity.Agreements == 0 {
				t.Errorf("self-check saw no agreement (engine reported %d): %+v", usage.Usage.Details.Cached, st.Status.KVParity)
			}

			// 3. A draining worker is never chosen, even holding the prefix.
			gw.SetDraining("kv", warmID, true)
			resp, _ = post(t, c, url, chatBodyFor(system, "third question"))
			if resp.Header.Get("X-Llmgw-Endpoint") == warmID {
				t.Errorf("a draining worker was chosen")
			}
			gw.SetDraining("kv", warmID, false)

			// 4. A publisher restart (engine restart: empty cache) clears the
			// inventory; traffic rebuilds it.
			before := rt.kv.ingest[pos].State().Resyncs
			if resp, b := post(t, c, "http://"+simX.Addrs().HTTP+"/_sim/faults", `{"restart_publisher":true}`); resp.StatusCode != 200 {
				t.Fatalf("restart: %s", b)
			}
			if tc.engine == engines.TRTLLM {
				// TRT has no publisher to restart; its event queue restarts
				// with a "created" event only on a real restart.
				return
			}
			// The restart is seen when a batch of the new publisher
			// (sequence from 0) arrives: a regression. Keep the engine busy,
			// as a real one is, until the subscriber has reconnected.
			n := 0
			wait.For(t, 10*time.Second, "a resync after the publisher restart", func() bool {
				n++
				post(t, c, "http://"+simX.Addrs().HTTP+"/v1/chat/completions", chatBodyFor(kvPrompt(fmt.Sprint("restart", n), 2), "x"))
				st := rt.kv.ingest[pos].State()
				if n%10 == 0 {
					t.Logf("ingest state: %+v", st)
				}
				return st.Resyncs > before
			})
			post(t, c, url, chatBodyFor(system, "fourth question"))
			wait.For(t, 10*time.Second, "the inventory to rebuild", func() bool { return rt.kv.index.Blocks(pos) > 0 || anyBlocks(rt) })
		})
	}
}

func anyBlocks(rt *ruleRuntime) bool {
	for i := range rt.kv.pool {
		if rt.kv.index.Blocks(i) > 0 {
			return true
		}
	}
	return false
}

func TestKVExactEvictionMovesTheNextRequest(t *testing.T) {
	var sims []*sim.Sim
	for i := 0; i < 2; i++ {
		s, err := sim.Start(t.Context(), sim.Config{Engine: engines.VLLM, Model: "m", KVEvents: "tcp://127.0.0.1:0", CacheBlocks: 40, PrefillPerToken: time.Microsecond})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { s.Close() })
		sims = append(sims, s)
	}
	gw := startGateway(t, "", nil)
	mustApply(t, gw, kvRule(t, "kv", "vllm", 16, sims))
	rt := gw.rules["kv"]
	wait.For(t, 10*time.Second, "streams", func() bool { _, a, _ := rt.kv.ready(0); _, b, _ := rt.kv.ready(1); return a && b })
	c := newClient(t)
	url := "http://" + gw.Addr() + "/v1/chat/completions"
	system := kvPrompt("eviction", 6)
	resp, _ := post(t, c, url, chatBodyFor(system, "q1"))
	warmID := resp.Header.Get("X-Llmgw-Endpoint")
	pos := 0
	if warmID == "w2" {
		pos = 1
	}
	wait.For(t, 10*time.Second, "inventory", func() bool { return rt.kv.index.Blocks(pos) > 0 })
	if r, _ := post(t, c, url, chatBodyFor(system, "q2")); r.Header.Get("X-Llmgw-Endpoint") != warmID {
		t.Fatalf("follow-up went to %s; want %s", r.Header.Get("X-Llmgw-Endpoint"), warmID)
	}
	// Fill the warmed worker's small cache directly with other prompts: LRU
	// eviction emits BlockRemoved for the shared prefix.
	for i := 0; i < 6; i++ {
		post(t, c, "http://"+sims[pos].Addrs().HTTP+"/v1/chat/completions", chatBodyFor(kvPrompt(fmt.Sprint("filler", i), 6), "z"))
	}
	sc := &kvScratch{}
	wait.For(t, 10*time.Second, "the prefix to be evicted from the inventory", func() bool {
		c := rt.kv.route(context.Background(), sc, mustParse(t, chatBodyFor(system, "q3")), 0, nil)
		return c.ep == nil || sc.matched[pos] == 0
	})
	resp, _ = post(t, c, url, chatBodyFor(system, "q3"))
	if strings.HasPrefix(resp.Header.Get("X-Llmgw-Route"), "kv-exact hit=") && resp.Header.Get("X-Llmgw-Endpoint") == warmID {
		t.Errorf("after eviction the request still routed as a hit on %s (%s)", warmID, resp.Header.Get("X-Llmgw-Route"))
	}
}

func TestKVExactSeedMismatchRaisesParityWarning(t *testing.T) {
	s, err := sim.Start(t.Context(), sim.Config{Engine: engines.VLLM, Model: "m", KVEvents: "tcp://127.0.0.1:0", HashSeed: "1", PrefillPerToken: time.Microsecond})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	gw := startGateway(t, "", nil)
	mustApply(t, gw, kvRule(t, "kv", "vllm", 16, []*sim.Sim{s})) // gateway seed "0"
	rt := gw.rules["kv"]
	wait.For(t, 10*time.Second, "stream", func() bool { _, a, _ := rt.kv.ready(0); return a })
	c := newClient(t)
	url := "http://" + gw.Addr() + "/v1/chat/completions"
	system := kvPrompt("seeds", 8)
	for i := 0; i < 8; i++ {
		resp, out := post(t, c, url, chatBodyFor(system, fmt.Sprint("question ", i)))
		if resp.StatusCode != 200 {
			t.Fatalf("%d %s", resp.StatusCode, out)
		}
		if strings.HasPrefix(resp.Header.Get("X-Llmgw-Route"), "kv-exact hit=") {
			t.Fatalf("request %d routed as a kv hit with mismatched seeds", i)
		}
	}
	st, _ := gw.Rule("kv")
	if st.Status.KVParity == nil || !st.Status.KVParity.Broken {
		t.Fatalf("parity warning not raised: %+v", st.Status.KVParity)
	}
	if got := gw.metricValue(t, "llmgw_kv_parity_broken", "kv"); got != 1 {
		t.Errorf("llmgw_kv_parity_broken = %v; want 1", got)
	}
	// The token cache reports what it holds. With the seeds apart no
	// endpoint ever holds block 0, so each prompt is tokenized only to its
	// first block and no segment is encoded whole: every lookup misses.
	cs := rt.kv.tok.cacheStats()
	for _, m := range []struct {
		name  string
		label []string
		want  float64
	}{
		{"llmgw_kv_token_cache_bytes", []string{"kv"}, float64(cs.Bytes)},
		{"llmgw_kv_token_cache_entries", []string{"kv"}, float64(cs.Entries)},
		{"llmgw_kv_token_cache_lookups_total", []string{"kv", "hit"}, float64(cs.Hits)},
		{"llmgw_kv_token_cache_lookups_total", []string{"kv", "miss"}, float64(cs.Misses)},
	} {
		if got := gw.metricValue(t, m.name, m.label...); got != m.want {
			t.Errorf("%s%v = %v; want %v", m.name, m.label, got, m.want)
		}
	}
	if cs.Misses < 8 {
		t.Errorf("token cache counted %d misses for 8 prompts", cs.Misses)
	}
	if cs.Bytes > DefaultKVTokenCacheBytes {
		t.Errorf("token cache holds %d bytes, over its bound %d", cs.Bytes, DefaultKVTokenCacheBytes)
	}
}

func TestKVExactMode1ScoresPrefillEndpoints(t *testing.T) {
	var prefills []*sim.Sim
	for i := 0; i < 2; i++ {
		s, err := sim.Start(t.Context(), sim.Config{Engine: engines.VLLM, Model: "m", Role: sim.RolePrefill, KVEvents: "tcp://127.0.0.1:0", PrefillPerToken: time.Microsecond})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { s.Close() })
		prefills = append(prefills, s)
	}
	d := startSimT(t, sim.Config{Engine: engines.VLLM, Role: sim.RoleDecode})
	var sb strings.Builder
	fmt.Fprintf(&sb, "name: pdkv\nmodel_name: m\nkvEngineType: vllm\nkvExactMode: 1\nkvTokenizer: %q\npd_disagg_mode: true\nprobe: {disabled: true}\nendpoints:\n", testfix.Qwen3Dir(t))
	for i, p := range prefills {
		h, port := hostPort(t, p.Addrs().HTTP)
		fmt.Fprintf(&sb, "  - {id: p%d, endpointIP: %s, targetPort: %d, ep_role: 1, kvEventsEndpoint: %q, kvReplayEndpoint: %q}\n", i+1, h, port, p.Addrs().Events, p.Addrs().Replay)
	}
	h, port := hostPort(t, d.Addrs().HTTP)
	fmt.Fprintf(&sb, "  - {id: d1, endpointIP: %s, targetPort: %d, ep_role: 2}\n", h, port)
	gw := startGateway(t, "", nil)
	mustApply(t, gw, sb.String())
	rt := gw.rules["pdkv"]
	if len(rt.kv.pool) != 2 {
		t.Fatalf("kv pool has %d endpoints; want the 2 prefill endpoints only", len(rt.kv.pool))
	}
	wait.For(t, 10*time.Second, "streams", func() bool { _, a, _ := rt.kv.ready(0); _, b, _ := rt.kv.ready(1); return a && b })
	c := newClient(t)
	url := "http://" + gw.Addr() + "/v1/chat/completions"
	system := kvPrompt("disaggregation", 10)
	resp, out := post(t, c, url, chatBodyFor(system, "first"))
	if resp.StatusCode != 200 {
		t.Fatalf("%d %s", resp.StatusCode, out)
	}
	warm := -1
	for i := range prefills {
		if strings.Contains(resp.Header.Get("X-Llmgw-Route"), fmt.Sprintf("prefill=p%d ", i+1)) {
			warm = i
		}
	}
	if warm < 0 {
		t.Fatalf("route %q names no prefill", resp.Header.Get("X-Llmgw-Route"))
	}
	wait.For(t, 10*time.Second, "the warmed prefill's inventory", func() bool { return rt.kv.index.Blocks(warm) > 0 })
	for i := 0; i < 3; i++ {
		resp, _ = post(t, c, url, chatBodyFor(system, fmt.Sprint("follow-up ", i)))
		route := resp.Header.Get("X-Llmgw-Route")
		if !strings.Contains(route, fmt.Sprintf("prefill=p%d (kv-exact hit=", warm+1)) {
			t.Errorf("follow-up %d route %q; want the warmed prefill p%d by a kv-exact hit", i, route, warm+1)
		}
	}
	recs := prefills[warm].Receipts()
	if last := recs[len(recs)-1]; last.CachedTokens == 0 {
		t.Errorf("the warmed prefill reported no cached tokens: %+v", last)
	}
}

func TestKVExactTRTAdmission(t *testing.T) {
	s, err := sim.Start(t.Context(), sim.Config{Engine: engines.TRTLLM, Model: "m", PrefillPerToken: time.Microsecond}) // tokens_per_block 32
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	gw := startGateway(t, "", nil)
	mustApply(t, gw, kvRule(t, "trt16", "trtllm", 16, []*sim.Sim{s}))
	rt := gw.rules["trt16"]
	wait.For(t, 10*time.Second, "the block-size refusal", func() bool {
		return strings.HasPrefix(rt.kv.ingest[0].State().Admission, "refused")
	})
	st, _ := gw.Rule("trt16")
	if kv := st.Status.Endpoints[0].KV; kv == nil || kv.Ready || kv.EventsConnected || !strings.Contains(kv.Admission, "32") {
		t.Errorf("endpoint kv status %+v; want not ready, refused naming tokens_per_block 32", kv)
	}
	// A second rule polling the same worker is refused with a conflict.
	y := strings.Replace(strings.Replace(kvRule(t, "trt32", "trtllm", 32, []*sim.Sim{s}), "model_name: m", "model_name: m2", 1), "name: trt32", "name: trt32", 1)
	r, err := rule.Decode([]byte(y))
	if err != nil {
		t.Fatal(err)
	}
	_, err = gw.Apply(r, true)
	var ae *rule.AdmissionError
	if !errors.As(err, &ae) || !ae.Conflict || ae.Code != "trtllm_event_consumer_conflict" {
		t.Errorf("second TRT consumer: %v; want a trtllm_event_consumer_conflict conflict", err)
	}
}

func TestKVExactEngineTokenizer(t *testing.T) {
	var sims []*sim.Sim
	for i := 0; i < 2; i++ {
		s, err := sim.Start(t.Context(), sim.Config{Engine: engines.VLLM, Model: "m", KVEvents: "tcp://127.0.0.1:0", PrefillPerToken: time.Microsecond})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { s.Close() })
		sims = append(sims, s)
	}
	gw := startGateway(t, "", nil)
	mustApply(t, gw, kvTokenizerLine.ReplaceAllString(kvRule(t, "kv", "vllm", 16, sims), "kvTokenizer: engine\n"))
	rt := gw.rules["kv"]
	wait.For(t, 10*time.Second, "streams", func() bool { _, a, _ := rt.kv.ready(0); _, b, _ := rt.kv.ready(1); return a && b })
	c := newClient(t)
	url := "http://" + gw.Addr() + "/v1/chat/completions"
	system := kvPrompt("engine tokenizer", 8)
	resp, _ := post(t, c, url, chatBodyFor(system, "q1"))
	warm := resp.Header.Get("X-Llmgw-Endpoint")
	pos := 0
	if warm == "w2" {
		pos = 1
	}
	wait.For(t, 10*time.Second, "inventory", func() bool { return rt.kv.index.Blocks(pos) > 0 })
	resp, _ = post(t, c, url, chatBodyFor(system, "q2"))
	if route := resp.Header.Get("X-Llmgw-Route"); resp.Header.Get("X-Llmgw-Endpoint") != warm || !strings.HasPrefix(route, "kv-exact hit=") {
		t.Errorf("follow-up to %s route %q; want %s by a kv-exact hit via the engine's /tokenize", resp.Header.Get("X-Llmgw-Endpoint"), route, warm)
	}
	// The same request again is answered from the tokenization cache.
	lt := rt.kv.tok.(*engineTokenizer)
	before := lt.cache.Stats()
	post(t, c, url, chatBodyFor(system, "q2"))
	if after := lt.cache.Stats(); after.Entries != before.Entries || after.Hits != before.Hits+1 {
		t.Errorf("a repeated request was tokenized again (cache %d -> %d entries, %d -> %d hits)", before.Entries, after.Entries, before.Hits, after.Hits)
	}
}

// TestKVExactEngineTokenizerFailsVisibly: when the engine's /tokenize
// stalls or fails, the request is still served (by the fallback policy)
// and the miss says why, in X-Llmgw-Route and llmgw_kv_misses_total; a
// stalled /tokenize is abandoned at its deadline, its request context
// cancelled.
func TestKVExactEngineTokenizerFailsVisibly(t *testing.T) {
	cases := []struct {
		name   string
		reason string
	}{
		{"stall", "tokenize_timeout"},
		{"status 500", "tokenize_engine"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			abandoned := make(chan struct{}, 4)
			srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				switch r.URL.Path {
				case "/tokenize":
					if tc.reason == "tokenize_timeout" {
						// With the body read, the server watches the
						// connection and cancels r.Context() when the
						// gateway abandons the call.
						_, _ = io.Copy(io.Discard, r.Body)
						<-r.Context().Done()
						abandoned <- struct{}{}
						return
					}
					http.Error(w, `{"error":"boom"}`, http.StatusInternalServerError)
				default:
					w.Header().Set("Content-Type", "application/json")
					fmt.Fprint(w, `{"id":"x","object":"chat.completion","created":1,"model":"m","choices":[{"index":0,"message":{"role":"assistant","content":"ok"},"finish_reason":"stop"}],"usage":{"prompt_tokens":1,"completion_tokens":1,"total_tokens":2}}`)
				}
			}))
			t.Cleanup(srv.Close)
			h, p := hostPort(t, strings.TrimPrefix(srv.URL, "http://"))
			gw := startGateway(t, "", nil)
			mustApply(t, gw, fmt.Sprintf("name: kv\nmodel_name: m\nsel: 8\nkvEngineType: vllm\nkvExactMode: 3\nkvTokenizer: engine\nprobe: {disabled: true}\nendpoints:\n  - {id: w1, endpointIP: %s, targetPort: %d, kvEventsEndpoint: \"tcp://127.0.0.1:9\"}\n", h, p))
			c := newClient(t)
			resp, _ := post(t, c, "http://"+gw.Addr()+"/v1/chat/completions", chatBodyFor("system", "q"))
			if resp.StatusCode != http.StatusOK {
				t.Fatalf("status %d; a tokenizer failure must not fail the request", resp.StatusCode)
			}
			if route := resp.Header.Get("X-Llmgw-Route"); !strings.Contains(route, "miss="+tc.reason) {
				t.Errorf("X-Llmgw-Route %q; want miss=%s", route, tc.reason)
			}
			if n := gw.metricValue(t, "llmgw_kv_misses_total", "kv", tc.reason); n != 1 {
				t.Errorf("llmgw_kv_misses_total{reason=%q} = %v, want 1", tc.reason, n)
			}
			if tc.reason == "tokenize_timeout" {
				select {
				case <-abandoned:
				case <-t.Context().Done():
					t.Fatal("the stalled /tokenize call was never cancelled")
				}
			}
		})
	}
}

// TestKVExactHitNeedsShare: a request sharing only a short preamble with a
// warm worker is "partial", not a hit, unless the rule's kvHitMinShare says
// any block counts; the decision records the match and the verdict.
func TestKVExactHitNeedsShare(t *testing.T) {
	for _, tc := range []struct {
		name, extra string
		wantRoute   string
		wantHits    float64
	}{
		{name: "default share", wantRoute: "kv-exact partial=", wantHits: 1},
		{name: "any block", extra: "kvHitMinShare: 0\n", wantRoute: "kv-exact hit=", wantHits: 2},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s, err := sim.Start(t.Context(), sim.Config{Engine: engines.VLLM, Model: "m", KVEvents: "tcp://127.0.0.1:0", BlockSize: 16, PrefillPerToken: time.Microsecond})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { s.Close() })
			gw := startGateway(t, "", nil)
			y := strings.Replace(kvRule(t, "kv", "vllm", 16, []*sim.Sim{s}), "kvExactMode: 3\n", "kvExactMode: 3\n"+tc.extra, 1)
			eff := mustApply(t, gw, y)
			if tc.extra == "" && (eff.KVHitMinShare == nil || *eff.KVHitMinShare != rule.DefaultKVHitMinShare) {
				t.Fatalf("effective kvHitMinShare %v, want the default %v", eff.KVHitMinShare, rule.DefaultKVHitMinShare)
			}
			rt := gw.rules["kv"]
			wait.For(t, 10*time.Second, "the event stream to connect", func() bool { _, conn, _ := rt.kv.ready(0); return conn })
			c := newClient(t)
			url := "http://" + gw.Addr() + "/v1/chat/completions"
			preamble := "You are a helpful assistant."
			// Warm the worker with the whole conversation, then repeat it:
			// every block matches.
			long := chatBodyFor(preamble, kvPrompt("retrieved document one", 10))
			if resp, out := post(t, c, url, long); resp.StatusCode != 200 {
				t.Fatalf("warm: %d %s", resp.StatusCode, out)
			}
			wait.For(t, 10*time.Second, "the inventory to fill", func() bool { return rt.kv.index.Blocks(0) > 0 })
			resp, _ := post(t, c, url, long)
			if r := resp.Header.Get("X-Llmgw-Route"); !strings.HasPrefix(r, "kv-exact hit=") {
				t.Fatalf("repeat: route %q, want a hit", r)
			}
			// Same preamble, another document: only the first block(s).
			resp, _ = post(t, c, url, chatBodyFor(preamble, kvPrompt("a different document", 10)))
			r := resp.Header.Get("X-Llmgw-Route")
			if !strings.HasPrefix(r, tc.wantRoute) {
				t.Fatalf("shared preamble only: route %q, want %q", r, tc.wantRoute)
			}
			ds := gw.decisions.list("kv", time.Time{})
			last := ds[len(ds)-1]
			if last.MatchedBlocks == nil || last.TotalBlocks == nil || last.Hit == nil ||
				*last.MatchedBlocks < 1 || 2*(*last.MatchedBlocks) >= *last.TotalBlocks || *last.Hit != (tc.wantHits == 2) {
				t.Errorf("decision %+v: want matched 1..<half of total and hit=%v", last, tc.wantHits == 2)
			}
			if n := gw.metricValue(t, "llmgw_kv_hits_total", "kv"); n != tc.wantHits {
				t.Errorf("llmgw_kv_hits_total = %v, want %v", n, tc.wantHits)
			}
		})
	}
}
