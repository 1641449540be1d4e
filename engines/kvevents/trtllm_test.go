package kvevents

import (
	"encoding/json"
	"errors"
	"reflect"
	"strings"
	"testing"

	"github.com/llmgw/llmgw/engines/kvhash"
)

// trtGolden is a /kv_cache_events response built from TRT-LLM's serializer
// field list (engine-contracts §4.1): created, a stored chain with a parent
// and a full-width hash, removed, updated, and a V2 event with hash_algo and
// layer_group_id, in TRT's field order.
const trtGolden = `[` +
	`{"event_id":0,"data":{"type":"created","num_blocks_per_cache_level":[2048,512]},"window_size":4096},` +
	`{"event_id":1,"data":{"type":"stored","parent_hash":null,"blocks":[` +
	`{"type":"stored_block","block_hash":924206229973855,"tokens":[` +
	`{"type":"unique_token","token_id":1,"token_extra_id":0},{"type":"unique_token","token_id":2,"token_extra_id":0},` +
	`{"type":"unique_token","token_id":3,"token_extra_id":0},{"type":"unique_token","token_id":4,"token_extra_id":0}],` +
	`"cache_level":0,"priority":35}]},"window_size":4096,"attention_dp_rank":1},` +
	`{"event_id":2,"data":{"type":"stored","parent_hash":924206229973855,"blocks":[` +
	`{"type":"stored_block","block_hash":18446744073709551615,"tokens":[` +
	`{"type":"unique_token","token_id":4294967295,"token_extra_id":7}],"cache_level":1,"priority":0,` +
	`"lora_id":123,"cache_salt":"abc","mm_keys":[["00ff",3]]}]},"window_size":4096},` +
	`{"event_id":3,"data":{"type":"removed","block_hashes":[924206229973855,18446744073709551615]},"window_size":4096},` +
	`{"event_id":4,"data":{"type":"updated","block_hash":924206229973855,` +
	`"cache_level":{"type":"event_diff","new_value":1,"old_value":0},` +
	`"priority":{"type":"event_diff","new_value":50,"old_value":35}},"window_size":4096},` +
	`{"event_id":5,"data":{"type":"removed","block_hashes":["9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08"]},` +
	`"window_size":4096,"hash_algo":"v2_sha256","layer_group_id":2}` +
	`]`

func trtGoldenEvents() []TRTEvent {
	parent := TRTHash{Value: 924206229973855}
	return []TRTEvent{
		{EventID: 0, WindowSize: 4096, Data: TRTEventData{Type: TRTCreated, NumBlocksPerCacheLevel: []int64{2048, 512}}},
		{EventID: 1, WindowSize: 4096, AttentionDPRank: ptr(int64(1)), Data: TRTEventData{Type: TRTStored, Blocks: []TRTStoredBlock{{
			BlockHash:  TRTHash{Value: 924206229973855},
			Tokens:     []TRTToken{{TokenID: 1}, {TokenID: 2}, {TokenID: 3}, {TokenID: 4}},
			CacheLevel: 0, Priority: 35,
		}}}},
		{EventID: 2, WindowSize: 4096, Data: TRTEventData{Type: TRTStored, ParentHash: &parent, Blocks: []TRTStoredBlock{{
			BlockHash:  TRTHash{Value: 18446744073709551615},
			Tokens:     []TRTToken{{TokenID: 4294967295, TokenExtraID: 7}},
			CacheLevel: 1, LoraID: ptr(int64(123)),
			CacheSalt: json.RawMessage(`"abc"`), MMKeys: json.RawMessage(`[["00ff",3]]`),
		}}}},
		{EventID: 3, WindowSize: 4096, Data: TRTEventData{Type: TRTRemoved, BlockHashes: []TRTHash{{Value: 924206229973855}, {Value: 18446744073709551615}}}},
		{EventID: 4, WindowSize: 4096, Data: TRTEventData{Type: TRTUpdated, BlockHash: TRTHash{Value: 924206229973855},
			CacheLevel: &TRTEventDiff{NewValue: 1, OldValue: 0}, Priority: &TRTEventDiff{NewValue: 50, OldValue: 35}}},
		{EventID: 5, WindowSize: 4096, HashAlgo: "v2_sha256", LayerGroupID: ptr(int64(2)), Data: TRTEventData{Type: TRTRemoved,
			BlockHashes: []TRTHash{{Hex: "9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08"}}}},
	}
}

