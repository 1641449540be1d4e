package kvevents

// TensorRT-LLM has no push protocol in most releases: trtllm-serve answers
// POST /kv_cache_events with a JSON array of the events queued since the
// last call (a destructive read). The types below mirror the JSON that its
// KVCacheEventSerializer writes, field for field.

import (
	"bytes"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strconv"
)

// The TRT-LLM event data types.
const (
	TRTCreated = "created"
	TRTStored  = "stored"
	TRTRemoved = "removed"
	TRTUpdated = "updated"
)

// DefaultTRTMaxEvents is the event limit DecodeTRTEvents applies when given
// a limit <= 0.
const DefaultTRTMaxEvents = 1 << 16

// ErrTRTMalformed reports a /kv_cache_events body that does not have TRT's
// shape or types. ErrTRTTooMany reports more events than the caller allowed.
var (
	ErrTRTMalformed = errors.New("kvevents: malformed TRT-LLM event")
	ErrTRTTooMany   = errors.New("kvevents: too many TRT-LLM events")
)

// TRTEvent is one item of the /kv_cache_events response.
type TRTEvent struct {
	// EventID increases by one per event per engine; the gateway uses it as
	// the sequence number.
	EventID uint64
	Data    TRTEventData
	// WindowSize is the attention window the event's cache belongs to; 0
	// when the event carries none. TensorRT-LLM's executor declares it a
	// required SizeType32 (NVIDIA/TensorRT-LLM@879039f6,
	// cpp/include/tensorrt_llm/executor/executor.h, struct KVCacheEvent) and
	// its serializer always writes it (tensorrt_llm/_utils.py,
	// KVCacheEventSerializer.to_json_str), but executors from before
	// variable sliding-window attention had no window in KVCacheEvent at
	// all, so a consumer must not reject an event for lacking it: such an
	// engine has a single window.
	WindowSize int64
	// AttentionDPRank is present only with attention data parallelism.
	AttentionDPRank *int64
	// HashAlgo is present with KV-cache manager V2: "v1_block_key",
	// "v2_sha256" (block hashes are then hex strings) or "v2_sha256_64".
	// "" = absent (v1_block_key).
	HashAlgo string
	// LayerGroupID is present with KV-cache manager V2.
	LayerGroupID *int64
}

// TRTEventData is the "data" object; which fields are used depends on Type.
type TRTEventData struct {
	// Type is TRTCreated, TRTStored, TRTRemoved or TRTUpdated. Other values
	// are kept, with the object in Raw, so that a consumer can treat a newer
	// event type as a no-op instead of rejecting the whole response.
	Type string

	// NumBlocksPerCacheLevel (created) is the pool size per cache level.
	NumBlocksPerCacheLevel []int64

	// ParentHash (stored) is the hash of the block before Blocks[0]; nil for
	// JSON null (the first block of a sequence).
	ParentHash *TRTHash
	// Blocks (stored) are the newly stored blocks, in chain order.
	Blocks []TRTStoredBlock

	// BlockHashes (removed) are the evicted blocks.
	BlockHashes []TRTHash

	// BlockHash (updated) is the block whose level or priority changed;
	// CacheLevel and Priority are nil when absent or null.
	BlockHash  TRTHash
	CacheLevel *TRTEventDiff
	Priority   *TRTEventDiff

	// Raw is the data object as received, for types this package does not
	// know; it is written back verbatim by MarshalTRTEvents.
	Raw json.RawMessage
}

// TRTHash is a TRT block hash: an unsigned 64-bit integer, or with hash_algo
// "v2_sha256" a hex string (Hex non-empty, Value unused).
type TRTHash struct {
	Value uint64
	Hex   string
}

// MarshalJSON writes the hash as a JSON number, or a string when Hex is set.
func (h TRTHash) MarshalJSON() ([]byte, error) {
	if h.Hex != "" {
		return json.Marshal(h.Hex)
	}
	return strconv.AppendUint(nil, h.Value, 10), nil
}

// UnmarshalJSON accepts a non-negative integer up to 2^64-1 (parsed exactly,
// never through float64) or a string of hex digits.
func (h *TRTHash) UnmarshalJSON(b []byte) error {
	if len(b) > 0 && b[0] == '"' {
		var s string
		if err := json.Unmarshal(b, &s); err != nil {
			return fmt.Errorf("%w: hash string: %w", ErrTRTMalformed, err)
		}
		if _, err := hex.DecodeString(s); err != nil || s == "" {
			return fmt.Errorf("%w: hash string %q is not hex", ErrTRTMalformed, s)
		}
		*h = TRTHash{Hex: s}
		return nil
	}
	v, err := strconv.ParseUint(string(b), 10, 64)
	if err != nil {
		return fmt.Errorf("%w: hash %s is not an unsigned 64-bit integer", ErrTRTMalformed, b)
	}
	*h = TRTHash{Value: v}
	return nil
}

