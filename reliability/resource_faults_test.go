//go:build faults

package reliability

import (
	"bufio"
	"bytes"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/llmgw/llmgw/internal/wait"
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
		"serve", "--listen", "127.0.0.1:0", "--admin", "127.0.0.1:0", "--state-dir", stateDir, "--drain-window", "0s")
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
	wait.For(t, 20*time.Second, "/readyz to report the data listener not accepting", func() bool {
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
	wait.For(t, 5*time.Second, "/readyz ready again", func() bool {
		code, _ := rawGet(t, admin, abr, g.Admin, "/readyz")
		return code == http.StatusOK
	})
}

// TestClientLeavingCancelsTheWorkerRequest: a client that gives up on a
// non-streaming request after 0.5 s (while the worker is still generating:
// 200 ms a token, at least 8 tokens) has its worker request cancelled: the
// simulator's receipt says so. Before the fix the worker ran to the end
// (fasthttp does not read a connection while its handler runs, so the
// gateway never saw the client leave). The delay from the client's close
// to the worker's cancel is logged (measured, not asserted).
func TestClientLeavingCancelsTheWorkerRequest(t *testing.T) {
	s := startSim(t, "w1", "--kv-events", "off", "--decode-us-per-token", "200000")
	g := startGW(t, "")
	putRule(t, g, "r", ruleFor(t, "r", "", s))
	const runs = 5
	var worst time.Duration
	for i := range runs {
		c := newClient(t, 500*time.Millisecond)
		r := chat(t.Context(), c, g.URL(), chatBody(fmt.Sprintf("leave %d", i), 100, false))
		closed := time.Now()
		if r.err == nil {
			t.Fatalf("run %d: the request finished (%d) before the client's 0.5 s", i, r.status)
		}
		var rec harness.Receipt
		wait.For(t, 10*time.Second, "the sim's receipt of the abandoned request", func() bool {
			rs, err := s.Receipts(t.Context())
			if err != nil {
				t.Fatal(err)
			}
			for _, x := range rs {
				if x.Cancelled && x.CancelledAt.After(closed.Add(-time.Second)) && !x.CancelledAt.Before(r.start) {
					rec = x
					return true
				}
			}
			return false
		})
		lat := rec.CancelledAt.Sub(closed)
		worst = max(worst, lat)
		t.Logf("run %d: client closed %v after sending; worker cancelled %v after the close", i, closed.Sub(r.start).Round(time.Millisecond), lat.Round(100*time.Microsecond))
		wait.For(t, 5*time.Second, "the gateway to count the cancel", func() bool {
			return metric(t, g, "llmgw_client_cancels_total") >= float64(i+1)
		})
	}
	t.Logf("cancel latency over %d runs: worst %v", runs, worst.Round(100*time.Microsecond))
}

// procStatusKB reads one "Name:  N kB" field of /proc/<pid>/status.
func procStatusKB(t *testing.T, pid int, field string) int64 {
	t.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, field+":"); ok {
			n, err := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 10, 64)
			if err != nil {
				t.Fatal(err)
			}
			return n
		}
	}
	t.Fatalf("no %s in /proc/%d/status", field, pid)
	return 0
}

