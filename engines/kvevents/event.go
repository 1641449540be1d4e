// Package kvevents encodes, decodes and transports the KV-cache events that
// vLLM and SGLang publish over ZeroMQ (msgpack EventBatch payloads, 3-frame
// PUB messages, a ROUTER replay socket) and the JSON events TensorRT-LLM
// returns from POST /kv_cache_events.
//
// The codec speaks every layout the engines have shipped: vLLM's tagged
// arrays of the ~0.11 era and of the late array era, the tagged maps of newer
// vLLM and SGLang, and SGLang's tagged arrays. Block hashes are carried as
// uint64 bit patterns whatever their wire form (unsigned, signed, bytes).
package kvevents

import (
	"errors"
	"fmt"
)

// Kind is the type of a KV-cache event. The zero value is not a valid kind.
type Kind uint8

// The event kinds, named after the engines' tag strings.
const (
	BlockStored Kind = iota + 1
	BlockRemoved
	AllBlocksCleared
)

// String returns the engines' tag for k ("BlockStored", ...).
func (k Kind) String() string {
	switch k {
	case BlockStored:
		return "BlockStored"
	case BlockRemoved:
		return "BlockRemoved"
	case AllBlocksCleared:
		return "AllBlocksCleared"
	}
	return fmt.Sprintf("Kind(%d)", uint8(k))
}

// Event is one KV-cache event. Pointer fields are nil when the wire value is
// msgpack nil or absent. Which fields an encoding carries is listed on
// Encoding; fields an encoding lacks are ignored when encoding and left zero
// when decoding.
type Event struct {
	Kind Kind
	// BlockHashes are the blocks' engine hashes as uint64 bit patterns
	// (SGLang's signed int64 reinterpreted; a bytes hash is its last 8 bytes
	// read big-endian, as vLLM converts it).
	BlockHashes []uint64
	// ParentHash is the hash of the block before the first stored one; only
	// meaningful when HasParent (nil on the wire otherwise). BlockStored only.
	ParentHash uint64
	HasParent  bool
	// TokenIDs are the stored blocks' tokens, concatenated. BlockStored only.
	TokenIDs []uint32
	// TokenPairs reports that the wire carried SGLang EAGLE bigram tokens
	// ([a, b] pairs); TokenIDs then holds the pairs flattened (a, b, a, b...),
	// which is also the byte order SGLang hashes them in.
	TokenPairs bool
	// BlockSize is the number of tokens per block. BlockStored only.
	BlockSize int

	LoraID   *int64
	LoraName *string
	Medium   *string
	// ExtraKeys is the raw msgpack value of vLLM's extra_keys (one entry per
	// block: nil or an array of keys); nil means the field is nil or absent.
	// It is kept raw because its contents (LoRA names, multimodal hashes,
	// cache salts) are engine-specific and only passed through.
	ExtraKeys []byte
	// GroupIdx is vLLM's KV-cache group index (hybrid models).
	GroupIdx *int64
	// KVCacheSpecKind and SlidingWindow describe the group's cache spec.
	KVCacheSpecKind *string
	SlidingWindow   *int64
	// CacheSalt is SGLang's per-request salt (its BlockStored metadata
	// element, or the cache_salt key of map events).
	CacheSalt *string
	// DPRank is SGLang's trailing attn_dp_rank element of a BlockStored
	// array, when present.
	DPRank *int64
}

// Batch is one published EventBatch.
type Batch struct {
	// TS is the publisher's wall clock in seconds since the epoch.
	TS     float64
	Events []Event
	// DPRank is the data-parallel rank of the publisher; nil for a 2-element
	// batch (vLLM 0.9.0, SGLang 0.4) or a nil rank.
	DPRank *int64
}

// Encoding selects the msgpack layout of the events inside a batch. The outer
// batch is always the array [ts, events, dp_rank].
type Encoding uint8

// The event layouts.
const (
	// ArrayV011 is vLLM ~0.11's tagged arrays: BlockStored has 7 elements
	// [tag, block_hashes, parent, token_ids, block_size, lora_id, medium],
	// BlockRemoved 3 [tag, block_hashes, medium]. Real SGLang 0.5 BlockStored
	// without metadata has the same shape.
	ArrayV011 Encoding = iota + 1
	// ArrayLate is vLLM main just before the switch to maps (#42892):
	// BlockStored has 12 elements (adds lora_name, extra_keys, group_idx,
	// kv_cache_spec_kind, kv_cache_spec_sliding_window), BlockRemoved 4
	// (adds group_idx).
	ArrayLate
	// Map is tagged maps ({"type": "BlockStored", ...}) as newer vLLM and
	// SGLang send them. Fields whose default is nil (extra_keys, group_idx,
	// kv_cache_spec_kind, kv_cache_spec_sliding_window, cache_salt) are
	// omitted when nil, as msgspec's omit_defaults does.
	Map
	// ArraySGLang is SGLang's tagged arrays as the gateway reference pins them
	// (0.5.x): BlockStored has 10 elements [tag, block_hashes, parent,
	// token_ids, block_size, lora_id, medium, lora_name, extra_keys,
	// attn_dp_rank], hashes as signed int64; BlockRemoved 3.
	ArraySGLang
	// MapSGLang is the tagged-map layout of SGLang after PR #37482: Map with
	// hashes as signed int64. Decoding reports it as Map (a signed and an
	// unsigned hash decode to the same bit pattern).
	MapSGLang
)

// String names the encoding.
func (e Encoding) String() string {
	switch e {
	case ArrayV011:
		return "array-v0.11"
	case ArrayLate:
		return "array-late"
	case Map:
		return "map"
	case ArraySGLang:
		return "array-sglang"
	case MapSGLang:
		return "map-sglang"
	}
	return fmt.Sprintf("Encoding(%d)", uint8(e))
}

// Errors returned by the codec; match them with errors.Is.
var (
	// ErrMalformed reports a payload that is not a well-formed event batch.
	ErrMalformed = errors.New("kvevents: malformed batch")
	// ErrUnknownEvent reports an event whose tag is none of the known kinds.
	// The whole batch is rejected: applying only part of a batch could leave
	// an inventory with blocks the engine has already dropped.
	ErrUnknownEvent = errors.New("kvevents: unknown event type")
)
