package sim

import (
	"strconv"
	"unicode/utf8"
)

// jw appends compact JSON to a byte slice in exactly the key order the
// caller writes, which is what golden-byte conformance needs (encoding/json
// would sort map keys and cannot mirror each engine's field order without a
// struct per engine and version). Commas are inserted automatically.
type jw struct {
	b []byte
	// comma[i] reports whether the container at depth i already holds a value.
	comma []bool
	// skip suppresses the comma before the value that follows a key.
	skip bool
}

func (w *jw) sep() {
	if w.skip {
		w.skip = false
		return
	}
	if n := len(w.comma); n > 0 {
		if w.comma[n-1] {
			w.b = append(w.b, ',')
		}
		w.comma[n-1] = true
	}
}

func (w *jw) open(c byte) *jw {
	w.sep()
	w.b = append(w.b, c)
	w.comma = append(w.comma, false)
	return w
}

func (w *jw) close(c byte) *jw {
	w.b = append(w.b, c)
	w.comma = w.comma[:len(w.comma)-1]
	return w
}

func (w *jw) obj() *jw  { return w.open('{') }
func (w *jw) end() *jw  { return w.close('}') }
func (w *jw) arr() *jw  { return w.open('[') }
func (w *jw) aend() *jw { return w.close(']') }

// key writes an object key; the next value call writes its value.
func (w *jw) key(k string) *jw {
	w.sep()
	w.b = appendJSONString(w.b, k)
	w.b = append(w.b, ':')
	w.skip = true
	return w
}

func (w *jw) str(s string) *jw {
	w.sep()
	w.b = appendJSONString(w.b, s)
	return w
}

func (w *jw) int(v int64) *jw {
	w.sep()
	w.b = strconv.AppendInt(w.b, v, 10)
	return w
}

func (w *jw) uint(v uint64) *jw {
	w.sep()
	w.b = strconv.AppendUint(w.b, v, 10)
	return w
}

func (w *jw) float(v float64) *jw {
	w.sep()
	w.b = strconv.AppendFloat(w.b, v, 'f', -1, 64)
	return w
}

func (w *jw) bool(v bool) *jw {
	w.sep()
	w.b = strconv.AppendBool(w.b, v)
	return w
}

func (w *jw) null() *jw {
	w.sep()
	w.b = append(w.b, "null"...)
	return w
}

// raw writes pre-encoded JSON (which must be valid) as one value.
func (w *jw) raw(v []byte) *jw {
	w.sep()
	w.b = append(w.b, v...)
	return w
}

func (w *jw) ints(v []uint32) *jw {
	w.arr()
	for _, x := range v {
		w.uint(uint64(x))
	}
	return w.aend()
}

// Key/value shorthands.
func (w *jw) kstr(k, v string) *jw { return w.key(k).str(v) }
func (w *jw) kint(k string, v int64) *jw {
	return w.key(k).int(v)
}
func (w *jw) knull(k string) *jw         { return w.key(k).null() }
func (w *jw) kbool(k string, v bool) *jw { return w.key(k).bool(v) }

// appendJSONString appends s as a JSON string the way Python's json.dumps
// with ensure_ascii=False (and orjson/pydantic) does: only '"', '\\' and
// control characters are escaped; invalid UTF-8 becomes U+FFFD.
func appendJSONString(b []byte, s string) []byte {
	const hex = "0123456789abcdef"
	b = append(b, '"')
	start := 0
	for i := 0; i < len(s); {
		c := s[i]
		if c < utf8.RuneSelf {
			if c >= 0x20 && c != '"' && c != '\\' {
				i++
				continue
			}
			b = append(b, s[start:i]...)
			switch c {
			case '"', '\\':
				b = append(b, '\\', c)
			case '\n':
				b = append(b, '\\', 'n')
			case '\r':
				b = append(b, '\\', 'r')
			case '\t':
				b = append(b, '\\', 't')
			case '\b':
				b = append(b, '\\', 'b')
			case '\f':
				b = append(b, '\\', 'f')
			default:
				b = append(b, '\\', 'u', '0', '0', hex[c>>4], hex[c&0xf])
			}
			i++
			start = i
			continue
		}
		r, size := utf8.DecodeRuneInString(s[i:])
		if r == utf8.RuneError && size == 1 {
			b = append(b, s[start:i]...)
			b = append(b, "\ufffd"...)
			i++
			start = i
			continue
		}
		i += size
	}
	b = append(b, s[start:]...)
	return append(b, '"')
}
