package sim

import (
	"encoding/json"
	"fmt"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/llmgw/llmgw/engines"
	"github.com/llmgw/llmgw/engines/kvhash"
)

func TestSGLangConformance(t *testing.T) {
	s := startSim(t, Config{Engine: engines.SGLang, KVEvents: KVEventsOff, Seed: 7, BootstrapListen: "127.0.0.1:0"})
	runConformance(t, "sglang", s, []conformanceCase{
		{"chat_json", "POST", "/v1/chat/completions", chatBody + `}`, 200, "application/json"},
		{"chat_sse", "POST", "/v1/chat/completions", chatBody + `,"stream":true,"stream_options":{"include_usage":true}}`, 200, "text/event-stream"},
		{"chat_sse_options_no_usage", "POST", "/v1/chat/completions", chatBody + `,"stream":true,"stream_options":{}}`, 200, "text/event-stream"},
		{"completion_json", "POST", "/v1/completions", `{"prompt":"The capital of France is","max_tokens":3}`, 200, "application/json"},
		{"generate_text", "POST", "/generate", `{"text":"The capital of France is","sampling_params":{"max_new_tokens":3}}`, 200, "application/json"},
		{"generate_ids_sse", "POST", "/generate", `{"input_ids":[1,2,3,4,5,6],"sampling_params":{"max_new_tokens":2},"stream":true}`, 200, "text/event-stream"},
		{"model_info", "GET", "/get_model_info", "", 200, "application/json"},
		{"models", "GET", "/v1/models", "", 200, "application/json"},
		{"health", "GET", "/health", "", 200, ""},
		{"health_generate", "GET", "/health_generate", "", 200, ""},
		{"err_malformed_json", "POST", "/v1/chat/completions", `{"messages":`, 400, "application/json"},
		{"err_missing_messages", "POST", "/v1/chat/completions", `{}`, 400, "application/json"},
		{"err_generate_no_input", "POST", "/generate", `{"sampling_params":{}}`, 400, "application/json"},
		{"err_bad_room", "POST", "/v1/completions", `{"prompt":"x","bootstrap_host":"127.0.0.1","bootstrap_port":1,"bootstrap_room":-5}`, 400, "application/json"},
	})
	// get_server_info reports the page size (SGLang's default, 1, as the
	// sim was started without one) and the bootstrap port.
	res := do(t, client(t), "GET", "http://"+s.Addrs().HTTP+"/get_server_info", "")
	var info struct {
		PageSize      int `json:"page_size"`
		BootstrapPort int `json:"disaggregation_bootstrap_port"`
	}
	if err := json.Unmarshal(res.body, &info); err != nil || info.PageSize != engines.MustFor(engines.SGLang).KV().BlockSize || fmt.Sprint(info.BootstrapPort) != portOf(s.Addrs().Bootstrap) {
		t.Errorf("get_server_info: %s (err %v)", res.body, err)
	}
}

func TestTRTLLMConformance(t *testing.T) {
	s := startSim(t, Config{Engine: engines.TRTLLM, Seed: 7, Model: "Qwen/Qwen2.5-7B-Instruct"})
	runConformance(t, "trtllm", s, []conformanceCase{
		{"kv_events_created", "POST", "/kv_cache_events", "", 200, "application/json"},
		{"chat_json", "POST", "/v1/chat/completions", `{"model":"Qwen/Qwen2.5-7B-Instruct","messages":[{"role":"user","content":"hello"}],"max_tokens":2}`, 200, "application/json"},
		{"completion_sse", "POST", "/v1/completions", `{"prompt":"The capital of France is","max_tokens":2,"stream":true}`, 200, "text/event-stream"},
		{"server_info", "GET", "/server_info", "", 200, "application/json"},
		{"models", "GET", "/v1/models", "", 200, "application/json"},
		{"health", "GET", "/health", "", 200, ""},
		{"err_unknown_field", "POST", "/v1/completions", `{"prompt":"x","kv_transfer_params":{}}`, 400, "application/json"},
		{"err_malformed_json", "POST", "/v1/completions", `{"prompt"`, 400, "application/json"},
		{"err_bad_opaque", "POST", "/v1/completions", `{"prompt":"x","disaggregated_params":{"request_type":"generation_only","encoded_opaque_state":"!!"}}`, 400, "application/json"},
	})
}

