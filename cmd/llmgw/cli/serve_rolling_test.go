package cli

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	"github.com/llmgw/llmgw/engines"
	"github.com/llmgw/llmgw/engines/sim"
	"github.com/llmgw/llmgw/internal/k8stest"
	"github.com/llmgw/llmgw/k8s"
	"github.com/llmgw/llmgw/reliability/harness"
)

// replicaSet is the gateway replicas a Service would balance over, and the
// dialer such a client sees: a connection goes to a replica whose /readyz
// answers 200 when the connection is opened (kube-proxy sends new
// connections only to ready endpoints; an open connection stays where it
// is until one end closes it).
type replicaSet struct {
	mu   sync.Mutex
	gws  []*harness.Gateway
	next int
}

func (rs *replicaSet) add(g *harness.Gateway) {
	rs.mu.Lock()
	defer rs.mu.Unlock()
	rs.gws = append(rs.gws, g)
}

func (rs *replicaSet) remove(g *harness.Gateway) {
	rs.mu.Lock()
	defer rs.mu.Unlock()
	for i, x := range rs.gws {
		if x == g {
			rs.gws = append(rs.gws[:i], rs.gws[i+1:]...)
			return
		}
	}
}

// dial opens a connection to the next ready replica, asking again until
// ctx ends while none is.
func (rs *replicaSet) dial(ctx context.Context) (net.Conn, error) {
	tick := time.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
	for {
		rs.mu.Lock()
		cands := append([]*harness.Gateway(nil), rs.gws...)
		start := rs.next
		rs.next++
		rs.mu.Unlock()
		for k := range cands {
			g := cands[(start+k)%len(cands)]
			if code, _ := readyz(g.Admin); code != http.StatusOK {
				continue
			}
			var d net.Dialer
			if c, err := d.DialContext(ctx, "tcp", g.Data); err == nil {
				return c, nil
			}
		}
		select {
		case <-ctx.Done():
			return nil, fmt.Errorf("no ready replica: %w", ctx.Err())
		case <-tick.C:
		}
	}
}

