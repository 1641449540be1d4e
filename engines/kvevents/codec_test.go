package kvevents

import (
	"bytes"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"math"
	"reflect"
	"runtime"
	"strings"
	"testing"
)

// Appendix A of engine-contracts: the same batch in three event layouts,
// produced by msgspec.
const (
	appendixV011 = "93cb41d954fc402000009397ab426c6f636b53746f72656492cf1e0b2e028ef071cbcfefad121d154ab2d6c098010203040506070804c0a347505593ac426c6f636b52656d6f76656491cf1e0b2e028ef071cba347505591b0416c6c426c6f636b73436c656172656400"
	appendixLate = "93cb41d954fc40200000939cab426c6f636b53746f72656492cf1e0b2e028ef071cbcfefad121d154ab2d6c098010203040506070804c0a3475055c092c0c000ae66756c6c5f617474656e74696f6ec094ac426c6f636b52656d6f76656491cf1e0b2e028ef071cba34750550091b0416c6c426c6f636b73436c656172656400"
	appendixMap  = "93cb41d954fc40200000938ba474797065ab426c6f636b53746f726564ac626c6f636b5f68617368657392cf1e0b2e028ef071cbcfefad121d154ab2d6b1706172656e745f626c6f636b5f68617368c0a9746f6b656e5f696473980102030405060708aa626c6f636b5f73697a6504a76c6f72615f6964c0a66d656469756da3475055a96c6f72615f6e616d65c0aa65787472615f6b65797392c0c0a967726f75705f69647800b26b765f63616368655f737065635f6b696e64ae66756c6c5f617474656e74696f6e84a474797065ac426c6f636b52656d6f766564ac626c6f636b5f68617368657391cf1e0b2e028ef071cba66d656469756da3475055a967726f75705f6964780081a474797065b0416c6c426c6f636b73436c656172656400"
)

func ptr[T any](v T) *T { return &v }

// appendixBatch is the batch behind the Appendix A vectors, with the fields
// of the late layouts set; enc trims it to what that layout carries.
func appendixBatch(enc Encoding) *Batch {
	stored := Event{
		Kind:        BlockStored,
		BlockHashes: []uint64{2164874634404590027, 17270480062156288726},
		TokenIDs:    []uint32{1, 2, 3, 4, 5, 6, 7, 8},
		BlockSize:   4,
		Medium:      ptr("GPU"),
	}
	removed := Event{Kind: BlockRemoved, BlockHashes: []uint64{2164874634404590027}, Medium: ptr("GPU")}
	if enc != ArrayV011 {
		stored.ExtraKeys = NilExtraKeys(2)
		stored.GroupIdx = ptr(int64(0))
		stored.KVCacheSpecKind = ptr("full_attention")
		removed.GroupIdx = ptr(int64(0))
	}
	return &Batch{
		TS:     1700000000.5,
		Events: []Event{stored, removed, {Kind: AllBlocksCleared}},
		DPRank: ptr(int64(0)),
	}
}

func mustHex(t testing.TB, s string) []byte {
	t.Helper()
	b, err := hex.DecodeString(s)
	if err != nil {
		t.Fatalf("bad hex: %v", err)
	}
	return b
}

func TestAppendixVectors(t *testing.T) {
	cases := []struct {
		name    string
		enc     Encoding
		hex     string
		wantLen int
	}{
		{"v0.11_arrays", ArrayV011, appendixV011, 106},
		{"late_arrays", ArrayLate, appendixLate, 128},
		{"maps", Map, appendixMap, 289},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			want := mustHex(t, tc.hex)
			if len(want) != tc.wantLen {
				t.Fatalf("vector is %d bytes, want %d", len(want), tc.wantLen)
			}
			got, err := AppendBatch(nil, appendixBatch(tc.enc), tc.enc)
			if err != nil {
				t.Fatalf("AppendBatch: %v", err)
			}
			if hex.EncodeToString(got) != tc.hex {
				t.Errorf("encode:\n got %x\nwant %s", got, tc.hex)
			}
			var b Batch
			enc, err := DecodeBatch(want, &b)
			if err != nil {
				t.Fatalf("DecodeBatch: %v", err)
			}
			if enc != tc.enc {
				t.Errorf("encoding: got %v, want %v", enc, tc.enc)
			}
			if wantB := appendixBatch(tc.enc); !reflect.DeepEqual(&b, wantB) {
				t.Errorf("decode:\n got %+v\nwant %+v", b, *wantB)
			}
		})
	}
}