func TestLlamaCppLoading(t *testing.T) {
	now := time.Unix(1700000000, 0)
	var mu sync.Mutex
	clock := func() time.Time { mu.Lock(); defer mu.Unlock(); return now }
	s := startSim(t, Config{Engine: engines.LlamaCpp, LoadingFor: time.Minute, Clock: clock})
	c := client(t)
	base := "http://" + s.Addrs().HTTP
	loading := `{"error":{"code":503,"message":"Loading model","type":"unavailable_error"}}`
	if res := do(t, c, "GET", base+"/health", ""); res.status != 503 || string(res.body) != loading {
		t.Errorf("health while loading: %d %s", res.status, res.body)
	}
	if res := do(t, c, "POST", base+"/completion", `{"prompt":"x"}`); res.status != 503 || string(res.body) != loading {
		t.Errorf("completion while loading: %d %s", res.status, res.body)
	}
	mu.Lock()
	now = now.Add(2 * time.Minute)
	mu.Unlock()
	if res := do(t, c, "GET", base+"/health", ""); res.status != 200 || string(res.body) != `{"status":"ok"}` {
		t.Errorf("health when loaded: %d %s", res.status, res.body)
	}
}

// TestTRTLLMEvents checks the destructive drain: created first, stored
// blocks with TensorRT-LLM's own block keys chained by parent, monotonic ids,
// removals on eviction, and an empty array on the second read.
func TestTRTLLMEvents(t *testing.T) {
	s := startSim(t, Config{Engine: engines.TRTLLM, CacheBlocks: 2, BlockSize: 4})
	c := client(t)
	base := "http://" + s.Addrs().HTTP
	drain := func() []map[string]any {
		res := do(t, c, "POST", base+"/kv_cache_events", "")
		var evs []map[string]any
		dec := json.NewDecoder(strings.NewReader(string(res.body)))
		dec.UseNumber()
		if err := dec.Decode(&evs); err != nil {
			t.Fatalf("decode %s: %v", res.body, err)
		}
		return evs
	}
	if evs := drain(); len(evs) != 1 || evs[0]["data"].(map[string]any)["type"] != "created" {
		t.Fatalf("first drain: %v", evs)
	}
	if evs := drain(); len(evs) != 0 {
		t.Fatalf("drain is not destructive: %v", evs)
	}
	// 9 prompt tokens = 2 full blocks of 4.
	do(t, c, "POST", base+"/v1/completions", `{"prompt":[1,2,3,4,5,6,7,8,9],"max_tokens":1}`)
	evs := drain()
	if len(evs) != 1 {
		t.Fatalf("stored events: got %d, want 1: %v", len(evs), evs)
	}
	data := evs[0]["data"].(map[string]any)
	blocks := data["blocks"].([]any)
	k1 := kvhash.TRTLLMBlockKey(0, []uint32{1, 2, 3, 4})
	k2 := kvhash.TRTLLMBlockKey(k1, []uint32{5, 6, 7, 8})
	if data["type"] != "stored" || data["parent_hash"] != nil || len(blocks) != 2 ||
		blocks[0].(map[string]any)["block_hash"].(json.Number).String() != fmt.Sprint(k1) ||
		blocks[1].(map[string]any)["block_hash"].(json.Number).String() != fmt.Sprint(k2) {
		t.Errorf("stored event: got %v, want block hashes %d, %d", evs[0], k1, k2)
	}
	if id := evs[0]["event_id"].(json.Number).String(); id != "1" {
		t.Errorf("event_id: got %s, want 1", id)
	}
	// A different prompt evicts both blocks (capacity 2).
	do(t, c, "POST", base+"/v1/completions", `{"prompt":[9,9,9,9,8,8,8,8,7],"max_tokens":1}`)
	evs = drain()
	if len(evs) != 3 {
		t.Fatalf("after eviction: got %d events, want 2 removed + 1 stored: %v", len(evs), evs)
	}
	for i, want := range []string{"removed", "removed", "stored"} {
		if got := evs[i]["data"].(map[string]any)["type"]; got != want {
			t.Errorf("event %d: got %v, want %s", i, got, want)
		}
		if id := evs[i]["event_id"].(json.Number).String(); id != fmt.Sprint(i+2) {
			t.Errorf("event %d id: got %s, want %d", i, id, i+2)
		}
	}
	// Sequence gap and drop faults apply to event ids.
	postFaults(t, s, `{"seq_gap":5,"drop_events":1}`)
	do(t, c, "POST", base+"/_sim/reset_cache", "")
	do(t, c, "POST", base+"/v1/completions", `{"prompt":[1,1,1,1,2],"max_tokens":1}`)
	evs = drain()
	if len(evs) != 1 || evs[0]["event_id"].(json.Number).String() != "11" {
		t.Errorf("after gap 5 and one dropped event: got %v, want one event with id 11", evs)
	}
}

