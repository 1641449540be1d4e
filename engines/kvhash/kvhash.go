// Package kvhash computes the block hashes that inference engines publish in
// their KV-cache events, so that the gateway can predict which cached blocks a
// prompt would hit and the simulators can publish the same keys as the real
// engines.
//
// Four algorithms are supported:
//
//   - sha256_cbor and xxhash_cbor: vLLM's reproducible prefix-caching hashes.
//     Each full block is hashed as the canonical CBOR encoding of the 3-array
//     [parent digest, token ids, null]; the chain starts from a root digest
//     derived from PYTHONHASHSEED. The routing key is the last 8 digest bytes,
//     big-endian (what vLLM publishes with VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES=1).
//   - sha256_sglang: SGLang 0.5.x's page chain, SHA-256 over the parent's raw
//     digest (absent for the first page) followed by each token as a 4-byte
//     little-endian integer. The routing key is the first 8 digest bytes,
//     big-endian; SGLang publishes that bit pattern as a signed int64.
//   - blockhash_trtllm: the routing key the gateway uses for TensorRT-LLM is the
//     same SGLang chain, recomputed from the token ids TRT publishes. TRT's own
//     engine hash (its "v1_block_key") is available separately as
//     TRTLLMBlockKey; it is only a lookup handle, never a routing key.
package kvhash

import (
	"encoding/binary"
	"fmt"
	"strings"
)

// Algo names a block-hash algorithm. The zero value is not valid; parse user
// input with ParseAlgo.
type Algo string

// The supported algorithms. The string values are the names used in
// configuration (and, for the vLLM ones, vLLM's --prefix-caching-hash-algo).
const (
	SHA256CBOR      Algo = "sha256_cbor"
	XXHashCBOR      Algo = "xxhash_cbor"
	SHA256SGLang    Algo = "sha256_sglang"
	BlockHashTRTLLM Algo = "blockhash_trtllm"
)

// Algos lists every supported algorithm in a stable order.
func Algos() []Algo { return []Algo{SHA256CBOR, XXHashCBOR, SHA256SGLang, BlockHashTRTLLM} }

// ParseAlgo returns the algorithm named s, or an error listing the valid names.
func ParseAlgo(s string) (Algo, error) {
	for _, a := range Algos() {
		if string(a) == s {
			return a, nil
		}
	}
	names := make([]string, 0, 4)
	for _, a := range Algos() {
		names = append(names, string(a))
	}
	return "", fmt.Errorf("kvhash: unknown algorithm %q: valid algorithms are %s", s, strings.Join(names, ", "))
}

// DigestSize returns the length in bytes of a full block digest for a (32 for
// the SHA-256 based algorithms, 16 for xxhash_cbor), or 0 for an unknown algo.
func (a Algo) DigestSize() int {
	switch a {
	case SHA256CBOR, SHA256SGLang, BlockHashTRTLLM:
		return 32
	case XXHashCBOR:
		return 16
	}
	return 0
}

// Seeded reports whether a's chain starts from a root derived from the
// engine's PYTHONHASHSEED (the vLLM algorithms); the others ignore the seed.
func (a Algo) Seeded() bool { return a == SHA256CBOR || a == XXHashCBOR }

// MaxBlockSize bounds the block size New accepts. Engines use 1..256 in
// practice; the bound keeps per-call scratch space predictable.
const MaxBlockSize = 1 << 16

// Hasher computes the routing keys of the full blocks of a token sequence,
// chained from the root.
//
// Implementations are safe for concurrent use and allocate nothing beyond
// growing dst.
type Hasher interface {
	// Algo returns the algorithm this hasher implements.
	Algo() Algo
	// BlockSize returns the number of tokens per block.
	BlockSize() int
	// BlockKeys appends one 64-bit routing key per full block of tokens
	// (len(tokens)/BlockSize() keys) and returns the extended slice. A
	// trailing partial block is ignored.
	BlockKeys(dst []uint64, tokens []uint32) []uint64
}

// New returns a Hasher for algo with blockSize tokens per block.
//
// seed is the engine's PYTHONHASHSEED and matters only for the vLLM
// algorithms: the root parent is H(cbor(seed)). An empty seed, or one longer
// than 23 bytes, gives an all-zero root (the gateway's convention for an
// unpinned seed; a vLLM engine without PYTHONHASHSEED uses random bytes and
// can never be matched, and Python rejects seeds that are not decimal integers
// up to 4294967295, so a long seed cannot match a real engine either). The
// SGLang and TRT-LLM chains have no seed and ignore it.
func New(algo Algo, blockSize int, seed string) (Hasher, error) {
	if blockSize < 1 || blockSize > MaxBlockSize {
		return nil, fmt.Errorf("kvhash: block size %d out of range 1..%d", blockSize, MaxBlockSize)
	}
	switch algo {
	case SHA256CBOR, XXHashCBOR:
		h := &vllmHasher{algo: algo, blockSize: blockSize}
		copy(h.root[:], NoneHash(algo, seed))
		return h, nil
	case SHA256SGLang, BlockHashTRTLLM:
		return &sglangHasher{algo: algo, blockSize: blockSize}, nil
	}
	_, err := ParseAlgo(string(algo))
	return nil, err
}

// KeyFromDigest returns the routing key that algo derives from a full block
// digest: the last 8 bytes big-endian for the vLLM algorithms, the first 8
// bytes big-endian for the SGLang chain. It returns 0 when digest is shorter
// than 8 bytes or algo is unknown.
func KeyFromDigest(algo Algo, digest []byte) uint64 {
	if len(digest) < 8 {
		return 0
	}
	switch algo {
	case SHA256CBOR, XXHashCBOR:
		return binary.BigEndian.Uint64(digest[len(digest)-8:])
	case SHA256SGLang, BlockHashTRTLLM:
		return binary.BigEndian.Uint64(digest[:8])
	}
	return 0
}