// fullEvent sets every field an encoding can carry.
func fullEvents() []Event {
	return []Event{
		{
			Kind:        BlockStored,
			BlockHashes: []uint64{0, 1, 127, 128, 255, 256, 65535, 65536, 1<<32 - 1, 1 << 32, 1<<63 - 1, 1 << 63, math.MaxUint64},
			ParentHash:  0xdf3f619804a92fdb, HasParent: true,
			TokenIDs:  []uint32{0, 23, 24, 127, 128, 255, 256, 65535, 65536, 151644, math.MaxUint32},
			BlockSize: 11,
			LoraID:    ptr(int64(-7)), LoraName: ptr(strings.Repeat("l", 40)), Medium: ptr("CPU"),
			ExtraKeys:       []byte{0x91, 0x91, 0xa7, 'm', 'y', '-', 'l', 'o', 'r', 'a'}, // [["my-lora"]]
			GroupIdx:        ptr(int64(1)),
			KVCacheSpecKind: ptr("sliding_window"),
			SlidingWindow:   ptr(int64(4096)),
			DPRank:          ptr(int64(2)),
		},
		{Kind: BlockRemoved, BlockHashes: []uint64{1 << 63}, Medium: ptr("GPU"), GroupIdx: ptr(int64(1))},
		{Kind: AllBlocksCleared},
		{Kind: BlockStored, BlockHashes: []uint64{5}, TokenIDs: []uint32{1, 2, 3, 4}, TokenPairs: true, BlockSize: 2},
	}
}

// carried trims an event to the fields enc carries.
func carried(e Event, enc Encoding) Event {
	switch enc {
	case ArrayV011:
		e.LoraName, e.ExtraKeys, e.GroupIdx, e.KVCacheSpecKind, e.SlidingWindow, e.CacheSalt, e.DPRank = nil, nil, nil, nil, nil, nil, nil
	case ArrayLate:
		e.CacheSalt, e.DPRank = nil, nil
	case Map:
		e.DPRank = nil
	case ArraySGLang:
		e.GroupIdx, e.KVCacheSpecKind, e.SlidingWindow, e.CacheSalt = nil, nil, nil, nil
		if e.Kind == BlockStored {
			return e
		}
		e.LoraName, e.ExtraKeys, e.DPRank = nil, nil, nil
	}
	if e.Kind == BlockRemoved {
		e.LoraName, e.ExtraKeys, e.KVCacheSpecKind, e.SlidingWindow, e.CacheSalt, e.DPRank, e.LoraID = nil, nil, nil, nil, nil, nil, nil
		if enc == ArrayV011 {
			e.GroupIdx = nil
		}
	}
	return e
}

func TestRoundTrip(t *testing.T) {
	cases := []struct {
		name string
		enc  Encoding
		rank *int64
	}{
		{"v0.11", ArrayV011, ptr(int64(0))},
		{"late", ArrayLate, ptr(int64(3))},
		{"map", Map, nil},
		{"sglang", ArraySGLang, ptr(int64(1))},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			in := &Batch{TS: 1.25e9, Events: fullEvents(), DPRank: tc.rank}
			if tc.enc == Map {
				in.Events[0].CacheSalt = ptr("salt")
			}
			payload, err := AppendBatch([]byte("prefix"), in, tc.enc)
			if err != nil {
				t.Fatalf("AppendBatch: %v", err)
			}
			if string(payload[:6]) != "prefix" {
				t.Fatalf("AppendBatch clobbered dst's prefix")
			}
			var out Batch
			enc, err := DecodeBatch(payload[6:], &out)
			if err != nil {
				t.Fatalf("DecodeBatch: %v", err)
			}
			if enc != tc.enc {
				t.Errorf("encoding: got %v, want %v", enc, tc.enc)
			}
			want := Batch{TS: in.TS, DPRank: in.DPRank}
			for _, e := range in.Events {
				want.Events = append(want.Events, carried(e, tc.enc))
			}
			if !reflect.DeepEqual(out, want) {
				t.Errorf("round trip:\n got %+v\nwant %+v", out, want)
			}
		})
	}
}

