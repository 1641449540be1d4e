package gateway

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/valyala/fasthttp"
	"github.com/valyala/fastjson"
	"go.uber.org/goleak"

	"github.com/llmgw/llmgw/gateway/rule"
)

func TestMain(m *testing.M) {
	if dir := os.Getenv("LLMGW_TEST_CHILD_GATEWAY"); dir != "" {
		runChildGateway(dir)
		return
	}
	goleak.VerifyTestMain(m,
		// fasthttp's own housekeeping goroutines: each sleeps for its period
		// and then exits once its pool is closed or empty. They are not ours
		// to stop; everything the gateway starts is checked.
		goleak.IgnoreAnyFunction("github.com/valyala/fasthttp.(*HostClient).connsCleaner"),
		goleak.IgnoreAnyFunction("github.com/valyala/fasthttp.(*workerPool).Start.func2"),
		goleak.IgnoreAnyFunction("github.com/valyala/fasthttp.(*TCPDialer).tcpAddrsClean"),
		goleak.IgnoreAnyFunction("github.com/valyala/fasthttp.updateServerDate.func1"),
		// zmq4 v0.17.0 leaves one parked writer per closed PUB socket (it
		// checks its closed flag only after a wake-up); it holds no socket.
		goleak.IgnoreAnyFunction("github.com/go-zeromq/zmq4.(*pubMWriter).run"),
	)
}

// backend is a real HTTP worker on 127.0.0.1:0 for gateway tests.
type backend struct {
	t       *testing.T
	ln      net.Listener
	srv     *fasthttp.Server
	hits    atomic.Int64
	health  atomic.Int32 // status for GET /health; 0 = 200
	mu      sync.Mutex
	headers []http.Header
	handler func(ctx *fasthttp.RequestCtx)
	done    chan struct{}
}

func (b *backend) addr() string { return b.ln.Addr().String() }

func (b *backend) port() int {
	_, p, _ := net.SplitHostPort(b.addr())
	n, _ := strconv.Atoi(p)
	return n
}

// lastHeader returns header h of the last inference request seen.
func (b *backend) lastHeader(h string) string {
	b.mu.Lock()
	defer b.mu.Unlock()
	if len(b.headers) == 0 {
		return ""
	}
	return b.headers[len(b.headers)-1].Get(h)
}

// newBackend starts a worker; handler nil answers a small chat completion
// naming the backend in "id".
func newBackend(t *testing.T, name string, handler func(ctx *fasthttp.RequestCtx)) *backend {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	b := &backend{t: t, ln: ln, handler: handler, done: make(chan struct{})}
	b.srv = &fasthttp.Server{
		Handler: func(ctx *fasthttp.RequestCtx) {
			if string(ctx.Path()) == "/health" {
				if c := b.health.Load(); c != 0 {
					ctx.SetStatusCode(int(c))
				}
				return
			}
			b.hits.Add(1)
			h := http.Header{}
			for k, v := range ctx.Request.Header.All() {
				h.Add(string(k), string(v))
			}
			b.mu.Lock()
			b.headers = append(b.headers, h)
			b.mu.Unlock()
			if b.handler != nil {
				b.handler(ctx)
				return
			}
			// Echo the request id, as vLLM does with --enable-request-id-headers.
			ctx.Response.Header.SetBytesV("X-Request-Id", ctx.Request.Header.Peek("X-Request-Id"))
			ctx.SetContentType("application/json")
			fmt.Fprintf(ctx, `{"id":"%s","object":"chat.completion","choices":[{"index":0,"message":{"role":"assistant","content":"hello"},"finish_reason":"stop"}]}`, name)
		},
		CloseOnShutdown: true,
	}
	go func() {
		defer close(b.done)
		_ = b.srv.Serve(ln)
	}()
	t.Cleanup(b.close)
	return b
}

func (b *backend) close() {
	_ = b.srv.Shutdown()
	<-b.done
}

// testPlane is the data plane the suite runs on: LLMGW_TEST_DATA_PLANE
// ("loop", "goroutine"), or the gateway's default when unset. `make test`
// runs the suite on each.
var testPlane = os.Getenv("LLMGW_TEST_DATA_PLANE")

// testNoIOURing: LLMGW_TEST_IO_URING=0 runs the loop plane with a write(2)
// per request to a worker (Config.NoIOURing), as on a kernel without
// io_uring.
var testNoIOURing = os.Getenv("LLMGW_TEST_IO_URING") == "0"

// keptUpstream is how many kept (pooled) connections s holds to rt's
// endpoint i, on the plane serving rt. Only for engines that serve a
// limited number of connections (keptConns): the loop plane counts those
// over its loops.
func (s *Server) keptUpstream(t *testing.T, rt *ruleRuntime, i int) int {
	t.Helper()
	if s.plane() != PlaneLoop || rt.loopEPs == nil {
		return rt.clients[i].ConnsCount()
	}
	if keptConns(rt.conn) == 0 {
		t.Fatal("keptUpstream: the loop plane counts kept connections only for engines with a limit")
	}
	s.clientsMu.Lock()
	k := s.kept[loopKey(rt, i)]
	s.clientsMu.Unlock()
	if k == nil {
		return 0
	}
	return int(k.n.Load())
}

