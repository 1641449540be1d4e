//go:build faults

package reliability

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"net/http"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/llmgw/llmgw/reliability/harness"
)

// rawGet sends GET path on an already open keep-alive connection and
// returns the status and body: it works while the server cannot accept new
// connections.
func rawGet(t *testing.T, conn net.Conn, br *bufio.Reader, host, path string) (int, string) {
	t.Helper()
	_ = conn.SetDeadline(time.Now().Add(10 * time.Second))
	if _, err := fmt.Fprintf(conn, "GET %s HTTP/1.1\r\nHost: %s\r\n\r\n", path, host); err != nil {
		t.Fatalf("GET %s: %v", path, err)
	}
	resp, err := http.ReadResponse(br, nil)
	if err != nil {
		t.Fatalf("GET %s: %v", path, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatalf("GET %s: %v", path, err)
	}
	return resp.StatusCode, string(b)
}

// TestDescriptorExhaustionDoesNotKillTheDataPlane: a gateway under
// `ulimit -n 256` is sent 300 connections, more than it has descriptors.
// While it cannot accept, /readyz (asked on an admin connection opened
// before) says not ready and names the data listener, and the accept errors
// are counted; once the connections close, a normal request gets 200
// within 1 s. Before the fix fasthttp's Serve returned on the first EMFILE
// and the data plane never accepted again while /readyz said ready.
func TestDescriptorExhaustionDoesNotKillTheDataPlane(t *testing.T) {
	s := startSim(t, "w1", "--kv-events", "off")
	stateDir := t.TempDir()
	g, err := harness.StartGatewayArgs(t.Context(), "sh", filepath.Join(t.TempDir(), "gateway.log"),
		"-c", `ulimit -n 256 && exec "$0" "$@"`, llmgwBin,
		"serve", "--listen", "127.0.0.1:0", "--admin", "127.0.0.1:0", "--state-dir", stateDir)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		g.Stop()
		if t.Failed() {
			t.Logf("gateway log:\n%s", tail(g.Log(), 4000))
		}
	})
	// No active probes: their dials would fail too while descriptors are
	// out, and this test is about the listener, not endpoint health.
	putRule(t, g, "r", ruleFor(t, "r", "probe: {disabled: true}", s))
	c := newClient(t, 10*time.Second)
	if r := chat(t.Context(), c, g.URL(), chatBody("warm", 2, false)); r.failed() {
		t.Fatalf("request before the flood: %d %v %s", r.status, r.err, r.body)
	}
	admin, err := net.Dial("tcp", g.Admin)
	if err != nil {
		t.Fatal(err)
	}
	defer admin.Close()
	abr := bufio.NewReader(admin)
	if code, body := rawGet(t, admin, abr, g.Admin, "/readyz"); code != 200 {
		t.Fatalf("/readyz before the flood = %d %s", code, body)
	}

	const flood = 300
	conns := make([]net.Conn, 0, flood)
	defer func() {
		for _, c := range conns {
			c.Close()
		}
	}()
	for range flood {
		// The kernel completes the handshake from the backlog even when
		// the gateway cannot accept, so every dial succeeds.
		conn, err := net.DialTimeout("tcp", g.Data, 5*time.Second)
		if err != nil {
			break
		}
		conns = append(conns, conn)
	}
	var readyBody string
	eventually(t, 20*time.Second, "/readyz to report the data listener not accepting", func() bool {
		code, body := rawGet(t, admin, abr, g.Admin, "/readyz")
		readyBody = body
		return code == http.StatusServiceUnavailable && strings.Contains(body, "listeners_not_accepting") && strings.Contains(body, g.Data)
	})
	t.Logf("/readyz while accepting failed: %s", strings.Join(strings.Fields(readyBody), " "))
	if !strings.Contains(readyBody, "too many open files") {
		t.Errorf("/readyz = %s; want the accept error named", readyBody)
	}
	_, metrics := rawGet(t, admin, abr, g.Admin, "/metrics")
	if !strings.Contains(metrics, `llmgw_accept_errors_total{listener="`+g.Data+`",reason="emfile"}`) {
		t.Errorf("/metrics has no llmgw_accept_errors_total for %s emfile", g.Data)
	}

	for _, c := range conns {
		c.Close()
	}
	conns = conns[:0]
	released := time.Now()
	// One request, 1 s budget: the listener must be accepting again by
	// then (its back-off is at most 200 ms; the gateway also has to notice
	// the closed connections).
	c1 := newClient(t, time.Second)
	r := chat(t.Context(), c1, g.URL(), chatBody("after", 2, false))
	if r.failed() {
		t.Fatalf("request after the flood: status %d err %v body %s", r.status, r.err, r.body)
	}
	t.Logf("first request after the connections closed answered %v after release", r.end.Sub(released))
	eventually(t, 5*time.Second, "/readyz ready again", func() bool {
		code, _ := rawGet(t, admin, abr, g.Admin, "/readyz")
		return code == http.StatusOK
	})
}