// TestSGLangSignedHashes checks that ArraySGLang writes hashes as SGLang does
// (signed int64) and that signed values decode to the same bit pattern.
func TestSGLangSignedHashes(t *testing.T) {
	h := uint64(0xdf3f619804a92fdb) // SGLang publishes -2360060374177730597
	b := &Batch{Events: []Event{{Kind: BlockRemoved, BlockHashes: []uint64{h, 5, uint64(math.MaxUint64)}}}}
	payload, err := AppendBatch(nil, b, ArraySGLang)
	if err != nil {
		t.Fatalf("AppendBatch: %v", err)
	}
	// d3 <int64 BE>, then 5 as fixint, then -1 as negative fixint.
	if want := "d3df3f619804a92fdb05ff"; !strings.Contains(hex.EncodeToString(payload), want) {
		t.Errorf("payload %x: want hashes encoded as %s", payload, want)
	}
	var out Batch
	if _, err := DecodeBatch(payload, &out); err != nil {
		t.Fatalf("DecodeBatch: %v", err)
	}
	if got := out.Events[0].BlockHashes; !reflect.DeepEqual(got, []uint64{h, 5, math.MaxUint64}) {
		t.Errorf("got %x, want bit patterns preserved", got)
	}
}

// TestHashForms feeds one BlockRemoved with a hash in each wire form.
func TestHashForms(t *testing.T) {
	// [ts, [["BlockRemoved", [<hash>]]]] with a 2-element batch.
	wrap := func(h string) []byte {
		return mustHex(t, "92cb3ff0000000000000"+"9192ac426c6f636b52656d6f76656491"+h)
	}
	cases := []struct {
		name string
		hash string
		want uint64
		ok   bool
	}{
		{"fixint", "07", 7, true},
		{"uint8", "cc80", 0x80, true},
		{"uint16", "cd0102", 0x102, true},
		{"uint32", "ce01020304", 0x01020304, true},
		{"uint64", "cfefad121d154ab2d6", 0xefad121d154ab2d6, true},
		{"neg_fixint", "ff", math.MaxUint64, true},
		{"int8", "d080", uint64(1<<64 - 128), true},
		{"int16", "d1fffe", uint64(1<<64 - 2), true},
		{"int32", "d2fffffffe", uint64(1<<64 - 2), true},
		{"int64", "d3df3f619804a92fdb", 0xdf3f619804a92fdb, true},
		{"positive_int64", "d3000000000000002a", 42, true},
		{"float64", "cb4059000000000000", 100, true},
		{"float32", "ca42c80000", 100, true},
		{"negative_float64", "cbc059000000000000", uint64(1<<64 - 100), true},
		{"bin32_digest", "c420" + strings.Repeat("00", 24) + "1e0b2e028ef071cb", 0x1e0b2e028ef071cb, true},
		{"bin16_digest", "c410" + strings.Repeat("ff", 8) + "0000000000000102", 0x102, true},
		{"bin_short", "c4020102", 0x102, true},
		{"bin_empty", "c400", 0, true},
		{"fractional_float", "cb3ff8000000000000", 0, false},
		{"nan", "cb7ff8000000000000", 0, false},
		{"too_big_float", "cb43f0000000000000", 0, false},
		{"string", "a131", 0, false},
		{"nil", "c0", 0, false},
		{"truncated_uint64", "cf0102", 0, false},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			var b Batch
			_, err := DecodeBatch(wrap(tc.hash), &b)
			if !tc.ok {
				if !errors.Is(err, ErrMalformed) {
					t.Fatalf("got error %v, want ErrMalformed", err)
				}
				if len(b.Events) != 0 {
					t.Errorf("got %d events after an error, want 0", len(b.Events))
				}
				return
			}
			if err != nil {
				t.Fatalf("DecodeBatch: %v", err)
			}
			if b.DPRank != nil {
				t.Errorf("2-element batch: got rank %d, want nil", *b.DPRank)
			}
			if got := b.Events[0].BlockHashes; len(got) != 1 || got[0] != tc.want {
				t.Errorf("got %x, want [%x]", got, tc.want)
			}
		})
	}
}

