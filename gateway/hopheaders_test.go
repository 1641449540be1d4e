package gateway

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/valyala/fasthttp"

	"github.com/llmgw/llmgw/engines"
	"github.com/llmgw/llmgw/engines/sim"
)

// parseClientRequest parses raw as the data plane's server does
// (header names normalized).
func parseClientRequest(t testing.TB, raw string) *fasthttp.RequestHeader {
	t.Helper()
	var h fasthttp.RequestHeader
	if err := h.Read(bufio.NewReader(strings.NewReader(raw))); err != nil {
		t.Fatalf("parse request %q: %v", raw, err)
	}
	return &h
}

// parseWorkerAnswer parses raw as the gateway's upstream client does
// (HostClient.DisableHeaderNamesNormalizing: names as the worker sent
// them).
func parseWorkerAnswer(t testing.TB, raw string) *fasthttp.ResponseHeader {
	t.Helper()
	var h fasthttp.ResponseHeader
	h.DisableNormalizing()
	if err := h.Read(bufio.NewReader(strings.NewReader(raw))); err != nil {
		t.Fatalf("parse answer %q: %v", raw, err)
	}
	return &h
}

// headerLines lists h's headers as lower-case "name: value" lines, sorted,
// with Connection: close shown when the header says the connection closes.
func headerLines(all func(yield func([]byte, []byte) bool), connClose bool) []string {
	var out []string
	sawConn := false
	for k, v := range all {
		name := strings.ToLower(string(k))
		sawConn = sawConn || name == "connection"
		out = append(out, name+": "+string(v))
	}
	if connClose && !sawConn {
		out = append(out, "connection: close")
	}
	slices.Sort(out)
	return out
}

func TestUpstreamHead(t *testing.T) {
	const ep = "10.0.0.7:8000"
	cases := []struct {
		name    string
		line    string // the client's request line
		in      string // header lines after it
		bodyLen int    // the body the gateway sends
		want    []string
		wantURI string
	}{
		{"plain", "POST /v1/chat/completions HTTP/1.1", "Host: gw\r\nContent-Type: application/json\r\nContent-Length: 2\r\nAuthorization: Bearer k\r\nAccept: */*\r\n", 2,
			[]string{"accept: */*", "authorization: Bearer k", "content-length: 2", "content-type: application/json", "host: " + ep}, "/v1/chat/completions"},
		{"every hop header, any case", "POST /v1/chat/completions HTTP/1.1", "Host: gw\r\nconnection: keep-alive\r\nKEEP-ALIVE: timeout=5\r\nProxy-Authenticate: Basic\r\nproxy-authorization: Basic x\r\nProxy-Connection: keep-alive\r\nte: trailers\r\nUpgrade: h2c\r\nX-Kept: 1\r\n", 0,
			[]string{"content-length: 0", "host: " + ep, "x-kept: 1"}, "/v1/chat/completions"},
		{"connection close", "POST /v1/chat/completions HTTP/1.1", "Host: gw\r\nConnection: close\r\nX-Kept: 1\r\n", 0,
			[]string{"content-length: 0", "host: " + ep, "x-kept: 1"}, "/v1/chat/completions"},
		{"headers named by Connection", "POST /v1/chat/completions HTTP/1.1", "Host: gw\r\nConnection: keep-alive, X-Secret ,x-other\r\nX-Secret: s\r\nX-Other: o\r\nX-Kept: 1\r\n", 0,
			[]string{"content-length: 0", "host: " + ep, "x-kept: 1"}, "/v1/chat/completions"},
		{"close and a named header", "POST /v1/chat/completions HTTP/1.1", "Host: gw\r\nConnection: close, X-Secret\r\nX-Secret: s\r\nX-Kept: 1\r\n", 0,
			[]string{"content-length: 0", "host: " + ep, "x-kept: 1"}, "/v1/chat/completions"},
		{"repeated headers kept", "POST /v1/chat/completions HTTP/1.1", "Host: gw\r\nX-Multi: a\r\nX-Multi: b\r\n", 0,
			[]string{"content-length: 0", "host: " + ep, "x-multi: a", "x-multi: b"}, "/v1/chat/completions"},
		{"look-alike names kept", "POST /v1/chat/completions HTTP/1.1", "Host: gw\r\nTEA: green\r\nConnections: 3\r\nX-Upgrade: no\r\n", 0,
			[]string{"connections: 3", "content-length: 0", "host: " + ep, "tea: green", "x-upgrade: no"}, "/v1/chat/completions"},
		// The client's framing is not the worker's: a chunked body goes out
		// with the length of what the gateway read.
		{"chunked client body", "POST /v1/completions HTTP/1.1", "Host: gw\r\nTransfer-Encoding: chunked\r\nContent-Type: application/json\r\n", 5,
			[]string{"content-length: 5", "content-type: application/json", "host: " + ep}, "/v1/completions"},
		{"GET has no length", "GET /v1/models?x=1 HTTP/1.1", "Host: gw\r\nAccept: */*\r\n", 0,
			[]string{"accept: */*", "host: " + ep}, "/v1/models?x=1"},
		{"no Host from the client", "POST /v1/completions HTTP/1.0", "Content-Length: 2\r\n", 2,
			[]string{"content-length: 2", "host: " + ep}, "/v1/completions"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			src := parseClientRequest(t, tc.line+"\r\n"+tc.in+"\r\n")
			head := appendUpstreamHead(nil, src, src.RequestURI(), ep, tc.bodyLen, src.IsGet() || src.IsHead())
			var got fasthttp.RequestHeader
			got.DisableNormalizing()
			if err := got.Read(bufio.NewReader(strings.NewReader(string(head) + "\r\n"))); err != nil {
				t.Fatalf("the worker cannot parse %q: %v", head, err)
			}
			if lines := headerLines(got.All(), got.ConnectionClose()); !slices.Equal(lines, tc.want) {
				t.Errorf("worker's request headers:\n got %q\nwant %q", lines, tc.want)
			}
			method, _, _ := strings.Cut(tc.line, " ")
			wantLine := method + " " + tc.wantURI + " HTTP/1.1\r\n"
			if !strings.HasPrefix(string(head), wantLine) {
				t.Errorf("request line: got %q, want %q (the gateway's own version)", head[:strings.Index(string(head), "\r\n")+2], wantLine)
			}
		})
	}
}

