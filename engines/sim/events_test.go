package sim

import (
	"bytes"
	"context"
	"encoding/binary"
	"encoding/hex"
	"fmt"
	"reflect"
	"testing"
	"time"

	"github.com/go-zeromq/zmq4"
	"github.com/vmihailenco/msgpack/v5"

	"github.com/llmgw/llmgw/engines"
)

// zmqMsg is one received 3-frame KV event message.
type zmqMsg struct {
	topic   []byte
	seq     uint64
	payload []byte
}

// subscribe dials a zmq4 SUB (independent of the sim's publisher code) to
// endpoint and delivers messages on the returned channel until the test ends.
func subscribe(t *testing.T, endpoint string) <-chan zmqMsg {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	sub := zmq4.NewSub(ctx)
	if err := sub.Dial(endpoint); err != nil {
		cancel()
		t.Fatalf("dial %s: %v", endpoint, err)
	}
	if err := sub.SetOption(zmq4.OptionSubscribe, ""); err != nil {
		t.Fatal(err)
	}
	ch := make(chan zmqMsg, 64)
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			m, err := sub.Recv()
			if err != nil {
				return
			}
			if len(m.Frames) != 3 || len(m.Frames[1]) != 8 {
				t.Errorf("message with %d frames (want 3, seq of 8 bytes)", len(m.Frames))
				continue
			}
			select {
			case ch <- zmqMsg{m.Frames[0], binary.BigEndian.Uint64(m.Frames[1]), m.Frames[2]}:
			case <-ctx.Done():
				return
			}
		}
	}()
	t.Cleanup(func() {
		cancel()
		_ = sub.Close()
		<-done
	})
	return ch
}