func TestTRTGolden(t *testing.T) {
	got, err := MarshalTRTEvents(trtGoldenEvents())
	if err != nil {
		t.Fatalf("MarshalTRTEvents: %v", err)
	}
	if string(got) != trtGolden {
		t.Errorf("marshal:\n got %s\nwant %s", got, trtGolden)
	}
	events, err := DecodeTRTEvents([]byte(trtGolden), 0)
	if err != nil {
		t.Fatalf("DecodeTRTEvents: %v", err)
	}
	if !reflect.DeepEqual(events, trtGoldenEvents()) {
		t.Errorf("decode:\n got %+v\nwant %+v", events, trtGoldenEvents())
	}
	// The stored block's engine hash is TRT's v1 block key of its tokens.
	blk := events[1].Data.Blocks[0]
	if got, want := kvhash.TRTLLMBlockKey(0, blk.TokenIDs(nil)), blk.BlockHash.Value; got != want {
		t.Errorf("v1 block key of the golden block: got %d, want %d", got, want)
	}
}

func TestTRTDecodeTolerance(t *testing.T) {
	cases := []struct {
		name string
		body string
		want []TRTEvent
	}{
		{"empty_array", `[]`, []TRTEvent{}},
		{"whitespace", " \n[ ]\n", []TRTEvent{}},
		{
			// Executors before variable sliding-window attention have no
			// window in KVCacheEvent; WindowSize 0 says so.
			"missing_window_size",
			`[{"event_id":9,"data":{"type":"removed","block_hashes":[1]}}]`,
			[]TRTEvent{{EventID: 9, Data: TRTEventData{Type: TRTRemoved, BlockHashes: []TRTHash{{Value: 1}}}}},
		},
		{
			"unknown_fields",
			`[{"event_id":9,"new_top":true,"data":{"type":"removed","block_hashes":[1],"extra":{"a":[1,2]}},"window_size":32}]`,
			[]TRTEvent{{EventID: 9, WindowSize: 32, Data: TRTEventData{Type: TRTRemoved, BlockHashes: []TRTHash{{Value: 1}}}}},
		},
		{
			"unknown_type_kept_raw",
			`[{"event_id":3,"data":{"type":"offloaded","x":1},"window_size":32}]`,
			[]TRTEvent{{EventID: 3, WindowSize: 32, Data: TRTEventData{Type: "offloaded", Raw: json.RawMessage(`{"type":"offloaded","x":1}`)}}},
		},
		{
			"null_optionals",
			`[{"event_id":1,"data":{"type":"stored","parent_hash":null,"blocks":[{"type":"stored_block","block_hash":5,"tokens":[{"token_id":7}],"cache_salt":null,"mm_keys":null,"lora_id":null}]},"window_size":32,"attention_dp_rank":null}]`,
			[]TRTEvent{{EventID: 1, WindowSize: 32, Data: TRTEventData{Type: TRTStored, Blocks: []TRTStoredBlock{{BlockHash: TRTHash{Value: 5}, Tokens: []TRTToken{{TokenID: 7}}}}}}},
		},
		{
			"updated_without_diffs",
			`[{"event_id":2,"data":{"type":"updated","block_hash":5},"window_size":32}]`,
			[]TRTEvent{{EventID: 2, WindowSize: 32, Data: TRTEventData{Type: TRTUpdated, BlockHash: TRTHash{Value: 5}}}},
		},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			got, err := DecodeTRTEvents([]byte(tc.body), 10)
			if err != nil {
				t.Fatalf("DecodeTRTEvents: %v", err)
			}
			if !reflect.DeepEqual(got, tc.want) {
				t.Errorf("got %+v\nwant %+v", got, tc.want)
			}
		})
	}
}

