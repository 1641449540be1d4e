package kvevents

import (
	"bytes"
	"fmt"
	"math"
)

// Tag strings and map keys as the engines write them.
const (
	tagStored  = "BlockStored"
	tagRemoved = "BlockRemoved"
	tagCleared = "AllBlocksCleared"
)

// AppendBatch appends the msgpack encoding of b in layout enc to dst and
// returns the extended slice. The bytes are those msgspec produces for the
// same values: ts as float64 (0xcb), integers in their smallest form (so
// hashes >= 2^63 are uint64 0xcf, except in ArraySGLang, where hashes are
// signed int64 as SGLang publishes them), str8 for strings of 32+ bytes. A
// nil b.DPRank is written as a nil rank (3-element batch).
//
// It fails on an unknown kind or encoding, or on Event.ExtraKeys that are not
// exactly one msgpack value; dst is then returned unchanged.
func AppendBatch(dst []byte, b *Batch, enc Encoding) ([]byte, error) {
	if enc < ArrayV011 || enc > MapSGLang {
		return dst, fmt.Errorf("kvevents: unknown encoding %d", uint8(enc))
	}
	start := len(dst)
	dst = appendArrayHeader(dst, 3)
	dst = appendFloat64(dst, b.TS)
	dst = appendArrayHeader(dst, len(b.Events))
	for i := range b.Events {
		var err error
		if dst, err = appendEvent(dst, &b.Events[i], enc); err != nil {
			return dst[:start], fmt.Errorf("kvevents: event %d: %w", i, err)
		}
	}
	return appendOptInt(dst, b.DPRank), nil
}

func appendEvent(dst []byte, e *Event, enc Encoding) ([]byte, error) {
	if e.ExtraKeys != nil {
		r := reader{b: e.ExtraKeys}
		if !r.skip() || r.remaining() != 0 {
			return dst, fmt.Errorf("extra keys are not one msgpack value")
		}
	}
	if e.TokenPairs && len(e.TokenIDs)%2 != 0 {
		return dst, fmt.Errorf("token pairs with an odd number of ids (%d)", len(e.TokenIDs))
	}
	if enc == Map || enc == MapSGLang {
		return appendEventMap(dst, e, enc == MapSGLang)
	}
	signed := enc == ArraySGLang
	switch e.Kind {
	case BlockStored:
		n := 7
		switch enc {
		case ArrayLate:
			n = 12
		case ArraySGLang:
			n = 10
		}
		dst = appendArrayHeader(dst, n)
		dst = appendStr(dst, tagStored)
		dst = appendHashes(dst, e.BlockHashes, signed)
		dst = appendParent(dst, e, signed)
		dst = appendTokens(dst, e)
		dst = appendInt(dst, int64(e.BlockSize))
		dst = appendOptInt(dst, e.LoraID)
		dst = appendOptStr(dst, e.Medium)
		if n == 7 {
			return dst, nil
		}
		dst = appendOptStr(dst, e.LoraName)
		dst = appendExtraKeys(dst, e.ExtraKeys)
		if enc == ArraySGLang {
			return appendOptInt(dst, e.DPRank), nil
		}
		dst = appendOptInt(dst, e.GroupIdx)
		dst = appendOptStr(dst, e.KVCacheSpecKind)
		return appendOptInt(dst, e.SlidingWindow), nil
	case BlockRemoved:
		n := 3
		if enc == ArrayLate {
			n = 4
		}
		dst = appendArrayHeader(dst, n)
		dst = appendStr(dst, tagRemoved)
		dst = appendHashes(dst, e.BlockHashes, signed)
		dst = appendOptStr(dst, e.Medium)
		if n == 4 {
			dst = appendOptInt(dst, e.GroupIdx)
		}
		return dst, nil
	case AllBlocksCleared:
		return appendStr(appendArrayHeader(dst, 1), tagCleared), nil
	}
	return dst, fmt.Errorf("%w: kind %d", ErrUnknownEvent, uint8(e.Kind))
}

