//go:build linux

package gateway

import (
	"bytes"
	"strconv"
	"time"

	"github.com/valyala/fasthttp"

	"github.com/llmgw/llmgw/internal/h1"
)

// The loop plane's heads, written directly from the parsed fields (the
// goroutine plane's equivalents go through fasthttp's header types:
// appendUpstreamHead, copyAnswerHeaders, writeError). The rules are the
// same: connection-scoped fields (hopHeaders and every field a Connection
// field names, RFC 9110 §7.6.1) never cross the gateway, the gateway owns
// X-Request-Id, Host and the framing. Field names go as they came (HTTP
// field names are case-insensitive; the goroutine plane's fasthttp
// normalises their case).

var strDate = []byte("Date")

// appendUpstreamFields appends the worker's request head for req (parsed
// from head), up to but not including its ending blank line (roundTrip's
// contract: the caller appends it, or Connection: close and it): req's
// method and target, the gateway's HTTP/1.1, Host: host, req's field lines
// but the connection-scoped ones, Host, Content-Length and X-Request-Id,
// then X-Request-Id: id and, unless bodyless (GET, HEAD), the length of
// the body sent.
func appendUpstreamFields(dst []byte, head []byte, req *h1.Request, host string, id []byte, bodyLen int, bodyless bool) []byte {
	dst = append(dst, req.Method...)
	dst = append(dst, ' ')
	dst = append(dst, req.Target...)
	dst = append(dst, " HTTP/1.1\r\nHost: "...)
	dst = append(dst, host...)
	dst = append(dst, '\r', '\n')
	var scratch [4][]byte
	conn := connectionValues(req.Fields, scratch[:0])
	dst = appendKept(dst, head, req.Fields, conn, dropToWorker)
	dst = appendField(dst, hdrRequestID, id)
	if !bodyless {
		dst = append(dst, "Content-Length: "...)
		dst = strconv.AppendInt(dst, int64(bodyLen), 10)
		dst = append(dst, '\r', '\n')
	}
	return dst
}

// Field classes: what a field name is to the gateway (fieldClass).
const (
	fHop       = 1 << iota // connection-scoped (hopHeaders)
	fHost                  // Host
	fLength                // Content-Length
	fRequestID             // X-Request-Id
	fDate                  // Date

	// dropToWorker: fields the worker's request does not take from the
	// client's (the gateway writes its own Host, length and id).
	dropToWorker = fHop | fHost | fLength | fRequestID
	// dropToClient: fields the client's answer does not take from the
	// worker's (the gateway writes its own id, framing and Date).
	dropToClient = fHop | fLength | fRequestID | fDate
)

// fieldClass classifies a field name in one switch on its length.
func fieldClass(k []byte) int {
	switch len(k) {
	case 4:
		switch {
		case bytes.EqualFold(k, strHost):
			return fHost
		case bytes.EqualFold(k, strDate):
			return fDate
		}
	case 12:
		if bytes.EqualFold(k, hdrRequestID) {
			return fRequestID
		}
	case 14:
		if bytes.EqualFold(k, strContentLength) {
			return fLength
		}
	}
	if isHopHeader(k) {
		return fHop
	}
	return 0
}

// appendKept appends the field lines of fs (parsed from head) that drop
// does not name and no Connection value conn names, copying runs of
// adjacent kept lines in one piece, as they came.
func appendKept(dst, head []byte, fs []h1.Field, conn [][]byte, drop int) []byte {
	run := -1 // start of the run of kept lines not yet copied
	for i := range fs {
		f := &fs[i]
		if fieldClass(f.Name)&drop == 0 && (len(conn) == 0 || !namedIn(conn, f.Name)) {
			if run < 0 {
				run = f.Start
			}
			continue
		}
		if run >= 0 {
			dst = append(dst, head[run:f.Start]...)
			run = -1
		}
	}
	if run >= 0 {
		dst = append(dst, head[run:fs[len(fs)-1].End]...)
	}
	return dst
}

// connectionValues appends to dst the values of the Connection fields of
// fs that name other fields (see connectionTokens), and returns it.
func connectionValues(fs []h1.Field, dst [][]byte) [][]byte {
	for _, f := range fs {
		if bytes.EqualFold(f.Name, fasthttpConnection) && namesHeaders(f.Value) {
			dst = append(dst, f.Value)
		}
	}
	return dst
}

var fasthttpConnection = []byte(fasthttp.HeaderConnection)

// namedIn reports whether one of the Connection values conn names field k.
func namedIn(conn [][]byte, k []byte) bool {
	for _, v := range conn {
		if connectionNames(v, k) {
			return true
		}
	}
	return false
}

// appendStatusLine appends HTTP/1.1's status line for status, with the
// standard reason phrase (fasthttp's, as the goroutine plane writes it).
func appendStatusLine(dst []byte, status int) []byte {
	dst = append(dst, "HTTP/1.1 "...)
	dst = strconv.AppendInt(dst, int64(status), 10)
	dst = append(dst, ' ')
	dst = append(dst, fasthttp.StatusMessage(status)...)
	return append(dst, '\r', '\n')
}

func appendField(dst, name, value []byte) []byte {
	dst = append(dst, name...)
	dst = append(dst, ':', ' ')
	dst = append(dst, value...)
	return append(dst, '\r', '\n')
}

func appendFieldString(dst []byte, name, value string) []byte {
	dst = append(dst, name...)
	dst = append(dst, ':', ' ')
	dst = append(dst, value...)
	return append(dst, '\r', '\n')
}

// dateLine is the gateway's Date field line, made again when the loop's
// clock has passed the second it names.
func (pl *planeLoop) dateLine() []byte {
	now := pl.l.Now()
	if pl.dateAt == 0 || now-pl.dateAt >= int64(time.Second) || now < pl.dateAt {
		t := pl.l.Wall(now).Truncate(time.Second)
		pl.dateAt = now - int64(pl.l.Wall(now).Sub(t))
		pl.date = append(pl.date[:0], "Date: "...)
		pl.date = fasthttp.AppendHTTPDate(pl.date, t)
		pl.date = append(pl.date, '\r', '\n')
	}
	return pl.date
}

// errorAnswer is the loop plane's answer to the gateway's own error (as
// writeError's): its head in pl.head and its OpenAI error body.
func (pl *planeLoop) errorAnswer(err error, id []byte, closeConn bool) (head, body []byte) {
	status, body := errorJSON(err)
	b := appendStatusLine(pl.head[:0], status)
	b = append(b, pl.dateLine()...)
	b = append(b, "Content-Type: application/json\r\nContent-Length: "...)
	b = strconv.AppendInt(b, int64(len(body)), 10)
	b = append(b, '\r', '\n')
	b = appendField(b, hdrRequestID, id)
	if closeConn {
		b = append(b, "Connection: close\r\n"...)
	}
	pl.head = append(b, '\r', '\n')
	return pl.head, body
}