func TestTRTLLMDisaggregated(t *testing.T) {
	ctxSrv := startSim(t, Config{Engine: engines.TRTLLM, Role: RolePrefill, PrefillPerToken: time.Microsecond})
	gen := startSim(t, Config{Engine: engines.TRTLLM, Role: RoleDecode, PrefillPerToken: time.Microsecond})
	c := client(t)
	res := do(t, c, "POST", "http://"+ctxSrv.Addrs().HTTP+"/v1/completions",
		`{"prompt":"a long shared context for the context server","max_tokens":10,"disaggregated_params":{"request_type":"context_only","disagg_request_id":77}}`)
	if res.status != 200 {
		t.Fatalf("context: %d %s", res.status, res.body)
	}
	var cr struct {
		Choices []struct {
			FinishReason string          `json:"finish_reason"`
			DP           json.RawMessage `json:"disaggregated_params"`
		} `json:"choices"`
		PromptTokenIDs []uint32 `json:"prompt_token_ids"`
		Usage          struct {
			Completion int `json:"completion_tokens"`
		} `json:"usage"`
	}
	if err := json.Unmarshal(res.body, &cr); err != nil || len(cr.Choices) != 1 {
		t.Fatalf("context response %s: %v", res.body, err)
	}
	if cr.Choices[0].FinishReason != "length" || cr.Usage.Completion != 1 || len(cr.PromptTokenIDs) == 0 {
		t.Errorf("context response: %s", res.body)
	}
	var dp map[string]any
	if err := json.Unmarshal(cr.Choices[0].DP, &dp); err != nil || dp["request_type"] != "context_only" || dp["ctx_request_id"] == nil || dp["encoded_opaque_state"] == nil {
		t.Fatalf("disaggregated_params: %s", cr.Choices[0].DP)
	}
	dp["request_type"] = "generation_only"
	genParams, _ := json.Marshal(dp)
	ids, _ := json.Marshal(cr.PromptTokenIDs)
	tests := []struct {
		name       string
		body       string
		wantStatus int
		wantRemote bool
	}{
		{"generation_only", fmt.Sprintf(`{"prompt":%s,"max_tokens":10,"disaggregated_params":%s}`, ids, genParams), 200, true},
		{"converged fallback", fmt.Sprintf(`{"prompt":%s,"max_tokens":10}`, ids), 200, false},
		{"prompt mismatch", fmt.Sprintf(`{"prompt":[1,2,3],"max_tokens":10,"disaggregated_params":%s}`, genParams), 400, false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			do(t, c, "POST", "http://"+gen.Addrs().HTTP+"/_sim/reset_cache", "")
			res := do(t, c, "POST", "http://"+gen.Addrs().HTTP+"/v1/completions", tc.body)
			if res.status != tc.wantStatus {
				t.Fatalf("status: got %d, want %d: %s", res.status, tc.wantStatus, res.body)
			}
			if tc.wantStatus != 200 {
				return
			}
			rs := gen.Receipts()
			if got := rs[len(rs)-1].RemotePrefillTokens > 0; got != tc.wantRemote {
				t.Errorf("remote prefill: got %v, want %v", got, tc.wantRemote)
			}
		})
	}
}