// appendEventMap writes the tagged-map form: "type" first, then the fields in
// declaration order; fields whose default is nil are omitted when nil.
// signed writes hashes as int64, as SGLang publishes them.
func appendEventMap(dst []byte, e *Event, signed bool) ([]byte, error) {
	switch e.Kind {
	case BlockStored:
		n := 8 + countSet(e.ExtraKeys != nil, e.GroupIdx != nil, e.KVCacheSpecKind != nil,
			e.SlidingWindow != nil, e.CacheSalt != nil)
		dst = appendMapHeader(dst, n)
		dst = appendStr(appendStr(dst, "type"), tagStored)
		dst = appendHashes(appendStr(dst, "block_hashes"), e.BlockHashes, signed)
		dst = appendParent(appendStr(dst, "parent_block_hash"), e, signed)
		dst = appendTokens(appendStr(dst, "token_ids"), e)
		dst = appendInt(appendStr(dst, "block_size"), int64(e.BlockSize))
		dst = appendOptInt(appendStr(dst, "lora_id"), e.LoraID)
		dst = appendOptStr(appendStr(dst, "medium"), e.Medium)
		dst = appendOptStr(appendStr(dst, "lora_name"), e.LoraName)
		if e.ExtraKeys != nil {
			dst = append(appendStr(dst, "extra_keys"), e.ExtraKeys...)
		}
		if e.GroupIdx != nil {
			dst = appendInt(appendStr(dst, "group_idx"), *e.GroupIdx)
		}
		if e.KVCacheSpecKind != nil {
			dst = appendStr(appendStr(dst, "kv_cache_spec_kind"), *e.KVCacheSpecKind)
		}
		if e.SlidingWindow != nil {
			dst = appendInt(appendStr(dst, "kv_cache_spec_sliding_window"), *e.SlidingWindow)
		}
		if e.CacheSalt != nil {
			dst = appendStr(appendStr(dst, "cache_salt"), *e.CacheSalt)
		}
		return dst, nil
	case BlockRemoved:
		dst = appendMapHeader(dst, 3+countSet(e.GroupIdx != nil))
		dst = appendStr(appendStr(dst, "type"), tagRemoved)
		dst = appendHashes(appendStr(dst, "block_hashes"), e.BlockHashes, signed)
		dst = appendOptStr(appendStr(dst, "medium"), e.Medium)
		if e.GroupIdx != nil {
			dst = appendInt(appendStr(dst, "group_idx"), *e.GroupIdx)
		}
		return dst, nil
	case AllBlocksCleared:
		return appendStr(appendStr(appendMapHeader(dst, 1), "type"), tagCleared), nil
	}
	return dst, fmt.Errorf("%w: kind %d", ErrUnknownEvent, uint8(e.Kind))
}

func countSet(flags ...bool) int {
	n := 0
	for _, f := range flags {
		if f {
			n++
		}
	}
	return n
}

func appendHash(dst []byte, h uint64, signed bool) []byte {
	if signed {
		return appendInt(dst, int64(h))
	}
	return appendUint(dst, h)
}

func appendHashes(dst []byte, hs []uint64, signed bool) []byte {
	dst = appendArrayHeader(dst, len(hs))
	for _, h := range hs {
		dst = appendHash(dst, h, signed)
	}
	return dst
}

func appendParent(dst []byte, e *Event, signed bool) []byte {
	if !e.HasParent {
		return appendNil(dst)
	}
	return appendHash(dst, e.ParentHash, signed)
}

func appendTokens(dst []byte, e *Event) []byte {
	if e.TokenPairs {
		dst = appendArrayHeader(dst, len(e.TokenIDs)/2)
		for i := 0; i+1 < len(e.TokenIDs); i += 2 {
			dst = appendArrayHeader(dst, 2)
			dst = appendUint(dst, uint64(e.TokenIDs[i]))
			dst = appendUint(dst, uint64(e.TokenIDs[i+1]))
		}
		return dst
	}
	dst = appendArrayHeader(dst, len(e.TokenIDs))
	for _, t := range e.TokenIDs {
		dst = appendUint(dst, uint64(t))
	}
	return dst
}

func appendExtraKeys(dst, raw []byte) []byte {
	if raw == nil {
		return appendNil(dst)
	}
	return append(dst, raw...)
}

// NilExtraKeys returns the extra_keys value vLLM sends for n plain-text
// blocks: an array of n nils.
func NilExtraKeys(n int) []byte {
	b := appendArrayHeader(make([]byte, 0, 5+n), n)
	for range n {
		b = appendNil(b)
	}
	return b
}