func TestTRTDecodeRejects(t *testing.T) {
	ev := func(data string) string { return `[{"event_id":1,"data":` + data + `,"window_size":32}]` }
	cases := []struct {
		name string
		body string
		max  int
		want error
	}{
		{"not_array", `{"detail":"x"}`, 0, ErrTRTMalformed},
		{"empty_body", ``, 0, ErrTRTMalformed},
		{"null_body", `null`, 0, ErrTRTMalformed},
		{"trailing_data", `[] []`, 0, ErrTRTMalformed},
		{"unterminated", `[{"event_id":1,"data":{"type":"created","num_blocks_per_cache_level":[]},"window_size":1}`, 0, ErrTRTMalformed},
		{"too_many", `[` + strings.Repeat(`{"event_id":1,"data":{"type":"removed","block_hashes":[]},"window_size":1},`, 3) + `{}]`, 3, ErrTRTTooMany},
		{"missing_event_id", `[{"data":{"type":"removed","block_hashes":[]},"window_size":1}]`, 0, ErrTRTMalformed},
		{"missing_data", `[{"event_id":1,"window_size":1}]`, 0, ErrTRTMalformed},
		{"missing_type", ev(`{"block_hashes":[]}`), 0, ErrTRTMalformed},
		{"string_event_id", `[{"event_id":"1","data":{"type":"removed","block_hashes":[]},"window_size":1}]`, 0, ErrTRTMalformed},
		{"negative_event_id", `[{"event_id":-1,"data":{"type":"removed","block_hashes":[]},"window_size":1}]`, 0, ErrTRTMalformed},
		{"float_hash", ev(`{"type":"removed","block_hashes":[1.5]}`), 0, ErrTRTMalformed},
		{"exponent_hash", ev(`{"type":"removed","block_hashes":[1e3]}`), 0, ErrTRTMalformed},
		{"negative_hash", ev(`{"type":"removed","block_hashes":[-5]}`), 0, ErrTRTMalformed},
		{"hash_over_uint64", ev(`{"type":"removed","block_hashes":[18446744073709551616]}`), 0, ErrTRTMalformed},
		{"null_hash", ev(`{"type":"removed","block_hashes":[null]}`), 0, ErrTRTMalformed},
		{"non_hex_hash", ev(`{"type":"removed","block_hashes":["xyz"]}`), 0, ErrTRTMalformed},
		{"missing_block_hashes", ev(`{"type":"removed"}`), 0, ErrTRTMalformed},
		{"missing_blocks", ev(`{"type":"stored","parent_hash":null}`), 0, ErrTRTMalformed},
		{"block_without_tokens", ev(`{"type":"stored","parent_hash":null,"blocks":[{"block_hash":1}]}`), 0, ErrTRTMalformed},
		{"token_without_id", ev(`{"type":"stored","parent_hash":null,"blocks":[{"block_hash":1,"tokens":[{"token_extra_id":0}]}]}`), 0, ErrTRTMalformed},
		{"token_over_uint32", ev(`{"type":"stored","parent_hash":null,"blocks":[{"block_hash":1,"tokens":[{"token_id":4294967296}]}]}`), 0, ErrTRTMalformed},
		{"created_without_levels", ev(`{"type":"created"}`), 0, ErrTRTMalformed},
		{"updated_without_hash", ev(`{"type":"updated"}`), 0, ErrTRTMalformed},
		{"half_diff", ev(`{"type":"updated","block_hash":1,"priority":{"new_value":1}}`), 0, ErrTRTMalformed},
		{"blocks_not_array", ev(`{"type":"stored","parent_hash":null,"blocks":{}}`), 0, ErrTRTMalformed},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			got, err := DecodeTRTEvents([]byte(tc.body), tc.max)
			if !errors.Is(err, tc.want) {
				t.Fatalf("got %v (events %+v), want error %v", err, got, tc.want)
			}
		})
	}
}

