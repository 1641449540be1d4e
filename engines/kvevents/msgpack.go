package kvevents

// The msgpack primitives are hand-written rather than taken from
// github.com/vmihailenco/msgpack/v5. Its Encoder writes through an io.Writer
// and its Decoder reads through an io.Reader, one interface call per value,
// and its string/bytes decoders allocate; this package needs an append-style
// encoder into a caller's buffer, a decoder over a byte slice that allocates
// only for what it returns, exact control over which integer widths are
// accepted for hashes, and every length checked against the bytes actually
// left before anything is sized from it. The subset used (nil, bool, ints,
// floats, str, bin, array, map) is small enough to own.

import (
	"encoding/binary"
	"math"
)

// --- encoding -----------------------------------------------------------

func appendNil(b []byte) []byte { return append(b, 0xc0) }

// appendUint writes v in the smallest unsigned form, as msgspec does.
func appendUint(b []byte, v uint64) []byte {
	switch {
	case v < 0x80:
		return append(b, byte(v))
	case v <= math.MaxUint8:
		return append(b, 0xcc, byte(v))
	case v <= math.MaxUint16:
		return binary.BigEndian.AppendUint16(append(b, 0xcd), uint16(v))
	case v <= math.MaxUint32:
		return binary.BigEndian.AppendUint32(append(b, 0xce), uint32(v))
	}
	return binary.BigEndian.AppendUint64(append(b, 0xcf), v)
}

// appendInt writes v in the smallest form: unsigned forms for v >= 0,
// negative fixint or int8..int64 otherwise.
func appendInt(b []byte, v int64) []byte {
	switch {
	case v >= 0:
		return appendUint(b, uint64(v))
	case v >= -32:
		return append(b, byte(v))
	case v >= math.MinInt8:
		return append(b, 0xd0, byte(v))
	case v >= math.MinInt16:
		return binary.BigEndian.AppendUint16(append(b, 0xd1), uint16(v))
	case v >= math.MinInt32:
		return binary.BigEndian.AppendUint32(append(b, 0xd2), uint32(v))
	}
	return binary.BigEndian.AppendUint64(append(b, 0xd3), uint64(v))
}

func appendOptInt(b []byte, v *int64) []byte {
	if v == nil {
		return appendNil(b)
	}
	return appendInt(b, *v)
}

func appendFloat64(b []byte, f float64) []byte {
	return binary.BigEndian.AppendUint64(append(b, 0xcb), math.Float64bits(f))
}

func appendStr(b []byte, s string) []byte {
	n := len(s)
	switch {
	case n < 32:
		b = append(b, 0xa0|byte(n))
	case n <= math.MaxUint8:
		b = append(b, 0xd9, byte(n))
	case n <= math.MaxUint16:
		b = binary.BigEndian.AppendUint16(append(b, 0xda), uint16(n))
	default:
		b = binary.BigEndian.AppendUint32(append(b, 0xdb), uint32(n))
	}
	return append(b, s...)
}

func appendOptStr(b []byte, s *string) []byte {
	if s == nil {
		return appendNil(b)
	}
	return appendStr(b, *s)
}

func appendArrayHeader(b []byte, n int) []byte {
	switch {
	case n < 16:
		return append(b, 0x90|byte(n))
	case n <= math.MaxUint16:
		return binary.BigEndian.AppendUint16(append(b, 0xdc), uint16(n))
	}
	return binary.BigEndian.AppendUint32(append(b, 0xdd), uint32(n))
}

func appendMapHeader(b []byte, n int) []byte {
	switch {
	case n < 16:
		return append(b, 0x80|byte(n))
	case n <= math.MaxUint16:
		return binary.BigEndian.AppendUint16(append(b, 0xde), uint16(n))
	}
	return binary.BigEndian.AppendUint32(append(b, 0xdf), uint32(n))
}

// --- decoding -----------------------------------------------------------

// reader walks a msgpack byte slice. Every method reports failure with ok ==
// false and never reads past the end; callers turn that into ErrMalformed.
type reader struct {
	b []byte
	i int
}

func (r *reader) remaining() int { return len(r.b) - r.i }

func (r *reader) peek() (byte, bool) {
	if r.i >= len(r.b) {
		return 0, false
	}
	return r.b[r.i], true
}

func (r *reader) take(n int) ([]byte, bool) {
	if n < 0 || n > len(r.b)-r.i {
		return nil, false
	}
	s := r.b[r.i : r.i+n]
	r.i += n
	return s, true
}