// warmUp defeats ZeroMQ's slow-joiner window: it triggers AllBlocksCleared
// batches until the subscriber sees one, and returns the last seq seen.
func warmUp(t *testing.T, s *Sim, ch <-chan zmqMsg) uint64 {
	t.Helper()
	c := client(t)
	deadline := time.Now().Add(10 * time.Second)
	for {
		do(t, c, "POST", "http://"+s.Addrs().HTTP+"/_sim/reset_cache", "")
		select {
		case m := <-ch:
			// Drain whatever else the warm-up produced.
			for {
				select {
				case m = <-ch:
				case <-time.After(50 * time.Millisecond):
					return m.seq
				}
			}
		case <-time.After(20 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			t.Fatal("subscriber never received a batch")
		}
	}
}

func recvMsg(t *testing.T, ch <-chan zmqMsg) zmqMsg {
	t.Helper()
	select {
	case m := <-ch:
		return m
	case <-time.After(10 * time.Second):
		t.Fatal("timed out waiting for a KV event batch")
		return zmqMsg{}
	}
}

// The appendix vectors of engine-contracts.md: the BlockStored and
// BlockRemoved events of the batch for tokens 1..8, block size 4,
// sha256_cbor with PYTHONHASHSEED "0".
const (
	arrayStoredHex  = "97ab426c6f636b53746f72656492cf1e0b2e028ef071cbcfefad121d154ab2d6c098010203040506070804c0a3475055"
	mapStoredHex    = "8ba474797065ab426c6f636b53746f726564ac626c6f636b5f68617368657392cf1e0b2e028ef071cbcfefad121d154ab2d6b1706172656e745f626c6f636b5f68617368c0a9746f6b656e5f696473980102030405060708aa626c6f636b5f73697a6504a76c6f72615f6964c0a66d656469756da3475055a96c6f72615f6e616d65c0aa65787472615f6b65797392c0c0a967726f75705f69647800b26b765f63616368655f737065635f6b696e64ae66756c6c5f617474656e74696f6e"
	arrayRemovedHex = "93ac426c6f636b52656d6f76656491cf1e0b2e028ef071cba3475055"
	mapRemovedHex   = "84a474797065ac426c6f636b52656d6f766564ac626c6f636b5f68617368657391cf1e0b2e028ef071cba66d656469756da3475055a967726f75705f69647800"
)

func TestVLLMEventsGolden(t *testing.T) {
	tests := []struct {
		encoding          string
		stored, removed   string
		wantStoredHeader  byte
		wantRemovedHeader byte
	}{
		{EncodingArray, arrayStoredHex, arrayRemovedHex, 0x97, 0x93},
		{EncodingMap, mapStoredHex, mapRemovedHex, 0x8b, 0x84},
	}
	for _, tc := range tests {
		t.Run(tc.encoding, func(t *testing.T) {
			s := startSim(t, Config{Engine: engines.VLLM, BlockSize: 4, CacheBlocks: 2, EventEncoding: tc.encoding})
			if s.Addrs().Events == "" || s.Addrs().Replay == "" {
				t.Fatalf("addrs: %+v", s.Addrs())
			}
			ch := subscribe(t, s.Addrs().Events)
			last := warmUp(t, s, ch)
			c := client(t)
			do(t, c, "POST", "http://"+s.Addrs().HTTP+"/v1/completions", `{"prompt":[1,2,3,4,5,6,7,8],"max_tokens":1}`)
			m := recvMsg(t, ch)
			if m.seq != last+1 || len(m.topic) != 0 {
				t.Errorf("seq/topic: got %d %q, want %d and an empty topic", m.seq, m.topic, last+1)
			}
			want, _ := hex.DecodeString(tc.stored)
			// [ts float64, [event], 0]: 0x93, cb + 8 bytes, 0x91, event, 0x00.
			if len(m.payload) < 12 || m.payload[0] != 0x93 || m.payload[1] != 0xcb || m.payload[10] != 0x91 ||
				!bytes.Equal(m.payload[11:len(m.payload)-1], want) || m.payload[len(m.payload)-1] != 0 {
				t.Errorf("BlockStored batch:\n got %x\nwant 93cb<ts>91%s00", m.payload, tc.stored)
			}
			// An independent msgpack decoder reads the same values.
			var batch []any
			if err := msgpack.Unmarshal(m.payload, &batch); err != nil || len(batch) != 3 {
				t.Fatalf("msgpack decode: %v (%v)", err, batch)
			}
			if ts, ok := batch[0].(float64); !ok || ts != 1700000000.5 {
				t.Errorf("ts: got %v, want 1700000000.5", batch[0])
			}
			// A second prompt evicts the first two blocks (capacity 2).
			do(t, c, "POST", "http://"+s.Addrs().HTTP+"/v1/completions", `{"prompt":[9,9,9,9,8,8,8,8],"max_tokens":1}`)
			m = recvMsg(t, ch)
			rm, _ := hex.DecodeString(tc.removed)
			if !bytes.Contains(m.payload, rm) {
				t.Errorf("eviction batch %x lacks BlockRemoved %s", m.payload, tc.removed)
			}
		})
	}
}

// replay asks the ROUTER for every batch from start and returns them until
// the end marker.
func replay(t *testing.T, endpoint string, start uint64) []zmqMsg {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	d := zmq4.NewDealer(ctx)
	defer d.Close()
	if err := d.Dial(endpoint); err != nil {
		t.Fatalf("dial replay: %v", err)
	}
	var req [8]byte
	binary.BigEndian.PutUint64(req[:], start)
	if err := d.SendMulti(zmq4.NewMsgFrom([]byte{}, req[:])); err != nil {
		t.Fatal(err)
	}
	var out []zmqMsg
	for {
		m, err := d.Recv()
		if err != nil {
			t.Fatalf("replay recv: %v", err)
		}
		f := m.Frames
		if len(f) > 0 && len(f[0]) == 0 {
			f = f[1:] // the empty delimiter
		}
		// vLLM >= 0.26 framing: [topic, seq, payload].
		if len(f) == 3 {
			f = f[1:]
		}
		if len(f) != 2 || len(f[0]) != 8 {
			t.Fatalf("replay frames: %q", m.Frames)
		}
		seq := binary.BigEndian.Uint64(f[0])
		if seq == 1<<64-1 && len(f[1]) == 0 {
			return out
		}
		out = append(out, zmqMsg{seq: seq, payload: f[1]})
	}
}

func TestEventReplayAndRestart(t *testing.T) {
	for _, k := range []engines.Kind{engines.VLLM, engines.SGLang} {
		t.Run(string(k), func(t *testing.T) {
			s := startSim(t, Config{Engine: k, BlockSize: 4})
			ch := subscribe(t, s.Addrs().Events)
			warmUp(t, s, ch)
			c := client(t)
			var live []zmqMsg
			for i := 0; i < 3; i++ {
				do(t, c, "POST", "http://"+s.Addrs().HTTP+"/v1/completions", fmt.Sprintf(`{"prompt":[%d,2,3,4,5],"max_tokens":1}`, 100+i))
				live = append(live, recvMsg(t, ch))
			}
			// A subscriber that missed the last two batches gets exactly those.
			got := replay(t, s.Addrs().Replay, live[1].seq)
			if len(got) != 2 {
				t.Fatalf("replay from %d: got %d batches, want 2", live[1].seq, len(got))
			}
			for i, m := range got {
				if m.seq != live[i+1].seq || !bytes.Equal(m.payload, live[i+1].payload) {
					t.Errorf("replayed batch %d: seq %d, want %d (payload equal: %v)", i, m.seq, live[i+1].seq, bytes.Equal(m.payload, live[i+1].payload))
				}
			}
			// Restart: same ports, sequence from 0, empty replay buffer and an
			// empty cache (the next request stores its blocks again).
			before := s.Addrs()
			postFaults(t, s, `{"restart_publisher":true}`)
			if !reflect.DeepEqual(s.Addrs(), before) {
				t.Errorf("addresses changed across restart: %+v -> %+v", before, s.Addrs())
			}
			if got := replay(t, s.Addrs().Replay, 0); len(got) != 0 {
				t.Errorf("replay after restart: got %d batches, want 0", len(got))
			}
			ch2 := subscribe(t, s.Addrs().Events)
			// The warm-up's reset batches take seq 0.., then the request.
			warmUp(t, s, ch2)
			do(t, c, "POST", "http://"+s.Addrs().HTTP+"/v1/completions", `{"prompt":[100,2,3,4,5],"max_tokens":1}`)
			m := recvMsg(t, ch2)
			all := replay(t, s.Addrs().Replay, 0)
			if len(all) == 0 || all[0].seq != 0 || all[len(all)-1].seq != m.seq {
				t.Errorf("after restart: replay seqs %v, last live %d; want from 0 to the live seq", seqs(all), m.seq)
			}
			var batch []any
			if err := msgpack.Unmarshal(m.payload, &batch); err != nil {
				t.Fatal(err)
			}
			evs := batch[1].([]any)
			if len(evs) != 1 {
				t.Fatalf("events after restart: %v", evs)
			}
		})
	}
}

func seqs(ms []zmqMsg) []uint64 {
	out := make([]uint64, len(ms))
	for i, m := range ms {
		out[i] = m.seq
	}
	return out
}

// TestSGLangEventsPerPage checks SGLang's layout: one BlockStored per page,
// hashes as signed int64 (its first-8-bytes key), parent chained.
func TestSGLangEventsPerPage(t *testing.T) {
	s := startSim(t, Config{Engine: engines.SGLang, BlockSize: 4})
	ch := subscribe(t, s.Addrs().Events)
	warmUp(t, s, ch)
	do(t, client(t), "POST", "http://"+s.Addrs().HTTP+"/generate", `{"input_ids":[1,2,3,4,5,6,7,8,9],"sampling_params":{"max_new_tokens":1}}`)
	m := recvMsg(t, ch)
	var batch []any
	if err := msgpack.Unmarshal(m.payload, &batch); err != nil {
		t.Fatal(err)
	}
	evs := batch[1].([]any)
	if len(evs) != 2 {
		t.Fatalf("events: got %d, want 2 (one per full page): %v", len(evs), evs)
	}
	first, second := evs[0].([]any), evs[1].([]any)
	// Spec vectors: page [1,2,3,4] -> -3488128144981237669, then [5,6,7,8]
	// -> 5674439469042975057.
	if fmt.Sprint(first[0]) != "BlockStored" || fmt.Sprint(first[1]) != "[-3488128144981237669]" || first[2] != nil {
		t.Errorf("first page event: %v", first)
	}
	if fmt.Sprint(second[1]) != "[5674439469042975057]" || fmt.Sprint(second[2]) != "-3488128144981237669" {
		t.Errorf("second page event: %v", second)
	}
}

func TestOffsetEndpointPort(t *testing.T) {
	tests := []struct {
		name     string
		endpoint string
		rank     int
		want     string
	}{
		{"rank 0 unchanged", "tcp://*:5557", 0, "tcp://*:5557"},
		{"tcp port offset", "tcp://*:5557", 1, "tcp://*:5558"},
		{"host kept", "tcp://127.0.0.1:6000", 3, "tcp://127.0.0.1:6003"},
		{"kernel-chosen stays 0", "tcp://127.0.0.1:0", 2, "tcp://127.0.0.1:0"},
		{"inproc suffix", "inproc://kv", 1, "inproc://kv_dp1"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if got := offsetEndpointPort(tc.endpoint, tc.rank); got != tc.want {
				t.Errorf("offsetEndpointPort(%q, %d): got %q, want %q", tc.endpoint, tc.rank, got, tc.want)
			}
		})
	}
}

