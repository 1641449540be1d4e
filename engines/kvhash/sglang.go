package kvhash

import (
	"crypto/sha256"
	"encoding/binary"
	"slices"
)

// SGLangPageHash returns SGLang's digest of one page: SHA-256 over prior (the
// previous page's full 32-byte digest; nil or empty for the first page under
// the root) followed by each token as a 4-byte little-endian integer. tokens
// may be a partial page: SGLang emits its trailing partial page with this same
// function.
func SGLangPageHash(prior []byte, tokens []uint32) [32]byte {
	h := sha256.New()
	h.Write(prior)
	var b [4]byte
	for _, t := range tokens {
		binary.LittleEndian.PutUint32(b[:], t)
		h.Write(b[:])
	}
	var out [32]byte
	h.Sum(out[:0])
	return out
}

// SGLangKey returns the event integer SGLang publishes for a page digest: the
// first 8 bytes big-endian, as a signed int64.
func SGLangKey(digest [32]byte) int64 {
	return int64(binary.BigEndian.Uint64(digest[:8]))
}

// sglangHasher implements Hasher for sha256_sglang and blockhash_trtllm (the
// gateway's TRT routing key is the same chain). Immutable after New, hence
// safe for concurrent use.
type sglangHasher struct {
	algo      Algo
	blockSize int
}

func (h *sglangHasher) Algo() Algo     { return h.algo }
func (h *sglangHasher) BlockSize() int { return h.blockSize }

func (h *sglangHasher) BlockKeys(dst []uint64, tokens []uint32) []uint64 {
	n := len(tokens) / h.blockSize
	if n == 0 {
		return dst
	}
	dst = slices.Grow(dst, n)
	need := 32 + 4*h.blockSize

	var stack [stackScratch]byte
	var buf []byte
	if need <= len(stack) {
		buf = stack[:need]
	} else {
		p := scratchPool.Get().(*[]byte)
		if cap(*p) < need {
			*p = make([]byte, 0, need)
		}
		buf = (*p)[:need]
		defer scratchPool.Put(p)
	}

	// The message is [prior digest | tokens]; the first page has no prior, so
	// it is hashed from offset 32.
	start := 32
	for i := range n {
		block := tokens[i*h.blockSize : (i+1)*h.blockSize]
		for j, t := range block {
			binary.LittleEndian.PutUint32(buf[32+4*j:], t)
		}
		d := sha256.Sum256(buf[start:])
		copy(buf[:32], d[:])
		start = 0
		dst = append(dst, binary.BigEndian.Uint64(d[:8]))
	}
	return dst
}