// TRTStoredBlock is one block of a stored event.
type TRTStoredBlock struct {
	BlockHash  TRTHash
	Tokens     []TRTToken
	CacheLevel int64 // 0 = primary (GPU), 1 = secondary (host)
	Priority   int64
	// LoraID, CacheSalt and MMKeys are written by newer TRT versions only;
	// nil when absent. CacheSalt and MMKeys are kept as raw JSON: the gateway
	// only needs to know that they are present (such blocks are not routed).
	LoraID    *int64
	CacheSalt json.RawMessage
	MMKeys    json.RawMessage
}

// TokenIDs appends the block's token ids to dst.
func (b *TRTStoredBlock) TokenIDs(dst []uint32) []uint32 {
	for _, t := range b.Tokens {
		dst = append(dst, t.TokenID)
	}
	return dst
}

// TRTToken is one token of a stored block ("unique_token").
type TRTToken struct {
	TokenID      uint32
	TokenExtraID uint64 // 0 for plain text
}

// TRTEventDiff is an "event_diff": a value that changed.
type TRTEventDiff struct {
	NewValue int64
	OldValue int64
}

// MarshalTRTEvents encodes events as trtllm-serve's /kv_cache_events
// response: a JSON array, TRT's field names and order, "type" tags on blocks,
// tokens and diffs. An empty or nil slice encodes as [].
func MarshalTRTEvents(events []TRTEvent) ([]byte, error) {
	b := []byte{'['}
	for i := range events {
		if i > 0 {
			b = append(b, ',')
		}
		var err error
		if b, err = appendTRTEvent(b, &events[i]); err != nil {
			return nil, fmt.Errorf("kvevents: TRT event %d: %w", i, err)
		}
	}
	return append(b, ']'), nil
}

func appendTRTEvent(b []byte, e *TRTEvent) ([]byte, error) {
	b = append(b, `{"event_id":`...)
	b = strconv.AppendUint(b, e.EventID, 10)
	b = append(b, `,"data":`...)
	var err error
	if b, err = appendTRTData(b, &e.Data); err != nil {
		return nil, err
	}
	if e.WindowSize != 0 {
		b = append(b, `,"window_size":`...)
		b = strconv.AppendInt(b, e.WindowSize, 10)
	}
	if e.AttentionDPRank != nil {
		b = append(b, `,"attention_dp_rank":`...)
		b = strconv.AppendInt(b, *e.AttentionDPRank, 10)
	}
	if e.HashAlgo != "" {
		b = append(b, `,"hash_algo":`...)
		b = appendJSONString(b, e.HashAlgo)
	}
	if e.LayerGroupID != nil {
		b = append(b, `,"layer_group_id":`...)
		b = strconv.AppendInt(b, *e.LayerGroupID, 10)
	}
	return append(b, '}'), nil
}

func appendTRTData(b []byte, d *TRTEventData) ([]byte, error) {
	switch d.Type {
	case TRTCreated:
		b = append(b, `{"type":"created","num_blocks_per_cache_level":[`...)
		for i, n := range d.NumBlocksPerCacheLevel {
			if i > 0 {
				b = append(b, ',')
			}
			b = strconv.AppendInt(b, n, 10)
		}
		return append(b, "]}"...), nil
	case TRTStored:
		b = append(b, `{"type":"stored","parent_hash":`...)
		if d.ParentHash == nil {
			b = append(b, "null"...)
		} else {
			b = appendTRTHash(b, *d.ParentHash)
		}
		b = append(b, `,"blocks":[`...)
		for i := range d.Blocks {
			if i > 0 {
				b = append(b, ',')
			}
			var err error
			if b, err = appendTRTBlock(b, &d.Blocks[i]); err != nil {
				return nil, fmt.Errorf("block %d: %w", i, err)
			}
		}
		return append(b, "]}"...), nil
	case TRTRemoved:
		b = append(b, `{"type":"removed","block_hashes":[`...)
		for i, h := range d.BlockHashes {
			if i > 0 {
				b = append(b, ',')
			}
			b = appendTRTHash(b, h)
		}
		return append(b, "]}"...), nil
	case TRTUpdated:
		b = append(b, `{"type":"updated","block_hash":`...)
		b = appendTRTHash(b, d.BlockHash)
		if d.CacheLevel != nil {
			b = appendTRTDiff(append(b, `,"cache_level":`...), d.CacheLevel)
		}
		if d.Priority != nil {
			b = appendTRTDiff(append(b, `,"priority":`...), d.Priority)
		}
		return append(b, '}'), nil
	}
	if len(d.Raw) == 0 || !json.Valid(d.Raw) {
		return nil, fmt.Errorf("unknown data type %q without a valid raw object", d.Type)
	}
	var c bytes.Buffer
	if err := json.Compact(&c, d.Raw); err != nil {
		return nil, err
	}
	return append(b, c.Bytes()...), nil
}

