package h1

import (
	"bufio"
	"bytes"
	"errors"
	"testing"

	"github.com/valyala/fasthttp"
)

func TestParseRequest(t *testing.T) {
	cases := []struct {
		name   string
		head   string
		method string
		target string
		cl     int64
		te     bool
		expect bool
		close  bool
		fields int
		err    bool
	}{
		{name: "chat", head: "POST /v1/chat/completions HTTP/1.1\r\nHost: gw\r\nContent-Length: 12\r\nX-A:  b \r\n\r\n", method: "POST", target: "/v1/chat/completions", cl: 12, fields: 3},
		{name: "no body", head: "GET /v1/models?x=1 HTTP/1.1\r\nHost: gw\r\n\r\n", method: "GET", target: "/v1/models?x=1", cl: -1, fields: 1},
		{name: "no Host", head: "GET / HTTP/1.1\r\n\r\n", err: true},
		{name: "two Hosts", head: "GET / HTTP/1.1\r\nHost: a\r\nHost: b\r\n\r\n", err: true},
		{name: "close", head: "GET / HTTP/1.1\r\nHost: gw\r\nConnection: keep-alive, Close\r\n\r\n", method: "GET", target: "/", cl: -1, close: true, fields: 2},
		{name: "chunked", head: "POST / HTTP/1.1\r\nHost: gw\r\nTransfer-Encoding: chunked\r\n\r\n", method: "POST", target: "/", cl: -1, te: true, fields: 2},
		{name: "expect", head: "POST / HTTP/1.1\r\nHost: gw\r\nExpect: 100-continue\r\nContent-Length: 1\r\n\r\n", method: "POST", target: "/", cl: 1, expect: true, fields: 3},
		{name: "HTTP/1.0", head: "GET / HTTP/1.0\r\n\r\n", err: true},
		{name: "bare LF", head: "GET / HTTP/1.1\nHost: gw\n\n", err: true},
		{name: "two Content-Lengths", head: "POST / HTTP/1.1\r\nContent-Length: 1\r\nContent-Length: 1\r\n\r\n", err: true},
		{name: "signed Content-Length", head: "POST / HTTP/1.1\r\nContent-Length: +1\r\n\r\n", err: true},
		{name: "Content-Length list", head: "POST / HTTP/1.1\r\nContent-Length: 1, 1\r\n\r\n", err: true},
		{name: "obs-fold", head: "GET / HTTP/1.1\r\nX-A: b\r\n c\r\n\r\n", err: true},
		{name: "space before colon", head: "GET / HTTP/1.1\r\nX-A : b\r\n\r\n", err: true},
		{name: "control in value", head: "GET / HTTP/1.1\r\nX-A: b\x01c\r\n\r\n", err: true},
		{name: "two spaces", head: "GET  / HTTP/1.1\r\n\r\n", err: true},
		{name: "no target", head: "GET HTTP/1.1\r\n\r\n", err: true},
		{name: "lowercase version", head: "GET / http/1.1\r\n\r\n", err: true},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			var r Request
			err := ParseRequest([]byte(tc.head), &r)
			if (err != nil) != tc.err {
				t.Fatalf("err %v, want error %v", err, tc.err)
			}
			if err != nil {
				if !errors.Is(err, ErrHead) {
					t.Fatalf("%v is not ErrHead", err)
				}
				return
			}
			if string(r.Method) != tc.method || string(r.Target) != tc.target || r.ContentLength != tc.cl ||
				r.TransferEncoding != tc.te || r.Expect != tc.expect || r.Close != tc.close || len(r.Fields) != tc.fields {
				t.Fatalf("got %+v", r)
			}
		})
	}
	var r Request
	if err := ParseRequest([]byte("GET / HTTP/1.1\r\nHost: gw\r\nX-A:  b \r\nx-a: c\r\n\r\n"), &r); err != nil {
		t.Fatal(err)
	}
	if v := r.Peek([]byte("X-a")); string(v) != "b" {
		t.Fatalf("Peek = %q, want the first value, trimmed", v)
	}
}