// TestUpstreamURI: the worker gets origin form whatever form the client
// used.
func TestUpstreamURI(t *testing.T) {
	cases := []struct{ name, target, want string }{
		{"origin form", "/v1/chat/completions?a=b", "/v1/chat/completions?a=b"},
		{"absolute form", "http://gw:8080/v1/chat/completions?a=b", "/v1/chat/completions?a=b"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			var req fasthttp.Request
			if err := req.Read(bufio.NewReader(strings.NewReader("POST " + tc.target + " HTTP/1.1\r\nHost: gw\r\nContent-Length: 0\r\n\r\n"))); err != nil {
				t.Fatal(err)
			}
			if got := string(upstreamURI(&req.Header, req.URI())); got != tc.want {
				t.Errorf("upstreamURI = %q, want %q", got, tc.want)
			}
		})
	}
}

func TestCopyAnswerHeaders(t *testing.T) {
	cases := []struct {
		name string
		in   string
		want []string
	}{
		// Date is the gateway's own (fasthttp writes it).
		{"uvicorn", "date: Tue, 01 Dec 2026 20:00:00 GMT\r\nserver: uvicorn\r\ncontent-length: 2\r\ncontent-type: application/json\r\n",
			[]string{"content-length: 2", "content-type: application/json", "server: uvicorn"}},
		{"llama.cpp keep-alive", "Keep-Alive: timeout=5, max=100\r\nContent-Type: application/json; charset=utf-8\r\nServer: llama.cpp\r\nContent-Length: 2\r\n",
			[]string{"content-length: 2", "content-type: application/json; charset=utf-8", "server: llama.cpp"}},
		{"connection close", "Connection: close\r\nContent-Type: application/json\r\nContent-Length: 2\r\nX-Kept: 1\r\n",
			[]string{"content-length: 2", "content-type: application/json", "x-kept: 1"}},
		{"every hop header, any case", "Content-Type: application/json\r\nContent-Length: 2\r\nconnection: keep-alive\r\nkeep-alive: timeout=5\r\nPROXY-AUTHENTICATE: Basic\r\nProxy-Authorization: x\r\nproxy-connection: close\r\nTE: trailers\r\nupgrade: websocket\r\nX-Kept: 1\r\n",
			[]string{"content-length: 2", "content-type: application/json", "x-kept: 1"}},
		{"headers named by Connection", "Content-Type: application/json\r\nContent-Length: 2\r\nConnection: x-a, X-B\r\nx-a: 1\r\nX-B: 2\r\nX-Kept: 1\r\n",
			[]string{"content-length: 2", "content-type: application/json", "x-kept: 1"}},
		{"worker's request id dropped", "Content-Type: application/json\r\nContent-Length: 2\r\nx-request-id: worker-echo\r\nX-Kept: 1\r\n",
			[]string{"content-length: 2", "content-type: application/json", "x-kept: 1"}},
		{"repeated and look-alike kept", "Content-Type: application/json\r\nContent-Length: 2\r\nSet-Cookie: a=1\r\nSet-Cookie: b=2\r\nX-Keep-Alive-Hint: 1\r\n",
			[]string{"content-length: 2", "content-type: application/json", "set-cookie: a=1", "set-cookie: b=2", "x-keep-alive-hint: 1"}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			src := parseWorkerAnswer(t, "HTTP/1.1 200 OK\r\n"+tc.in+"\r\n")
			var dst fasthttp.ResponseHeader
			dst.SetNoDefaultContentType(true) // as the data plane's server (NoDefaultContentType)
			copyAnswerHeaders(&dst, src)
			got := headerLines(dst.All(), dst.ConnectionClose())
			if !slices.Equal(got, tc.want) {
				t.Errorf("client's answer headers:\n got %q\nwant %q", got, tc.want)
			}
		})
	}
}