// TestSGLangBootstrap runs the concurrent dual dispatch: the same body with
// the same bootstrap triple to prefill and decode. A matching pair succeeds
// with the decode answering; a mismatched room fails both legs.
func TestSGLangBootstrap(t *testing.T) {
	p := startSim(t, Config{Engine: engines.SGLang, Role: RolePrefill, KVEvents: KVEventsOff, RendezvousTimeout: 300 * time.Millisecond, PrefillPerToken: time.Microsecond})
	d := startSim(t, Config{Engine: engines.SGLang, Role: RoleDecode, KVEvents: KVEventsOff, RendezvousTimeout: 300 * time.Millisecond, PrefillPerToken: time.Microsecond})
	if d.Addrs().Bootstrap != "" {
		t.Errorf("decode has a bootstrap server: %s", d.Addrs().Bootstrap)
	}
	c := client(t)
	host, port := hostOf(p.Addrs().Bootstrap), portOf(p.Addrs().Bootstrap)
	body := func(room uint64) string {
		return fmt.Sprintf(`{"messages":[{"role":"user","content":"bootstrap me please, this prompt spans blocks"}],"max_tokens":4,"bootstrap_host":%q,"bootstrap_port":%s,"bootstrap_room":%d}`, host, port, room)
	}
	tests := []struct {
		name                 string
		prefillRoom, decRoom uint64
		wantStatus           int
	}{
		{"matching pair", 9223372036854775807, 9223372036854775807, 200},
		{"mismatched room", 11, 12, 500},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			var wg sync.WaitGroup
			var pre, dec httpResult
			wg.Add(2)
			go func() {
				defer wg.Done()
				pre = do(t, c, "POST", "http://"+p.Addrs().HTTP+"/v1/chat/completions", body(tc.prefillRoom))
			}()
			go func() {
				defer wg.Done()
				dec = do(t, c, "POST", "http://"+d.Addrs().HTTP+"/v1/chat/completions", body(tc.decRoom))
			}()
			wg.Wait()
			if pre.status != tc.wantStatus || dec.status != tc.wantStatus {
				t.Fatalf("statuses: prefill %d (%s), decode %d (%s); want both %d", pre.status, pre.body, dec.status, dec.body, tc.wantStatus)
			}
			if tc.wantStatus != 200 {
				if !strings.Contains(string(pre.body), `"object":"error"`) || !strings.Contains(string(dec.body), "bootstrap") {
					t.Errorf("error bodies: prefill %s, decode %s", pre.body, dec.body)
				}
				return
			}
			rs := d.Receipts()
			r := rs[len(rs)-1]
			if r.Bootstrap == nil || r.Bootstrap.Room != tc.decRoom || r.RemotePrefillTokens == 0 || r.PrefillCostUS != 1 {
				t.Errorf("decode receipt: %+v", r)
			}
		})
	}
	// A decode sent a bootstrap_port where no bootstrap server answers fails,
	// and so does its prefill, whose decode never joins: SGLang's decode
	// asks GET http://{bootstrap_host}:{bootstrap_port}/route first and
	// records the room failed when it gets no answer (CommonKVReceiver,
	// python/sglang/srt/disaggregation/common/conn.py, sgl-project/sglang
	// 0094505da74125a31ceb354f37ae7a1b6a97d3f5).
	{
		dead := closedPort(t)
		var wg sync.WaitGroup
		var pre, dec httpResult
		wg.Add(2)
		go func() {
			defer wg.Done()
			pre = do(t, c, "POST", "http://"+p.Addrs().HTTP+"/v1/chat/completions", body(21))
		}()
		go func() {
			defer wg.Done()
			dec = do(t, c, "POST", "http://"+d.Addrs().HTTP+"/v1/chat/completions", strings.Replace(body(21), `"bootstrap_port":`+port, `"bootstrap_port":`+dead, 1))
		}()
		wg.Wait()
		if dec.status != 500 || !strings.Contains(string(dec.body), "bootstrap") || pre.status != 500 {
			t.Errorf("wrong decode bootstrap port: prefill %d (%s), decode %d (%s); want both 500", pre.status, pre.body, dec.status, dec.body)
		}
	}
	// A prefill whose bootstrap_port is not its own is rejected at once.
	res := do(t, c, "POST", "http://"+p.Addrs().HTTP+"/v1/chat/completions",
		fmt.Sprintf(`{"messages":[{"role":"user","content":"x"}],"bootstrap_host":%q,"bootstrap_port":1,"bootstrap_room":1}`, host))
	if res.status != 400 {
		t.Errorf("port mismatch: got %d %s, want 400", res.status, res.body)
	}
}

// TestSeveralSims runs one sim per persona in one process.
func TestSeveralSims(t *testing.T) {
	c := client(t)
	for _, k := range engines.Kinds() {
		s := startSim(t, Config{Engine: k, KVEvents: KVEventsOff})
		res := do(t, c, "POST", "http://"+s.Addrs().HTTP+"/v1/completions", `{"prompt":"hi","max_tokens":2}`)
		if res.status != 200 {
			t.Errorf("%s: %d %s", k, res.status, res.body)
		}
	}
}

// closedPort is a loopback port nothing listens on (a kernel-chosen port,
// released).
func closedPort(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	_, port, _ := net.SplitHostPort(ln.Addr().String())
	ln.Close()
	return port
}
