package kvhash

import (
	"crypto/sha256"
	"encoding/binary"
	"fmt"
	"slices"
	"sync"

	"github.com/zeebo/xxh3"
)

// maxSeedLen is the longest seed that fits a one-byte CBOR text header. The
// gateway reference hashes only such seeds and falls back to a zero root
// otherwise; see New.
const maxSeedLen = 23

// NoneHash returns vLLM's root digest (NONE_HASH) for algo and seed: the hash
// of the canonical CBOR text string seed (32 bytes for sha256_cbor, 16 for
// xxhash_cbor). An empty seed or one longer than 23 bytes gives all zeros, as
// described on New. It returns nil for algorithms without a root (the SGLang
// and TRT-LLM chains) and for unknown ones. The result is a fresh slice.
func NoneHash(algo Algo, seed string) []byte {
	if algo != SHA256CBOR && algo != XXHashCBOR {
		return nil
	}
	out := make([]byte, algo.DigestSize())
	if seed == "" || len(seed) > maxSeedLen {
		return out
	}
	// CBOR major type 3 (text string) with the length in the low 5 bits.
	enc := make([]byte, 0, 1+len(seed))
	enc = append(enc, 0x60|byte(len(seed)))
	enc = append(enc, seed...)
	digestInto(algo, out, enc)
	return out
}

// VLLMBlockHash returns the full digest vLLM computes for one block: the hash
// of canonical CBOR [parent, tokens, null]. parent must be a full digest of
// the algorithm's size (use NoneHash for the first block). Unlike BlockKeys,
// tokens may be any length, so callers can reproduce per-block evidence. The
// result is a fresh slice.
func VLLMBlockHash(algo Algo, parent []byte, tokens []uint32) ([]byte, error) {
	if algo != SHA256CBOR && algo != XXHashCBOR {
		return nil, fmt.Errorf("kvhash: %q is not a vLLM CBOR algorithm", algo)
	}
	if len(parent) != algo.DigestSize() {
		return nil, fmt.Errorf("kvhash: parent digest is %d bytes, %s needs %d", len(parent), algo, algo.DigestSize())
	}
	buf := appendBlockCBOR(make([]byte, 0, cborSize(len(parent), len(tokens))), parent, tokens)
	out := make([]byte, algo.DigestSize())
	digestInto(algo, out, buf)
	return out, nil
}

// VLLMBlockCBOR appends the canonical CBOR input vLLM hashes for one block
// ([parent, tokens, null], no extra keys) to dst. It exists for tests and
// evidence: the fixtures pin these bytes.
func VLLMBlockCBOR(dst, parent []byte, tokens []uint32) []byte {
	return appendBlockCBOR(dst, parent, tokens)
}

// vllmHasher implements Hasher for sha256_cbor and xxhash_cbor. It is
// immutable after New, hence safe for concurrent use.
type vllmHasher struct {
	algo      Algo
	blockSize int
	root      [32]byte // first DigestSize() bytes used
}

func (h *vllmHasher) Algo() Algo     { return h.algo }
func (h *vllmHasher) BlockSize() int { return h.blockSize }

// stackScratch covers the CBOR of blocks up to ~400 tokens without touching
// the heap; larger blocks borrow a buffer from scratchPool.
const stackScratch = 2048

var scratchPool = sync.Pool{New: func() any { b := make([]byte, 0, 8192); return &b }}

func (h *vllmHasher) BlockKeys(dst []uint64, tokens []uint32) []uint64 {
	n := len(tokens) / h.blockSize
	if n == 0 {
		return dst
	}
	dst = slices.Grow(dst, n)
	size := h.algo.DigestSize()
	need := cborSize(size, h.blockSize)

	var stack [stackScratch]byte
	var buf []byte
	if need <= len(stack) {
		buf = stack[:0]
	} else {
		p := scratchPool.Get().(*[]byte)
		if cap(*p) < need {
			*p = make([]byte, 0, need)
		}
		buf = (*p)[:0]
		defer scratchPool.Put(p)
	}

	var parent [32]byte
	copy(parent[:], h.root[:size])
	for i := range n {
		block := tokens[i*h.blockSize : (i+1)*h.blockSize]
		buf = appendBlockCBOR(buf[:0], parent[:size], block)
		digestInto(h.algo, parent[:size], buf)
		dst = append(dst, binary.BigEndian.Uint64(parent[size-8:size]))
	}
	return dst
}

// digestInto hashes msg with algo's function and writes the digest to out,
// which must be algo.DigestSize() bytes. xxhash_cbor is XXH3-128 in canonical
// (big-endian, high half first) form, as python-xxhash's xxh3_128_digest.
func digestInto(algo Algo, out, msg []byte) {
	if algo == XXHashCBOR {
		d := xxh3.Hash128(msg).Bytes()
		copy(out, d[:])
		return
	}
	d := sha256.Sum256(msg)
	copy(out, d[:])
}

// cborSize is an upper bound on the CBOR length of one block: array(3)
// header, byte-string header (at most 2 bytes for digests up to 255 bytes) and
// digest, array header (at most 5 bytes), at most 5 bytes per uint32 token,
// and the null.
func cborSize(digestLen, nTokens int) int {
	return 1 + 2 + digestLen + 5 + 5*nTokens + 1
}

// appendBlockCBOR appends canonical CBOR of [parent, tokens, null]: every
// length and integer in its shortest form, as cbor2 canonical=True emits.
func appendBlockCBOR(dst, parent []byte, tokens []uint32) []byte {
	dst = append(dst, 0x83)
	dst = appendCBORHead(dst, 0x40, uint64(len(parent)))
	dst = append(dst, parent...)
	dst = appendCBORHead(dst, 0x80, uint64(len(tokens)))
	for _, t := range tokens {
		dst = appendCBORHead(dst, 0x00, uint64(t))
	}
	return append(dst, 0xf6)
}

// appendCBORHead appends a CBOR initial byte of the given major type (already
// shifted into the top 3 bits) carrying v in its shortest encoding.
func appendCBORHead(dst []byte, major byte, v uint64) []byte {
	switch {
	case v < 24:
		return append(dst, major|byte(v))
	case v <= 0xff:
		return append(dst, major|24, byte(v))
	case v <= 0xffff:
		return append(dst, major|25, byte(v>>8), byte(v))
	case v <= 0xffffffff:
		return append(dst, major|26, byte(v>>24), byte(v>>16), byte(v>>8), byte(v))
	}
	return append(dst, major|27, byte(v>>56), byte(v>>48), byte(v>>40), byte(v>>32),
		byte(v>>24), byte(v>>16), byte(v>>8), byte(v))
}
