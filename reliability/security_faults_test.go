//go:build faults

package reliability

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/llmgw/llmgw/internal/wait"
	"github.com/llmgw/llmgw/reliability/harness"
)

// rawExchange sends req on a fresh connection and returns the answer.
func rawExchange(t *testing.T, addr, req string) string {
	t.Helper()
	conn, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	_ = conn.SetDeadline(time.Now().Add(10 * time.Second))
	if _, err := io.WriteString(conn, req); err != nil {
		t.Fatalf("write: %v", err)
	}
	b, err := io.ReadAll(conn)
	if err != nil && len(b) == 0 {
		t.Fatalf("no answer: %v", err)
	}
	return string(b)
}

// TestOversizeAndMalformedRequestsRefused: requests over the header or body
// limit, or not HTTP at all, are refused cleanly with an OpenAI error body
// and never reach a worker.
func TestOversizeAndMalformedRequestsRefused(t *testing.T) {
	s := startSim(t, "w1", "--kv-events", "off")
	g := startGW(t, "", "--max-body-bytes", "65536")
	putRule(t, g, "r", ruleFor(t, "r", "", s))
	bigBody := chatBody(strings.Repeat("x", 100<<10), 2, false)
	cases := []struct {
		name     string
		req      string
		wantLine string
		wantCode string
	}{
		{
			name:     "20 KiB header",
			req:      fmt.Sprintf("POST /v1/chat/completions HTTP/1.1\r\nHost: %s\r\nX-Big: %s\r\nContent-Length: 2\r\n\r\n{}", g.Data, strings.Repeat("a", 20<<10)),
			wantLine: "HTTP/1.1 431 ", wantCode: "request_header_too_large",
		},
		{
			name:     "100 KiB body over a 64 KiB limit",
			req:      fmt.Sprintf("POST /v1/chat/completions HTTP/1.1\r\nHost: %s\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s", g.Data, len(bigBody), bigBody),
			wantLine: "HTTP/1.1 413 ", wantCode: "request_too_large",
		},
		{
			name:     "body length announced over the limit",
			req:      fmt.Sprintf("POST /v1/chat/completions HTTP/1.1\r\nHost: %s\r\nContent-Type: application/json\r\nContent-Length: 1000000000\r\n\r\n{", g.Data),
			wantLine: "HTTP/1.1 413 ", wantCode: "request_too_large",
		},
		{
			name:     "not HTTP",
			req:      "\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03 binary junk\r\n\r\n",
			wantLine: "HTTP/1.1 400 ", wantCode: "invalid_request",
		},
		{
			name:     "malformed JSON",
			req:      fmt.Sprintf("POST /v1/chat/completions HTTP/1.1\r\nHost: %s\r\nContent-Type: application/json\r\nContent-Length: 9\r\nConnection: close\r\n\r\n{\"model\":", g.Data),
			wantLine: "HTTP/1.1 400 ", wantCode: "invalid_request",
		},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			got := rawExchange(t, g.Data, tc.req)
			head, body, _ := strings.Cut(got, "\r\n\r\n")
			if !strings.HasPrefix(head, tc.wantLine) {
				t.Fatalf("answer %.200q; want %q", got, tc.wantLine)
			}
			var e struct {
				Error struct {
					Code string `json:"code"`
				} `json:"error"`
			}
			if err := json.Unmarshal([]byte(body), &e); err != nil || e.Error.Code != tc.wantCode {
				t.Errorf("body %q: code %q (%v); want an OpenAI error with code %q", body, e.Error.Code, err, tc.wantCode)
			}
		})
	}
	rs, err := s.Receipts(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	if len(rs) != 0 {
		t.Errorf("the worker saw %d of the refused requests; want 0", len(rs))
	}
}