func TestDecodeTolerance(t *testing.T) {
	cases := []struct {
		name string
		hex  string
		want Batch
		enc  Encoding
	}{
		{
			// ["AllBlocksCleared", "future", 1] and a 4th batch element.
			name: "extra_trailing_elements",
			hex:  "94cb3ff0000000000000" + "9193b0416c6c426c6f636b73436c6561726564a6667574757265" + "01" + "05" + "a178",
			want: Batch{TS: 1, Events: []Event{{Kind: AllBlocksCleared}}, DPRank: ptr(int64(5))},
			enc:  ArrayV011,
		},
		{
			// v0.9-era BlockStored (6 elements), BlockRemoved (2 elements).
			name: "v0.9_short_arrays",
			hex:  "92cb3ff0000000000000" + "92" + "96ab426c6f636b53746f7265649101c0920102" + "02c0" + "92ac426c6f636b52656d6f766564910a",
			want: Batch{TS: 1, Events: []Event{
				{Kind: BlockStored, BlockHashes: []uint64{1}, TokenIDs: []uint32{1, 2}, BlockSize: 2},
				{Kind: BlockRemoved, BlockHashes: []uint64{10}},
			}},
			enc: ArrayV011,
		},
		{
			// Map event with an unknown key and the type key last.
			name: "map_unknown_key_type_last",
			hex:  "93cb3ff0000000000000" + "91" + "83" + "a3666f6f92c0c0" + "ac626c6f636b5f686173686573910b" + "a474797065ac426c6f636b52656d6f766564" + "c0",
			want: Batch{TS: 1, Events: []Event{{Kind: BlockRemoved, BlockHashes: []uint64{11}}}},
			enc:  Map,
		},
		{
			// SGLang BlockStoredWithMetadata: 8th element is {"cache_salt": "s"}.
			name: "sglang_metadata",
			hex:  "93cb3ff0000000000000" + "91" + "98ab426c6f636b53746f7265649101c0920102" + "02c0a3475055" + "81aa63616368655f73616c74a173" + "00",
			want: Batch{TS: 1, Events: []Event{{Kind: BlockStored, BlockHashes: []uint64{1}, TokenIDs: []uint32{1, 2}, BlockSize: 2,
				Medium: ptr("GPU"), CacheSalt: ptr("s")}}, DPRank: ptr(int64(0))},
			enc: ArraySGLang,
		},
		{
			// SGLang EAGLE bigram tokens [[1,2],[3,4]].
			name: "sglang_token_pairs",
			hex:  "93cb3ff0000000000000" + "91" + "96ab426c6f636b53746f7265649101c092920102920304" + "02c0" + "00",
			want: Batch{TS: 1, Events: []Event{{Kind: BlockStored, BlockHashes: []uint64{1}, TokenIDs: []uint32{1, 2, 3, 4}, TokenPairs: true, BlockSize: 2}},
				DPRank: ptr(int64(0))},
			enc: ArrayV011,
		},
		{
			name: "batch_as_map",
			hex:  "83" + "a27473cb3ff0000000000000" + "a66576656e74739191b0416c6c426c6f636b73436c6561726564" + "b2646174615f706172616c6c656c5f72616e6b01",
			want: Batch{TS: 1, Events: []Event{{Kind: AllBlocksCleared}}, DPRank: ptr(int64(1))},
			enc:  ArrayV011,
		},
		{
			name: "integer_ts_nil_rank",
			hex:  "930590c0",
			want: Batch{TS: 5, Events: []Event{}},
			enc:  ArrayV011,
		},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			var b Batch
			enc, err := DecodeBatch(mustHex(t, tc.hex), &b)
			if err != nil {
				t.Fatalf("DecodeBatch: %v", err)
			}
			if enc != tc.enc {
				t.Errorf("encoding: got %v, want %v", enc, tc.enc)
			}
			if len(tc.want.Events) == 0 {
				tc.want.Events = b.Events[:0]
			}
			if !reflect.DeepEqual(b, tc.want) {
				t.Errorf("got %+v\nwant %+v", b, tc.want)
			}
		})
	}
}