// --- decoding -----------------------------------------------------------

// DecodeBatch decodes one EventBatch payload into dst and reports which
// event layout it used.
//
// It accepts a 2- or 3-element outer array (extra trailing elements are
// skipped; a map with ts/events/data_parallel_rank keys is accepted too),
// tagged-array and tagged-map events in any mix, trailing array elements and
// unknown map keys, and every form of block hash listed on Event. Any bad
// event rejects the whole batch: on error dst holds no events. Lengths are
// checked against the bytes that remain before anything is allocated, and no
// input makes it panic.
//
// dst's slices are reused (their previous contents are overwritten), so keep
// no references into a Batch across calls. The returned encoding is a best
// guess when the layouts coincide (a 7-element BlockStored is both vLLM 0.11
// and SGLang without metadata; a batch without BlockStored or BlockRemoved
// reports ArrayV011). A 10-element BlockStored array is read as ArraySGLang
// (element 9 = attn_dp_rank), although a short-lived vLLM main layout had
// group_idx there.
func DecodeBatch(payload []byte, dst *Batch) (Encoding, error) {
	var d decoder
	d.r = reader{b: payload}
	enc, err := d.batch(dst)
	if err != nil {
		dst.Events = dst.Events[:0]
		dst.DPRank = nil
		dst.TS = 0
		return 0, err
	}
	return enc, nil
}

type decoder struct {
	r reader
	// layout evidence seen so far
	sawMap, sawSGLang, sawLate bool
}

func (d *decoder) fail(what string) error {
	return fmt.Errorf("%w: %s at byte %d", ErrMalformed, what, d.r.i)
}

func (d *decoder) batch(dst *Batch) (Encoding, error) {
	dst.Events = dst.Events[:0]
	dst.DPRank = nil
	dst.TS = 0
	if c, ok := d.r.peek(); ok && (c&0xf0 == 0x80 || c == 0xde || c == 0xdf) {
		if err := d.batchMap(dst); err != nil {
			return 0, err
		}
	} else {
		n, ok := d.r.arrayLen()
		if !ok || n < 2 {
			return 0, d.fail("batch is not an array of 2 or more elements")
		}
		ts, ok := d.r.number()
		if !ok {
			return 0, d.fail("ts is not a number")
		}
		dst.TS = ts
		if err := d.events(dst); err != nil {
			return 0, err
		}
		if n >= 3 {
			rank, err := d.optInt("dp rank")
			if err != nil {
				return 0, err
			}
			dst.DPRank = rank
		}
		for range n - min(n, 3) {
			if !d.r.skip() {
				return 0, d.fail("truncated batch element")
			}
		}
	}
	if d.r.remaining() != 0 {
		return 0, d.fail("trailing bytes after the batch")
	}
	switch {
	case d.sawMap:
		return Map, nil
	case d.sawSGLang:
		return ArraySGLang, nil
	case d.sawLate:
		return ArrayLate, nil
	}
	return ArrayV011, nil
}

// batchMap reads a batch encoded as a map (a vLLM branch state without
// array_like on EventBatch).
func (d *decoder) batchMap(dst *Batch) error {
	n, _ := d.r.mapLen()
	sawEvents := false
	for range n {
		key, ok := d.r.str()
		if !ok {
			return d.fail("batch map key is not a string")
		}
		switch string(key) {
		case "ts":
			if dst.TS, ok = d.r.number(); !ok {
				return d.fail("ts is not a number")
			}
		case "events":
			if err := d.events(dst); err != nil {
				return err
			}
			sawEvents = true
		case "data_parallel_rank", "attn_dp_rank":
			rank, err := d.optInt("dp rank")
			if err != nil {
				return err
			}
			dst.DPRank = rank
		default:
			if !d.r.skip() {
				return d.fail("truncated batch value")
			}
		}
	}
	if !sawEvents {
		return d.fail("batch map has no events")
	}
	return nil
}

// minEventSize is the shortest encoding of a known event:
// ["BlockRemoved", []] is 15 bytes.
const minEventSize = 15

