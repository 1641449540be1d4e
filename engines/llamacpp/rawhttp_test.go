package llamacpp_test

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/llmgw/llmgw/engines/sim"
)

// The conformance tests talk raw HTTP/1.1 over a TCP socket, as the
// captures were made: a client library would hide the framing, the header
// order, the Keep-Alive header and when the server closes.

// startSim starts a llama.cpp persona and closes it at cleanup.
func startSim(t *testing.T, cfg sim.Config) *sim.Sim {
	t.Helper()
	cfg.Engine = "llamacpp"
	s, err := sim.Start(context.Background(), cfg)
	if err != nil {
		t.Fatalf("sim.Start: %v", err)
	}
	t.Cleanup(func() {
		if err := s.Close(); err != nil {
			t.Errorf("sim.Close: %v", err)
		}
	})
	return s
}

// rawConn is one client connection.
type rawConn struct {
	t  *testing.T
	c  net.Conn
	br *bufio.Reader
}

func dial(t *testing.T, addr string) *rawConn {
	t.Helper()
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatalf("dial %s: %v", addr, err)
	}
	t.Cleanup(func() { _ = c.Close() })
	return &rawConn{t: t, c: c, br: bufio.NewReader(c)}
}

// rawResponse is one response as it came off the socket.
type rawResponse struct {
	status  int
	headers []header // in wire order
	body    []byte   // de-chunked
	chunks  [][]byte // the chunks of a chunked body, in order
	chunked bool
	// headAt and bodyAt are when the head was complete and when the body
	// was complete.
	headAt, bodyAt time.Time
}

type header struct{ name, value string }

func (r *rawResponse) get(name string) (string, bool) {
	for _, h := range r.headers {
		if strings.EqualFold(h.name, name) {
			return h.value, true
		}
	}
	return "", false
}

// send writes one request in a single write.
func (rc *rawConn) send(method, path string, headers map[string]string, body string) {
	rc.t.Helper()
	var b strings.Builder
	fmt.Fprintf(&b, "%s %s HTTP/1.1\r\nHost: 127.0.0.1\r\n", method, path)
	for k, v := range headers {
		fmt.Fprintf(&b, "%s: %s\r\n", k, v)
	}
	if body != "" || method == "POST" {
		fmt.Fprintf(&b, "Content-Length: %d\r\n", len(body))
	}
	b.WriteString("\r\n")
	b.WriteString(body)
	if err := rc.c.SetDeadline(time.Now().Add(30 * time.Second)); err != nil {
		rc.t.Fatal(err)
	}
	if _, err := io.WriteString(rc.c, b.String()); err != nil {
		rc.t.Fatalf("write: %v", err)
	}
}

// read reads one response.
func (rc *rawConn) read() (*rawResponse, error) {
	if err := rc.c.SetReadDeadline(time.Now().Add(30 * time.Second)); err != nil {
		return nil, err
	}
	return readResponse(rc.br)
}

func (rc *rawConn) roundTrip(method, path string, headers map[string]string, body string) *rawResponse {
	rc.t.Helper()
	rc.send(method, path, headers, body)
	r, err := rc.read()
	if err != nil {
		rc.t.Fatalf("%s %s: %v", method, path, err)
	}
	return r
}

// waitEOF reports whether the server closed the connection (EOF or reset)
// before the deadline, having sent nothing more.
func (rc *rawConn) waitEOF(within time.Duration) error {
	if err := rc.c.SetReadDeadline(time.Now().Add(within)); err != nil {
		return err
	}
	b, err := rc.br.ReadByte()
	switch {
	case err == nil:
		return fmt.Errorf("server sent %q instead of closing", b)
	case errors.Is(err, io.EOF):
		return nil
	case errors.Is(err, net.ErrClosed):
		return err
	default:
		var ne net.Error
		if errors.As(err, &ne) && ne.Timeout() {
			return fmt.Errorf("connection still open after %v", within)
		}
		return nil // reset
	}
}

// readResponse parses one HTTP/1.1 response: status line, headers,
// Content-Length or chunked body.
func readResponse(br *bufio.Reader) (*rawResponse, error) {
	line, err := br.ReadString('\n')
	if err != nil {
		return nil, fmt.Errorf("status line: %w", err)
	}
	parts := strings.SplitN(strings.TrimRight(line, "\r\n"), " ", 3)
	if len(parts) < 2 || parts[0] != "HTTP/1.1" {
		return nil, fmt.Errorf("status line %q", line)
	}
	r := &rawResponse{}
	if r.status, err = strconv.Atoi(parts[1]); err != nil {
		return nil, fmt.Errorf("status line %q: %w", line, err)
	}
	length := -1
	for {
		l, err := br.ReadString('\n')
		if err != nil {
			return nil, fmt.Errorf("headers: %w", err)
		}
		l = strings.TrimRight(l, "\r\n")
		if l == "" {
			break
		}
		name, value, ok := strings.Cut(l, ":")
		if !ok {
			return nil, fmt.Errorf("header line %q", l)
		}
		h := header{name: name, value: strings.TrimSpace(value)}
		r.headers = append(r.headers, h)
		switch strings.ToLower(name) {
		case "content-length":
			if length, err = strconv.Atoi(h.value); err != nil {
				return nil, fmt.Errorf("content-length %q: %w", h.value, err)
			}
		case "transfer-encoding":
			r.chunked = strings.EqualFold(h.value, "chunked")
		}
	}
	r.headAt = time.Now()
	switch {
	case r.chunked:
		for {
			sz, err := br.ReadString('\n')
			if err != nil {
				return r, fmt.Errorf("chunk size: %w", err)
			}
			n, err := strconv.ParseInt(strings.TrimRight(sz, "\r\n"), 16, 32)
			if err != nil {
				return r, fmt.Errorf("chunk size %q: %w", sz, err)
			}
			chunk := make([]byte, n+2)
			if _, err := io.ReadFull(br, chunk); err != nil {
				return r, fmt.Errorf("chunk: %w", err)
			}
			if !bytes.HasSuffix(chunk, []byte("\r\n")) {
				return r, fmt.Errorf("chunk not followed by CRLF")
			}
			if n == 0 {
				break
			}
			r.chunks = append(r.chunks, chunk[:n])
			r.body = append(r.body, chunk[:n]...)
		}
	case length >= 0:
		r.body = make([]byte, length)
		if _, err := io.ReadFull(br, r.body); err != nil {
			return r, fmt.Errorf("body: %w", err)
		}
	default:
		return r, errors.New("response has neither Content-Length nor chunked framing")
	}
	r.bodyAt = time.Now()
	return r, nil
}

// parseRaw parses a captured .http file.
func parseRaw(b []byte) (*rawResponse, error) {
	return readResponse(bufio.NewReader(bytes.NewReader(b)))
}
