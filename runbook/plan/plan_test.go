package plan

import (
	"bytes"
	"context"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/llmgw/llmgw/engines"
	_ "github.com/llmgw/llmgw/engines/all"
	"github.com/llmgw/llmgw/engines/sim"
	"github.com/llmgw/llmgw/engines/tokenizer"
	"github.com/llmgw/llmgw/gateway/rule"
)

// warmPrompt is long enough (> 2 blocks of 16 and of 32 builtin tokens) to
// publish root blocks.
const warmPrompt = "Plan warm-up: a shared system prompt that fills several KV blocks so the engine publishes BlockStored events the planner can read back from the replay socket, with enough words for two blocks of thirty-two tokens each, and then some more words to be safe."

// startSim starts a receipt-less simulator (no /_sim/* surface), as silent as
// a real engine: the planner must work from the engine's own surfaces. The
// test itself still reads the receipts in-process (Sim.Receipts).
func startSim(t *testing.T, cfg sim.Config) *sim.Sim {
	t.Helper()
	cfg.Silent = true
	s, err := sim.Start(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

// warm sends one completion straight to the worker (the test's traffic, not
// the planner's), so that its cache publishes events.
func warm(t *testing.T, s *sim.Sim, model string) {
	t.Helper()
	body := `{"model":"` + model + `","prompt":` + strconv.Quote(warmPrompt) + `,"max_tokens":1}`
	resp, err := http.Post("http://"+s.Addrs().HTTP+"/v1/completions", "application/json", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 {
		t.Fatalf("warm-up: %d", resp.StatusCode)
	}
}

func target(s *sim.Sim) Target {
	a := s.Addrs()
	return Target{Addr: a.HTTP, Events: a.Events, Replay: a.Replay}
}

func probe(t *testing.T, o Options) *Plan {
	t.Helper()
	if o.ProbeTimeout == 0 {
		o.ProbeTimeout = time.Second
	}
	p, err := Probe(context.Background(), o)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

func stage(p *Plan, capability string) *Stage {
	for i := range p.Stages {
		if p.Stages[i].Capability == capability {
			return &p.Stages[i]
		}
	}
	return nil
}

func blocked(p *Plan, capability string) []Block {
	var out []Block
	for _, b := range p.Blocked {
		if b.Capability == capability {
			out = append(out, b)
		}
	}
	return out
}

// checkRules runs every stage's rule through the gateway's strict
// admission, as `llmgw rule apply` would.
func checkRules(t *testing.T, p *Plan) {
	t.Helper()
	for _, s := range p.Stages {
		var buf bytes.Buffer
		if err := p.WriteYAML(&buf, s.N); err != nil {
			t.Fatal(err)
		}
		r, err := rule.Decode(buf.Bytes())
		if err != nil {
			t.Fatalf("stage %d yaml does not decode: %v\n%s", s.N, err, buf.String())
		}
		if err := rule.Admit(r, nil, nil); err != nil {
			t.Errorf("stage %d (%s) rule refused: %v\n%s", s.N, s.Capability, err, buf.String())
		}
	}
}

func receipts(sims []*sim.Sim) int {
	n := 0
	for _, s := range sims {
		n += len(s.Receipts())
	}
	return n
}

func TestThreeVLLMConverged(t *testing.T) {
	var sims []*sim.Sim
	var targets []Target
	for i := 0; i < 3; i++ {
		s := startSim(t, sim.Config{Engine: engines.VLLM})
		warm(t, s, "Qwen/Qwen3-0.6B")
		sims, targets = append(sims, s), append(targets, target(s))
	}
	before := receipts(sims)
	p := probe(t, Options{Targets: targets})
	if after := receipts(sims); after != before {
		t.Errorf("the planner left %d worker receipts: it sent engine work", after-before)
	}
	want := map[string]string{KeyEngine: "vllm", KeyEvents: "reachable", KeyModels: "Qwen/Qwen3-0.6B", KeyBlockSize: "16", KeyHashes: "reproduced", KeyHashAlgo: "sha256_cbor"}
	for k, v := range want {
		if a := p.Answer(k); a.Status != Known || a.Value != v {
			t.Errorf("%s = %s %q; want known %q (%+v)", k, a.Status, a.Value, v, a)
		}
	}
	if a := p.Answer(KeyRoles); !strings.HasPrefix(a.Value, "converged") || p.Topology != "converged" {
		t.Errorf("roles = %+v, topology %s; want converged", a, p.Topology)
	}
	if a := p.Answer(KeyTokenizer); a.Status != Known {
		t.Errorf("tokenizer = %+v; want known", a)
	}
	if !p.Consistent {
		t.Errorf("pool inconsistent: %+v", p.Answers)
	}
	caps := []string{}
	for _, s := range p.Stages {
		caps = append(caps, s.Capability)
	}
	if strings.Join(caps, ",") != "fullproxy,chwbl,kv-exact" {
		t.Errorf("stages = %v; want fullproxy, chwbl, kv-exact", caps)
	}
	if s := p.Stages[0]; s.Rule.Sel != 0 || s.Rule.Probe.Path != "/health" || !strings.Contains(s.Runbook, "--mode rr") {
		t.Errorf("stage 1 = %+v; want health-checked round robin", s)
	}
	if s := stage(p, CapKVExact); s == nil || s.Rule.KVExactMode != 3 || s.Rule.Sel != 8 || s.Rule.Endpoints[0].KVEventsEndpoint == "" {
		t.Errorf("kv-exact stage = %+v; want kvExactMode 3, sel 8, per-endpoint events", s)
	}
	if len(blocked(p, CapPD)) == 0 {
		t.Errorf("no P/D block reason for a converged pool")
	}
	checkRules(t, p)
}

func TestSGLangPrefillDecode(t *testing.T) {
	pre := startSim(t, sim.Config{Engine: engines.SGLang, Role: sim.RolePrefill})
	dec := startSim(t, sim.Config{Engine: engines.SGLang, Role: sim.RoleDecode})
	p := probe(t, Options{Targets: []Target{{Addr: pre.Addrs().HTTP}, {Addr: dec.Addrs().HTTP}}})
	_, bport, _ := net.SplitHostPort(pre.Addrs().Bootstrap)
	wantPort, _ := strconv.Atoi(bport)
	if p.Engine != engines.SGLang || p.Topology != "pd" || p.BootstrapPort != wantPort {
		t.Fatalf("engine %s topology %s bootstrap %d; want sglang pd %d\n%+v", p.Engine, p.Topology, p.BootstrapPort, wantPort, p.Answers)
	}
	s := stage(p, CapPD)
	if s == nil || !s.Rule.PDDisaggMode || s.Rule.PDBootstrapPort != wantPort || !strings.Contains(s.Reason, "concurrent") ||
		!strings.Contains(s.Runbook, "--bootstrap-port "+bport) {
		t.Fatalf("P/D stage = %+v; want concurrent P/D with bootstrap port %d", s, wantPort)
	}
	if s.Rule.Endpoints[0].EPRole != 1 || s.Rule.Endpoints[1].EPRole != 2 {
		t.Errorf("roles in rule = %+v", s.Rule.Endpoints)
	}
	// SGLang reports its event sockets on /get_server_info: found without
	// being told.
	if a := p.Answer(KeyEvents); a.Status != Known {
		t.Errorf("events = %+v; want reachable from the reported kv_events_config", a)
	}
	checkRules(t, p)
}

// versionProxy fronts a worker and rewrites its /version answer: an
// endpoint running another build.
func versionProxy(t *testing.T, s *sim.Sim, version string) string {
	u, _ := url.Parse("http://" + s.Addrs().HTTP)
	rp := httputil.NewSingleHostReverseProxy(u)
	rp.ModifyResponse = func(r *http.Response) error {
		if r.Request.URL.Path == "/version" {
			r.Body.Close()
			b := `{"version":"` + version + `"}`
			r.Body = io.NopCloser(strings.NewReader(b))
			r.ContentLength = int64(len(b))
			r.Header.Set("Content-Length", strconv.Itoa(len(b)))
		}
		return nil
	}
	srv := httptest.NewServer(rp)
	t.Cleanup(srv.Close)
	return strings.TrimPrefix(srv.URL, "http://")
}

func TestInconsistentPools(t *testing.T) {
	cases := []struct {
		name     string
		second   sim.Config
		build    string // rewrite the second endpoint's /version
		fact     string
		blocksKV bool
		// stage1 is the number of endpoints stage 1 keeps (-1: no stage 1)
		stage1 int
	}{
		{"block size", sim.Config{Engine: engines.VLLM, BlockSize: 32}, "", KeyBlockSize, true, 2},
		{"served model", sim.Config{Engine: engines.VLLM, Model: "Qwen/Qwen3-8B"}, "", KeyModels, true, 1},
		{"hash seed", sim.Config{Engine: engines.VLLM, HashSeed: "7"}, "", KeyHashes, true, 2},
		// vllm:cache_config_info names each endpoint's algorithm.
		{"hash algorithm", sim.Config{Engine: engines.VLLM, HashAlgo: "xxhash_cbor"}, "", KeyHashAlgo, true, 2},
		{"engine build", sim.Config{Engine: engines.VLLM}, "0.30.9", KeyVersion, true, 2}, // the sim reports the catalog's 0.31.0
		{"engine", sim.Config{Engine: engines.SGLang}, "", KeyEngine, true, -1},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			a := startSim(t, sim.Config{Engine: engines.VLLM})
			b := startSim(t, tc.second)
			warm(t, a, "Qwen/Qwen3-0.6B")
			warm(t, b, firstNonEmpty(tc.second.Model, "Qwen/Qwen3-0.6B"))
			tb := target(b)
			if tc.build != "" {
				tb.Addr = versionProxy(t, b, tc.build)
			}
			p := probe(t, Options{Targets: []Target{target(a), tb}})
			if p.Consistent {
				t.Fatalf("pool consistent; want %s inconsistent\n%+v", tc.fact, p.Answers)
			}
			ans := p.Answer(tc.fact)
			if ans.Status != Inconsistent || len(ans.Disagree) == 0 {
				t.Fatalf("%s = %+v; want inconsistent naming an endpoint", tc.fact, ans)
			}
			named := false
			for _, d := range ans.Disagree {
				named = named || d.Endpoint == tb.Addr || d.Endpoint == a.Addrs().HTTP
			}
			if !named {
				t.Errorf("disagreement names %+v; want one of the pool's endpoints", ans.Disagree)
			}
			if stage(p, CapKVExact) != nil || stage(p, CapPD) != nil || stage(p, CapPDKVExact) != nil {
				t.Errorf("inconsistent pool offered KV-exact or P/D: %+v", p.Stages)
			}
			found := false
			for _, bl := range p.Blocked {
				found = found || (bl.Fact == tc.fact && (bl.Capability == CapKVExact || bl.Capability == "any"))
			}
			if tc.blocksKV && !found {
				t.Errorf("blocked = %+v; want KV-exact blocked by %s", p.Blocked, tc.fact)
			}
			s1 := stage(p, CapFullproxy)
			switch {
			case tc.stage1 < 0 && s1 != nil:
				t.Errorf("stage 1 offered for a pool of unknown engine: %+v", s1)
			case tc.stage1 >= 0 && (s1 == nil || len(s1.Rule.Endpoints) != tc.stage1):
				t.Errorf("stage 1 = %+v; want %d endpoints", s1, tc.stage1)
			}
			checkRules(t, p)
		})
	}
}

// A pool whose engines all run PYTHONHASHSEED=7: consistent, but the
// gateway's default seed does not reproduce their hashes, so KV-exact waits
// for --hash-seed 7, after which the stage carries it.
func TestHashSeedOfThePool(t *testing.T) {
	var targets []Target
	for i := 0; i < 2; i++ {
		s := startSim(t, sim.Config{Engine: engines.VLLM, HashSeed: "7"})
		warm(t, s, "Qwen/Qwen3-0.6B")
		targets = append(targets, target(s))
	}
	p := probe(t, Options{Targets: targets})
	if !p.Consistent || stage(p, CapKVExact) != nil {
		t.Fatalf("default seed: consistent %v, stages %+v; want consistent, no KV-exact", p.Consistent, p.Stages)
	}
	if bl := blocked(p, CapKVExact); len(bl) == 0 || bl[0].Fact != KeyHashes {
		t.Errorf("blocked = %+v; want hash parity", bl)
	}
	p = probe(t, Options{Targets: targets, HashSeed: "7"})
	s := stage(p, CapKVExact)
	if s == nil || s.Rule.KVHashSeed == nil || *s.Rule.KVHashSeed != "7" {
		t.Fatalf("--hash-seed 7: kv-exact stage = %+v; want kvHashSeed 7", s)
	}
	checkRules(t, p)
}

func TestUnreachableEvents(t *testing.T) {
	a := startSim(t, sim.Config{Engine: engines.VLLM})
	b := startSim(t, sim.Config{Engine: engines.VLLM})
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	dead := "tcp://" + ln.Addr().String()
	ln.Close()
	tb := Target{Addr: b.Addrs().HTTP, Events: dead}
	p := probe(t, Options{Targets: []Target{target(a), tb}})
	if ev := p.Endpoints[1].Events; ev.Reachable != Unreachable {
		t.Errorf("dead events endpoint = %+v; want unreachable", ev)
	}
	if !p.Consistent || stage(p, CapKVExact) != nil {
		t.Errorf("consistent %v, stages %+v; want consistent without a KV-exact stage", p.Consistent, p.Stages)
	}
	bl := blocked(p, CapKVExact)
	if len(bl) == 0 || bl[0].Endpoint != tb.Addr {
		t.Errorf("kv-exact blocks = %+v; want the unreachable endpoint named", bl)
	}
	if stage(p, CapFullproxy) == nil {
		t.Errorf("no stage 1")
	}
}

func TestTRTLLMEventsNotDrained(t *testing.T) {
	a := startSim(t, sim.Config{Engine: engines.TRTLLM})
	b := startSim(t, sim.Config{Engine: engines.TRTLLM})
	warm(t, a, "Qwen/Qwen3-0.6B")
	// trtllm-serve has no tokenize endpoint: the KV-exact stage needs the
	// model's tokenizer file (the simulators run Qwen3's).
	p := probe(t, Options{Targets: []Target{{Addr: a.Addrs().HTTP}, {Addr: b.Addrs().HTTP}}, KVTokenizer: qwen3Path(t)})
	if p.Engine != engines.TRTLLM || p.Answer(KeyEvents).Status != Known || p.Answer(KeyBlockSize).Value != "32" {
		t.Fatalf("plan = %+v", p.Answers)
	}
	if c := p.Answer(KeyConsumer); c.Status != Unknown || !strings.Contains(c.Note, "sole consumer") {
		t.Errorf("consumer = %+v; want unknown with the sole-consumer advice", c)
	}
	if s := p.Stages[0]; s.Rule.Sel != 0 {
		t.Errorf("stage 1 sel %d; want plain round robin", s.Rule.Sel)
	}
	if s := stage(p, CapKVExact); s == nil || !strings.Contains(s.Reason, "sole consumer") {
		t.Errorf("kv-exact stage = %+v", s)
	}
	// The warmed worker's queue still holds its events: the planner did
	// not drain it.
	resp, err := http.Post("http://"+a.Addrs().HTTP+"/kv_cache_events", "application/json", nil)
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if !bytes.Contains(body, []byte("stored")) {
		t.Errorf("drain after planning = %s; want the warm-up's stored events still queued", body)
	}
	checkRules(t, p)
}

func TestTRTLLMContextGeneration(t *testing.T) {
	c := startSim(t, sim.Config{Engine: engines.TRTLLM, Role: sim.RolePrefill})
	g := startSim(t, sim.Config{Engine: engines.TRTLLM, Role: sim.RoleDecode})
	p := probe(t, Options{Targets: []Target{{Addr: c.Addrs().HTTP}, {Addr: g.Addrs().HTTP}}})
	s := stage(p, CapPD)
	if p.Topology != "pd" || s == nil || !strings.Contains(s.Reason, "context_only") {
		t.Fatalf("topology %s, stage %+v; want context/generation P/D", p.Topology, s)
	}
	checkRules(t, p)
}

func TestLlamaCppPool(t *testing.T) {
	var targets []Target
	for i := 0; i < 2; i++ {
		targets = append(targets, Target{Addr: startSim(t, sim.Config{Engine: engines.LlamaCpp}).Addrs().HTTP})
	}
	p := probe(t, Options{Targets: targets})
	if p.Engine != engines.LlamaCpp || !p.Consistent || len(p.Stages) != 1 || p.Stages[0].Rule.Sel != 8 {
		t.Fatalf("plan = engine %s consistent %v stages %+v", p.Engine, p.Consistent, p.Stages)
	}
	for _, c := range []string{CapKVExact, CapPD} {
		if bl := blocked(p, c); len(bl) == 0 || !strings.Contains(bl[0].Reason, "llama.cpp") {
			t.Errorf("%s blocked = %+v; want the guide's llama.cpp reason", c, bl)
		}
	}
	checkRules(t, p)
}

// vLLM reports no role: declared roles make a sequential P/D plan; a
// declared role an engine contradicts is inconsistent.
func TestDeclaredRoles(t *testing.T) {
	pre := startSim(t, sim.Config{Engine: engines.VLLM, Role: sim.RolePrefill})
	dec := startSim(t, sim.Config{Engine: engines.VLLM, Role: sim.RoleDecode})
	tp, td := target(pre), target(dec)
	tp.Role, td.Role = engines.RolePrefill, engines.RoleDecode
	p := probe(t, Options{Targets: []Target{tp, td}})
	s := stage(p, CapPD)
	if p.Topology != "pd" || s == nil || !strings.Contains(s.Reason, "sequential") || s.Rule.PDBootstrapPort != 0 {
		t.Fatalf("topology %s stage %+v; want sequential P/D", p.Topology, s)
	}
	if r := p.Answer(KeyRoles); r.Status != Known || !strings.Contains(strings.Join(r.Evidence, " "), "declared") {
		t.Errorf("roles = %+v; want known and marked as declared", r)
	}
	checkRules(t, p)

	sp := startSim(t, sim.Config{Engine: engines.SGLang, Role: sim.RolePrefill})
	sd := startSim(t, sim.Config{Engine: engines.SGLang, Role: sim.RoleDecode})
	p = probe(t, Options{Targets: []Target{{Addr: sp.Addrs().HTTP, Role: engines.RoleDecode}, {Addr: sd.Addrs().HTTP}}})
	r := p.Answer(KeyRoles)
	if r.Status != Inconsistent || len(r.Disagree) != 1 || r.Disagree[0].Endpoint != sp.Addrs().HTTP || p.Consistent || len(p.Stages) != 0 {
		t.Errorf("roles = %+v, stages %d; want the contradicted declaration named and nothing staged", r, len(p.Stages))
	}
}

func TestSGLangConverged(t *testing.T) {
	var targets []Target
	for i := 0; i < 2; i++ {
		s := startSim(t, sim.Config{Engine: engines.SGLang, BlockSize: 16}) // the catalog launches SGLang with --page-size 16 (its default is 1)
		warm(t, s, "Qwen/Qwen3-0.6B")
		targets = append(targets, Target{Addr: s.Addrs().HTTP})
	}
	p := probe(t, Options{Targets: targets})
	if p.Topology != "converged" || p.Answer(KeyRoles).Status != Known || len(p.Stages) != 2 {
		t.Fatalf("plan: topology %s roles %+v stages %+v blocked %+v tokenizer %+v", p.Topology, p.Answer(KeyRoles), p.Stages, p.Blocked, p.Answer(KeyTokenizer))
	}
	if s := p.Stages[0]; s.Rule.Sel != 8 || s.RunbookMode != "chwbl" {
		t.Errorf("stage 1 = %+v; want the guide's single pool with CHWBL", s)
	}
	if s := p.Stages[1]; s.Capability != CapKVExact || s.Rule.KVBlockSize != 16 || p.Answer(KeyHashes).Value != "reproduced" {
		t.Errorf("stage 2 = %+v, parity %+v; want KV-exact after reproduced hashes", s, p.Answer(KeyHashes))
	}
	checkRules(t, p)
}

func TestGivenEngineChecked(t *testing.T) {
	a := startSim(t, sim.Config{Engine: engines.VLLM})
	p := probe(t, Options{Targets: []Target{{Addr: a.Addrs().HTTP}}, Engine: engines.SGLang})
	if e := p.Answer(KeyEngine); e.Status == Known || len(p.Stages) != 0 {
		t.Errorf("engine = %+v, stages %d; want the given sglang refused for a vLLM endpoint", e, len(p.Stages))
	}
	p = probe(t, Options{Targets: []Target{{Addr: a.Addrs().HTTP}}, Engine: engines.VLLM})
	if e := p.Answer(KeyEngine); e.Status != Known || e.Value != "vllm" {
		t.Errorf("engine = %+v; want vllm confirmed", e)
	}
}

// A peer that accepts connections and never answers: every probe ends at
// its deadline and the endpoint is unknown.
func TestSilentEndpointIsUnknown(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	done := make(chan struct{})
	defer close(done)
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() { <-done; c.Close() }()
		}
	}()
	p := probe(t, Options{Targets: []Target{{Addr: ln.Addr().String(), Events: "tcp://" + ln.Addr().String()}}, ProbeTimeout: 200 * time.Millisecond})
	if e := p.Answer(KeyEngine); e.Status != Unknown || len(p.Stages) != 0 {
		t.Errorf("engine = %+v stages %d; want unknown and no stage", e, len(p.Stages))
	}
	if len(p.Endpoints[0].Problems) == 0 || !strings.Contains(strings.Join(p.Endpoints[0].Problems, " "), "no answer within") {
		t.Errorf("problems = %v; want a probe deadline", p.Endpoints[0].Problems)
	}
}

func TestOptionsInvalid(t *testing.T) {
	cases := []struct {
		name string
		o    Options
	}{
		{"no endpoints", Options{}},
		{"bad address", Options{Targets: []Target{{Addr: "nohost"}}}},
		{"duplicate", Options{Targets: []Target{{Addr: "127.0.0.1:1"}, {Addr: "127.0.0.1:1"}}}},
		{"bad events", Options{Targets: []Target{{Addr: "127.0.0.1:1", Events: "udp://x:1"}}}},
		{"bad engine", Options{Targets: []Target{{Addr: "127.0.0.1:1"}}, Engine: "tgi"}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			if _, err := Probe(context.Background(), tc.o); err == nil || !strings.Contains(err.Error(), "invalid") {
				t.Errorf("err = %v; want ErrInvalid", err)
			}
		})
	}
}

// qwen3Path is the simulators' default tokenizer (the embedded Qwen3) as a
// tokenizer.json file, as an operator would give it with --kv-tokenizer.
func qwen3Path(t *testing.T) string {
	t.Helper()
	path, err := tokenizer.ExportQwen3(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	return path
}
