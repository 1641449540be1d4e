package kvevents

import (
	"encoding/hex"
	"reflect"
	"testing"
)

// FuzzDecodeBatch checks that DecodeBatch never panics and that whatever it
// accepts survives a re-encode/decode round trip in the reported layout.
func FuzzDecodeBatch(f *testing.F) {
	for _, h := range []string{
		appendixV011, appendixLate, appendixMap,
		"930590c0",               // empty batch, integer ts
		"92cb3ff000000000000090", // 2-element batch
		"92cb3ff00000000000009192ac426c6f636b52656d6f766564ddffffffff01",                          // hostile length
		"92cb3ff0000000000000" + "91" + "96ab426c6f636b53746f7265649101c092920102920304" + "02c0", // token pairs
		"93cb3ff0000000000000" + "91" + "98ab426c6f636b53746f7265649101c0920102" + "02c0a3475055" + "81aa63616368655f73616c74a173" + "00",
		"92cb3ff00000000000009191a3466f6f", // unknown tag
		"92cb3ff0000000000000" + "9192ac426c6f636b52656d6f76656491c420" + "00000000000000000000000000000000000000000000000000000000000000ff",
	} {
		b, err := hex.DecodeString(h)
		if err != nil {
			f.Fatalf("seed %q: %v", h, err)
		}
		f.Add(b)
	}
	for _, enc := range []Encoding{ArrayV011, ArrayLate, Map, ArraySGLang} {
		p, err := AppendBatch(nil, &Batch{TS: 2, Events: fullEvents(), DPRank: ptr(int64(1))}, enc)
		if err != nil {
			f.Fatalf("seed %v: %v", enc, err)
		}
		f.Add(p)
	}
	f.Fuzz(func(t *testing.T, payload []byte) {
		var b Batch
		enc, err := DecodeBatch(payload, &b)
		if err != nil {
			return
		}
		// Re-encoding what was decoded must decode to the same batch, as far
		// as the reported layout carries the fields.
		out, err := AppendBatch(nil, &b, enc)
		if err != nil {
			t.Fatalf("re-encode of a decoded batch failed: %v", err)
		}
		var b2 Batch
		if _, err := DecodeBatch(out, &b2); err != nil {
			t.Fatalf("decode of the re-encoded batch failed: %v\n%x", err, out)
		}
		want := Batch{TS: b.TS, DPRank: b.DPRank, Events: make([]Event, 0, len(b.Events))}
		for _, e := range b.Events {
			want.Events = append(want.Events, carried(e, enc))
		}
		if len(want.Events) == 0 {
			want.Events = b2.Events
		}
		if !reflect.DeepEqual(normalize(b2), normalize(want)) && !(b.TS != b.TS) {
			t.Fatalf("round trip mismatch:\n got %+v\nwant %+v", b2, want)
		}
	})
}

// normalize clears the differences a round trip may legitimately introduce:
// empty versus nil slices.
func normalize(b Batch) Batch {
	out := b
	out.Events = make([]Event, len(b.Events))
	for i, e := range b.Events {
		if len(e.BlockHashes) == 0 {
			e.BlockHashes = nil
		}
		if len(e.TokenIDs) == 0 {
			e.TokenIDs = nil
		}
		out.Events[i] = e
	}
	return out
}

// FuzzDecodeTRTItems checks that DecodeTRTItems never panics, agrees with
// DecodeTRTEvents (which fails exactly when some item is rejected), and that
// every event it accepts survives a marshal/decode round trip.
func FuzzDecodeTRTItems(f *testing.F) {
	for _, s := range []string{
		trtGolden, `[]`, `[{"event_id":1,"data":{"type":"removed","block_hashes":[1.5]},"window_size":4}]`,
		`[{"event_id":1,"data":{"type":"removed","block_hashes":[2]}},{"event_id":"x"},{}]`,
		`[{"event_id":1,"data":{"type":"offloaded"}}]`, `[1,"a",null]`, `[{"event_id":18446744073709551615,"data":{"type":"created","num_blocks_per_cache_level":[]}}]`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		items, err := DecodeTRTItems(body, 64)
		evs, strictErr := DecodeTRTEvents(body, 64)
		if err != nil {
			if strictErr == nil {
				t.Fatalf("items failed (%v) but the strict decoder accepted %d events", err, len(evs))
			}
			return
		}
		bad := 0
		var good []TRTEvent
		for _, it := range items {
			if it.Err != nil {
				bad++
				continue
			}
			good = append(good, it.Event)
		}
		if (bad > 0) != (strictErr != nil) {
			t.Fatalf("%d rejected items, strict decoder error %v", bad, strictErr)
		}
		if len(good) == 0 {
			return
		}
		out, err := MarshalTRTEvents(good)
		if err != nil {
			return // e.g. an unknown type whose raw object does not re-encode
		}
		again, err := DecodeTRTEvents(out, 64)
		if err != nil || len(again) != len(good) {
			t.Fatalf("round trip of %d accepted events: %d events, %v\n%s", len(good), len(again), err, out)
		}
	})
}
