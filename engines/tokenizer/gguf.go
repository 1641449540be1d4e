package tokenizer

import (
	"bufio"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
)

// ErrGGUF classifies a file that is not a readable GGUF file (bad magic,
// unsupported version, truncated or oversized metadata).
var ErrGGUF = errors.New("tokenizer: malformed GGUF")

// GGUF metadata value types (the GGUF specification, ggml repository
// docs/gguf.md, "gguf_metadata_value_type").
const (
	ggufUint8 uint32 = iota
	ggufInt8
	ggufUint16
	ggufInt16
	ggufUint32
	ggufInt32
	ggufFloat32
	ggufBool
	ggufString
	ggufArray
	ggufUint64
	ggufInt64
	ggufFloat64
)

// Bounds on what the reader accepts: a vocabulary has at most a few hundred
// thousand entries and a chat template some kilobytes; anything larger is
// refused before it is allocated, so a hostile header cannot make the
// gateway allocate gigabytes.
const (
	ggufMaxKV       = 1 << 16
	ggufMaxArray    = 1 << 22
	ggufMaxString   = 1 << 22
	ggufMaxMetadata = 1 << 30 // bytes of strings and arrays in total
)

// ggufMeta is the key/value metadata of a GGUF file. Values are string,
// bool, int64 (all integer types), float64, []string, or []float64 (numeric
// arrays). Arrays of arrays are read and dropped.
type ggufMeta map[string]any

// readGGUFMeta reads the header and metadata of a GGUF file (versions 2 and
// 3) and stops before the tensor infos: a model file's gigabytes of weights
// are never read.
func readGGUFMeta(r io.Reader) (ggufMeta, error) {
	g := &ggufReader{r: bufio.NewReaderSize(r, 1<<16)}
	var magic [4]byte
	g.read(magic[:])
	if g.err == nil && string(magic[:]) != "GGUF" {
		return nil, fmt.Errorf("%w: bad magic %q", ErrGGUF, magic[:])
	}
	version := g.u32()
	if g.err == nil && version != 2 && version != 3 {
		return nil, fmt.Errorf("%w: version %d (2 and 3 are supported)", ErrGGUF, version)
	}
	_ = g.u64() // tensor count
	nkv := g.u64()
	if g.err != nil {
		return nil, g.err
	}
	if nkv > ggufMaxKV {
		return nil, fmt.Errorf("%w: %d metadata entries", ErrGGUF, nkv)
	}
	meta := make(ggufMeta, nkv)
	for i := uint64(0); i < nkv && g.err == nil; i++ {
		key := g.str()
		typ := g.u32()
		v := g.value(typ, 0)
		if g.err == nil && v != nil {
			meta[key] = v
		}
	}
	if g.err != nil {
		return nil, g.err
	}
	return meta, nil
}

type ggufReader struct {
	r      *bufio.Reader
	err    error
	budget int64 // bytes of strings and array elements read so far
	buf    [8]byte
}

func (g *ggufReader) fail(err error) {
	if g.err == nil {
		g.err = err
	}
}

func (g *ggufReader) read(p []byte) {
	if g.err != nil {
		return
	}
	if _, err := io.ReadFull(g.r, p); err != nil {
		g.fail(fmt.Errorf("%w: truncated: %w", ErrGGUF, err))
	}
}

func (g *ggufReader) u32() uint32 {
	g.read(g.buf[:4])
	if g.err != nil {
		return 0
	}
	return binary.LittleEndian.Uint32(g.buf[:4])
}

func (g *ggufReader) u64() uint64 {
	g.read(g.buf[:8])
	if g.err != nil {
		return 0
	}
	return binary.LittleEndian.Uint64(g.buf[:8])
}

func (g *ggufReader) charge(n uint64) bool {
	g.budget += int64(n)
	if n > ggufMaxMetadata || g.budget > ggufMaxMetadata {
		g.fail(fmt.Errorf("%w: metadata larger than %d bytes", ErrGGUF, ggufMaxMetadata))
		return false
	}
	return true
}

func (g *ggufReader) str() string {
	n := g.u64()
	if g.err != nil {
		return ""
	}
	if n > ggufMaxString {
		g.fail(fmt.Errorf("%w: string of %d bytes", ErrGGUF, n))
		return ""
	}
	if !g.charge(n) {
		return ""
	}
	b := make([]byte, n)
	g.read(b)
	return string(b)
}