func (r *reader) u8() (uint64, bool) {
	s, ok := r.take(1)
	if !ok {
		return 0, false
	}
	return uint64(s[0]), true
}

func (r *reader) u16() (uint64, bool) {
	s, ok := r.take(2)
	if !ok {
		return 0, false
	}
	return uint64(binary.BigEndian.Uint16(s)), true
}

func (r *reader) u32() (uint64, bool) {
	s, ok := r.take(4)
	if !ok {
		return 0, false
	}
	return uint64(binary.BigEndian.Uint32(s)), true
}

func (r *reader) u64() (uint64, bool) {
	s, ok := r.take(8)
	if !ok {
		return 0, false
	}
	return binary.BigEndian.Uint64(s), true
}

// isNil consumes a nil and reports whether there was one.
func (r *reader) isNil() bool {
	if c, ok := r.peek(); ok && c == 0xc0 {
		r.i++
		return true
	}
	return false
}

// lenFor turns a declared element count into an int after checking that the
// remaining input could hold that many values of at least minSize bytes
// each. This is what keeps a hostile header from sizing an allocation.
func (r *reader) lenFor(n uint64, minSize int) (int, bool) {
	if n > uint64(r.remaining()/minSize) {
		return 0, false
	}
	return int(n), true
}

// arrayLen reads an array header.
func (r *reader) arrayLen() (int, bool) { return r.containerLen(0x90, 0xdc, 0xdd, 1) }

// mapLen reads a map header (the number of key/value pairs).
func (r *reader) mapLen() (int, bool) { return r.containerLen(0x80, 0xde, 0xdf, 2) }

// containerLen reads an array or map header: fix is the fixarray/fixmap
// high nibble, c16 and c32 the 16- and 32-bit header codes, per the values
// per entry (bounding the length by the bytes left, see lenFor).
func (r *reader) containerLen(fix, c16, c32 byte, per int) (int, bool) {
	c, ok := r.peek()
	if !ok {
		return 0, false
	}
	var n uint64
	switch {
	case c&0xf0 == fix:
		r.i++
		n = uint64(c & 0x0f)
	case c == c16:
		r.i++
		n, ok = r.u16()
	case c == c32:
		r.i++
		n, ok = r.u32()
	default:
		return 0, false
	}
	if !ok {
		return 0, false
	}
	return r.lenFor(n, per)
}

// str reads a str value and returns its bytes, aliasing the input.
func (r *reader) str() ([]byte, bool) {
	c, ok := r.peek()
	if !ok {
		return nil, false
	}
	var n uint64
	switch {
	case c&0xe0 == 0xa0:
		r.i++
		n = uint64(c & 0x1f)
	case c == 0xd9:
		r.i++
		n, ok = r.u8()
	case c == 0xda:
		r.i++
		n, ok = r.u16()
	case c == 0xdb:
		r.i++
		n, ok = r.u32()
	default:
		return nil, false
	}
	if !ok || n > uint64(r.remaining()) {
		return nil, false
	}
	return r.take(int(n))
}

// bin reads a bin value and returns its bytes, aliasing the input.
func (r *reader) bin() ([]byte, bool) {
	c, ok := r.peek()
	if !ok {
		return nil, false
	}
	var n uint64
	switch c {
	case 0xc4:
		r.i++
		n, ok = r.u8()
	case 0xc5:
		r.i++
		n, ok = r.u16()
	case 0xc6:
		r.i++
		n, ok = r.u32()
	default:
		return nil, false
	}
	if !ok || n > uint64(r.remaining()) {
		return nil, false
	}
	return r.take(int(n))
}

// integer reads any msgpack integer. Signed values come back as their
// two's-complement bit pattern with neg set when negative.
func (r *reader) integer() (v uint64, neg, ok bool) {
	c, ok := r.peek()
	if !ok {
		return 0, false, false
	}
	switch {
	case c < 0x80:
		r.i++
		return uint64(c), false, true
	case c >= 0xe0:
		r.i++
		return uint64(int64(int8(c))), true, true
	}
	r.i++
	switch c {
	case 0xcc:
		v, ok = r.u8()
	case 0xcd:
		v, ok = r.u16()
	case 0xce:
		v, ok = r.u32()
	case 0xcf:
		v, ok = r.u64()
	case 0xd0:
		v, ok = r.u8()
		v = uint64(int64(int8(v)))
	case 0xd1:
		v, ok = r.u16()
		v = uint64(int64(int16(v)))
	case 0xd2:
		v, ok = r.u32()
		v = uint64(int64(int32(v)))
	case 0xd3:
		v, ok = r.u64()
	default:
		r.i--
		return 0, false, false
	}
	if !ok {
		return 0, false, false
	}
	switch c {
	case 0xd0, 0xd1, 0xd2, 0xd3:
		neg = int64(v) < 0
	}
	return v, neg, true
}

