package h1

import (
	"bytes"
	"errors"
	"fmt"
)

// Field is one header field line: its name and value (without the
// whitespace around it), sub-slices of the parsed head, and where the
// whole line (its line end included) lies in the head: head[Start:End].
// Consecutive fields' lines are adjacent, so a run of them can be copied
// in one piece.
type Field struct {
	Name, Value []byte
	Start, End  int
}

// ErrHead: a message head this package does not parse. For a request the
// gateway then leaves the request to fasthttp's parser (which answers what
// it refuses); for a worker's answer it is a failed answer.
var ErrHead = errors.New("h1: malformed message head")

// Limits of what the parsers accept.
const (
	// MaxFields bounds the field lines of one head.
	MaxFields = 256
	maxDigits = 15 // Content-Length up to 10^15-1
)

// Request is a parsed request head. Its slices point into the parsed
// bytes, which must outlive it.
type Request struct {
	Method, Target []byte
	Fields         []Field // in order
	// ContentLength is the body's length; -1 without a Content-Length
	// field (no body, as the request has no Transfer-Encoding either).
	ContentLength int64
	// TransferEncoding, Expect: the request has such a field (the gateway
	// leaves those requests to fasthttp).
	TransferEncoding, Expect bool
	// Close: a Connection field says close.
	Close bool
	// Host is the Host field's value.
	Host []byte
}

// ParseRequest parses head, a whole request head (HeadEnd bytes), into r,
// reusing r.Fields' memory. It is strict by design: it accepts only
// HTTP/1.1 with CRLF line ends, token methods and field names, field
// values of visible characters, spaces and tabs (and obs-text), at most
// one Content-Length of digits only, exactly one non-empty Host (fasthttp
// requires one of HTTP/1.1), origin-form targets, and no obs-fold; anything else is
// ErrHead. What it accepts, fasthttp's parser accepts with the same
// meaning (FuzzRequestAgainstFasthttp).
func ParseRequest(head []byte, r *Request) error {
	*r = Request{Fields: r.Fields[:0], ContentLength: -1}
	line, rest, ok := cutLine(head, true)
	if !ok {
		return fmt.Errorf("%w: no request line", ErrHead)
	}
	sp := bytes.IndexByte(line, ' ')
	if sp <= 0 || !isToken(line[:sp]) {
		return fmt.Errorf("%w: bad method", ErrHead)
	}
	r.Method = line[:sp]
	line = line[sp+1:]
	sp = bytes.IndexByte(line, ' ')
	if sp <= 0 {
		return fmt.Errorf("%w: bad request target", ErrHead)
	}
	r.Target = line[:sp]
	if r.Target[0] != '/' {
		// Origin form only (absolute, authority and asterisk forms are
		// fasthttp's to read).
		return fmt.Errorf("%w: not an origin-form target", ErrHead)
	}
	for _, c := range r.Target {
		if c <= ' ' || c == 0x7f {
			return fmt.Errorf("%w: bad request target", ErrHead)
		}
	}
	if string(line[sp+1:]) != "HTTP/1.1" {
		return fmt.Errorf("%w: not HTTP/1.1", ErrHead)
	}
	var err error
	if rest, err = parseFields(rest, len(head)-len(rest), &r.Fields); err != nil {
		return err
	}
	if len(rest) != 0 {
		return fmt.Errorf("%w: bytes after the head", ErrHead)
	}
	for i := range r.Fields {
		f := &r.Fields[i]
		switch {
		case equalFold(f.Name, "Content-Length"):
			if r.ContentLength >= 0 {
				return fmt.Errorf("%w: more than one Content-Length", ErrHead)
			}
			if r.ContentLength = parseDigits(f.Value); r.ContentLength < 0 {
				return fmt.Errorf("%w: bad Content-Length", ErrHead)
			}
		case equalFold(f.Name, "Transfer-Encoding"):
			r.TransferEncoding = true
		case equalFold(f.Name, "Expect"):
			r.Expect = true
		case equalFold(f.Name, "Connection"):
			r.Close = r.Close || hasToken(f.Value, "close")
		case equalFold(f.Name, "Host"):
			if r.Host != nil {
				return fmt.Errorf("%w: more than one Host", ErrHead)
			}
			r.Host = f.Value
		}
	}
	if len(r.Host) == 0 {
		return fmt.Errorf("%w: no Host", ErrHead)
	}
	return nil
}

// Peek is the value of the first field named name (any case), or nil.
func (r *Request) Peek(name []byte) []byte { return peek(r.Fields, name) }

