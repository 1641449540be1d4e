//go:build faults

package reliability

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/llmgw/llmgw/internal/wait"
	"github.com/llmgw/llmgw/reliability/harness"
)

// resources is the gateway's own view of what it holds.
type resources struct{ fds, goroutines float64 }

func gatewayResources(t *testing.T, g *harness.Gateway) resources {
	t.Helper()
	m, err := g.Scrape(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	return resources{fds: m.Sum("process_open_fds"), goroutines: m.Sum("go_goroutines")}
}

// gatewayReadTimeout is the data plane's whole-request read deadline
// (fasthttp ReadTimeout in gateway/proxy.go).
const gatewayReadTimeout = 30 * time.Second

// TestSlowAndVanishingClientsFreeResources: clients that trickle their
// headers or body (slowloris), or vanish mid-body or mid-stream, hold
// gateway connections only until the read deadline (or at once, for the
// vanishing ones); afterwards the gateway's open fds and goroutines return
// to their baseline, measured from its own /metrics.
func TestSlowAndVanishingClientsFreeResources(t *testing.T) {
	const conns = 30
	cases := []struct {
		name string
		// attack opens one connection and misbehaves on it; it returns
		// when the gateway has closed the connection (or the attack gave
		// up the connection itself).
		// For the vanishing clients, release says when to vanish.
		attack func(t *testing.T, g *harness.Gateway, conn net.Conn, held chan<- struct{}, release <-chan struct{})
		// cutBy bounds how long the gateway may hold an attacking
		// connection.
		cutBy time.Duration
	}{
		{
			name: "slowloris headers",
			attack: func(t *testing.T, g *harness.Gateway, conn net.Conn, held chan<- struct{}, release <-chan struct{}) {
				fmt.Fprintf(conn, "POST /v1/chat/completions HTTP/1.1\r\nHost: %s\r\n", g.Data)
				held <- struct{}{}
				expect408(t, trickle(conn, "X-Slow: "+strings.Repeat("a", 1000)))
			},
			cutBy: gatewayReadTimeout + 10*time.Second,
		},
		{
			name: "slowloris body",
			attack: func(t *testing.T, g *harness.Gateway, conn net.Conn, held chan<- struct{}, release <-chan struct{}) {
				body := chatBody("slow body", 2, false)
				fmt.Fprintf(conn, "POST /v1/chat/completions HTTP/1.1\r\nHost: %s\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n", g.Data, len(body)+1000)
				held <- struct{}{}
				expect408(t, trickle(conn, body+strings.Repeat(" ", 1000)))
			},
			cutBy: gatewayReadTimeout + 10*time.Second,
		},
		{
			// An HTTP client's spare pooled connection: opened, never used.
			name: "connection that never sends a byte",
			attack: func(t *testing.T, g *harness.Gateway, conn net.Conn, held chan<- struct{}, release <-chan struct{}) {
				held <- struct{}{}
				b, _ := io.ReadAll(conn)
				expect408(t, string(b))
			},
			cutBy: gatewayReadTimeout + 10*time.Second,
		},
		{
			name: "client vanishes mid-body",
			attack: func(t *testing.T, g *harness.Gateway, conn net.Conn, held chan<- struct{}, release <-chan struct{}) {
				fmt.Fprintf(conn, "POST /v1/chat/completions HTTP/1.1\r\nHost: %s\r\nContent-Type: application/json\r\nContent-Length: 5000\r\n\r\n{\"model\":\"m\",", g.Data)
				held <- struct{}{}
				<-release
			},
			cutBy: 10 * time.Second,
		},
		{
			name: "client vanishes mid-stream",
			attack: func(t *testing.T, g *harness.Gateway, conn net.Conn, held chan<- struct{}, release <-chan struct{}) {
				body := chatBody("a long story please", 500, true)
				fmt.Fprintf(conn, "POST /v1/chat/completions HTTP/1.1\r\nHost: %s\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s", g.Data, len(body), body)
				br := bufio.NewReader(conn)
				for {
					line, err := br.ReadString('\n')
					if err != nil {
						t.Errorf("stream ended before its first event: %v", err)
						return
					}
					if strings.HasPrefix(line, "data: ") {
						break
					}
				}
				held <- struct{}{}
				<-release
			},
			cutBy: 10 * time.Second,
		},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			// 10 ms a token: a 500-token stream would run 5 s.
			s := startSim(t, "w1", "--kv-events", "off", "--decode-us-per-token", "10000")
			g := startGW(t, "")
			putRule(t, g, "r", ruleFor(t, "r", "", s))
			c := newClient(t, 10*time.Second)
			for i := range 5 {
				if r := chat(t.Context(), c, g.URL(), chatBody(fmt.Sprint("warm ", i), 2, false)); r.failed() {
					t.Fatalf("warm-up: %d %v", r.status, r.err)
				}
			}
			c.CloseIdleConnections()
			// fasthttp parks idle worker goroutines for up to 10 s; the
			// baseline is taken once the warm-up's have gone.
			var base resources
			wait.For(t, 20*time.Second, "a stable baseline", func() bool {
				r := gatewayResources(t, g)
				stable := r == base
				base = r
				return stable
			})
			held := make(chan struct{}, conns)
			release := make(chan struct{})
			var wg sync.WaitGroup
			start := time.Now()
			var cutMu sync.Mutex
			var slowest time.Duration
			for range conns {
				conn, err := net.Dial("tcp", g.Data)
				if err != nil {
					t.Fatal(err)
				}
				wg.Add(1)
				go func() {
					defer wg.Done()
					defer conn.Close()
					tc.attack(t, g, conn, held, release)
					cutMu.Lock()
					slowest = max(slowest, time.Since(start))
					cutMu.Unlock()
				}()
			}
			for range conns {
				select {
				case <-held:
				case <-time.After(10 * time.Second):
					t.Fatal("the attack did not get hold of its connections")
				}
			}
			// The gateway has accepted the attacking connections (on a busy
			// machine its accept loop may lag the dials a little).
			var peak resources
			wait.For(t, 10*time.Second, "the gateway to hold the attacking connections", func() bool {
				peak = gatewayResources(t, g)
				return peak.fds >= base.fds+conns
			})
			close(release)
			done := make(chan struct{})
			go func() { wg.Wait(); close(done) }()
			select {
			case <-done:
			case <-time.After(tc.cutBy):
				t.Fatalf("attacking connections still open after %v", tc.cutBy)
			}
			// Resources come back once fasthttp's idle-worker cleaner has
			// run: a worker parks for up to MaxIdleWorkerDuration (10 s by
			// default) and the cleaner looks every 10 s, so up to ~20 s in
			// the normal course (fasthttp workerpool.go). The deadline only
			// detects a leak: three times that.
			var now resources
			took := wait.ForErr(t, 60*time.Second, "fds and goroutines back to the baseline", func() error {
				now = gatewayResources(t, g)
				if now.fds <= base.fds && now.goroutines <= base.goroutines {
					return nil
				}
				return fmt.Errorf("baseline %+v, under attack %+v, now %+v", base, peak, now)
			})
			t.Logf("baseline %+v, under attack %+v, after %+v; connections closed by %v; back to baseline %v later",
				base, peak, now, slowest.Round(time.Millisecond), took.Round(time.Millisecond))
			if tc.name == "client vanishes mid-stream" {
				// Each abandoned stream's worker request was cancelled.
				if got := metric(t, g, "llmgw_client_cancels_total"); got < conns {
					t.Errorf("llmgw_client_cancels_total = %v; want %d", got, conns)
				}
			}
			// The gateway still serves.
			if r := chat(t.Context(), c, g.URL(), chatBody("after the attack", 2, false)); r.failed() {
				t.Errorf("after the attack: %d %v", r.status, r.err)
			}
		})
	}
}

// trickle writes s one byte every 100 ms until the peer closes the
// connection or s is sent, and returns what the peer answered.
func trickle(conn net.Conn, s string) string {
	var got strings.Builder
	done := make(chan struct{})
	go func() {
		defer close(done)
		_, _ = io.Copy(&got, conn)
	}()
	for i := range len(s) {
		if _, err := conn.Write([]byte{s[i]}); err != nil {
			break
		}
		select {
		case <-done:
			return got.String()
		case <-time.After(100 * time.Millisecond):
		}
	}
	<-done
	return got.String()
}

// expect408 checks the answer to a request the gateway cut off at its read
// deadline: 408 (which HTTP clients treat as "this connection is closing",
// not as the answer to a request), never a 400 or a silent hang.
func expect408(t *testing.T, answer string) {
	t.Helper()
	if !strings.HasPrefix(answer, "HTTP/1.1 408 ") || !strings.Contains(answer, `"code":"request_timeout"`) {
		t.Errorf("a request cut at the read deadline got %.300q; want 408 request_timeout", answer)
	}
}