func TestDecodeRejects(t *testing.T) {
	good := mustHex(t, appendixV011)
	cases := []struct {
		name    string
		payload []byte
		want    error
	}{
		{"empty", nil, ErrMalformed},
		{"not_array", []byte{0x01}, ErrMalformed},
		{"one_element_batch", mustHex(t, "91cb3ff0000000000000"), ErrMalformed},
		{"truncated", good[:len(good)-1], ErrMalformed},
		{"trailing_garbage", append(append([]byte{}, good...), 0x00), ErrMalformed},
		{"unknown_tag", mustHex(t, "92cb3ff00000000000009191a3466f6f"), ErrUnknownEvent},
		{"unknown_map_type", mustHex(t, "92cb3ff00000000000009181a474797065a3466f6f"), ErrUnknownEvent},
		{"map_without_type", mustHex(t, "92cb3ff00000000000009181a3666f6f01"), ErrMalformed},
		{"stored_map_without_tokens", mustHex(t, "92cb3ff0000000000000"+"9182a474797065ab426c6f636b53746f726564ac626c6f636b5f68617368657390"), ErrMalformed},
		{"nil_event", mustHex(t, "92cb3ff000000000000091c0"), ErrMalformed},
		{"negative_token", mustHex(t, "92cb3ff0000000000000"+"9196ab426c6f636b53746f7265649101c091ff02c0"), ErrMalformed},
		{"token_over_uint32", mustHex(t, "92cb3ff0000000000000"+"9196ab426c6f636b53746f7265649101c091cf000000010000000002c0"), ErrMalformed},
		{"medium_not_string", mustHex(t, "92cb3ff0000000000000"+"9193ac426c6f636b52656d6f7665649101"+"05"), ErrMalformed},
		{"rank_not_int", mustHex(t, "93cb3ff000000000000090a130"), ErrMalformed},
		// One good event followed by a bad one: the whole batch is rejected.
		{"bad_second_event", mustHex(t, "92cb3ff0000000000000"+"92"+"91b0416c6c426c6f636b73436c6561726564"+"91a3466f6f"), ErrUnknownEvent},
		// Hostile lengths: a 2^32-1 element array in a few bytes.
		{"huge_events_array", mustHex(t, "92cb3ff0000000000000ddffffffff"), ErrMalformed},
		{"huge_hash_array", mustHex(t, "92cb3ff00000000000009192ac426c6f636b52656d6f766564ddffffffff01"), ErrMalformed},
		{"huge_string", mustHex(t, "92cb3ff00000000000009191dbffffffff41"), ErrMalformed},
		{"huge_map", mustHex(t, "92cb3ff000000000000091dfffffffff"), ErrMalformed},
		{"huge_bin_extra_keys", mustHex(t, "92cb3ff0000000000000"+"9197ab426c6f636b53746f7265649101c0910102c0c0"+"c6ffffffff"), ErrMalformed},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			b := Batch{Events: []Event{{Kind: BlockStored}}}
			_, err := DecodeBatch(tc.payload, &b)
			if !errors.Is(err, tc.want) {
				t.Fatalf("got error %v, want %v", err, tc.want)
			}
			if len(b.Events) != 0 || b.DPRank != nil {
				t.Errorf("after error: got %d events, rank %v; want an empty batch", len(b.Events), b.DPRank)
			}
		})
	}
}