// TestAdminAPIProtected: mutations need the bearer token (reads do not), the
// admin API binds loopback by default, and the gateway refuses to start
// with a non-loopback admin address and no token.
func TestAdminAPIProtected(t *testing.T) {
	t.Run("token required for mutations", func(t *testing.T) {
		s := startSim(t, "w1", "--kv-events", "off")
		tokenFile := filepath.Join(t.TempDir(), "token")
		if err := os.WriteFile(tokenFile, []byte("s3cret-token\n"), 0o600); err != nil {
			t.Fatal(err)
		}
		g := startGW(t, "", "--admin-token-file", tokenFile)
		body := ruleFor(t, "r", "", s)
		cases := []struct {
			name, method, path, token string
			want                      int
		}{
			{"PUT without a token", http.MethodPut, "/v1/rules/r", "", http.StatusUnauthorized},
			{"PUT with a wrong token", http.MethodPut, "/v1/rules/r", "s3cret-tokeX", http.StatusUnauthorized},
			{"PUT with a token prefix", http.MethodPut, "/v1/rules/r", "s3cret", http.StatusUnauthorized},
			{"PUT with the token", http.MethodPut, "/v1/rules/r", "s3cret-token", http.StatusOK},
			{"GET without a token", http.MethodGet, "/v1/rules/r", "", http.StatusOK},
			{"drain without a token", http.MethodPost, "/v1/rules/r/drain", "", http.StatusUnauthorized},
			{"DELETE without a token", http.MethodDelete, "/v1/rules/r", "", http.StatusUnauthorized},
			{"DELETE with the token", http.MethodDelete, "/v1/rules/r", "s3cret-token", http.StatusOK},
		}
		for _, tc := range cases {
			t.Run(tc.name, func(t *testing.T) {
				var rd io.Reader
				if tc.method == http.MethodPut {
					rd = strings.NewReader(body)
				}
				req, _ := http.NewRequestWithContext(t.Context(), tc.method, g.AdminURL()+tc.path, rd)
				if tc.token != "" {
					req.Header.Set("Authorization", "Bearer "+tc.token)
				}
				resp, err := http.DefaultClient.Do(req)
				if err != nil {
					t.Fatal(err)
				}
				b, _ := io.ReadAll(resp.Body)
				resp.Body.Close()
				got := resp.StatusCode
				if tc.want == http.StatusOK && got/100 == 2 {
					got = http.StatusOK
				}
				if got != tc.want {
					t.Errorf("%s %s: %d %s; want %d", tc.method, tc.path, resp.StatusCode, b, tc.want)
				}
			})
		}
	})
	t.Run("non-loopback admin without a token refused", func(t *testing.T) {
		_, err := harness.StartGateway(t.Context(), llmgwBin, t.TempDir(), filepath.Join(t.TempDir(), "gw.log"), "--admin", "0.0.0.0:0")
		if !errors.Is(err, harness.ErrStart) || !strings.Contains(err.Error(), "non-loopback") {
			t.Fatalf("start with --admin 0.0.0.0:0 and no token: %v; want a refusal naming the non-loopback address", err)
		}
	})
	t.Run("admin on loopback by default", func(t *testing.T) {
		// No --admin: the default is 127.0.0.1:8081. Another process may
		// hold that port; then the start fails naming it, which shows the
		// default just as well.
		dir := t.TempDir()
		p, err := harness.StartGatewayArgs(t.Context(), llmgwBin, filepath.Join(dir, "gw.log"), "serve", "--listen", "127.0.0.1:0", "--state-dir", dir, "--drain-window", "0s")
		if err != nil {
			if !strings.Contains(err.Error(), "127.0.0.1:8081") {
				t.Fatalf("default admin start: %v", err)
			}
			t.Logf("127.0.0.1:8081 is busy; the refusal names it: %v", err)
			return
		}
		defer p.Stop()
		if host, _, _ := net.SplitHostPort(p.Admin); !net.ParseIP(host).IsLoopback() {
			t.Errorf("default admin address %s is not loopback", p.Admin)
		}
	})
}

// TestPayloadsNotLogged: at debug level the gateway logs no prompt or
// completion text unless --log-payloads is set (which proves the check can
// see them).
func TestPayloadsNotLogged(t *testing.T) {
	cases := []struct {
		name    string
		args    []string
		visible bool
	}{
		{"default", []string{"--log-level", "debug"}, false},
		{"--log-payloads", []string{"--log-level", "debug", "--log-payloads"}, true},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			s := startSim(t, "w1", "--kv-events", "off")
			g := startGW(t, "", tc.args...)
			putRule(t, g, "r", ruleFor(t, "r", "", s))
			const secret = "PROMPT-SECRET-7f3a9c"
			c := newClient(t, 10*time.Second)
			for _, stream := range []bool{false, true} {
				r := chat(t.Context(), c, g.URL(), chatBody("my card number is "+secret, 8, stream))
				if r.failed() {
					t.Fatalf("request: %d %v", r.status, r.err)
				}
			}
			// A later admin write logs a line of its own; once it is in the
			// log, so is anything the requests logged (with --log-payloads
			// the same wait finds the prompt, so it is long enough).
			putRule(t, g, "r2", strings.Replace(ruleFor(t, "r2", "", s), "model_name: m", "model_name: m2", 1))
			var log string
			wait.For(t, 5*time.Second, "the second rule's log line", func() bool {
				log = g.Log()
				return strings.Contains(log, "rule=r2")
			})
			if got := strings.Contains(log, secret); got != tc.visible {
				t.Errorf("prompt text in the log: %v; want %v\n%s", got, tc.visible, tail(log, 2000))
			}
		})
	}
}