// TestDecodeTRTItemsRejectsOnlyTheBadEvent: a malformed element is returned
// with its error (and its id when readable) between the good ones.
func TestDecodeTRTItemsRejectsOnlyTheBadEvent(t *testing.T) {
	body := `[{"event_id":1,"data":{"type":"removed","block_hashes":[1]},"window_size":4},` +
		`{"event_id":2,"data":{"type":"removed","block_hashes":[1.5]},"window_size":4},` +
		`{"event_id":"3","data":{"type":"removed","block_hashes":[]}},` +
		`{"event_id":4,"data":{"type":"removed","block_hashes":[2]}}]`
	items, err := DecodeTRTItems([]byte(body), 0)
	if err != nil {
		t.Fatal(err)
	}
	type got struct {
		id    uint64
		hasID bool
		bad   bool
	}
	var g []got
	for _, it := range items {
		if it.Err != nil && !errors.Is(it.Err, ErrTRTMalformed) {
			t.Errorf("item error %v does not wrap ErrTRTMalformed", it.Err)
		}
		g = append(g, got{it.Event.EventID, it.HasID, it.Err != nil})
	}
	want := []got{{1, true, false}, {2, true, true}, {0, false, true}, {4, true, false}}
	if !reflect.DeepEqual(g, want) {
		t.Errorf("items %+v, want %+v", g, want)
	}
	if _, err := DecodeTRTEvents([]byte(body), 0); !errors.Is(err, ErrTRTMalformed) {
		t.Errorf("strict decoder: %v, want ErrTRTMalformed", err)
	}
}

func TestMarshalTRTEventsRejects(t *testing.T) {
	cases := []struct {
		name string
		ev   TRTEvent
	}{
		{"unknown_type_without_raw", TRTEvent{Data: TRTEventData{Type: "future"}}},
		{"invalid_raw", TRTEvent{Data: TRTEventData{Type: "future", Raw: json.RawMessage(`{`)}}},
		{"invalid_cache_salt", TRTEvent{Data: TRTEventData{Type: TRTStored, Blocks: []TRTStoredBlock{{CacheSalt: json.RawMessage(`{`)}}}}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			if _, err := MarshalTRTEvents([]TRTEvent{tc.ev}); err == nil {
				t.Error("got nil error, want one")
			}
		})
	}
	if got, err := MarshalTRTEvents(nil); err != nil || string(got) != "[]" {
		t.Errorf("nil slice: got %q, %v; want [] and no error", got, err)
	}
}

// FuzzDecodeTRTEvents checks that DecodeTRTEvents never panics and that what
// it accepts survives a marshal/decode round trip.
func FuzzDecodeTRTEvents(f *testing.F) {
	f.Add([]byte(trtGolden))
	f.Add([]byte(`[]`))
	f.Add([]byte(`[{"event_id":3,"data":{"type":"offloaded","x":1},"window_size":32}]`))
	f.Add([]byte(`[{"event_id":1,"data":{"type":"removed","block_hashes":["ab"]},"window_size":1}]`))
	f.Add([]byte(`[{"event_id":1,"data":{"type":"removed","block_hashes":[1e3]},"window_size":1}]`))
	f.Fuzz(func(t *testing.T, body []byte) {
		events, err := DecodeTRTEvents(body, 64)
		if err != nil {
			return
		}
		out, err := MarshalTRTEvents(events)
		if err != nil {
			t.Fatalf("marshal of decoded events failed: %v", err)
		}
		again, err := DecodeTRTEvents(out, 64)
		if err != nil {
			t.Fatalf("decode of re-marshalled events failed: %v\n%s", err, out)
		}
		// Raw objects are compacted on output; compare them compacted.
		for _, evs := range [][]TRTEvent{events, again} {
			for i := range evs {
				if evs[i].Data.Raw != nil {
					c, err := compactJSON(evs[i].Data.Raw)
					if err != nil {
						t.Fatalf("compact raw: %v", err)
					}
					evs[i].Data.Raw = c
				}
				for j := range evs[i].Data.Blocks {
					b := &evs[i].Data.Blocks[j]
					if b.CacheSalt != nil {
						b.CacheSalt, _ = compactJSON(b.CacheSalt)
					}
					if b.MMKeys != nil {
						b.MMKeys, _ = compactJSON(b.MMKeys)
					}
				}
			}
		}
		if !reflect.DeepEqual(events, again) {
			t.Fatalf("round trip mismatch:\n got %+v\nwant %+v", again, events)
		}
	})
}

func compactJSON(raw json.RawMessage) (json.RawMessage, error) {
	var sb strings.Builder
	b, err := json.Marshal(raw) // re-encodes compactly and validates
	if err != nil {
		return nil, err
	}
	sb.Write(b)
	return json.RawMessage(sb.String()), nil
}