// openConnsTo counts the established TCP connections of this process's
// network namespace to addr (one end's remote address): the gateway's
// connections to a worker, kept or one-shot, whichever plane made them.
func openConnsTo(t *testing.T, addr string) int {
	t.Helper()
	ap, err := netip.ParseAddrPort(addr)
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, f := range []string{"/proc/net/tcp", "/proc/net/tcp6"} {
		b, err := os.ReadFile(f)
		if err != nil {
			continue
		}
		for _, line := range strings.Split(string(b), "\n")[1:] {
			fs := strings.Fields(line)
			if len(fs) < 4 || fs[3] != "01" { // ESTABLISHED
				continue
			}
			i := strings.LastIndexByte(fs[2], ':')
			if i < 0 {
				continue
			}
			port, err := strconv.ParseUint(fs[2][i+1:], 16, 16)
			if err == nil && uint16(port) == ap.Port() {
				n++
			}
		}
	}
	return n
}

// startGateway starts a gateway on loopback ports with a fresh state dir.
func startGateway(t *testing.T, dir string, mod func(*Config)) *Server {
	t.Helper()
	if dir == "" {
		dir = t.TempDir()
	}
	cfg := Config{Listen: "127.0.0.1:0", Admin: "127.0.0.1:0", StateDir: dir, DataPlane: testPlane, NoIOURing: testNoIOURing,
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil))}
	if mod != nil {
		mod(&cfg)
	}
	s, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

// ruleYAML builds a rule over backends; extra is YAML merged at the top.
func ruleYAML(name, model string, extra string, bs ...*backend) string {
	var sb strings.Builder
	fmt.Fprintf(&sb, "name: %s\nmodel_name: %q\n", name, model)
	if !strings.Contains(extra, "probe:") {
		sb.WriteString("probe: {interval: 50ms, timeout: 40ms, failures: 2, successes: 1}\n")
	}
	sb.WriteString(extra)
	if extra != "" && !strings.HasSuffix(extra, "\n") {
		sb.WriteString("\n")
	}
	sb.WriteString("endpoints:\n")
	for i, b := range bs {
		fmt.Fprintf(&sb, "  - {id: w%d, endpointIP: 127.0.0.1, targetPort: %d}\n", i+1, b.port())
	}
	return sb.String()
}

func mustApply(t *testing.T, s *Server, y string) *rule.Rule {
	t.Helper()
	r, err := rule.Decode([]byte(y))
	if err != nil {
		t.Fatalf("decode rule: %v\n%s", err, y)
	}
	eff, err := s.Apply(r, false)
	if err != nil {
		t.Fatalf("apply rule: %v\n%s", err, y)
	}
	return eff
}

// client is a plain net/http client; its idle connections are closed at
// test end so goleak sees no stray goroutines.
func newClient(t *testing.T) *http.Client {
	tr := &http.Transport{MaxIdleConnsPerHost: 64}
	t.Cleanup(tr.CloseIdleConnections)
	return &http.Client{Transport: tr, Timeout: 20 * time.Second}
}

func post(t *testing.T, c *http.Client, url, body string, hdr ...string) (*http.Response, string) {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, url, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	for i := 0; i+1 < len(hdr); i += 2 {
		req.Header.Set(hdr[i], hdr[i+1])
	}
	resp, err := c.Do(req)
	if err != nil {
		t.Fatalf("POST %s: %v", url, err)
	}
	data, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	if err != nil {
		t.Fatalf("read body: %v", err)
	}
	return resp, string(data)
}

const chatBody = `{"model":"m1","messages":[{"role":"user","content":"hi"}]}`

// metricValue sums the samples of family name whose label values include
// all of want (in any label).
func (s *Server) metricValue(t testing.TB, name string, want ...string) float64 {
	t.Helper()
	mfs, err := s.metrics.reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	var sum float64
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
	next:
		for _, m := range mf.GetMetric() {
			vals := map[string]bool{}
			for _, lp := range m.GetLabel() {
				vals[lp.GetValue()] = true
			}
			for _, w := range want {
				if !vals[w] {
					continue next
				}
			}
			switch {
			case m.Counter != nil:
				sum += m.GetCounter().GetValue()
			case m.Gauge != nil:
				sum += m.GetGauge().GetValue()
			case m.Histogram != nil:
				sum += float64(m.GetHistogram().GetSampleCount())
			}
		}
	}
	return sum
}

func mustDecode(tb testing.TB, y string) *rule.Rule {
	tb.Helper()
	r, err := rule.Decode([]byte(y))
	if err != nil {
		tb.Fatalf("decode rule: %v\n%s", err, y)
	}
	return r
}

// mustParse parses a JSON body into a fastjson value that lives for the test.
func mustParse(t *testing.T, body string) *fastjson.Value {
	t.Helper()
	v, err := fastjson.Parse(body)
	if err != nil {
		t.Fatal(err)
	}
	return v
}

// postErr is post for goroutines other than the test's: it returns the
// failure instead of ending the test.
func postErr(c *http.Client, url, body string) (*http.Response, string, error) {
	resp, err := c.Post(url, "application/json", strings.NewReader(body))
	if err != nil {
		return nil, "", fmt.Errorf("POST %s: %w", url, err)
	}
	data, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	if err != nil {
		return resp, string(data), fmt.Errorf("POST %s: reading the body: %w", url, err)
	}
	return resp, string(data), nil
}
