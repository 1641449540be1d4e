// Package h1 holds incremental HTTP/1.1 framing for the gateway's event
// loop, which cannot block on a reader: the end of a message head in a
// buffer, and a chunked body decoded from whatever bytes have arrived.
// Everything here parses untrusted bytes (workers' answers) and has fuzz
// targets.
package h1

import (
	"bytes"
	"errors"
	"fmt"
)

// HeadEnd returns the length of the message head at the start of b, its
// ending blank line included, or 0 when b does not hold a whole head yet.
// A head ends at the first CRLF CRLF; a bare LF LF ends one too, as
// fasthttp's parser accepts it (the gateway's planes must agree on where a
// head ends: the parse itself is fasthttp's).
func HeadEnd(b []byte) int {
	for i := 0; ; {
		j := bytes.IndexByte(b[i:], '\n')
		if j < 0 {
			return 0
		}
		i += j + 1
		switch {
		case i < len(b) && b[i] == '\n':
			return i + 1
		case i+1 < len(b) && b[i] == '\r' && b[i+1] == '\n':
			return i + 2
		case i >= len(b) || i+1 >= len(b) && b[i] == '\r':
			return 0
		}
	}
}

// ErrBrokenChunk: the chunked framing is malformed.
var ErrBrokenChunk = errors.New("h1: malformed chunked encoding")

// Limits of the chunked framing the decoder accepts.
const (
	// MaxChunkLine bounds a chunk-size line with its extensions.
	MaxChunkLine = 4096
	// MaxTrailer bounds the trailer section.
	MaxTrailer    = 16 << 10
	maxSizeDigits = 15 // a chunk of up to 2^60-1 bytes
)

type chunkState uint8

const (
	stSize      chunkState = iota // hex digits of a chunk size
	stSizeOWS                     // whitespace after the size
	stExt                         // a chunk extension, up to CR
	stSizeLF                      // the LF after the size line's CR
	stData                        // chunk data
	stDataCR                      // the CR after chunk data
	stDataLF                      // the LF after it
	stTrailer                     // a trailer line (or the final CRLF)
	stTrailerLF                   // the LF ending a trailer line
	stDone
)

// Chunked decodes one chunked body (RFC 9112 §7.1) incrementally: feed it
// bytes as they arrive, take the data it finds. The grammar is fasthttp's
// (the goroutine plane's reader): hex size, optional whitespace, optional
// extensions (";" not after whitespace, no LF inside), CRLF, data, CRLF;
// size 0 ends the data, then trailer lines up to an empty line. Extensions
// and trailers are dropped. The zero value is ready to decode.
type Chunked struct {
	st      chunkState
	size    uint64 // chunk size being read, or data left in the chunk
	digits  int
	line    int  // bytes of the current size or trailer line
	trailer int  // bytes of the trailer section
	empty   bool // the current trailer line has no bytes yet
}

// Done reports whether the terminating chunk and trailer were decoded.
func (c *Chunked) Done() bool { return c.st == stDone }

// Next decodes from in: it returns the next run of data (a sub-slice of
// in, possibly empty) and how many bytes of in it consumed, framing
// included. It consumes nothing after the body's end. A caller loops while
// consumed < len(in) and the body is not Done. An error is final.
func (c *Chunked) Next(in []byte) (data []byte, consumed int, err error) {
	i := 0
	for i < len(in) {
		b := in[i]
		switch c.st {
		case stSize:
			v, ok := hexVal(b)
			switch {
			case ok:
				if c.digits == maxSizeDigits {
					return nil, i, fmt.Errorf("%w: chunk size over %d hex digits", ErrBrokenChunk, maxSizeDigits)
				}
				c.size = c.size<<4 | uint64(v)
				c.digits++
			case c.digits == 0:
				return nil, i, fmt.Errorf("%w: chunk size expected, found %q", ErrBrokenChunk, b)
			case b == ' ' || b == '\t':
				c.st = stSizeOWS
			case b == ';':
				c.st = stExt
			case b == '\r':
				c.st = stSizeLF
			default:
				return nil, i, fmt.Errorf("%w: invalid character %q after chunk size", ErrBrokenChunk, b)
			}
		case stSizeOWS:
			switch b {
			case ' ', '\t':
			case '\r':
				c.st = stSizeLF
			default:
				return nil, i, fmt.Errorf("%w: invalid character %q after chunk size", ErrBrokenChunk, b)
			}
		case stExt:
			switch b {
			case '\r':
				c.st = stSizeLF
			case '\n':
				return nil, i, fmt.Errorf("%w: LF inside a chunk extension", ErrBrokenChunk)
			}
		case stSizeLF:
			if b != '\n' {
				return nil, i, fmt.Errorf("%w: %q after the chunk size line's CR", ErrBrokenChunk, b)
			}
			c.line, c.digits = 0, 0
			if c.size == 0 {
				c.st, c.empty = stTrailer, true
			} else {
				c.st = stData
			}
			i++
			continue
		case stData:
			n := uint64(len(in) - i)
			if n > c.size {
				n = c.size
			}
			data = in[i : i+int(n)]
			c.size -= n
			i += int(n)
			if c.size == 0 {
				c.st = stDataCR
			}
			return data, i, nil
		case stDataCR:
			if b != '\r' {
				return nil, i, fmt.Errorf("%w: %q after chunk data, want CR", ErrBrokenChunk, b)
			}
			c.st = stDataLF
		case stDataLF:
			if b != '\n' {
				return nil, i, fmt.Errorf("%w: %q after chunk data's CR", ErrBrokenChunk, b)
			}
			c.st = stSize
			i++
			continue
		case stTrailer:
			c.trailer++
			if c.trailer > MaxTrailer {
				return nil, i, fmt.Errorf("%w: trailer over %d bytes", ErrBrokenChunk, MaxTrailer)
			}
			switch b {
			case '\r':
				c.st = stTrailerLF
			case '\n':
				return nil, i, fmt.Errorf("%w: bare LF in the trailer", ErrBrokenChunk)
			default:
				c.empty = false
			}
			i++
			continue
		case stTrailerLF:
			c.trailer++
			if b != '\n' {
				return nil, i, fmt.Errorf("%w: %q after a trailer line's CR", ErrBrokenChunk, b)
			}
			i++
			if c.empty {
				c.st = stDone
				return nil, i, nil
			}
			c.st, c.empty = stTrailer, true
			continue
		case stDone:
			return nil, i, nil
		}
		i++
		c.line++
		if c.line > MaxChunkLine {
			return nil, i, fmt.Errorf("%w: chunk size line over %d bytes", ErrBrokenChunk, MaxChunkLine)
		}
	}
	return nil, i, nil
}

func hexVal(b byte) (byte, bool) {
	switch {
	case '0' <= b && b <= '9':
		return b - '0', true
	case 'a' <= b && b <= 'f':
		return b - 'a' + 10, true
	case 'A' <= b && b <= 'F':
		return b - 'A' + 10, true
	}
	return 0, false
}