func appendTRTBlock(b []byte, blk *TRTStoredBlock) ([]byte, error) {
	b = append(b, `{"type":"stored_block","block_hash":`...)
	b = appendTRTHash(b, blk.BlockHash)
	b = append(b, `,"tokens":[`...)
	for i, t := range blk.Tokens {
		if i > 0 {
			b = append(b, ',')
		}
		b = append(b, `{"type":"unique_token","token_id":`...)
		b = strconv.AppendUint(b, uint64(t.TokenID), 10)
		b = append(b, `,"token_extra_id":`...)
		b = strconv.AppendUint(b, t.TokenExtraID, 10)
		b = append(b, '}')
	}
	b = append(b, `],"cache_level":`...)
	b = strconv.AppendInt(b, blk.CacheLevel, 10)
	b = append(b, `,"priority":`...)
	b = strconv.AppendInt(b, blk.Priority, 10)
	if blk.LoraID != nil {
		b = append(b, `,"lora_id":`...)
		b = strconv.AppendInt(b, *blk.LoraID, 10)
	}
	for _, f := range []struct {
		name string
		raw  json.RawMessage
	}{{"cache_salt", blk.CacheSalt}, {"mm_keys", blk.MMKeys}} {
		if f.raw == nil {
			continue
		}
		var c bytes.Buffer
		if err := json.Compact(&c, f.raw); err != nil {
			return nil, fmt.Errorf("%s: %w", f.name, err)
		}
		b = append(b, `,"`+f.name+`":`...)
		b = append(b, c.Bytes()...)
	}
	return append(b, '}'), nil
}

func appendTRTHash(b []byte, h TRTHash) []byte {
	if h.Hex != "" {
		return appendJSONString(b, h.Hex)
	}
	return strconv.AppendUint(b, h.Value, 10)
}

func appendTRTDiff(b []byte, d *TRTEventDiff) []byte {
	b = append(b, `{"type":"event_diff","new_value":`...)
	b = strconv.AppendInt(b, d.NewValue, 10)
	b = append(b, `,"old_value":`...)
	b = strconv.AppendInt(b, d.OldValue, 10)
	return append(b, '}')
}

func appendJSONString(b []byte, s string) []byte {
	q, _ := json.Marshal(s) // cannot fail for a string
	return append(b, q...)
}

// --- decoding -----------------------------------------------------------

// trtEventWire is the event object with every field optional, so that
// missing required fields can be told from zero values.
type trtEventWire struct {
	EventID         *uint64         `json:"event_id"`
	Data            json.RawMessage `json:"data"`
	WindowSize      *int64          `json:"window_size"`
	AttentionDPRank *int64          `json:"attention_dp_rank"`
	HashAlgo        *string         `json:"hash_algo"`
	LayerGroupID    *int64          `json:"layer_group_id"`
}

type trtDataWire struct {
	Type                   *string         `json:"type"`
	NumBlocksPerCacheLevel *[]int64        `json:"num_blocks_per_cache_level"`
	ParentHash             *TRTHash        `json:"parent_hash"`
	Blocks                 *[]trtBlockWire `json:"blocks"`
	BlockHashes            *[]TRTHash      `json:"block_hashes"`
	BlockHash              *TRTHash        `json:"block_hash"`
	CacheLevel             *trtDiffWire    `json:"cache_level"`
	Priority               *trtDiffWire    `json:"priority"`
}

type trtBlockWire struct {
	BlockHash  *TRTHash         `json:"block_hash"`
	Tokens     *[]trtTokenWire  `json:"tokens"`
	CacheLevel *int64           `json:"cache_level"`
	Priority   *int64           `json:"priority"`
	LoraID     *int64           `json:"lora_id"`
	CacheSalt  *json.RawMessage `json:"cache_salt"`
	MMKeys     *json.RawMessage `json:"mm_keys"`
}