// maxEventPrealloc caps how many events are allocated up front from a
// declared count; beyond it the slice grows as events actually decode, so
// memory follows the bytes consumed (an Event is ~14x its minimal encoding).
const maxEventPrealloc = 4096

func (d *decoder) events(dst *Batch) error {
	n, ok := d.r.arrayLen()
	if !ok {
		return d.fail("events is not an array")
	}
	// A declared count the payload cannot hold fails while decoding; only
	// the preallocation is bounded here.
	if want := min(n, d.r.remaining()/minEventSize, maxEventPrealloc); cap(dst.Events) < want {
		dst.Events = growEvents(dst.Events, want)
	}
	for i := range n {
		if i == cap(dst.Events) {
			dst.Events = growEvents(dst.Events, max(2*i, 8))
		}
		dst.Events = dst.Events[:i+1]
		e := &dst.Events[i]
		*e = Event{BlockHashes: e.BlockHashes[:0], TokenIDs: e.TokenIDs[:0]}
		if err := d.event(e); err != nil {
			return fmt.Errorf("event %d: %w", i, err)
		}
	}
	return nil
}

// growEvents returns events with capacity c and the same length, carrying
// over every old element (beyond the length too) so that their slices are
// reused.
func growEvents(events []Event, c int) []Event {
	old := events[:cap(events)]
	grown := make([]Event, len(old), c)
	copy(grown, old)
	return grown[:len(events)]
}

func (d *decoder) event(e *Event) error {
	c, ok := d.r.peek()
	if !ok {
		return d.fail("truncated event")
	}
	if c&0xf0 == 0x80 || c == 0xde || c == 0xdf {
		d.sawMap = true
		return d.eventMap(e)
	}
	n, ok := d.r.arrayLen()
	if !ok || n < 1 {
		return d.fail("event is neither a tagged array nor a map")
	}
	tag, ok := d.r.str()
	if !ok {
		return d.fail("event tag is not a string")
	}
	switch string(tag) {
	case tagStored:
		return d.storedArray(e, n-1)
	case tagRemoved:
		e.Kind = BlockRemoved
		if n < 2 {
			return d.fail("BlockRemoved without block_hashes")
		}
		if err := d.hashes(e); err != nil {
			return err
		}
		rest := n - 2
		if rest > 0 {
			if e.Medium, ok = d.optStr(); !ok {
				return d.fail("BlockRemoved medium is not a string")
			}
			rest--
		}
		if rest > 0 {
			d.sawLate = true
			var err error
			if e.GroupIdx, err = d.optInt("group_idx"); err != nil {
				return err
			}
			rest--
		}
		return d.skipN(rest)
	case tagCleared:
		e.Kind = AllBlocksCleared
		return d.skipN(n - 1)
	}
	return fmt.Errorf("%w: %q", ErrUnknownEvent, tag)
}

// storedArray reads the fields of a BlockStored array after its tag; n is the
// number of elements left.
func (d *decoder) storedArray(e *Event, n int) error {
	e.Kind = BlockStored
	if n < 4 {
		return d.fail("BlockStored array too short")
	}
	if err := d.hashes(e); err != nil {
		return err
	}
	if err := d.parent(e); err != nil {
		return err
	}
	if err := d.tokens(e); err != nil {
		return err
	}
	bs, ok := d.r.int64Val()
	if !ok || bs < 0 || bs > math.MaxInt32 {
		return d.fail("block_size is not a non-negative integer")
	}
	e.BlockSize = int(bs)
	n -= 4
	var err error
	if n > 0 { // lora_id
		if e.LoraID, err = d.optInt("lora_id"); err != nil {
			return err
		}
		n--
	}
	if n > 0 { // medium
		if e.Medium, ok = d.optStr(); !ok {
			return d.fail("medium is not a string")
		}
		n--
	}
	if n > 0 { // lora_name (vLLM) or the metadata map (SGLang)
		if c, _ := d.r.peek(); c&0xf0 == 0x80 || c == 0xde || c == 0xdf {
			d.sawSGLang = true
			if err := d.metadata(e); err != nil {
				return err
			}
		} else if e.LoraName, ok = d.optStr(); !ok {
			return d.fail("lora_name is not a string")
		}
		n--
	}
	if n > 0 { // extra_keys
		if err := d.extraKeys(e); err != nil {
			return err
		}
		n--
	}
	if n == 1 { // exactly 10 elements: SGLang's trailing attn_dp_rank
		d.sawSGLang = true
		if e.DPRank, err = d.optInt("attn_dp_rank"); err != nil {
			return err
		}
		return nil
	}
	if n > 0 {
		d.sawLate = true
		if e.GroupIdx, err = d.optInt("group_idx"); err != nil {
			return err
		}
		n--
	}
	if n > 0 {
		if e.KVCacheSpecKind, ok = d.optStr(); !ok {
			return d.fail("kv_cache_spec_kind is not a string")
		}
		n--
	}
	if n > 0 {
		if e.SlidingWindow, err = d.optInt("kv_cache_spec_sliding_window"); err != nil {
			return err
		}
		n--
	}
	return d.skipN(n)
}