// Response is a parsed response head. Its slices point into the parsed
// bytes, which must outlive it.
type Response struct {
	Status int
	// HTTP10: the answer is HTTP/1.0 (else HTTP/1.1).
	HTTP10 bool
	Fields []Field // in order
	// ContentLength: the body's length; -1 chunked; -2 until the
	// connection closes (neither framing). Meaningless for answers without a body (HEAD, 1xx, 204,
	// 304).
	ContentLength int64
	// Close: the worker closes the connection after this answer
	// (Connection: close, HTTP/1.0 without keep-alive, or a body that
	// ends with the connection).
	Close bool
	// ContentType is the first Content-Type field's value.
	ContentType []byte
}

// ParseResponse parses head, a whole response head (HeadEnd bytes), into
// r, reusing r.Fields' memory. It reads what engines send: HTTP/1.1 or
// HTTP/1.0, a three-digit status, CRLF line ends; field names are
// tokens, values visible characters, spaces, tabs and obs-text; one
// Transfer-Encoding, chunked (ignored in HTTP/1.0). Differing
// Content-Lengths, other transfer codings, obs-fold and control characters
// are ErrHead. Where it
// accepts, fasthttp's client accepts with the same framing
// (FuzzResponseAgainstFasthttp).
func ParseResponse(head []byte, r *Response) error {
	*r = Response{Fields: r.Fields[:0], ContentLength: -2}
	line, rest, ok := cutLine(head, true)
	if !ok || len(line) < 12 || line[8] != ' ' {
		return fmt.Errorf("%w: bad status line", ErrHead)
	}
	switch string(line[:8]) {
	case "HTTP/1.1":
	case "HTTP/1.0":
		r.HTTP10 = true
	default:
		return fmt.Errorf("%w: bad status line", ErrHead)
	}
	for _, c := range line[9:12] {
		if c < '0' || c > '9' {
			return fmt.Errorf("%w: bad status code", ErrHead)
		}
		r.Status = r.Status*10 + int(c-'0')
	}
	if r.Status < 100 || len(line) > 12 && line[12] != ' ' {
		return fmt.Errorf("%w: bad status code", ErrHead)
	}
	for _, c := range line[12:] {
		if c < ' ' && c != '\t' || c == 0x7f {
			return fmt.Errorf("%w: control character in the reason phrase", ErrHead)
		}
	}
	var err error
	if rest, err = parseFields(rest, len(head)-len(rest), &r.Fields); err != nil {
		return err
	}
	if len(rest) != 0 {
		return fmt.Errorf("%w: bytes after the head", ErrHead)
	}
	cl, te, keepAlive := int64(-1), false, false
	for i := range r.Fields {
		f := &r.Fields[i]
		switch {
		case equalFold(f.Name, "Content-Length"):
			n := parseDigits(f.Value)
			if n < 0 || cl >= 0 && n != cl {
				return fmt.Errorf("%w: bad or conflicting Content-Length", ErrHead)
			}
			cl = n
		case equalFold(f.Name, "Transfer-Encoding"):
			// fasthttp's client reads one Transfer-Encoding, chunked,
			// and ignores it in HTTP/1.0.
			if r.HTTP10 {
				continue
			}
			if te || !equalFold(f.Value, "chunked") {
				return fmt.Errorf("%w: unsupported Transfer-Encoding", ErrHead)
			}
			te = true
			r.ContentLength = -1
		case equalFold(f.Name, "Connection"):
			r.Close = r.Close || hasToken(f.Value, "close")
			keepAlive = keepAlive || hasToken(f.Value, "keep-alive")
		case equalFold(f.Name, "Content-Type"):
			if r.ContentType == nil {
				r.ContentType = f.Value
			}
		}
	}
	if !te && cl >= 0 {
		r.ContentLength = cl
	}
	if r.HTTP10 && !keepAlive {
		r.Close = true
	}
	if r.ContentLength == -2 && r.Status >= 200 && r.Status != 204 && r.Status != 304 {
		// A body that ends with the connection: nothing can follow it.
		r.Close = true
	}
	return nil
}

// Peek is the value of the first field named name (any case), or nil.
func (r *Response) Peek(name []byte) []byte { return peek(r.Fields, name) }

func peek(fs []Field, name []byte) []byte {
	for i := range fs {
		if bytes.EqualFold(fs[i].Name, name) {
			return fs[i].Value
		}
	}
	return nil
}