// TestLargeAnswersStreamWithinTheBudget: eight concurrent stream requests
// answered by 100 MB non-SSE bodies (four with a Content-Length, four
// chunked) all arrive whole, and the gateway's peak RSS (VmHWM) stays under
// the buffer budget plus a fixed overhead. Before the fix each such body
// was buffered up to 64 MiB (and cut there), so eight took the gateway past
// 500 MB.
func TestLargeAnswersStreamWithinTheBudget(t *testing.T) {
	const (
		size     = 100 << 20
		parallel = 8
		budget   = 32 << 20
		// overhead: the Go runtime, fasthttp's buffers and pools, and the
		// connections' 32 KiB copy buffers, measured at about 20 MB.
		overhead = 48 << 20
	)
	chunk := bytes.Repeat([]byte("x"), 1<<20)
	worker := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Type", "application/json")
		if r.Header.Get("X-Chunked") == "" {
			w.Header().Set("Content-Length", strconv.Itoa(size))
		}
		for range size >> 20 {
			if _, err := w.Write(chunk); err != nil {
				return
			}
		}
	})}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go func() { _ = worker.Serve(ln) }()
	t.Cleanup(func() { _ = worker.Close() })
	g := startGW(t, "", "--buffer-budget-bytes", strconv.Itoa(budget))
	putRule(t, g, "r", fmt.Sprintf("name: r\nmodel_name: m\nprobe: {disabled: true}\nendpoints:\n  - {id: w1, endpointIP: 127.0.0.1, targetPort: %s}\n", port(t, ln.Addr().String())))
	base := procStatusKB(t, g.Pid(), "VmHWM")

	type got struct {
		n   int64
		err error
	}
	results := make(chan got, parallel)
	start := time.Now()
	for i := range parallel {
		go func() {
			req, _ := http.NewRequestWithContext(t.Context(), http.MethodPost, g.URL()+"/v1/chat/completions", strings.NewReader(chatBody("big", 2, true)))
			if i%2 == 1 {
				req.Header.Set("X-Chunked", "1")
			}
			resp, err := newClient(t, 2*time.Minute).Do(req)
			if err != nil {
				results <- got{err: err}
				return
			}
			defer resp.Body.Close()
			n, err := io.Copy(io.Discard, resp.Body)
			if err == nil && resp.StatusCode != 200 {
				err = fmt.Errorf("status %d", resp.StatusCode)
			}
			results <- got{n: n, err: err}
		}()
	}
	for range parallel {
		r := <-results
		if r.err != nil || r.n != size {
			t.Errorf("answer: %d bytes, err %v; want %d bytes", r.n, r.err, size)
		}
	}
	took := time.Since(start)
	peak := procStatusKB(t, g.Pid(), "VmHWM")
	t.Logf("8 x 100 MB through the gateway in %v (%.0f MB/s); gateway peak RSS %d MiB (before: %d MiB); budget %d MiB + overhead %d MiB",
		took.Round(time.Millisecond), float64(parallel*size)/took.Seconds()/1e6, peak>>10, base>>10, budget>>20, overhead>>20)
	if peak<<10 > budget+overhead {
		t.Errorf("gateway peak RSS %d MiB is over the budget %d MiB + overhead %d MiB", peak>>10, budget>>20, overhead>>20)
	}
}

// TestCurlSeesCutBodiesAsFailures: through a gateway child process, curl
// exits non-zero on a worker body cut mid-way (chunked JSON, or short of
// its Content-Length), and a 200 MB body arrives whole (it used to be cut
// to 64 MiB under a matching Content-Length, curl exit 0).
func TestCurlSeesCutBodiesAsFailures(t *testing.T) {
	curl, err := exec.LookPath("curl")
	if err != nil {
		t.Skip("curl is not installed; the same cases run with a Go client in gateway.TestBrokenOrLargeBodiesAreNeverDeliveredAsComplete")
	}
	const big = 200 << 20
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				req, err := http.ReadRequest(bufio.NewReader(c))
				if err != nil {
					return
				}
				_, _ = io.Copy(io.Discard, req.Body)
				switch req.Header.Get("X-Case") {
				case "chunked-cut":
					fmt.Fprintf(c, "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\na\r\n{\"id\":\"x\",\r\n")
				case "length-cut":
					fmt.Fprintf(c, "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n", 8<<20)
					_, _ = c.Write(bytes.Repeat([]byte(" "), 2<<20))
				case "big":
					fmt.Fprintf(c, "HTTP/1.1 200 OK\r\nConnection: close\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n", big)
					chunk := bytes.Repeat([]byte("x"), 1<<20)
					for range big >> 20 {
						if _, err := c.Write(chunk); err != nil {
							return
						}
					}
				}
			}()
		}
	}()
	g := startGW(t, "")
	putRule(t, g, "r", fmt.Sprintf("name: r\nmodel_name: m\nprobe: {disabled: true}\nendpoints:\n  - {id: w1, endpointIP: 127.0.0.1, targetPort: %s}\n", port(t, ln.Addr().String())))
	cases := []struct {
		name     string
		wantExit bool // curl must fail
		wantSize int
	}{
		{"chunked-cut", true, -1},
		{"length-cut", true, -1},
		{"big", false, big},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			cmd := exec.CommandContext(t.Context(), curl, "-sS", "-o", "/dev/null", "-w", "%{http_code} %{size_download}",
				"-H", "X-Case: "+tc.name, "-H", "Content-Type: application/json",
				"--data", chatBody("x", 2, true), g.URL()+"/v1/chat/completions")
			out, err := cmd.Output()
			var code, size int
			fmt.Sscanf(string(out), "%d %d", &code, &size)
			exit := 0
			if ee, ok := err.(*exec.ExitError); ok {
				exit = ee.ExitCode()
			} else if err != nil {
				t.Fatal(err)
			}
			t.Logf("curl exit %d, status %d, %d bytes", exit, code, size)
			if tc.wantExit && exit == 0 {
				t.Errorf("curl exited 0 (status %d, %d bytes) on a cut body", code, size)
			}
			if !tc.wantExit && (exit != 0 || size != tc.wantSize) {
				t.Errorf("curl exit %d with %d bytes; want 0 and %d", exit, size, tc.wantSize)
			}
		})
	}
}