func (d *decoder) eventMap(e *Event) error {
	n, ok := d.r.mapLen()
	if !ok {
		return d.fail("bad event map")
	}
	var tag []byte
	var sawHashes, sawTokens, sawSize bool
	var err error
	for range n {
		key, ok := d.r.str()
		if !ok {
			return d.fail("event map key is not a string")
		}
		switch string(key) {
		case "type":
			if tag, ok = d.r.str(); !ok {
				return d.fail("event type is not a string")
			}
		case "block_hashes":
			err = d.hashes(e)
			sawHashes = true
		case "parent_block_hash":
			err = d.parent(e)
		case "token_ids":
			err = d.tokens(e)
			sawTokens = true
		case "block_size":
			bs, ok := d.r.int64Val()
			if !ok || bs < 0 || bs > math.MaxInt32 {
				return d.fail("block_size is not a non-negative integer")
			}
			e.BlockSize = int(bs)
			sawSize = true
		case "lora_id":
			e.LoraID, err = d.optInt("lora_id")
		case "medium":
			if e.Medium, ok = d.optStr(); !ok {
				return d.fail("medium is not a string")
			}
		case "lora_name":
			if e.LoraName, ok = d.optStr(); !ok {
				return d.fail("lora_name is not a string")
			}
		case "extra_keys":
			err = d.extraKeys(e)
		case "group_idx":
			e.GroupIdx, err = d.optInt("group_idx")
		case "kv_cache_spec_kind":
			if e.KVCacheSpecKind, ok = d.optStr(); !ok {
				return d.fail("kv_cache_spec_kind is not a string")
			}
		case "kv_cache_spec_sliding_window":
			e.SlidingWindow, err = d.optInt("kv_cache_spec_sliding_window")
		case "cache_salt":
			if e.CacheSalt, ok = d.optStr(); !ok {
				return d.fail("cache_salt is not a string")
			}
		case "metadata":
			err = d.metadata(e)
		case "attn_dp_rank", "dp_rank":
			e.DPRank, err = d.optInt("attn_dp_rank")
		default:
			if !d.r.skip() {
				return d.fail("truncated event value")
			}
		}
		if err != nil {
			return err
		}
	}
	switch string(tag) {
	case tagStored:
		e.Kind = BlockStored
		if !sawHashes || !sawTokens || !sawSize {
			return d.fail("BlockStored map lacks block_hashes, token_ids or block_size")
		}
	case tagRemoved:
		e.Kind = BlockRemoved
		if !sawHashes {
			return d.fail("BlockRemoved map lacks block_hashes")
		}
	case tagCleared:
		e.Kind = AllBlocksCleared
	case "":
		if tag == nil {
			return d.fail("event map has no type")
		}
		return fmt.Errorf("%w: %q", ErrUnknownEvent, tag)
	default:
		return fmt.Errorf("%w: %q", ErrUnknownEvent, tag)
	}
	return nil
}

func (d *decoder) skipN(n int) error {
	for range n {
		if !d.r.skip() {
			return d.fail("truncated trailing element")
		}
	}
	return nil
}

func (d *decoder) hashes(e *Event) error {
	n, ok := d.r.arrayLen()
	if !ok {
		return d.fail("block_hashes is not an array")
	}
	e.BlockHashes = growU64(e.BlockHashes[:0], n)
	for range n {
		h, ok := d.r.hash()
		if !ok {
			return d.fail("block hash is not an integer or bytes")
		}
		e.BlockHashes = append(e.BlockHashes, h)
	}
	return nil
}

