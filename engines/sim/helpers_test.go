package sim

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/llmgw/llmgw/internal/wait"
)

func TestMain(m *testing.M) {
	code := m.Run()
	if code == 0 {
		code = checkLeaks()
	}
	os.Exit(code)
}

// checkLeaks fails the run if goroutines outlive the tests. fasthttp's
// idle-worker cleaner exits within idleWorkerCheck of Shutdown, which on a
// loaded machine can be later than goleak's own retries allow, so the check
// is repeated until a deadline before it counts as a leak.
func checkLeaks() int {
	opts := []goleak.Option{
		// fasthttp starts one process-wide goroutine that refreshes the
		// Date header and never stops; no Sim owns it.
		goleak.IgnoreAnyFunction("github.com/valyala/fasthttp.updateServerDate.func1"),
		// zmq4 v0.17.0's PUB writer goroutine can miss its Close signal
		// (it checks "closed" only after a wake-up) and then waits forever
		// holding no socket; kvevents' own tests ignore it too.
		goleak.IgnoreAnyFunction("github.com/go-zeromq/zmq4.(*pubMWriter).run"),
	}
	if _, err := wait.Until(5*time.Second, func() error { return goleak.Find(opts...) }); err != nil {
		fmt.Fprintf(os.Stderr, "goleak: %v\n", err)
		return 1
	}
	return 0
}

// waitLimit bounds every awaited condition: it only detects a hang.
const waitLimit = 10 * time.Second

// fixedClock pins "created" fields and event timestamps for golden bytes.
func fixedClock() time.Time { return time.Unix(1700000000, 500000000) }

// startSim starts a sim for the test and closes it at cleanup.
func startSim(t testing.TB, cfg Config) *Sim {
	t.Helper()
	if cfg.Clock == nil {
		cfg.Clock = fixedClock
	}
	s, err := Start(context.Background(), cfg)
	if err != nil {
		t.Fatalf("Start(%+v): %v", cfg, err)
	}
	t.Cleanup(func() {
		if err := s.Close(); err != nil {
			t.Errorf("Close: %v", err)
		}
	})
	return s
}

// client returns an HTTP client whose idle connections are closed at cleanup.
func client(t testing.TB) *http.Client {
	t.Helper()
	tr := &http.Transport{DisableCompression: true}
	t.Cleanup(tr.CloseIdleConnections)
	return &http.Client{Transport: tr, Timeout: 30 * time.Second}
}

type httpResult struct {
	status int
	header http.Header
	body   []byte
	err    error // body read error (a crashed stream)
}

// do sends one request; headers are "Name: value" strings.
func do(t testing.TB, c *http.Client, method, url, body string, headers ...string) httpResult {
	t.Helper()
	var rd io.Reader
	if body != "" {
		rd = strings.NewReader(body)
	}
	req, err := http.NewRequest(method, url, rd)
	if err != nil {
		t.Fatalf("new request: %v", err)
	}
	if body != "" {
		req.Header.Set("Content-Type", "application/json")
	}
	for _, h := range headers {
		k, v, _ := strings.Cut(h, ": ")
		req.Header.Set(k, v)
	}
	resp, err := c.Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", method, url, err)
	}
	defer resp.Body.Close()
	b, rerr := io.ReadAll(resp.Body)
	return httpResult{status: resp.StatusCode, header: resp.Header, body: b, err: rerr}
}