func TestAppendBatchRejects(t *testing.T) {
	cases := []struct {
		name string
		b    *Batch
		enc  Encoding
	}{
		{"unknown_encoding", &Batch{}, Encoding(9)},
		{"zero_kind", &Batch{Events: []Event{{}}}, ArrayV011},
		{"zero_kind_map", &Batch{Events: []Event{{}}}, Map},
		{"bad_extra_keys", &Batch{Events: []Event{{Kind: BlockStored, ExtraKeys: []byte{0x92, 0xc0}}}}, ArrayLate},
		{"two_values_extra_keys", &Batch{Events: []Event{{Kind: BlockStored, ExtraKeys: []byte{0xc0, 0xc0}}}}, Map},
		{"odd_pairs", &Batch{Events: []Event{{Kind: BlockStored, TokenIDs: []uint32{1}, TokenPairs: true}}}, ArrayV011},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			dst := []byte{0xaa}
			got, err := AppendBatch(dst, tc.b, tc.enc)
			if err == nil {
				t.Fatal("got nil error, want one")
			}
			if len(got) != 1 || got[0] != 0xaa {
				t.Errorf("got dst %x after error, want it unchanged (aa)", got)
			}
		})
	}
}

// TestDecodeReusesDst checks that a second decode into the same Batch
// reuses its slices and leaves no stale fields behind.
func TestDecodeReusesDst(t *testing.T) {
	var b Batch
	if _, err := DecodeBatch(mustHex(t, appendixLate), &b); err != nil {
		t.Fatalf("first decode: %v", err)
	}
	first := &b.Events[0].BlockHashes[0]
	if _, err := DecodeBatch(mustHex(t, appendixV011), &b); err != nil {
		t.Fatalf("second decode: %v", err)
	}
	if !reflect.DeepEqual(normalize(b), normalize(*appendixBatch(ArrayV011))) {
		t.Errorf("second decode left stale fields: %+v", b)
	}
	if &b.Events[0].BlockHashes[0] != first {
		t.Error("block hash slice was reallocated, want it reused")
	}
}

// benchBatch is a realistic batch: 64 BlockStored events of 16 blocks of
// 16 tokens (1,024 blocks), full-width hashes.
func benchBatch() *Batch {
	b := &Batch{TS: 1.7e9, DPRank: ptr(int64(0))}
	h := uint64(0x9e3779b97f4a7c15)
	tok := uint32(1)
	for range 64 {
		e := Event{Kind: BlockStored, BlockSize: 16, Medium: ptr("GPU"), HasParent: true, ParentHash: h}
		for range 16 {
			h = h*6364136223846793005 + 1442695040888963407
			e.BlockHashes = append(e.BlockHashes, h)
			for range 16 {
				tok = (tok*1103515245 + 12345) % 151936
				e.TokenIDs = append(e.TokenIDs, tok)
			}
		}
		b.Events = append(b.Events, e)
	}
	return b
}

func BenchmarkDecodeBatch(b *testing.B) {
	for _, enc := range []Encoding{ArrayV011, Map, ArraySGLang} {
		b.Run(enc.String(), func(b *testing.B) {
			payload, err := AppendBatch(nil, benchBatch(), enc)
			if err != nil {
				b.Fatalf("AppendBatch: %v", err)
			}
			var out Batch
			b.SetBytes(int64(len(payload)))
			b.ReportAllocs()
			for b.Loop() {
				if _, err := DecodeBatch(payload, &out); err != nil {
					b.Fatalf("DecodeBatch: %v", err)
				}
			}
			b.ReportMetric(float64(1024*b.N)/b.Elapsed().Seconds(), "blocks/s")
		})
	}
}