// scalarSize is the encoded size of a fixed-size value type, 0 otherwise.
func scalarSize(typ uint32) int {
	switch typ {
	case ggufUint8, ggufInt8, ggufBool:
		return 1
	case ggufUint16, ggufInt16:
		return 2
	case ggufUint32, ggufInt32, ggufFloat32:
		return 4
	case ggufUint64, ggufInt64, ggufFloat64:
		return 8
	}
	return 0
}

// scalar decodes a fixed-size value from b (len(b) == scalarSize(typ)).
func scalar(typ uint32, b []byte) any {
	switch typ {
	case ggufUint8:
		return int64(b[0])
	case ggufInt8:
		return int64(int8(b[0]))
	case ggufBool:
		return b[0] != 0
	case ggufUint16:
		return int64(binary.LittleEndian.Uint16(b))
	case ggufInt16:
		return int64(int16(binary.LittleEndian.Uint16(b)))
	case ggufUint32:
		return int64(binary.LittleEndian.Uint32(b))
	case ggufInt32:
		return int64(int32(binary.LittleEndian.Uint32(b)))
	case ggufFloat32:
		return float64(math.Float32frombits(binary.LittleEndian.Uint32(b)))
	case ggufUint64:
		return int64(binary.LittleEndian.Uint64(b)) // ids and counts fit
	case ggufInt64:
		return int64(binary.LittleEndian.Uint64(b))
	case ggufFloat64:
		return math.Float64frombits(binary.LittleEndian.Uint64(b))
	}
	return nil
}

func (g *ggufReader) value(typ uint32, depth int) any {
	if g.err != nil {
		return nil
	}
	if n := scalarSize(typ); n > 0 {
		g.read(g.buf[:n])
		if g.err != nil {
			return nil
		}
		return scalar(typ, g.buf[:n])
	}
	switch typ {
	case ggufString:
		return g.str()
	case ggufArray:
		if depth > 2 {
			g.fail(fmt.Errorf("%w: arrays nested too deep", ErrGGUF))
			return nil
		}
		et := g.u32()
		n := g.u64()
		if g.err != nil {
			return nil
		}
		if n > ggufMaxArray {
			g.fail(fmt.Errorf("%w: array of %d elements", ErrGGUF, n))
			return nil
		}
		if es := scalarSize(et); es > 0 {
			if !g.charge(n * uint64(es)) {
				return nil
			}
			out := make([]float64, 0, n)
			for i := uint64(0); i < n && g.err == nil; i++ {
				g.read(g.buf[:es])
				if g.err != nil {
					return nil
				}
				switch v := scalar(et, g.buf[:es]).(type) {
				case int64:
					out = append(out, float64(v))
				case float64:
					out = append(out, v)
				case bool:
					out = append(out, map[bool]float64{false: 0, true: 1}[v])
				}
			}
			return out
		}
		switch et {
		case ggufString:
			if !g.charge(n * 8) {
				return nil
			}
			out := make([]string, 0, n)
			for i := uint64(0); i < n && g.err == nil; i++ {
				out = append(out, g.str())
			}
			return out
		case ggufArray:
			for i := uint64(0); i < n && g.err == nil; i++ {
				g.value(ggufArray, depth+1)
			}
			return nil
		}
	}
	g.fail(fmt.Errorf("%w: unknown value type %d", ErrGGUF, typ))
	return nil
}

func (m ggufMeta) str(key string) (string, bool) {
	v, ok := m[key].(string)
	return v, ok
}

func (m ggufMeta) int(key string) (int64, bool) {
	v, ok := m[key].(int64)
	return v, ok
}

func (m ggufMeta) bool(key string) (bool, bool) {
	v, ok := m[key].(bool)
	return v, ok
}

func (m ggufMeta) strings(key string) []string {
	v, _ := m[key].([]string)
	return v
}

func (m ggufMeta) floats(key string) []float64 {
	v, _ := m[key].([]float64)
	return v
}

func openGGUFMeta(path string) (ggufMeta, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("tokenizer: load %s: %w", path, err)
	}
	defer f.Close()
	meta, err := readGGUFMeta(f)
	if err != nil {
		return nil, fmt.Errorf("tokenizer: load %s: %w", path, err)
	}
	return meta, nil
}