// TestDPRanks: each attention-DP rank has its own publisher and cache; a
// request pinned to rank 1 is published on rank 1's socket with rank 1 in
// the batch and in SGLang's attn_dp_rank element.
func TestDPRanks(t *testing.T) {
	s := startSim(t, Config{Engine: engines.SGLang, BlockSize: 4, DPRanks: 2})
	a := s.Addrs()
	if len(a.EventsByRank) != 2 || len(a.ReplayByRank) != 2 || a.EventsByRank[0] != a.Events || a.EventsByRank[1] == a.Events {
		t.Fatalf("addrs: %+v", a)
	}
	ch := subscribe(t, a.EventsByRank[1])
	warmUp(t, s, ch)
	c := client(t)
	body := `{"input_ids":[1,2,3,4,5],"sampling_params":{"max_new_tokens":1},"data_parallel_rank":1}`
	do(t, c, "POST", "http://"+a.HTTP+"/generate", body)
	m := recvMsg(t, ch)
	var batch []any
	if err := msgpack.Unmarshal(m.payload, &batch); err != nil {
		t.Fatal(err)
	}
	ev := batch[1].([]any)[0].([]any)
	if fmt.Sprint(batch[2]) != "1" || fmt.Sprint(ev[len(ev)-1]) != "1" {
		t.Errorf("rank 1 batch: dp rank %v, event %v", batch[2], ev)
	}
	// The same prompt on rank 1 hits its cache; on rank 0 it misses.
	res := do(t, c, "POST", "http://"+a.HTTP+"/generate", body)
	res0 := do(t, c, "POST", "http://"+a.HTTP+"/generate", `{"input_ids":[1,2,3,4,5],"sampling_params":{"max_new_tokens":1},"data_parallel_rank":0}`)
	if !bytes.Contains(res.body, []byte(`"cached_tokens":4`)) || !bytes.Contains(res0.body, []byte(`"cached_tokens":0`)) {
		t.Errorf("per-rank caches: rank 1 %s; rank 0 %s", res.body, res0.body)
	}
}