// TestRollingRestartNoFailedRequests (issue 42): two `llmgw serve
// --rules-from kubernetes` replicas against a real API server, a client
// load loop balancing as a Service does, and each replica restarted in
// turn (SIGTERM, a new one started, wait until it is ready): not one
// request fails, streamed or not.
func TestRollingRestartNoFailedRequests(t *testing.T) {
	const ns = "rolling"
	env, dyn := startRuleCluster(t, ns)

	// Two engine pods on one port, on two loopback addresses.
	var port int
	for i, ip := range []string{"127.0.0.41", "127.0.0.42"} {
		listen := ip + ":0"
		if port != 0 {
			listen = net.JoinHostPort(ip, strconv.Itoa(port))
		}
		s, err := sim.Start(context.Background(), sim.Config{Engine: engines.VLLM, Model: "m", Listen: listen, KVEvents: sim.KVEventsOff})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { s.Close() })
		_, ps, _ := net.SplitHostPort(s.Addrs().HTTP)
		port, _ = strconv.Atoi(ps)
		p, err := env.Client.CoreV1().Pods(ns).Create(t.Context(), &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("engine-%d", i), Labels: map[string]string{"app": "engine", "slot": strconv.Itoa(i)}},
			Spec:       corev1.PodSpec{Containers: []corev1.Container{{Name: "engine", Image: "llmgw-sim"}}},
		}, metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		p.Status = corev1.PodStatus{Phase: corev1.PodRunning, PodIP: ip, PodIPs: []corev1.PodIP{{IP: ip}},
			Conditions: []corev1.PodCondition{{Type: corev1.PodReady, Status: corev1.ConditionTrue}}}
		if _, err := env.Client.CoreV1().Pods(ns).UpdateStatus(t.Context(), p, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	createPoolRule(t, dyn, ns, port)

	binDir := t.TempDir()
	bctx, bcancel := context.WithTimeout(t.Context(), 5*time.Minute)
	bin, err := harness.Build(bctx, k8stest.RepoRoot(t), binDir, false)
	bcancel()
	if err != nil {
		t.Fatal(err)
	}
	kubeconfig := env.Kubeconfig(t)
	started := 0
	startReplica := func() *harness.Gateway {
		t.Helper()
		started++
		dir := t.TempDir()
		g, err := harness.StartGatewayArgs(t.Context(), bin, filepath.Join(dir, "serve.log"), "serve",
			"--listen", "127.0.0.1:0", "--admin", "127.0.0.1:0", "--state-dir", filepath.Join(dir, "state"),
			"--rules-from", "kubernetes", "--rules-namespace", ns, "--endpoints-source", "kubernetes", "--kubeconfig", kubeconfig,
			// The client below reconnects to a ready replica as soon as
			// an answer closes its connection; a second is ample.
			"--drain-window", "1s", "--shutdown-timeout", "20s")
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(g.Stop)
		waitCond(t, 30*time.Second, fmt.Sprintf("replica %d ready", started), func() bool {
			code, _ := readyz(g.Admin)
			return code == http.StatusOK
		})
		return g
	}
	rs := &replicaSet{}
	rs.add(startReplica())
	rs.add(startReplica())

	// The load loop: a few clients, each with one keep-alive connection
	// at a time and a request every 5 ms at most (about 800 a second in
	// all, bounded by maxRequests), every third request streamed.
	const clients, maxRequests = 4, 100000
	ctx, stop := context.WithCancel(t.Context())
	defer stop()
	var total, failed atomic.Int64
	var firstErr atomic.Value
	var wg sync.WaitGroup
	for w := range clients {
		wg.Add(1)
		go func() {
			defer wg.Done()
			tr := &http.Transport{MaxIdleConnsPerHost: 1, MaxConnsPerHost: 1,
				DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) { return rs.dial(ctx) }}
			defer tr.CloseIdleConnections()
			c := &http.Client{Transport: tr, Timeout: 30 * time.Second}
			pace := time.NewTicker(5 * time.Millisecond)
			defer pace.Stop()
			for i := 0; ctx.Err() == nil && total.Load() < maxRequests; i++ {
				select {
				case <-ctx.Done():
					return
				case <-pace.C:
				}
				err := oneRequest(c, i%3 == 0)
				total.Add(1)
				if err != nil {
					if failed.Add(1) == 1 {
						firstErr.Store(fmt.Sprintf("client %d request %d: %v", w, i, err))
					}
				}
			}
		}()
	}
	// Load before, between and after the restarts.
	atLeast := func(n int64) {
		t.Helper()
		target := total.Load() + n
		deadline := time.Now().Add(60 * time.Second)
		for total.Load() < target {
			if time.Now().After(deadline) {
				rs.mu.Lock()
				var logs []string
				for _, g := range rs.gws {
					l := g.Log()
					logs = append(logs, l[max(0, len(l)-3000):])
				}
				rs.mu.Unlock()
				t.Fatalf("timed out waiting for %d more requests: %d sent, %d failed, first failure %v; replica logs:\n%s",
					n, total.Load(), failed.Load(), firstErr.Load(), strings.Join(logs, "\n---\n"))
			}
			select {
			case <-ctx.Done():
				return
			case <-time.After(20 * time.Millisecond):
			}
		}
	}
	atLeast(50)
	for round := range 2 {
		rs.mu.Lock()
		old := rs.gws[0]
		rs.mu.Unlock()
		if err := syscall.Kill(old.Pid(), syscall.SIGTERM); err != nil {
			t.Fatal(err)
		}
		waitCond(t, 10*time.Second, "the old replica unready", func() bool {
			code, _ := readyz(old.Admin)
			return code != http.StatusOK
		})
		rs.add(startReplica())
		select {
		case <-old.Done():
		case <-time.After(60 * time.Second):
			t.Fatalf("round %d: the old replica did not exit after SIGTERM", round)
		}
		rs.remove(old)
		if log := old.Log(); !strings.Contains(log, "msg=stopped") {
			t.Errorf("round %d: the old replica's log has no clean stop:\n%s", round, log[max(0, len(log)-2000):])
		}
		atLeast(50)
	}
	stop()
	wg.Wait()
	t.Logf("%d requests through two rolling restarts, %d failed", total.Load(), failed.Load())
	if n := failed.Load(); n != 0 {
		t.Errorf("%d of %d requests failed across the rolling restart; first: %v", n, total.Load(), firstErr.Load())
	}

	// One pool empty: a second Rule over engine-1 alone, whose pod then
	// stops being Ready. The replica stays ready (rule "pool" still
	// serves), /readyz names the empty pool, and so does `rule get`.
	rs.mu.Lock()
	g := rs.gws[0]
	rs.mu.Unlock()
	solo := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "llmgw.io/v1alpha1", "kind": "Rule", "metadata": map[string]any{"name": "solo"},
		"spec": map[string]any{"model_name": "m-solo", "probe": map[string]any{"disabled": true},
			"endpoints_from": map[string]any{"namespace": ns, "selector": map[string]any{"app": "engine", "slot": "1"}, "target_ports": []any{int64(port)}}},
	}}
	if _, err := dyn.Resource(k8s.RuleResource).Namespace(ns).Create(t.Context(), solo, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	waitCond(t, 30*time.Second, "rule solo serving", func() bool {
		code, body := readyz(g.Admin)
		rules, _ := body["rules"].(map[string]any)
		return code == http.StatusOK && rules["solo"] == true
	})
	p, err := env.Client.CoreV1().Pods(ns).Get(t.Context(), "engine-1", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	p.Status.Conditions = []corev1.PodCondition{{Type: corev1.PodReady, Status: corev1.ConditionFalse}}
	if _, err := env.Client.CoreV1().Pods(ns).UpdateStatus(t.Context(), p, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	var body map[string]any
	waitCond(t, 30*time.Second, "/readyz naming solo's empty pool", func() bool {
		_, body = readyz(g.Admin)
		nr, _ := body["rules_not_ready"].(map[string]any)
		why, _ := nr["solo"].(string)
		return strings.Contains(why, "endpoint pool empty")
	})
	if body["ready"] != true {
		t.Errorf("/readyz with solo's pool empty: %v; want ready (rule pool serves)", body)
	}
	if err := oneRequest(&http.Client{Timeout: 30 * time.Second, Transport: &http.Transport{DisableKeepAlives: true,
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) { return rs.dial(ctx) }}}, false); err != nil {
		t.Errorf("model m with solo's pool empty: %v", err)
	}
	ios, out, errOut := TestIO()
	if code := Main(t.Context(), []string{"rule", "get", "solo", "--admin", "http://" + g.Admin}, ios); code != ExitOK ||
		!strings.Contains(out.String(), "not ready: endpoint pool empty") {
		t.Errorf("rule get solo: exit %d\n%s%s", code, out, errOut)
	}
}

// oneRequest sends one chat completion and reads the whole answer; a
// stream must end with [DONE].
func oneRequest(c *http.Client, stream bool) error {
	body := fmt.Sprintf(`{"model":"m","max_tokens":4,"stream":%v,"messages":[{"role":"user","content":"hi"}]}`, stream)
	resp, err := c.Post("http://gateway/v1/chat/completions", "application/json", strings.NewReader(body))
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		b, _ := io.ReadAll(resp.Body)
		return fmt.Errorf("status %d: %s", resp.StatusCode, b)
	}
	if !stream {
		_, err := io.ReadAll(resp.Body)
		return err
	}
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		if sc.Text() == "data: [DONE]" {
			_, err := io.Copy(io.Discard, resp.Body)
			return err
		}
	}
	if err := sc.Err(); err != nil {
		return err
	}
	return errors.New("stream ended without [DONE]")
}
