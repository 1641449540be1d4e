//go:build faults

package reliability

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"net/http"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/llmgw/llmgw/internal/wait"
	"github.com/llmgw/llmgw/reliability/harness"
)

// requireDocker skips the test without a reachable Docker daemon, except
// under CI=true, where a missing daemon is a failure.
func requireDocker(t *testing.T) {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 20*time.Second)
	defer cancel()
	if _, err := harness.Docker(ctx, "info", "--format", "{{.ServerVersion}}"); err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatalf("CI=true and no Docker daemon: %v", err)
		}
		t.Skipf("no Docker daemon reachable (set CI=true to make this a failure): %v", err)
	}
}

// TestNetworkPartitionBetweenHosts: three simulated workers run in Docker
// containers on a network the test creates; the gateway (on the host)
// reaches them by their container addresses. One worker is disconnected
// from the network under mixed streaming and non-streaming load: packets to
// it vanish (no reset), the harshest partition. No request may hang past
// the rule's timeouts, the worker is marked down, traffic recovers on the
// others, and it is readmitted once reconnected.
func TestNetworkPartitionBetweenHosts(t *testing.T) {
	requireDocker(t)
	root, err := harness.ModuleRoot()
	if err != nil {
		t.Fatal(err)
	}
	ctx := t.Context()
	id := fmt.Sprintf("%08x", rand.Uint32())
	tag := "llmgw-faults:" + id
	if err := harness.BuildImage(ctx, root, t.TempDir(), tag); err != nil {
		t.Fatal(err)
	}
	cleanup := func(args ...string) {
		// Cleanup runs after the test context ends: use a fresh one.
		cctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if _, err := harness.Docker(cctx, args...); err != nil {
			t.Logf("cleanup: %v", err)
		}
	}
	t.Cleanup(func() { cleanup("rmi", "-f", tag) })
	network := "llmgw-faults-" + id
	if _, err := harness.Docker(ctx, "network", "create", "--label", "llmgw.owner=llmgw-faults", network); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cleanup("network", "rm", network) })
	var containers, ips []string
	for i := range 3 {
		name := fmt.Sprintf("llmgw-faults-%s-w%d", id, i+1)
		if _, err := harness.Docker(ctx, "run", "-d", "--name", name, "--network", network, "--label", "llmgw.owner=llmgw-faults",
			tag, "sim", "--engine", "vllm", "--listen", "0.0.0.0:8000", "--kv-events", "off", "--model", "m", "--decode-us-per-token", "2000"); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { cleanup("rm", "-f", name) })
		ip, err := harness.Docker(ctx, "inspect", "-f", "{{range .NetworkSettings.Networks}}{{.IPAddress}}{{end}}", name)
		if err != nil || ip == "" {
			t.Fatalf("container address of %s: %q %v", name, ip, err)
		}
		containers, ips = append(containers, name), append(ips, ip)
	}
	probe := &http.Client{Timeout: time.Second, Transport: &http.Transport{DisableKeepAlives: true}}
	for _, ip := range ips {
		wait.For(t, 30*time.Second, "worker "+ip+" healthy", func() bool {
			resp, err := probe.Get("http://" + ip + ":8000/health")
			if err != nil {
				return false
			}
			resp.Body.Close()
			return resp.StatusCode == http.StatusOK
		})
	}
	g := startGW(t, "")
	var rule strings.Builder
	rule.WriteString("name: r\nmodel_name: m\nsel: 0\nprobe: {path: /health, interval: 200ms, timeout: 200ms, failures: 2, successes: 1}\n")
	rule.WriteString("timeouts: {connect: 500ms, first_byte: 2s, idle: 2s}\ncb: {open_for: 1s}\nendpoints:\n")
	for i, ip := range ips {
		fmt.Fprintf(&rule, "  - {id: w%d, endpointIP: %s, targetPort: 8000}\n", i+1, ip)
	}
	putRule(t, g, "r", rule.String())
	wait.For(t, 10*time.Second, "three healthy endpoints", func() bool {
		return metric(t, g, "llmgw_endpoint_available", "rule", "r") == 3
	})

	// Every request must be answered by the gateway: a dead connect
	// (500ms) is retried elsewhere, a stream whose worker vanished is cut
	// by the idle timeout (2s). The client's timeout only detects a
	// request the gateway left hanging: it is three times the longest of
	// those, for a loaded machine.
	const hang = 6 * time.Second
	c := newClient(t, hang)
	lctx, stop := context.WithCancel(ctx)
	var mu sync.Mutex
	var rs []result
	cur := make([]time.Time, 6) // each loop's request in flight (its start), zero between requests
	var wg sync.WaitGroup
	for i := range 6 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for k := 0; lctx.Err() == nil; k++ {
				stream := k%2 == 1
				mu.Lock()
				cur[i] = time.Now()
				mu.Unlock()
				r := chat(lctx, c, g.URL(), chatBody(fmt.Sprintf("loop %d req %d", i, k), 50, stream))
				mu.Lock()
				cur[i] = time.Time{}
				mu.Unlock()
				if lctx.Err() != nil && r.err != nil {
					return
				}
				if stream && r.err == nil && (!strings.Contains(r.body, "data: [DONE]") || strings.Contains(r.body, `data: {"error"`)) {
					r.status = -1 // a stream that ended with an error event
				}
				mu.Lock()
				rs = append(rs, r)
				mu.Unlock()
			}
		}()
	}
	wait.For(t, 10*time.Second, "load on every worker", func() bool {
		mu.Lock()
		defer mu.Unlock()
		seen := map[string]bool{}
		for _, r := range rs {
			seen[r.endpoint] = true
		}
		return seen["w1"] && seen["w2"] && seen["w3"]
	})
	faultAt := time.Now()
	if _, err := harness.Docker(ctx, "network", "disconnect", network, containers[1]); err != nil {
		stop()
		wg.Wait()
		t.Fatal(err)
	}
	took := wait.For(t, 5*time.Second, "w2 marked down", func() bool {
		return metric(t, g, "llmgw_endpoint_healthy", "rule", "r", "endpoint", "w2") == 0
	})
	markedAt := time.Now()
	// Keep the load running until every request in flight at the
	// mark-down has ended and enough started after it have completed.
	wait.For(t, 2*hang, "the requests in flight at the mark-down to end, and 20 after it", func() bool {
		mu.Lock()
		defer mu.Unlock()
		for _, st := range cur {
			if !st.IsZero() && st.Before(markedAt) {
				return false
			}
		}
		after := 0
		for _, r := range rs {
			if !r.start.Before(markedAt) {
				after++
			}
		}
		return after >= 20
	})
	stop()
	wg.Wait()

	var inWindow, inWindowFailed, after, afterFailed, afterOnW2 int
	var slowest time.Duration
	for _, r := range rs {
		if d := r.end.Sub(r.start); d > slowest {
			slowest = d
		}
		if ne := net.Error(nil); errors.As(r.err, &ne) && ne.Timeout() {
			t.Errorf("a request was left hanging by the gateway (endpoint %s): %v", r.endpoint, r.err)
		}
		switch {
		case r.end.Before(faultAt):
		case r.start.Before(markedAt):
			inWindow++
			if r.failed() {
				inWindowFailed++
			}
		default:
			after++
			if r.failed() {
				afterFailed++
				t.Errorf("failed after w2 was marked down: status %d endpoint %q err %v %.200s", r.status, r.endpoint, r.err, r.body)
			}
			if r.endpoint == "w2" {
				afterOnW2++
			}
		}
	}
	t.Logf("w2 marked down %v after the partition; %d requests in flight or started before that (%d failed: in flight on w2), %d after (%d failed, %d on w2); slowest request %v",
		took.Round(time.Millisecond), inWindow, inWindowFailed, after, afterFailed, afterOnW2, slowest.Round(time.Millisecond))
	if after < 10 || afterOnW2 != 0 {
		t.Errorf("after the partition: %d requests, %d on w2; want some, none on w2", after, afterOnW2)
	}

	// Heal the partition: w2 is readmitted and serves again.
	if _, err := harness.Docker(ctx, "network", "connect", network, containers[1]); err != nil {
		t.Fatal(err)
	}
	if ip, _ := harness.Docker(ctx, "inspect", "-f", "{{range .NetworkSettings.Networks}}{{.IPAddress}}{{end}}", containers[1]); ip != ips[1] {
		t.Fatalf("w2 came back as %q, not %s; the rule still names the old address", ip, ips[1])
	}
	readmit := wait.For(t, 10*time.Second, "w2 readmitted", func() bool {
		return metric(t, g, "llmgw_endpoint_available", "rule", "r", "endpoint", "w2") == 1
	})
	onW2 := 0
	for i := range 12 {
		r := chat(ctx, c, g.URL(), chatBody(fmt.Sprint("healed ", i), 4, false))
		if r.failed() {
			t.Fatalf("after healing: status %d err %v %s", r.status, r.err, r.body)
		}
		if r.endpoint == "w2" {
			onW2++
		}
	}
	if onW2 == 0 {
		t.Errorf("w2 took none of 12 round-robin requests after it was readmitted")
	}
	t.Logf("w2 readmitted %v after reconnecting; %d of 12 requests went to it", readmit.Round(time.Millisecond), onW2)
}