// cutLine splits b at its first line end: CRLF, or with crlfOnly false a
// bare LF too (fasthttp's parsers want CRLF; so do both parsers here).
func cutLine(b []byte, crlfOnly bool) (line, rest []byte, ok bool) {
	i := bytes.IndexByte(b, '\n')
	if i < 0 {
		return nil, nil, false
	}
	line, rest = b[:i], b[i+1:]
	if n := len(line); n > 0 && line[n-1] == '\r' {
		return line[:n-1], rest, true
	}
	return line, rest, !crlfOnly
}

// parseFields parses field lines up to the empty line that ends a head,
// appending them to fs; b starts at offset off of the head. rest is what
// follows the empty line.
func parseFields(b []byte, off int, fs *[]Field) (rest []byte, err error) {
	for {
		line, r, ok := cutLine(b, true)
		if !ok {
			return nil, fmt.Errorf("%w: unterminated field line", ErrHead)
		}
		start, end := off, off+len(b)-len(r)
		off = end
		b = r
		if len(line) == 0 {
			return b, nil
		}
		if len(*fs) == MaxFields {
			return nil, fmt.Errorf("%w: over %d fields", ErrHead, MaxFields)
		}
		colon := bytes.IndexByte(line, ':')
		if colon <= 0 || !isToken(line[:colon]) {
			// No name, a name with other characters, or obs-fold (a line
			// starting with whitespace).
			return nil, fmt.Errorf("%w: bad field line", ErrHead)
		}
		v := trimOWS(line[colon+1:])
		for _, c := range v {
			if c < ' ' && c != '\t' || c == 0x7f {
				return nil, fmt.Errorf("%w: control character in a field value", ErrHead)
			}
		}
		*fs = append(*fs, Field{Name: line[:colon], Value: v, Start: start, End: end})
	}
}

func trimOWS(b []byte) []byte {
	for len(b) > 0 && (b[0] == ' ' || b[0] == '\t') {
		b = b[1:]
	}
	for len(b) > 0 && (b[len(b)-1] == ' ' || b[len(b)-1] == '\t') {
		b = b[:len(b)-1]
	}
	return b
}

// parseDigits is b as a decimal of 1 to maxDigits digits, or -1.
func parseDigits(b []byte) int64 {
	if len(b) == 0 || len(b) > maxDigits {
		return -1
	}
	var n int64
	for _, c := range b {
		if c < '0' || c > '9' {
			return -1
		}
		n = n*10 + int64(c-'0')
	}
	return n
}

// tchar is RFC 9110 §5.6.2's token character set.
var tchar = func() (t [256]bool) {
	for c := '0'; c <= '9'; c++ {
		t[c] = true
	}
	for c := 'a'; c <= 'z'; c++ {
		t[c], t[c-32] = true, true
	}
	for _, c := range "!#$%&'*+-.^_`|~" {
		t[c] = true
	}
	return t
}()

func isToken(b []byte) bool {
	if len(b) == 0 {
		return false
	}
	for _, c := range b {
		if !tchar[c] {
			return false
		}
	}
	return true
}

// equalFold reports whether b equals s, an ASCII name, in any case.
func equalFold(b []byte, s string) bool {
	if len(b) != len(s) {
		return false
	}
	for i := range len(b) {
		c := b[i]
		if 'A' <= c && c <= 'Z' {
			c += 'a' - 'A'
		}
		d := s[i]
		if 'A' <= d && d <= 'Z' {
			d += 'a' - 'A'
		}
		if c != d {
			return false
		}
	}
	return true
}

// hasToken reports whether the comma-separated list v holds tok (any case).
func hasToken(v []byte, tok string) bool {
	found := false
	Tokens(v, func(t []byte) bool {
		found = equalFold(t, tok)
		return !found
	})
	return found
}

// Tokens calls f with each non-empty element of the comma-separated list
// v, trimmed, until f returns false.
func Tokens(v []byte, f func(tok []byte) bool) {
	for len(v) > 0 {
		t := v
		if i := bytes.IndexByte(v, ','); i >= 0 {
			t, v = v[:i], v[i+1:]
		} else {
			v = nil
		}
		if t = trimOWS(t); len(t) > 0 && !f(t) {
			return
		}
	}
}

// LineEnd is the offset in the parsed head just past the request or status
// line (where the first field line starts).
func LineEnd(fs []Field, head []byte) int {
	if len(fs) > 0 {
		return fs[0].Start
	}
	return len(head) - 2 // only the blank line follows
}
