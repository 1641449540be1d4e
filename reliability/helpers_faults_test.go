//go:build faults

package reliability

import (
	"bufio"
	"bytes"
	"context"
	"errors"
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

// startSim runs one simulator child for the test; it is killed at cleanup.
func startSim(t *testing.T, name string, args ...string) *harness.Sim {
	t.Helper()
	s, err := harness.StartSim(t.Context(), llmgwBin, filepath.Join(t.TempDir(), name+".log"), append([]string{"--engine", "vllm", "--model", "m"}, args...)...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Stop)
	return s
}

// startGW runs a gateway child on stateDir ("" = a fresh one).
func startGW(t *testing.T, stateDir string, args ...string) *harness.Gateway {
	t.Helper()
	if stateDir == "" {
		stateDir = t.TempDir()
	}
	g, err := harness.StartGateway(t.Context(), llmgwBin, stateDir, filepath.Join(t.TempDir(), "gateway.log"), args...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		g.Stop()
		if t.Failed() {
			t.Logf("gateway log:\n%s", tail(g.Log(), 4000))
		}
	})
	return g
}

func tail(s string, n int) string {
	if len(s) > n {
		return "..." + s[len(s)-n:]
	}
	return s
}

func port(t *testing.T, addr string) string {
	t.Helper()
	_, p, err := net.SplitHostPort(addr)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// ruleFor builds a rule named name over sims; extra is YAML placed before
// the endpoint list (it must hold probe: when the default is not wanted).
func ruleFor(t *testing.T, name, extra string, sims ...*harness.Sim) string {
	t.Helper()
	var sb strings.Builder
	fmt.Fprintf(&sb, "name: %s\nmodel_name: m\n", name)
	if !strings.Contains(extra, "probe:") {
		sb.WriteString("probe: {path: /health, interval: 100ms, timeout: 100ms, failures: 2, successes: 1}\n")
	}
	if extra != "" {
		sb.WriteString(strings.TrimSuffix(extra, "\n") + "\n")
	}
	sb.WriteString("endpoints:\n")
	for i, s := range sims {
		fmt.Fprintf(&sb, "  - {id: w%d, endpointIP: 127.0.0.1, targetPort: %s}\n", i+1, port(t, s.Addrs.HTTP))
	}
	return sb.String()
}

func putRule(t *testing.T, g *harness.Gateway, name, body string) {
	t.Helper()
	if err := g.PutRule(t.Context(), name, body); err != nil {
		t.Fatalf("%v\n%s", err, body)
	}
}

// newClient is a keep-alive client whose idle connections are closed at
// test end.
func newClient(t *testing.T, timeout time.Duration) *http.Client {
	tr := &http.Transport{MaxIdleConnsPerHost: 64}
	t.Cleanup(tr.CloseIdleConnections)
	return &http.Client{Transport: tr, Timeout: timeout}
}

func chatBody(user string, maxTokens int, stream bool) string {
	return fmt.Sprintf(`{"model":"m","max_tokens":%d,"stream":%t,"messages":[{"role":"user","content":%q}]}`, maxTokens, stream, user)
}

// result is what a client saw for one request.
type result struct {
	start, end time.Time
	status     int
	endpoint   string // X-Llmgw-Endpoint
	route      string // X-Llmgw-Route
	requestID  string
	body       string
	err        error
}

func (r result) failed() bool { return r.err != nil || r.status != http.StatusOK }

// chat sends one non-streaming request through the gateway.
func chat(ctx context.Context, c *http.Client, base, body string) result {
	r := result{start: time.Now()}
	defer func() { r.end = time.Now() }()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, base+"/v1/chat/completions", strings.NewReader(body))
	if err != nil {
		r.err = err
		return r
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := c.Do(req)
	if err != nil {
		r.err = err
		r.end = time.Now()
		return r
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	r.status, r.body, r.err = resp.StatusCode, string(b), err
	r.endpoint, r.route, r.requestID = resp.Header.Get("X-Llmgw-Endpoint"), resp.Header.Get("X-Llmgw-Route"), resp.Header.Get("X-Request-Id")
	r.end = time.Now()
	return r
}

// sseStream is an open streaming response read event by event.
type sseStream struct {
	resp     *http.Response
	sc       *bufio.Scanner
	endpoint string
}

func openStream(t *testing.T, ctx context.Context, c *http.Client, base, body string) *sseStream {
	t.Helper()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, base+"/v1/chat/completions", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := c.Do(req)
	if err != nil {
		t.Fatalf("open stream: %v", err)
	}
	t.Cleanup(func() { resp.Body.Close() })
	if resp.StatusCode != http.StatusOK {
		b, _ := io.ReadAll(resp.Body)
		t.Fatalf("open stream: status %d: %s", resp.StatusCode, b)
	}
	return &sseStream{resp: resp, sc: bufio.NewScanner(resp.Body), endpoint: resp.Header.Get("X-Llmgw-Endpoint")}
}

// next returns the next data: payload; ok false at the end of the body.
func (s *sseStream) next() (data []byte, ok bool) {
	for s.sc.Scan() {
		if d, found := bytes.CutPrefix(s.sc.Bytes(), []byte("data: ")); found {
			return d, true
		}
	}
	return nil, false
}

// metric scrapes one summed value from the gateway.
func metric(t *testing.T, g *harness.Gateway, name string, labels ...string) float64 {
	t.Helper()
	m, err := g.Scrape(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	return m.Sum(name, labels...)
}

func errorsAs[T error](err error, target *T) bool { return errors.As(err, target) }