type trtTokenWire struct {
	TokenID      *uint32 `json:"token_id"`
	TokenExtraID *uint64 `json:"token_extra_id"`
}

type trtDiffWire struct {
	NewValue *int64 `json:"new_value"`
	OldValue *int64 `json:"old_value"`
}

// DecodeTRTEvents decodes a /kv_cache_events response body. It is strict on
// types (hashes must be unsigned 64-bit integers or hex strings, token ids
// uint32, counters integers; required fields must be present) and tolerant
// of unknown fields and unknown data types (kept in TRTEventData.Raw). It
// stops with ErrTRTTooMany as soon as the array holds more than maxEvents
// items (<= 0 means DefaultTRTMaxEvents). Errors wrap ErrTRTMalformed or
// ErrTRTTooMany; no input makes it panic. One malformed event fails the
// whole body; DecodeTRTItems rejects only that event.
func DecodeTRTEvents(body []byte, maxEvents int) ([]TRTEvent, error) {
	items, err := DecodeTRTItems(body, maxEvents)
	if err != nil {
		return nil, err
	}
	out := make([]TRTEvent, 0, len(items))
	for i := range items {
		if items[i].Err != nil {
			return nil, fmt.Errorf("event %d: %w", i, items[i].Err)
		}
		out = append(out, items[i].Event)
	}
	return out, nil
}

// TRTItem is one element of a /kv_cache_events array.
type TRTItem struct {
	Event TRTEvent
	// Err, when set, is why this element is not a valid event (it wraps
	// ErrTRTMalformed); Event then holds only its EventID, and only when
	// HasID.
	Err   error
	HasID bool
}

// DecodeTRTItems decodes a /kv_cache_events body element by element, with
// DecodeTRTEvents' rules, but a well-formed JSON element that is not a
// valid event is returned with its Err instead of failing the body: the
// drain is destructive, so rejecting a whole response for one bad event
// would lose every other event in it. The body itself must be a JSON array
// of at most maxEvents elements; otherwise the error wraps ErrTRTMalformed
// or ErrTRTTooMany and no items are returned.
func DecodeTRTItems(body []byte, maxEvents int) ([]TRTItem, error) {
	if maxEvents <= 0 {
		maxEvents = DefaultTRTMaxEvents
	}
	dec := json.NewDecoder(bytes.NewReader(body))
	tok, err := dec.Token()
	if err != nil || tok != json.Delim('[') {
		return nil, fmt.Errorf("%w: body is not a JSON array", ErrTRTMalformed)
	}
	out := []TRTItem{}
	for dec.More() {
		if len(out) == maxEvents {
			return nil, fmt.Errorf("%w: more than %d", ErrTRTTooMany, maxEvents)
		}
		var raw json.RawMessage
		if err := dec.Decode(&raw); err != nil {
			// Not even JSON: the rest of the array cannot be found.
			return nil, fmt.Errorf("%w: event %d: %w", ErrTRTMalformed, len(out), err)
		}
		out = append(out, decodeTRTItem(raw))
	}
	if tok, err := dec.Token(); err != nil || tok != json.Delim(']') {
		return nil, fmt.Errorf("%w: unterminated array", ErrTRTMalformed)
	}
	if _, err := dec.Token(); err != io.EOF {
		return nil, fmt.Errorf("%w: data after the array", ErrTRTMalformed)
	}
	return out, nil
}

func decodeTRTItem(raw json.RawMessage) TRTItem {
	var w trtEventWire
	if err := json.Unmarshal(raw, &w); err != nil {
		it := TRTItem{Err: fmt.Errorf("%w: %w", ErrTRTMalformed, err)}
		// The id may still be readable when another field is wrong.
		var id struct {
			EventID *uint64 `json:"event_id"`
		}
		if json.Unmarshal(raw, &id) == nil && id.EventID != nil {
			it.Event.EventID, it.HasID = *id.EventID, true
		}
		return it
	}
	ev, err := w.event()
	if err != nil {
		it := TRTItem{Err: err}
		if w.EventID != nil {
			it.Event.EventID, it.HasID = *w.EventID, true
		}
		return it
	}
	return TRTItem{Event: ev, HasID: true}
}

func missing(what string) error { return fmt.Errorf("%w: missing %s", ErrTRTMalformed, what) }