func TestParseResponse(t *testing.T) {
	cases := []struct {
		name   string
		head   string
		status int
		cl     int64
		close  bool
		ctype  string
		err    bool
	}{
		{name: "json", head: "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 17\r\n\r\n", status: 200, cl: 17, ctype: "application/json"},
		{name: "sse chunked", head: "HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n", status: 200, cl: -1, ctype: "text/event-stream"},
		{name: "chunked wins over length", head: "HTTP/1.1 200 OK\r\nContent-Length: 5\r\nTransfer-Encoding: chunked\r\n\r\n", status: 200, cl: -1},
		{name: "until close", head: "HTTP/1.1 200 OK\r\nConnection: close\r\n\r\n", status: 200, cl: -2, close: true},
		{name: "HTTP/1.0", head: "HTTP/1.0 200 OK\r\nContent-Length: 2\r\n\r\n", status: 200, cl: 2, close: true},
		{name: "HTTP/1.0 keep-alive", head: "HTTP/1.0 200 OK\r\nConnection: keep-alive\r\nContent-Length: 2\r\n\r\n", status: 200, cl: 2},
		{name: "no reason", head: "HTTP/1.1 204\r\n\r\n", status: 204, cl: -2},
		{name: "until close without saying so", head: "HTTP/1.1 200 OK\r\n\r\n", status: 200, cl: -2, close: true},
		{name: "bare LF", head: "HTTP/1.1 500 Internal Server Error\nContent-Length: 0\n\n", err: true},
		{name: "same length twice", head: "HTTP/1.1 200 OK\r\nContent-Length: 3\r\nContent-Length: 3\r\n\r\n", status: 200, cl: 3},
		{name: "conflicting lengths", head: "HTTP/1.1 200 OK\r\nContent-Length: 3\r\nContent-Length: 4\r\n\r\n", err: true},
		{name: "bad status", head: "HTTP/1.1 two hundred\r\n\r\n", err: true},
		{name: "status glued to reason", head: "HTTP/1.1 200OK\r\n\r\n", err: true},
		{name: "HTTP/2", head: "HTTP/2 200 OK\r\n\r\n", err: true},
		{name: "obs-fold", head: "HTTP/1.1 200 OK\r\nX-A: 1\r\n 2\r\n\r\n", err: true},
		{name: "gzip coding", head: "HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip, chunked\r\n\r\n", err: true},
		{name: "two codings fields", head: "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nTransfer-Encoding: chunked\r\n\r\n", err: true},
		{name: "HTTP/1.0 ignores codings", head: "HTTP/1.0 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n", status: 200, cl: -2, close: true},
		{name: "negative length", head: "HTTP/1.1 200 OK\r\nContent-Length: -1\r\n\r\n", err: true},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			var r Response
			err := ParseResponse([]byte(tc.head), &r)
			if (err != nil) != tc.err {
				t.Fatalf("err %v, want error %v", err, tc.err)
			}
			if err != nil {
				return
			}
			if r.Status != tc.status || r.ContentLength != tc.cl || r.Close != tc.close || string(r.ContentType) != tc.ctype {
				t.Fatalf("got status %d length %d close %v type %q", r.Status, r.ContentLength, r.Close, r.ContentType)
			}
		})
	}
}

// FuzzRequestAgainstFasthttp: a head ParseRequest accepts, fasthttp's
// parser (the goroutine plane's) accepts too, with the same method,
// target, body length and field values.
func FuzzRequestAgainstFasthttp(f *testing.F) {
	f.Add([]byte("POST /v1/chat/completions HTTP/1.1\r\nHost: gw\r\nContent-Length: 12\r\nX-Request-Id: a\r\n\r\n"))
	f.Add([]byte("GET /x?y=1 HTTP/1.1\r\nHost: h\r\nConnection: close\r\nCookie: a=b\r\n\r\n"))
	f.Add([]byte("POST / HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: chunked\r\nContent-Length: 3\r\n\r\n"))
	f.Fuzz(func(t *testing.T, b []byte) {
		hl := HeadEnd(b)
		if hl == 0 {
			return
		}
		var r Request
		if ParseRequest(b[:hl], &r) != nil || r.TransferEncoding {
			// Refused, or framed by Transfer-Encoding: either way the
			// gateway hands the request to fasthttp, which reads it.
			return
		}
		var h fasthttp.RequestHeader
		br := bufio.NewReaderSize(bytes.NewReader(b[:hl]), 64<<10)
		if err := h.Read(br); err != nil {
			t.Fatalf("%q: accepted here, fasthttp: %v", b[:hl], err)
		}
		if br.Buffered() != 0 {
			t.Fatalf("%q: fasthttp ends the head %d bytes earlier", b[:hl], br.Buffered())
		}
		if string(h.Method()) != string(r.Method) || string(h.RequestURI()) != string(r.Target) {
			t.Fatalf("%q: method %q target %q, fasthttp %q %q", b[:hl], r.Method, r.Target, h.Method(), h.RequestURI())
		}
		// No Content-Length: no body (fasthttp's -2 "until close" is
		// ignored for requests: its readLimitBody sets 0).
		want, got := max(r.ContentLength, 0), int64(h.ContentLength())
		if got == -2 {
			got = 0
		}
		if got != want {
			t.Fatalf("%q: length %d, fasthttp %d", b[:hl], want, got)
		}
		for _, fl := range r.Fields {
			if isFramingOrSpecial(fl.Name) {
				continue
			}
			if got := h.PeekBytes(fl.Name); string(got) != string(r.Peek(fl.Name)) {
				t.Fatalf("%q: field %q = %q, fasthttp %q", b[:hl], fl.Name, r.Peek(fl.Name), got)
			}
		}
		if r.Close != h.ConnectionClose() {
			t.Fatalf("%q: close %v, fasthttp %v", b[:hl], r.Close, h.ConnectionClose())
		}
	})
}