// float reads a float32 or float64.
func (r *reader) float() (float64, bool) {
	c, ok := r.peek()
	if !ok {
		return 0, false
	}
	switch c {
	case 0xca:
		r.i++
		v, ok := r.u32()
		return float64(math.Float32frombits(uint32(v))), ok
	case 0xcb:
		r.i++
		v, ok := r.u64()
		return math.Float64frombits(v), ok
	}
	return 0, false
}

// number reads a float or an integer as float64 (for ts).
func (r *reader) number() (float64, bool) {
	if f, ok := r.float(); ok {
		return f, true
	}
	v, neg, ok := r.integer()
	if !ok {
		return 0, false
	}
	if neg {
		return float64(int64(v)), true
	}
	return float64(v), true
}

// int64Val reads an integer that must fit int64.
func (r *reader) int64Val() (int64, bool) {
	v, neg, ok := r.integer()
	if !ok || (!neg && v > math.MaxInt64) {
		return 0, false
	}
	return int64(v), true
}

// hash reads a block hash in any of the forms engines publish: unsigned or
// signed integers of any width (the bit pattern is kept), a float64 holding
// an integral value (accepted by the gateway reference), or bytes (the raw
// digest when VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES=0; vLLM's integer form is
// int.from_bytes(digest, "big") mod 2^64, i.e. the last 8 bytes).
func (r *reader) hash() (uint64, bool) {
	c, ok := r.peek()
	if !ok {
		return 0, false
	}
	switch c {
	case 0xc4, 0xc5, 0xc6:
		b, ok := r.bin()
		if !ok {
			return 0, false
		}
		if len(b) > 8 {
			b = b[len(b)-8:]
		}
		var v uint64
		for _, x := range b {
			v = v<<8 | uint64(x)
		}
		return v, true
	case 0xca, 0xcb:
		f, ok := r.float()
		if !ok || f != math.Trunc(f) || f < math.MinInt64 || f >= 1<<64 {
			return 0, false // also rejects NaN and ±Inf
		}
		if f < 0 {
			return uint64(int64(f)), true
		}
		return uint64(f), true
	}
	v, _, ok := r.integer()
	return v, ok
}

// skip consumes one complete value of any type, iteratively so that deep
// nesting cannot exhaust the stack. Extension types are accepted and skipped.
func (r *reader) skip() bool {
	pending := 1
	for pending > 0 {
		pending--
		c, ok := r.peek()
		if !ok {
			return false
		}
		var n uint64 // payload bytes to skip
		var items uint64
		r.i++
		switch {
		case c < 0x80, c >= 0xe0, c == 0xc0, c == 0xc2, c == 0xc3:
		case c&0xf0 == 0x80:
			items = 2 * uint64(c&0x0f)
		case c&0xf0 == 0x90:
			items = uint64(c & 0x0f)
		case c&0xe0 == 0xa0:
			n = uint64(c & 0x1f)
		default:
			switch c {
			case 0xcc, 0xd0:
				n = 1
			case 0xcd, 0xd1:
				n = 2
			case 0xca, 0xce, 0xd2:
				n = 4
			case 0xcb, 0xcf, 0xd3:
				n = 8
			case 0xd4:
				n = 2
			case 0xd5:
				n = 3
			case 0xd6:
				n = 5
			case 0xd7:
				n = 9
			case 0xd8:
				n = 17
			case 0xc4, 0xd9:
				n, ok = r.u8()
			case 0xc5, 0xda:
				n, ok = r.u16()
			case 0xc6, 0xdb:
				n, ok = r.u32()
			case 0xc7:
				n, ok = r.u8()
				n++ // type byte
			case 0xc8:
				n, ok = r.u16()
				n++
			case 0xc9:
				n, ok = r.u32()
				n++
			case 0xdc:
				items, ok = r.u16()
			case 0xdd:
				items, ok = r.u32()
			case 0xde:
				items, ok = r.u16()
				items *= 2
			case 0xdf:
				items, ok = r.u32()
				items *= 2
			default: // 0xc1 is never used
				return false
			}
			if !ok {
				return false
			}
		}
		if n > uint64(r.remaining()) || items > uint64(r.remaining()) {
			return false
		}
		r.i += int(n)
		pending += int(items)
	}
	return true
}