func (d *decoder) parent(e *Event) error {
	if d.r.isNil() {
		return nil
	}
	h, ok := d.r.hash()
	if !ok {
		return d.fail("parent_block_hash is not an integer, bytes or nil")
	}
	e.ParentHash, e.HasParent = h, true
	return nil
}

// tokens reads token_ids: integers 0..2^32-1, or (SGLang EAGLE) 2-element
// integer arrays, which are flattened.
func (d *decoder) tokens(e *Event) error {
	n, ok := d.r.arrayLen()
	if !ok {
		return d.fail("token_ids is not an array")
	}
	e.TokenIDs = growU32(e.TokenIDs[:0], n)
	for i := range n {
		if c, _ := d.r.peek(); c&0xf0 == 0x90 || c == 0xdc || c == 0xdd {
			if i > 0 && !e.TokenPairs {
				return d.fail("token_ids mixes ids and pairs")
			}
			e.TokenPairs = true
			m, ok := d.r.arrayLen()
			if !ok || m != 2 {
				return d.fail("token pair is not a 2-element array")
			}
			for range 2 {
				t, ok := d.token()
				if !ok {
					return d.fail("token id is not a uint32")
				}
				e.TokenIDs = append(e.TokenIDs, t)
			}
			continue
		}
		if e.TokenPairs {
			return d.fail("token_ids mixes ids and pairs")
		}
		t, ok := d.token()
		if !ok {
			return d.fail("token id is not a uint32")
		}
		e.TokenIDs = append(e.TokenIDs, t)
	}
	return nil
}

func (d *decoder) token() (uint32, bool) {
	v, neg, ok := d.r.integer()
	if !ok || neg || v > math.MaxUint32 {
		return 0, false
	}
	return uint32(v), true
}

func (d *decoder) optInt(what string) (*int64, error) {
	if d.r.isNil() {
		return nil, nil
	}
	v, ok := d.r.int64Val()
	if !ok {
		return nil, d.fail(what + " is not an int64 or nil")
	}
	return &v, nil
}

// optStr reads a string or nil. Common values are interned so that decoding
// a batch does not allocate one string per event for them.
func (d *decoder) optStr() (*string, bool) {
	if d.r.isNil() {
		return nil, true
	}
	b, ok := d.r.str()
	if !ok {
		return nil, false
	}
	s := intern(b)
	return &s, true
}

var interned = []string{"GPU", "CPU", "CPU_PINNED", "DISK", "EXTERNAL", "full_attention", "sliding_window"}

func intern(b []byte) string {
	for _, s := range interned {
		if string(b) == s {
			return s
		}
	}
	return string(b)
}

func (d *decoder) extraKeys(e *Event) error {
	if d.r.isNil() {
		e.ExtraKeys = nil
		return nil
	}
	start := d.r.i
	if !d.r.skip() {
		return d.fail("truncated extra_keys")
	}
	// Copied so the event does not pin or alias the payload.
	e.ExtraKeys = append([]byte(nil), d.r.b[start:d.r.i]...)
	return nil
}

// metadata reads SGLang's BlockStored metadata map ({"cache_salt": str}).
func (d *decoder) metadata(e *Event) error {
	if d.r.isNil() {
		return nil
	}
	n, ok := d.r.mapLen()
	if !ok {
		return d.fail("metadata is not a map")
	}
	for range n {
		key, ok := d.r.str()
		if !ok {
			return d.fail("metadata key is not a string")
		}
		if bytes.Equal(key, []byte("cache_salt")) {
			if e.CacheSalt, ok = d.optStr(); !ok {
				return d.fail("cache_salt is not a string")
			}
			continue
		}
		if !d.r.skip() {
			return d.fail("truncated metadata value")
		}
	}
	return nil
}

func growU64(s []uint64, n int) []uint64 {
	if cap(s) < n {
		return make([]uint64, 0, n)
	}
	return s
}

func growU32(s []uint32, n int) []uint32 {
	if cap(s) < n {
		return make([]uint32, 0, n)
	}
	return s
}