func (w *trtEventWire) event() (TRTEvent, error) {
	if w.EventID == nil {
		return TRTEvent{}, missing("event_id")
	}
	if len(w.Data) == 0 || bytes.Equal(w.Data, []byte("null")) {
		return TRTEvent{}, missing("data")
	}
	ev := TRTEvent{EventID: *w.EventID, AttentionDPRank: w.AttentionDPRank, LayerGroupID: w.LayerGroupID}
	if w.WindowSize != nil {
		ev.WindowSize = *w.WindowSize
	}
	if w.HashAlgo != nil {
		ev.HashAlgo = *w.HashAlgo
	}
	// The type is read first so that the fields of an unknown type are not
	// held to the known types' rules.
	var head struct {
		Type *string `json:"type"`
	}
	if err := json.Unmarshal(w.Data, &head); err != nil {
		return TRTEvent{}, fmt.Errorf("%w: data: %w", ErrTRTMalformed, err)
	}
	if head.Type == nil {
		return TRTEvent{}, missing("data.type")
	}
	ev.Data.Type = *head.Type
	var d trtDataWire
	switch *head.Type {
	case TRTCreated, TRTStored, TRTRemoved, TRTUpdated:
		if err := json.Unmarshal(w.Data, &d); err != nil {
			return TRTEvent{}, fmt.Errorf("%w: %s data: %w", ErrTRTMalformed, *head.Type, err)
		}
	}
	switch *head.Type {
	case TRTCreated:
		if d.NumBlocksPerCacheLevel == nil {
			return TRTEvent{}, missing("num_blocks_per_cache_level")
		}
		ev.Data.NumBlocksPerCacheLevel = *d.NumBlocksPerCacheLevel
	case TRTStored:
		if d.Blocks == nil {
			return TRTEvent{}, missing("blocks")
		}
		ev.Data.ParentHash = d.ParentHash
		ev.Data.Blocks = make([]TRTStoredBlock, 0, len(*d.Blocks))
		for i, bw := range *d.Blocks {
			blk, err := bw.block()
			if err != nil {
				return TRTEvent{}, fmt.Errorf("block %d: %w", i, err)
			}
			ev.Data.Blocks = append(ev.Data.Blocks, blk)
		}
	case TRTRemoved:
		if d.BlockHashes == nil {
			return TRTEvent{}, missing("block_hashes")
		}
		ev.Data.BlockHashes = *d.BlockHashes
	case TRTUpdated:
		if d.BlockHash == nil {
			return TRTEvent{}, missing("block_hash")
		}
		ev.Data.BlockHash = *d.BlockHash
		var err error
		if ev.Data.CacheLevel, err = d.CacheLevel.diff("cache_level"); err != nil {
			return TRTEvent{}, err
		}
		if ev.Data.Priority, err = d.Priority.diff("priority"); err != nil {
			return TRTEvent{}, err
		}
	default:
		ev.Data.Raw = append(json.RawMessage(nil), w.Data...)
	}
	return ev, nil
}

func (bw *trtBlockWire) block() (TRTStoredBlock, error) {
	if bw.BlockHash == nil {
		return TRTStoredBlock{}, missing("block_hash")
	}
	if bw.Tokens == nil {
		return TRTStoredBlock{}, missing("tokens")
	}
	blk := TRTStoredBlock{BlockHash: *bw.BlockHash, LoraID: bw.LoraID, Tokens: make([]TRTToken, 0, len(*bw.Tokens))}
	if bw.CacheLevel != nil {
		blk.CacheLevel = *bw.CacheLevel
	}
	if bw.Priority != nil {
		blk.Priority = *bw.Priority
	}
	// A JSON null for these optional fields means absent, like omission.
	if bw.CacheSalt != nil && !bytes.Equal(*bw.CacheSalt, []byte("null")) {
		blk.CacheSalt = *bw.CacheSalt
	}
	if bw.MMKeys != nil && !bytes.Equal(*bw.MMKeys, []byte("null")) {
		blk.MMKeys = *bw.MMKeys
	}
	for i, tw := range *bw.Tokens {
		if tw.TokenID == nil {
			return TRTStoredBlock{}, fmt.Errorf("token %d: %w", i, missing("token_id"))
		}
		t := TRTToken{TokenID: *tw.TokenID}
		if tw.TokenExtraID != nil {
			t.TokenExtraID = *tw.TokenExtraID
		}
		blk.Tokens = append(blk.Tokens, t)
	}
	return blk, nil
}

func (dw *trtDiffWire) diff(what string) (*TRTEventDiff, error) {
	if dw == nil {
		return nil, nil
	}
	if dw.NewValue == nil || dw.OldValue == nil {
		return nil, missing(what + " new_value/old_value")
	}
	return &TRTEventDiff{NewValue: *dw.NewValue, OldValue: *dw.OldValue}, nil
}