// The header work of one proxied request: the worker's request from the
// client's, the client's answer from the worker's. Typical headers: an
// OpenAI SDK's request, a vLLM (uvicorn) answer.
var (
	benchClientRequest = "POST /v1/chat/completions HTTP/1.1\r\nHost: gw:8080\r\nAccept-Encoding: gzip, deflate\r\nConnection: keep-alive\r\nAccept: application/json\r\nContent-Type: application/json\r\nUser-Agent: OpenAI/Python 1.59.6\r\nX-Stainless-Lang: python\r\nX-Stainless-Package-Version: 1.59.6\r\nAuthorization: Bearer sk-123\r\nContent-Length: 300\r\n\r\n"
	benchWorkerAnswer  = "HTTP/1.1 200 OK\r\ndate: Tue, 01 Dec 2026 20:00:00 GMT\r\nserver: uvicorn\r\ncontent-length: 1024\r\ncontent-type: application/json\r\n\r\n"
)

func BenchmarkUpstreamHead(b *testing.B) {
	src := parseClientRequest(b, benchClientRequest)
	var dst []byte
	b.ReportAllocs()
	for b.Loop() {
		dst = appendUpstreamHead(dst[:0], src, src.RequestURI(), "10.0.0.7:8000", 300, false)
	}
}

func BenchmarkCopyAnswerHeaders(b *testing.B) {
	src := parseWorkerAnswer(b, benchWorkerAnswer)
	var dst fasthttp.ResponseHeader
	b.ReportAllocs()
	for b.Loop() {
		dst.Reset()
		copyAnswerHeaders(&dst, src)
	}
}

// TestAnswerWithoutContentType: a worker answer that names no Content-Type
// reaches the client without one; the gateway invents none.
func TestAnswerWithoutContentType(t *testing.T) {
	b := newHardScripted(t, func(c net.Conn, _ *http.Request) {
		fmt.Fprintf(c, "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\n{}")
	})
	s := startGateway(t, "", nil)
	mustApply(t, s, hardScriptedRule("r", "m1", "", b))
	resp, body := post(t, newClient(t), "http://"+s.Addr()+"/v1/chat/completions", chatBody)
	if resp.StatusCode != 200 || body != "{}" {
		t.Fatalf("status %d body %q", resp.StatusCode, body)
	}
	if ct, ok := resp.Header["Content-Type"]; ok {
		t.Errorf("client got Content-Type %q; the worker sent none", ct)
	}
}