func BenchmarkAppendBatch(b *testing.B) {
	batch := benchBatch()
	buf := make([]byte, 0, 64<<10)
	b.ReportAllocs()
	for b.Loop() {
		var err error
		if buf, err = AppendBatch(buf[:0], batch, ArrayV011); err != nil {
			b.Fatalf("AppendBatch: %v", err)
		}
	}
	b.ReportMetric(float64(1024*b.N)/b.Elapsed().Seconds(), "blocks/s")
}

// TestHostileCountsAllocateLittle declares 2^32-1 events and hashes in a
// small payload: memory must follow the bytes present, not the counts.
func TestHostileCountsAllocateLittle(t *testing.T) {
	removed := mustHex(t, "92ac426c6f636b52656d6f76656490") // ["BlockRemoved", []]
	cases := []struct {
		name    string
		payload []byte
	}{
		// 15,000 events declared, which the 15,000 remaining bytes could
		// hold as far as a byte count goes, but only 1,000 are there.
		{"events", append(mustHex(t, "93cb3ff0000000000000dd00003a98"), bytes.Repeat(removed, 1000)...)},
		{"events_max_count", append(mustHex(t, "93cb3ff0000000000000ddffffffff"), bytes.Repeat(removed, 1000)...)},
		{"hashes", append(mustHex(t, "92cb3ff00000000000009192ac426c6f636b52656d6f766564ddffffffff"), bytes.Repeat([]byte{0x01}, 20000)...)},
		{"tokens", append(mustHex(t, "92cb3ff00000000000009196ab426c6f636b53746f7265649101c0ddffffffff"), bytes.Repeat([]byte{0x01}, 20000)...)},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			var b Batch
			var before, after runtime.MemStats
			runtime.ReadMemStats(&before)
			_, err := DecodeBatch(tc.payload, &b)
			runtime.ReadMemStats(&after)
			if !errors.Is(err, ErrMalformed) {
				t.Fatalf("got error %v, want ErrMalformed", err)
			}
			const limit = 1 << 20
			if got := after.TotalAlloc - before.TotalAlloc; got > limit {
				t.Errorf("allocated %d bytes for a %d-byte payload, want at most %d", got, len(tc.payload), limit)
			}
		})
	}
}

// TestMapSGLangSignsHashes: SGLang's map events carry hashes as signed
// int64 (msgpack 0xd3), decoding to the same bit pattern as vLLM's unsigned
// form (0xcf).
func TestMapSGLangSignsHashes(t *testing.T) {
	const h = uint64(0xdf3f619804a92fdb) // SGLang vector: negative as int64
	b := &Batch{TS: 1, Events: []Event{{Kind: BlockStored, BlockHashes: []uint64{h}, TokenIDs: []uint32{1}, BlockSize: 1}, {Kind: BlockRemoved, BlockHashes: []uint64{h}}}}
	for _, tc := range []struct {
		name   string
		enc    Encoding
		marker byte
	}{{"vllm map unsigned", Map, 0xcf}, {"sglang map signed", MapSGLang, 0xd3}} {
		t.Run(tc.name, func(t *testing.T) {
			out, err := AppendBatch(nil, b, tc.enc)
			if err != nil {
				t.Fatal(err)
			}
			want := append([]byte{tc.marker}, binary.BigEndian.AppendUint64(nil, h)...)
			if bytes.Count(out, want) != 2 {
				t.Errorf("%s: hash not encoded as %#x in both events: %x", tc.enc, tc.marker, out)
			}
			var got Batch
			enc, err := DecodeBatch(out, &got)
			if err != nil || enc != Map || got.Events[0].BlockHashes[0] != h || got.Events[1].BlockHashes[0] != h {
				t.Errorf("decode: %v %v %+v", enc, err, got.Events)
			}
		})
	}
}
