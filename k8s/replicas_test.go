package k8s_test

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/llmgw/llmgw/engines"
	"github.com/llmgw/llmgw/engines/sim"
	"github.com/llmgw/llmgw/engines/tokenizer"
	"github.com/llmgw/llmgw/gateway"
	"github.com/llmgw/llmgw/gateway/rule"
	"github.com/llmgw/llmgw/internal/k8stest"
	"github.com/llmgw/llmgw/internal/wait"
	"github.com/llmgw/llmgw/k8s"
)

// testReplicasAgree: two gateway replicas with the same KV-exact rule over
// discovered pods (each pod's KV event address from its annotation) ingest
// every engine's events; with warm indexes they send the same request to
// the same pod at least 95% of the time.
func testReplicasAgree(t *testing.T, env *k8stest.Env) {
	const ns = "replicas"
	cs := env.Client
	namespace(t, cs, ns)
	var port int
	for i := 0; i < 3; i++ {
		ip := "127.0.0." + strconv.Itoa(21+i)
		s, err := sim.Start(context.Background(), sim.Config{Engine: engines.VLLM, Model: "m", Listen: net.JoinHostPort(ip, strconv.Itoa(port)),
			KVEvents: "tcp://" + ip + ":0", BlockSize: 16, PrefillPerToken: time.Microsecond})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { s.Close() })
		if port == 0 {
			_, p, _ := net.SplitHostPort(s.Addrs().HTTP)
			port, _ = strconv.Atoi(p)
		}
		createPod(t, cs, ns, pod(fmt.Sprintf("engine-%d", i), ip, true, map[string]string{k8s.AnnotationKVEvents: s.Addrs().Events}))
	}
	// The simulators tokenize with the embedded Qwen3 tokenizer; the rule
	// names the same file, as an operator names the model's tokenizer.
	tok, err := tokenizer.ExportQwen3(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	y := fmt.Sprintf("name: kv\nmodel_name: m\nsel: 8\nkvEngineType: vllm\nkvExactMode: 3\nkvBlockSize: 16\nkvTokenizer: %q\nprobe: {disabled: true}\nendpoints_from: {namespace: %s, selector: {app: sim}, target_ports: [%d]}\n", tok, ns, port)
	var gws []*gateway.Server
	for range 2 {
		gw := startGateway(t, k8s.NewSource(cs, nil))
		r, err := rule.Decode([]byte(y))
		if err != nil {
			t.Fatal(err)
		}
		if _, err := gw.Apply(r, false); err != nil {
			t.Fatal(err)
		}
		wait.For(t, 20*time.Second, "KV event streams connected", func() bool {
			st, err := gw.Rule("kv")
			if err != nil || len(st.Status.Endpoints) != 3 {
				return false
			}
			for _, e := range st.Status.Endpoints {
				if e.KV == nil || !e.KV.EventsConnected {
					return false
				}
			}
			return true
		})
		gws = append(gws, gw)
	}
	tr := &http.Transport{MaxIdleConnsPerHost: 8}
	defer tr.CloseIdleConnections()
	hc := &http.Client{Transport: tr, Timeout: 20 * time.Second}
	// send returns the endpoint and the route class ("kv-exact hit" etc.).
	send := func(gw *gateway.Server, system, q string) (string, error) {
		body := fmt.Sprintf(`{"model":"m","max_tokens":2,"messages":[{"role":"system","content":%q},{"role":"user","content":%q}]}`, system, q)
		resp, err := hc.Post("http://"+gw.Addr()+"/v1/chat/completions", "application/json", strings.NewReader(body))
		if err != nil {
			return "", err
		}
		defer resp.Body.Close()
		_, _ = io.Copy(io.Discard, resp.Body)
		if resp.StatusCode != http.StatusOK {
			return "", fmt.Errorf("status %s", resp.Status)
		}
		route := resp.Header.Get("X-Llmgw-Route")
		if i := strings.IndexByte(route, '='); i >= 0 {
			route = route[:i]
		}
		return resp.Header.Get("X-Llmgw-Endpoint") + " " + route, nil
	}
	// Shared prefixes: 6 long system prompts, each warmed through both
	// replicas in turn.
	var systems []string
	for i := range 6 {
		systems = append(systems, strings.Repeat(fmt.Sprintf("You are assistant number %d and you answer carefully. ", i), 30))
	}
	for round := range 3 {
		for i, sys := range systems {
			if _, err := send(gws[(round+i)%2], sys, fmt.Sprintf("warm-up question %d", round)); err != nil {
				t.Fatal(err)
			}
		}
	}
	// Probes: a new question on each shared prefix, sent to both replicas
	// at once.
	same, pairs, hits := 0, 0, 0
	for round := range 5 {
		for _, sys := range systems {
			var got [2]string
			var errs [2]error
			var wg sync.WaitGroup
			for i := range 2 {
				wg.Add(1)
				go func() { defer wg.Done(); got[i], errs[i] = send(gws[i], sys, fmt.Sprintf("probe %d", round)) }()
			}
			wg.Wait()
			for _, err := range errs {
				if err != nil {
					t.Fatal(err)
				}
			}
			pairs++
			if got[0] == got[1] {
				same++
			}
			// Agreement must come from the KV indexes, not only from
			// CHWBL's shared hash ring (which agrees without any index).
			for _, g := range got {
				if strings.HasSuffix(g, " kv-exact hit") {
					hits++
				}
			}
		}
	}
	t.Logf("two replicas picked the same pod for %d of %d shared-prefix requests; %d of %d answers were kv-exact hits", same, pairs, hits, 2*pairs)
	if float64(same) < 0.95*float64(pairs) {
		t.Errorf("agreement %d/%d, want ≥ 95%%", same, pairs)
	}
	if float64(hits) < 0.95*float64(2*pairs) {
		t.Errorf("%d of %d probe answers were kv-exact hits, want ≥ 95%% (the indexes are not warm)", hits, 2*pairs)
	}
}