// TestWorkerRequestVersion: the worker's request speaks the gateway's own
// HTTP/1.1 (RFC 9110 §7.6.3) whatever the client spoke, names the endpoint
// as Host and carries the body's length once.
func TestWorkerRequestVersion(t *testing.T) {
	b := newHardScripted(t, func(c net.Conn, _ *http.Request) {
		fmt.Fprintf(c, "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 2\r\n\r\n{}")
	})
	s := startGateway(t, "", nil)
	mustApply(t, s, hardScriptedRule("r", "m1", "", b))
	for _, proto := range []string{"HTTP/1.0", "HTTP/1.1"} {
		t.Run(proto, func(t *testing.T) {
			resp, data, err := rawRequest(t, s.Addr(), "POST /v1/chat/completions "+proto+"\r\nHost: gw.example\r\nContent-Type: application/json\r\n", chatBody)
			if err != nil || resp.StatusCode != 200 || string(data) != "{}" {
				t.Fatalf("status %v body %q err %v", resp.StatusCode, data, err)
			}
			var req *http.Request
			select {
			case req = <-b.seen:
			case <-time.After(10 * time.Second):
				t.Fatal("the worker saw no request")
			}
			if req.Proto != "HTTP/1.1" {
				t.Errorf("worker's request is %s; want the gateway's HTTP/1.1", req.Proto)
			}
			if want := fmt.Sprintf("127.0.0.1:%d", b.port()); req.Host != want {
				t.Errorf("worker's Host %q, want %q", req.Host, want)
			}
			if cl := req.Header.Values("Content-Length"); req.ContentLength != int64(len(chatBody)) || len(cl) > 1 {
				t.Errorf("worker's Content-Length %v (%d), want one of %d", cl, req.ContentLength, len(chatBody))
			}
		})
	}
}

// TestReleaseIdleBuffers: with the client connection's buffers given back
// between requests (Config.ReleaseIdleBuffers) and without, one keep-alive
// connection carries a JSON answer, a stream, two pipelined requests and
// one more, every answer whole and in order.
func TestReleaseIdleBuffers(t *testing.T) {
	for _, release := range []bool{false, true} {
		t.Run(fmt.Sprintf("release=%v", release), func(t *testing.T) {
			w := startSimT(t, sim.Config{Engine: engines.VLLM})
			host, port := hostPort(t, w.Addrs().HTTP)
			s := startGateway(t, "", func(c *Config) { c.ReleaseIdleBuffers = release })
			mustApply(t, s, fmt.Sprintf("name: r\nmodel_name: m\nprobe: {disabled: true}\nendpoints:\n  - {id: w1, endpointIP: %s, targetPort: %d}\n", host, port))
			conn, err := net.Dial("tcp", s.Addr())
			if err != nil {
				t.Fatal(err)
			}
			defer conn.Close()
			_ = conn.SetDeadline(time.Now().Add(30 * time.Second))
			br := bufio.NewReader(conn)
			req := func(body string) string {
				return fmt.Sprintf("POST /v1/chat/completions HTTP/1.1\r\nHost: gw\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s", len(body), body)
			}
			chat := `{"model":"m","messages":[{"role":"user","content":"hi"}],"max_tokens":3}`
			stream := `{"model":"m","messages":[{"role":"user","content":"hi"}],"max_tokens":3,"stream":true}`
			read := func(what string, wantSSE bool) {
				t.Helper()
				resp, err := http.ReadResponse(br, nil)
				if err != nil {
					t.Fatalf("%s: %v", what, err)
				}
				data, err := io.ReadAll(resp.Body)
				resp.Body.Close()
				if err != nil || resp.StatusCode != 200 {
					t.Fatalf("%s: status %d, %d bytes, err %v", what, resp.StatusCode, len(data), err)
				}
				if sse := strings.Contains(string(data), "data: [DONE]"); sse != wantSSE {
					t.Fatalf("%s: [DONE] seen %v, want %v: %.200s", what, sse, wantSSE, data)
				}
			}
			steps := []struct {
				name, send string
				answers    []bool // one per answer: SSE or not
			}{
				{"json", req(chat), []bool{false}},
				{"stream", req(stream), []bool{true}},
				{"pipelined", req(chat) + req(stream), []bool{false, true}},
				{"again", req(chat), []bool{false}},
			}
			for _, st := range steps {
				if _, err := io.WriteString(conn, st.send); err != nil {
					t.Fatalf("%s: %v", st.name, err)
				}
				for i, sse := range st.answers {
					read(fmt.Sprintf("%s #%d", st.name, i+1), sse)
				}
			}
		})
	}
}