// TestEventFaults: a seq_gap fault is a jump in the live sequence that
// replay cannot fill; a dropped batch is a jump that replay fills.
func TestEventFaults(t *testing.T) {
	tests := []struct {
		name     string
		fault    string
		wantJump uint64
		// wantReplayed are the replayed seqs (relative to the last seen)
		// from just after the last seen batch.
		wantReplayed []uint64
	}{
		{"seq gap", `{"seq_gap":5}`, 6, []uint64{6, 7}},
		{"dropped batch", `{"drop_events":1}`, 2, []uint64{1, 2}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			s := startSim(t, Config{Engine: engines.VLLM, BlockSize: 4})
			ch := subscribe(t, s.Addrs().Events)
			last := warmUp(t, s, ch)
			c := client(t)
			postFaults(t, s, tc.fault)
			do(t, c, "POST", "http://"+s.Addrs().HTTP+"/v1/completions", `{"prompt":[1,2,3,4,5],"max_tokens":1}`)
			do(t, c, "POST", "http://"+s.Addrs().HTTP+"/v1/completions", `{"prompt":[6,2,3,4,5],"max_tokens":1}`)
			m := recvMsg(t, ch)
			if m.seq != last+tc.wantJump {
				t.Errorf("first live seq after the fault: got %d, want %d", m.seq, last+tc.wantJump)
			}
			var want []uint64
			for _, d := range tc.wantReplayed {
				want = append(want, last+d)
			}
			if got := seqs(replay(t, s.Addrs().Replay, last+1)); fmt.Sprint(got) != fmt.Sprint(want) {
				t.Errorf("replay from %d: got seqs %v, want %v", last+1, got, want)
			}
		})
	}
}