// isFramingOrSpecial: fields fasthttp keeps apart from the others (so
// PeekBytes reports them in its own form).
func isFramingOrSpecial(name []byte) bool {
	for _, s := range []string{"Content-Length", "Transfer-Encoding", "Connection", "Host", "Content-Type", "User-Agent", "Cookie", "Trailer"} {
		if equalFold(name, s) {
			return true
		}
	}
	return false
}

// FuzzResponseAgainstFasthttp: an answer head ParseResponse accepts,
// fasthttp's client (the goroutine plane's) accepts with the same status
// and framing.
func FuzzResponseAgainstFasthttp(f *testing.F) {
	f.Add([]byte("HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 17\r\n\r\n"))
	f.Add([]byte("HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n"))
	f.Add([]byte("HTTP/1.0 500 x\r\nConnection: keep-alive\r\nContent-Length: 0\r\n\r\n"))
	f.Fuzz(func(t *testing.T, b []byte) {
		hl := HeadEnd(b)
		if hl == 0 {
			return
		}
		var r Response
		if ParseResponse(b[:hl], &r) != nil {
			return
		}
		// With names normalized: the goroutine plane's client reads them
		// as sent, and then misses an HTTP/1.0 "CONNECTION: keep-alive"
		// (fasthttp looks the field up by its canonical name); here names
		// are matched in any case, as RFC 9110 §5.1 says.
		var h fasthttp.ResponseHeader
		br := bufio.NewReaderSize(bytes.NewReader(b[:hl]), 64<<10)
		if err := h.Read(br); err != nil {
			t.Fatalf("%q: accepted here, fasthttp: %v", b[:hl], err)
		}
		if h.StatusCode() != r.Status {
			t.Fatalf("%q: status %d, fasthttp %d", b[:hl], r.Status, h.StatusCode())
		}
		noBody := r.Status < 200 || r.Status == 204 || r.Status == 304
		if !noBody && int64(h.ContentLength()) != r.ContentLength {
			t.Fatalf("%q: length %d, fasthttp %d", b[:hl], r.ContentLength, h.ContentLength())
		}
		if !noBody && r.Close != h.ConnectionClose() {
			t.Fatalf("%q: close %v, fasthttp %v", b[:hl], r.Close, h.ConnectionClose())
		}
	})
}

// TestFieldLines: every field's Start:End is its whole line, and the lines
// of consecutive fields are adjacent.
func TestFieldLines(t *testing.T) {
	head := []byte("POST / HTTP/1.1\r\nHost: gw\r\nX-A:  b \r\nContent-Length: 0\r\n\r\n")
	var r Request
	if err := ParseRequest(head, &r); err != nil {
		t.Fatal(err)
	}
	want := []string{"Host: gw\r\n", "X-A:  b \r\n", "Content-Length: 0\r\n"}
	for i, f := range r.Fields {
		if got := string(head[f.Start:f.End]); got != want[i] {
			t.Fatalf("field %d line %q, want %q", i, got, want[i])
		}
		if i > 0 && r.Fields[i-1].End != f.Start {
			t.Fatalf("field %d does not start where field %d ends", i, i-1)
		}
	}
	if got := LineEnd(r.Fields, head); got != len("POST / HTTP/1.1\r\n") {
		t.Fatalf("LineEnd = %d", got)
	}
}
