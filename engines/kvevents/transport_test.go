package kvevents

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"reflect"
	"sync"
	"testing"
	"time"

	"github.com/go-zeromq/zmq4"
	"go.uber.org/goleak"

	"github.com/llmgw/llmgw/internal/wait"
)

func TestMain(m *testing.M) {
	// zmq4 v0.17.0's PUB socket starts a writer goroutine that socket.Close
	// never stops (pubMWriter.run stays parked on its condition variable); it
	// holds no socket and burns no CPU. Everything else must be gone.
	goleak.VerifyTestMain(m, goleak.IgnoreAnyFunction("github.com/go-zeromq/zmq4.(*pubMWriter).run"))
}

const (
	waitFor = 10 * time.Second // upper bound for any condition in these tests
	tick    = 20 * time.Millisecond
)

// probePayload marks the batches tests publish only to learn that a
// subscription is live; readers skip them.
var probePayload = []byte("probe")

// startPublisher binds a publisher on 127.0.0.1 with kernel-chosen ports.
func startPublisher(t *testing.T, cfg PublisherConfig) *Publisher {
	t.Helper()
	if cfg.Endpoint == "" {
		cfg.Endpoint = "tcp://127.0.0.1:0"
	}
	cfg.Bind = true
	p, err := NewPublisher(context.Background(), cfg)
	if err != nil {
		t.Fatalf("NewPublisher: %v", err)
	}
	t.Cleanup(func() { p.Close() })
	return p
}

func endpointOf(a net.Addr) string { return "tcp://" + a.String() }

// runningSub is a Subscriber running in its own goroutine, delivering into a
// channel.
type runningSub struct {
	sub    *Subscriber
	msgs   chan Message
	cancel context.CancelFunc
	done   chan error
}

func startSubscriber(t *testing.T, cfg SubscriberConfig) *runningSub {
	t.Helper()
	if cfg.MinBackoff == 0 {
		cfg.MinBackoff, cfg.MaxBackoff = 10*time.Millisecond, 50*time.Millisecond
	}
	ctx, cancel := context.WithCancel(context.Background())
	rs := &runningSub{sub: NewSubscriber(cfg), msgs: make(chan Message, 4096), cancel: cancel, done: make(chan error, 1)}
	go func() {
		rs.done <- rs.sub.Run(ctx, func(m Message) { rs.msgs <- m })
	}()
	t.Cleanup(func() { rs.stop(t) })
	return rs
}

func (rs *runningSub) stop(t *testing.T) {
	t.Helper()
	rs.cancel()
	select {
	case err, ok := <-rs.done:
		if ok && !errors.Is(err, context.Canceled) {
			t.Errorf("Run returned %v, want context.Canceled", err)
		}
		close(rs.done)
	case <-time.After(waitFor):
		t.Fatal("Run did not return after cancel")
	}
}

// next returns the next non-probe message, failing the test at the deadline.
func (rs *runningSub) next(t *testing.T) Message {
	t.Helper()
	deadline := time.After(waitFor)
	for {
		select {
		case m := <-rs.msgs:
			if bytes.Equal(m.Payload, probePayload) {
				continue
			}
			return m
		case <-deadline:
			t.Fatal("timed out waiting for a message")
			return Message{}
		}
	}
}

// waitLive publishes probes until one reaches rs (the subscription is then
// live), and returns that probe's message.
func waitLive(t *testing.T, p *Publisher, rs *runningSub) Message {
	t.Helper()
	deadline := time.Now().Add(waitFor)
	for time.Now().Before(deadline) {
		if _, err := p.Publish(probePayload); err != nil {
			t.Fatalf("Publish probe: %v", err)
		}
		select {
		case m := <-rs.msgs:
			if !bytes.Equal(m.Payload, probePayload) {
				t.Fatalf("got non-probe message seq %d before the subscription was live", m.Seq)
			}
			return m
		case <-time.After(tick):
		}
	}
	t.Fatal("subscription never became live")
	return Message{}
}

// waitState polls the subscriber state until cond holds.
func waitState(t *testing.T, rs *runningSub, what string, cond func(SubscriberState) bool) SubscriberState {
	t.Helper()
	var st SubscriberState
	wait.ForErr(t, waitFor, what, func() error {
		if st = rs.sub.State(); cond(st) {
			return nil
		}
		return fmt.Errorf("state %+v", st)
	})
	return st
}

func encode(t *testing.T, b *Batch, enc Encoding) []byte {
	t.Helper()
	p, err := AppendBatch(nil, b, enc)
	if err != nil {
		t.Fatalf("AppendBatch: %v", err)
	}
	return p
}

func TestPubSubEncodings(t *testing.T) {
	cases := []struct {
		name string
		enc  Encoding
	}{
		{"v0.11_arrays", ArrayV011},
		{"late_arrays", ArrayLate},
		{"maps", Map},
		{"sglang_arrays", ArraySGLang},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			p := startPublisher(t, PublisherConfig{Topic: "kv@10.0.0.1@model"})
			rs := startSubscriber(t, SubscriberConfig{Endpoint: endpointOf(p.Addr()), Topic: "kv@"})
			probe := waitLive(t, p, rs)

			var sent []*Batch
			for i := range 5 {
				b := &Batch{TS: float64(1700000000 + i), Events: fullEvents(), DPRank: ptr(int64(i))}
				sent = append(sent, b)
				if _, err := p.Publish(encode(t, b, tc.enc)); err != nil {
					t.Fatalf("Publish: %v", err)
				}
			}
			prev := probe.Seq
			for i, want := range sent {
				m := rs.next(t)
				if m.Seq <= prev {
					t.Fatalf("batch %d: got seq %d after %d, want increasing", i, m.Seq, prev)
				}
				prev = m.Seq
				if got := string(m.Topic); got != "kv@10.0.0.1@model" {
					t.Errorf("topic: got %q, want %q", got, "kv@10.0.0.1@model")
				}
				if m.Replayed {
					t.Error("live message marked Replayed")
				}
				var got Batch
				enc, err := DecodeBatch(m.Payload, &got)
				if err != nil {
					t.Fatalf("DecodeBatch: %v", err)
				}
				if enc != tc.enc {
					t.Errorf("encoding: got %v, want %v", enc, tc.enc)
				}
				w := Batch{TS: want.TS, DPRank: want.DPRank}
				for _, e := range want.Events {
					w.Events = append(w.Events, carried(e, tc.enc))
				}
				if !reflect.DeepEqual(normalize(got), normalize(w)) {
					t.Errorf("batch %d:\n got %+v\nwant %+v", i, got, w)
				}
			}
			if st := rs.sub.State(); st.Gaps != 0 || st.Regressions != 0 || !st.Connected {
				t.Errorf("state: got %+v, want connected with no gaps or regressions", st)
			}
		})
	}
}

// replayClient asks the replay socket for batches from start on, as a raw
// DEALER, and returns the replies up to and including the end marker.
func replayClient(t *testing.T, endpoint string, request [][]byte) [][][]byte {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), waitFor)
	defer cancel()
	d := zmq4.NewDealer(ctx)
	defer d.Close()
	if err := d.Dial(endpoint); err != nil {
		t.Fatalf("dial replay: %v", err)
	}
	if err := d.SendMulti(zmq4.NewMsgFrom(request...)); err != nil {
		t.Fatalf("send replay request: %v", err)
	}
	var replies [][][]byte
	for {
		msg, err := d.Recv()
		if err != nil {
			t.Fatalf("receive replay reply: %v", err)
		}
		replies = append(replies, msg.Frames)
		if len(msg.Frames[len(msg.Frames)-1]) == 0 {
			return replies
		}
	}
}

func seq8(v uint64) []byte { return binary.BigEndian.AppendUint64(nil, v) }

func TestReplayProtocol(t *testing.T) {
	cases := []struct {
		name      string
		withTopic bool
		steps     int
		from      uint64
		wantSeqs  []uint64
	}{
		{"from_k", false, 0, 4, []uint64{4, 5, 6, 7, 8, 9}},
		{"from_k_with_topic", true, 0, 7, []uint64{7, 8, 9}},
		{"from_zero_small_buffer", false, 3, 0, []uint64{7, 8, 9}},
		{"past_the_end", false, 0, 10, nil},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			p := startPublisher(t, PublisherConfig{ReplayEndpoint: "tcp://127.0.0.1:0", Topic: "t", BufferSteps: tc.steps, ReplayWithTopic: tc.withTopic})
			for i := range 10 {
				if seq, err := p.Publish([]byte(fmt.Sprintf("batch-%d", i))); err != nil || seq != uint64(i) {
					t.Fatalf("Publish %d: got seq %d, err %v", i, seq, err)
				}
			}
			replies := replayClient(t, endpointOf(p.ReplayAddr()), [][]byte{{}, seq8(tc.from)})
			var want [][][]byte
			for _, s := range tc.wantSeqs {
				if tc.withTopic {
					want = append(want, [][]byte{{}, []byte("t"), seq8(s), []byte(fmt.Sprintf("batch-%d", s))})
				} else {
					want = append(want, [][]byte{{}, seq8(s), []byte(fmt.Sprintf("batch-%d", s))})
				}
			}
			if tc.withTopic {
				want = append(want, [][]byte{{}, {}, seq8(EndSeq), {}})
			} else {
				want = append(want, [][]byte{{}, seq8(EndSeq), {}})
			}
			if !reflect.DeepEqual(replies, want) {
				t.Errorf("replies:\n got %q\nwant %q", replies, want)
			}
		})
	}
}

// TestReplayIgnoresBadRequests sends malformed requests before a good one;
// only the good one is answered.
func TestReplayIgnoresBadRequests(t *testing.T) {
	p := startPublisher(t, PublisherConfig{ReplayEndpoint: "tcp://127.0.0.1:0"})
	if _, err := p.Publish([]byte("only")); err != nil {
		t.Fatalf("Publish: %v", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), waitFor)
	defer cancel()
	d := zmq4.NewDealer(ctx)
	defer d.Close()
	if err := d.Dial(endpointOf(p.ReplayAddr())); err != nil {
		t.Fatalf("dial: %v", err)
	}
	for _, bad := range []zmq4.Msg{
		zmq4.NewMsgFrom(seq8(0)),                      // no delimiter
		zmq4.NewMsgFrom([]byte{}, []byte{0, 0, 0, 0}), // short seq
		zmq4.NewMsgFrom([]byte("x"), seq8(0)),         // non-empty delimiter
	} {
		if err := d.SendMulti(bad); err != nil {
			t.Fatalf("send: %v", err)
		}
	}
	if err := d.SendMulti(zmq4.NewMsgFrom([]byte{}, seq8(0))); err != nil {
		t.Fatalf("send: %v", err)
	}
	var got [][][]byte
	for len(got) < 2 {
		msg, err := d.Recv()
		if err != nil {
			t.Fatalf("recv: %v", err)
		}
		got = append(got, msg.Frames)
	}
	want := [][][]byte{{{}, seq8(0), []byte("only")}, {{}, seq8(EndSeq), {}}}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("got %q, want %q", got, want)
	}
}

// cutProxy forwards TCP between a subscriber and a publisher so a test can
// sever the connection while both ends stay up.
type cutProxy struct {
	ln       net.Listener
	upstream string
	ctx      context.Context
	cancel   context.CancelFunc
	wg       sync.WaitGroup

	mu      sync.Mutex
	blocked bool
	conns   []net.Conn
}

func newCutProxy(t *testing.T, upstream string) *cutProxy {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatalf("proxy listen: %v", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cp := &cutProxy{ln: ln, upstream: upstream, ctx: ctx, cancel: cancel}
	cp.wg.Add(1)
	go cp.accept()
	t.Cleanup(cp.close)
	return cp
}

func (cp *cutProxy) accept() {
	defer cp.wg.Done()
	for {
		c, err := cp.ln.Accept()
		if err != nil {
			return
		}
		cp.mu.Lock()
		blocked := cp.blocked
		cp.mu.Unlock()
		if blocked {
			c.Close()
			continue
		}
		var d net.Dialer
		u, err := d.DialContext(cp.ctx, "tcp", cp.upstream)
		if err != nil {
			c.Close()
			continue
		}
		cp.mu.Lock()
		cp.conns = append(cp.conns, c, u)
		cp.mu.Unlock()
		cp.wg.Add(2)
		go cp.pipe(c, u)
		go cp.pipe(u, c)
	}
}

func (cp *cutProxy) pipe(dst, src net.Conn) {
	defer cp.wg.Done()
	_, _ = io.Copy(dst, src)
	dst.Close()
	src.Close()
}

// cut closes every forwarded connection and, with block, refuses new ones.
func (cp *cutProxy) cut(block bool) {
	cp.mu.Lock()
	defer cp.mu.Unlock()
	cp.blocked = block
	for _, c := range cp.conns {
		c.Close()
	}
	cp.conns = nil
}

func (cp *cutProxy) unblock() {
	cp.mu.Lock()
	cp.blocked = false
	cp.mu.Unlock()
}

func (cp *cutProxy) close() {
	cp.cancel()
	cp.ln.Close()
	cp.cut(true)
	cp.wg.Wait()
}

// TestSubscriberReplaysMissedBatches severs the live connection, publishes
// while the subscriber is cut off, and checks that the reconnecting
// subscriber replays exactly the missed batches, in order, before live ones.
func TestSubscriberReplaysMissedBatches(t *testing.T) {
	cases := []struct {
		name      string
		withTopic bool
	}{
		{"replay_without_topic", false},
		{"replay_with_topic", true},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			p := startPublisher(t, PublisherConfig{ReplayEndpoint: "tcp://127.0.0.1:0", Topic: "kv", ReplayWithTopic: tc.withTopic})
			proxy := newCutProxy(t, p.Addr().String())
			rs := startSubscriber(t, SubscriberConfig{
				Endpoint:       "tcp://" + proxy.ln.Addr().String(),
				ReplayEndpoint: endpointOf(p.ReplayAddr()),
			})
			waitLive(t, p, rs)
			for i := range 3 {
				if _, err := p.Publish([]byte(fmt.Sprintf("before-%d", i))); err != nil {
					t.Fatalf("Publish: %v", err)
				}
			}
			var lastLive uint64
			for range 3 {
				lastLive = rs.next(t).Seq
			}

			proxy.cut(true)
			waitState(t, rs, "disconnect", func(st SubscriberState) bool { return !st.Connected })
			var missed []uint64
			for i := range 4 {
				seq, err := p.Publish([]byte(fmt.Sprintf("missed-%d", i)))
				if err != nil {
					t.Fatalf("Publish: %v", err)
				}
				missed = append(missed, seq)
			}
			proxy.unblock()

			for i, want := range missed {
				m := rs.next(t)
				if m.Seq != want || !m.Replayed || string(m.Payload) != fmt.Sprintf("missed-%d", i) {
					t.Fatalf("replayed %d: got seq %d replayed=%v payload %q, want seq %d replayed=true payload %q",
						i, m.Seq, m.Replayed, m.Payload, want, fmt.Sprintf("missed-%d", i))
				}
				if tc.withTopic && string(m.Topic) != "kv" {
					t.Errorf("replayed topic: got %q, want %q", m.Topic, "kv")
				}
			}
			if missed[0] != lastLive+1 {
				t.Fatalf("first missed seq %d does not follow last live %d", missed[0], lastLive)
			}
			// Live delivery resumes after the replay, without duplicates.
			// Probes lost to the slow-joiner window come back through gap
			// repair (Replayed), so only the batch after them is surely live.
			probe := waitLive(t, p, rs)
			if probe.Seq <= missed[len(missed)-1] {
				t.Errorf("after replay: got probe seq %d, want above %d", probe.Seq, missed[len(missed)-1])
			}
			seq, err := p.Publish([]byte("after"))
			if err != nil {
				t.Fatalf("Publish: %v", err)
			}
			if m := rs.next(t); m.Seq != seq || m.Replayed || string(m.Payload) != "after" {
				t.Errorf("after replay: got seq %d replayed=%v payload %q, want live seq %d %q", m.Seq, m.Replayed, m.Payload, seq, "after")
			}
			st := rs.sub.State()
			if st.Reconnects == 0 || st.Gaps != 0 || st.Regressions != 0 || st.ReplayErrors != 0 {
				t.Errorf("state: got %+v, want reconnects > 0 and no gaps, regressions or replay errors", st)
			}
		})
	}
}

// TestPublisherRestartIsSeqRegression restarts the publisher on the same
// port: the subscriber reconnects by itself and delivers the new publisher's
// seqs, which start again from 0, as they are.
func TestPublisherRestartIsSeqRegression(t *testing.T) {
	a := startPublisher(t, PublisherConfig{})
	addr := a.Addr().String()
	rs := startSubscriber(t, SubscriberConfig{Endpoint: "tcp://" + addr})
	waitLive(t, a, rs)
	const n = 200
	for i := range n {
		if _, err := a.Publish([]byte(fmt.Sprintf("a-%d", i))); err != nil {
			t.Fatalf("Publish: %v", err)
		}
	}
	var lastA uint64
	for range n {
		lastA = rs.next(t).Seq
	}
	if err := a.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
	waitState(t, rs, "disconnect", func(st SubscriberState) bool { return !st.Connected })

	b := startPublisher(t, PublisherConfig{Endpoint: "tcp://" + addr})
	first := waitLive(t, b, rs)
	if first.Seq >= lastA {
		t.Fatalf("first seq from the restarted publisher: got %d, want below %d", first.Seq, lastA)
	}
	seq, err := b.Publish([]byte("b-after"))
	if err != nil {
		t.Fatalf("Publish: %v", err)
	}
	if m := rs.next(t); m.Seq != seq || string(m.Payload) != "b-after" {
		t.Errorf("got seq %d payload %q, want seq %d payload %q", m.Seq, m.Payload, seq, "b-after")
	}
	st := rs.sub.State()
	if st.Regressions != 1 || st.Reconnects == 0 || st.LastSeq != int64(seq) {
		t.Errorf("state: got %+v, want 1 regression, reconnects > 0, last seq %d", st, seq)
	}
}

// TestSubscriberSkipsMalformed sends badly framed messages from a raw PUB
// socket; they are counted and skipped.
func TestSubscriberSkipsMalformed(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	pub := zmq4.NewPub(ctx)
	defer pub.Close()
	if err := pub.Listen("tcp://127.0.0.1:0"); err != nil {
		t.Fatalf("listen: %v", err)
	}
	rs := startSubscriber(t, SubscriberConfig{Endpoint: endpointOf(pub.Addr())})
	deadline := time.Now().Add(waitFor)
	live := false
	for !live && time.Now().Before(deadline) {
		if err := pub.SendMulti(zmq4.NewMsgFrom([]byte{}, seq8(0), probePayload)); err != nil {
			t.Fatalf("send: %v", err)
		}
		select {
		case <-rs.msgs:
			live = true
		case <-time.After(tick):
		}
	}
	if !live {
		t.Fatal("subscription never became live")
	}
	for _, m := range []zmq4.Msg{
		zmq4.NewMsgFrom([]byte{}, seq8(1)),                                      // 2 frames
		zmq4.NewMsgFrom([]byte{}, []byte{1, 2, 3}, []byte("short seq")),         // seq not 8 bytes
		zmq4.NewMsgFrom([]byte{}, seq8(2), []byte("extra"), []byte("4 frames")), // 4 frames
		zmq4.NewMsgFrom([]byte{}, seq8(3), []byte("good")),
	} {
		if err := pub.SendMulti(m); err != nil {
			t.Fatalf("send: %v", err)
		}
	}
	if m := rs.next(t); m.Seq != 3 || string(m.Payload) != "good" {
		t.Errorf("got seq %d payload %q, want seq 3 payload %q", m.Seq, m.Payload, "good")
	}
	if st := rs.sub.State(); st.Malformed != 3 {
		t.Errorf("malformed: got %d, want 3", st.Malformed)
	}
}

// TestSubscriberUnreachable checks that Run keeps retrying an endpoint with
// nothing behind it and returns ctx's error when cancelled.
func TestSubscriberUnreachable(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatalf("listen: %v", err)
	}
	addr := ln.Addr().String()
	ln.Close() // nothing listens on addr now
	rs := startSubscriber(t, SubscriberConfig{Endpoint: "tcp://" + addr})
	waitState(t, rs, "two reconnect attempts", func(st SubscriberState) bool { return st.Reconnects >= 2 })
	if st := rs.sub.State(); st.Connected || st.LastSeq != -1 {
		t.Errorf("state: got %+v, want disconnected with no seq", st)
	}
}

func TestPublisherCloseAndErrors(t *testing.T) {
	p := startPublisher(t, PublisherConfig{ReplayEndpoint: "tcp://127.0.0.1:0"})
	if p.Addr() == nil || p.ReplayAddr() == nil {
		t.Fatalf("got Addr %v ReplayAddr %v, want both bound", p.Addr(), p.ReplayAddr())
	}
	if err := p.Close(); err != nil {
		t.Fatalf("first Close: %v", err)
	}
	if err := p.Close(); err != nil {
		t.Fatalf("second Close: %v", err)
	}
	if _, err := p.Publish([]byte("x")); !errors.Is(err, ErrClosed) {
		t.Errorf("Publish after Close: got %v, want ErrClosed", err)
	}

	noReplay := startPublisher(t, PublisherConfig{})
	if noReplay.ReplayAddr() != nil {
		t.Errorf("ReplayAddr without replay: got %v, want nil", noReplay.ReplayAddr())
	}
	for _, cfg := range []PublisherConfig{
		{},
		{Endpoint: "tcp://127.0.0.1:0", Bind: true, BufferSteps: -1},
		{Endpoint: "bogus://x", Bind: true},
		{Endpoint: "tcp://127.0.0.1:0", Bind: true, ReplayEndpoint: "bogus://x"},
	} {
		if p, err := NewPublisher(context.Background(), cfg); err == nil {
			p.Close()
			t.Errorf("NewPublisher(%+v): got nil error, want one", cfg)
		}
	}
}

func TestShouldBind(t *testing.T) {
	cases := []struct {
		endpoint string
		want     bool
	}{
		{"tcp://*:5557", true},
		{"tcp://[::]:5557", true},
		{"ipc:///tmp/kv.sock", true},
		{"inproc://kv", true},
		{"tcp://0.0.0.0:5557", true},
		{"tcp://127.0.0.1:5557", false},
		{"tcp://vllm-0:5557", false},
	}
	for _, tc := range cases {
		t.Run(tc.endpoint, func(t *testing.T) {
			if got := ShouldBind(tc.endpoint); got != tc.want {
				t.Errorf("got %v, want %v", got, tc.want)
			}
		})
	}
	if got, want := listenAddr("tcp://*:0"), "tcp://0.0.0.0:0"; got != want {
		t.Errorf("listenAddr: got %q, want %q", got, want)
	}
}

// TestWildcardBind binds "tcp://*:0" as the engines' default form does and
// reaches it through 127.0.0.1.
func TestWildcardBind(t *testing.T) {
	p, err := NewPublisher(context.Background(), PublisherConfig{Endpoint: "tcp://*:0"})
	if err != nil {
		t.Fatalf("NewPublisher: %v", err)
	}
	defer p.Close()
	port := p.Addr().(*net.TCPAddr).Port
	rs := startSubscriber(t, SubscriberConfig{Endpoint: fmt.Sprintf("tcp://127.0.0.1:%d", port)})
	waitLive(t, p, rs)
}

func TestParseReplayReply(t *testing.T) {
	s := seq8(42)
	cases := []struct {
		name      string
		frames    [][]byte
		wantTopic string
		wantSeq   uint64
		wantErr   bool
	}{
		{"dealer_with_delimiter", [][]byte{{}, s, []byte("p")}, "", 42, false},
		{"req_style", [][]byte{s, []byte("p")}, "", 42, false},
		{"topic_with_delimiter", [][]byte{{}, []byte("kv"), s, []byte("p")}, "kv", 42, false},
		{"topic_without_delimiter", [][]byte{[]byte("kv"), s, []byte("p")}, "kv", 42, false},
		{"end_marker_v026", [][]byte{{}, {}, seq8(EndSeq), {}}, "", EndSeq, false},
		{"one_frame", [][]byte{s}, "", 0, true},
		{"short_seq", [][]byte{{}, {1}, []byte("p")}, "", 0, true},
		{"two_topics", [][]byte{[]byte("a"), []byte("b"), s, []byte("p")}, "", 0, true},
		{"five_frames", [][]byte{{}, {}, {}, s, []byte("p")}, "", 0, true},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			topic, seq, _, err := parseReplayReply(tc.frames)
			if (err != nil) != tc.wantErr {
				t.Fatalf("got error %v, want error %v", err, tc.wantErr)
			}
			if err == nil && (string(topic) != tc.wantTopic || seq != tc.wantSeq) {
				t.Errorf("got topic %q seq %d, want %q %d", topic, seq, tc.wantTopic, tc.wantSeq)
			}
		})
	}
}

// TestSubscriberRepairsLiveGap drives a subscriber from a raw PUB that skips
// seqs 1..3 and a raw ROUTER that serves them: the subscriber fills the gap
// from replay before delivering seq 4, and ignores replayed seqs >= 4.
func TestSubscriberRepairsLiveGap(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	pub := zmq4.NewPub(ctx)
	defer pub.Close()
	if err := pub.Listen("tcp://127.0.0.1:0"); err != nil {
		t.Fatalf("listen PUB: %v", err)
	}
	router := zmq4.NewRouter(ctx)
	defer router.Close()
	if err := router.Listen("tcp://127.0.0.1:0"); err != nil {
		t.Fatalf("listen ROUTER: %v", err)
	}
	requests := make(chan uint64, 4)
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			msg, err := router.Recv()
			if err != nil {
				return
			}
			if len(msg.Frames) != 3 {
				continue
			}
			start := binary.BigEndian.Uint64(msg.Frames[2])
			select {
			case requests <- start:
			default:
			}
			// Old framing [seq, payload] without delimiter, plus a batch
			// past the live seq that must not be delivered from replay.
			for s := start; s <= 5; s++ {
				_ = router.SendMulti(zmq4.NewMsgFrom(msg.Frames[0], seq8(s), []byte(fmt.Sprintf("r-%d", s))))
			}
			_ = router.SendMulti(zmq4.NewMsgFrom(msg.Frames[0], seq8(EndSeq), []byte{}))
		}
	}()
	defer func() { cancel(); router.Close(); wg.Wait() }()

	rs := startSubscriber(t, SubscriberConfig{Endpoint: endpointOf(pub.Addr()), ReplayEndpoint: endpointOf(router.Addr())})
	deadline := time.Now().Add(waitFor)
	for live := false; !live; {
		if time.Now().After(deadline) {
			t.Fatal("subscription never became live")
		}
		if err := pub.SendMulti(zmq4.NewMsgFrom([]byte{}, seq8(0), probePayload)); err != nil {
			t.Fatalf("send: %v", err)
		}
		select {
		case <-rs.msgs:
			live = true
		case <-time.After(tick):
		}
	}
	for _, s := range []uint64{4, 5} {
		if err := pub.SendMulti(zmq4.NewMsgFrom([]byte{}, seq8(s), []byte(fmt.Sprintf("live-%d", s)))); err != nil {
			t.Fatalf("send: %v", err)
		}
	}
	want := []struct {
		seq      uint64
		payload  string
		replayed bool
	}{{1, "r-1", true}, {2, "r-2", true}, {3, "r-3", true}, {4, "live-4", false}, {5, "live-5", false}}
	for _, w := range want {
		m := rs.next(t)
		if m.Seq != w.seq || string(m.Payload) != w.payload || m.Replayed != w.replayed {
			t.Fatalf("got seq %d %q replayed=%v, want seq %d %q replayed=%v", m.Seq, m.Payload, m.Replayed, w.seq, w.payload, w.replayed)
		}
	}
	if got := <-requests; got != 1 {
		t.Errorf("replay request start: got %d, want 1", got)
	}
	if st := rs.sub.State(); st.Gaps != 0 || st.GapsRepaired != 1 || st.LastSeq != 5 {
		t.Errorf("state: got %+v, want no gaps, 1 repair, last seq 5", st)
	}
}

// TestFaultInjection covers PublishDropped (a gap replay can fill) and
// SkipSeq (a gap it cannot), as simulators use them.
func TestFaultInjection(t *testing.T) {
	p := startPublisher(t, PublisherConfig{ReplayEndpoint: "tcp://127.0.0.1:0"})
	rs := startSubscriber(t, SubscriberConfig{Endpoint: endpointOf(p.Addr()), ReplayEndpoint: endpointOf(p.ReplayAddr())})
	waitLive(t, p, rs)
	// Probes lost before the subscription was live may be repaired later;
	// count from here.
	before := rs.sub.State()

	a, errA := p.Publish([]byte("a"))
	b, errB := p.PublishDropped([]byte("b"))
	c, errC := p.Publish([]byte("c"))
	p.SkipSeq(2)
	d, errD := p.Publish([]byte("d"))
	if err := errors.Join(errA, errB, errC, errD); err != nil {
		t.Fatalf("publish: %v", err)
	}
	if b != a+1 || c != a+2 || d != a+5 {
		t.Fatalf("seqs: got a=%d b=%d c=%d d=%d, want consecutive a..c and d = a+5", a, b, c, d)
	}
	want := []struct {
		seq      uint64
		payload  string
		replayed bool
	}{{a, "a", false}, {b, "b", true}, {c, "c", false}, {d, "d", false}}
	for _, w := range want {
		m := rs.next(t)
		if m.Seq != w.seq || string(m.Payload) != w.payload || m.Replayed != w.replayed {
			t.Fatalf("got seq %d %q replayed=%v, want seq %d %q replayed=%v", m.Seq, m.Payload, m.Replayed, w.seq, w.payload, w.replayed)
		}
	}
	st := rs.sub.State()
	if st.GapsRepaired-before.GapsRepaired != 1 || st.Gaps-before.Gaps != 1 {
		t.Errorf("state: got %+v (before %+v), want one repaired gap and one unrepaired", st, before)
	}
	p.Close()
	p.SkipSeq(1) // no effect after Close, and no panic
	if _, err := p.PublishDropped(nil); !errors.Is(err, ErrClosed) {
		t.Errorf("PublishDropped after Close: got %v, want ErrClosed", err)
	}
}

// TestPublisherConnects checks the connect side of the engines' rule: a
// "tcp://host:port" endpoint is dialled, here to a SUB socket that listens.
func TestPublisherConnects(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	sub := zmq4.NewSub(ctx)
	defer sub.Close()
	if err := sub.SetOption(zmq4.OptionSubscribe, ""); err != nil {
		t.Fatalf("subscribe: %v", err)
	}
	if err := sub.Listen("tcp://127.0.0.1:0"); err != nil {
		t.Fatalf("listen SUB: %v", err)
	}
	p, err := NewPublisher(ctx, PublisherConfig{Endpoint: endpointOf(sub.Addr()), Topic: "x"})
	if err != nil {
		t.Fatalf("NewPublisher: %v", err)
	}
	defer p.Close()
	if p.Addr() != nil {
		t.Errorf("Addr of a connecting publisher: got %v, want nil", p.Addr())
	}
	got := make(chan zmq4.Msg, 1)
	recvDone := make(chan struct{})
	go func() {
		defer close(recvDone)
		msg, err := sub.Recv()
		if err == nil {
			got <- msg
		}
	}()
	defer func() { cancel(); sub.Close(); <-recvDone }()
	deadline := time.Now().Add(waitFor)
	for {
		if _, err := p.Publish([]byte("hello")); err != nil {
			t.Fatalf("Publish: %v", err)
		}
		select {
		case msg := <-got:
			if len(msg.Frames) != 3 || string(msg.Frames[0]) != "x" || len(msg.Frames[1]) != 8 || string(msg.Frames[2]) != "hello" {
				t.Errorf("got frames %q, want [x, <8-byte seq>, hello]", msg.Frames)
			}
			return
		case <-time.After(tick):
		}
		if time.Now().After(deadline) {
			t.Fatal("the listening SUB never received a batch")
		}
	}
}

// TestSubscriberDetectsRestartThatCaughtUp restarts the publisher while the
// subscriber is cut off, and lets the new publisher run past the old
// sequence numbers before the subscriber is back. The sequence numbers alone
// then look like a continuation; the replay check (the batch under the last
// delivered seq differs) reveals the restart.
func TestSubscriberDetectsRestartThatCaughtUp(t *testing.T) {
	a := startPublisher(t, PublisherConfig{ReplayEndpoint: "tcp://127.0.0.1:0"})
	addr, replayAddr := a.Addr().String(), a.ReplayAddr().String()
	proxy := newCutProxy(t, addr)
	rs := startSubscriber(t, SubscriberConfig{Endpoint: "tcp://" + proxy.ln.Addr().String(), ReplayEndpoint: "tcp://" + replayAddr})
	waitLive(t, a, rs)
	for i := range 3 {
		if _, err := a.Publish([]byte(fmt.Sprintf("a-%d", i))); err != nil {
			t.Fatal(err)
		}
	}
	var last Message
	for range 3 {
		last = rs.next(t)
	}
	proxy.cut(true)
	waitState(t, rs, "disconnect", func(st SubscriberState) bool { return !st.Connected })
	a.Close()
	b := startPublisher(t, PublisherConfig{Endpoint: "tcp://" + addr, ReplayEndpoint: "tcp://" + replayAddr})
	for i := uint64(0); i <= last.Seq+3; i++ {
		if _, err := b.Publish([]byte(fmt.Sprintf("b-%d", i))); err != nil {
			t.Fatal(err)
		}
	}
	proxy.unblock()
	m := rs.next(t)
	if !m.Restarted || m.Seq != last.Seq || string(m.Payload) != fmt.Sprintf("b-%d", last.Seq) {
		t.Fatalf("first message after the restart: seq %d payload %q restarted=%v; want seq %d from the new publisher marked Restarted", m.Seq, m.Payload, m.Restarted, last.Seq)
	}
	if n := rs.next(t); n.Restarted {
		t.Errorf("Restarted set on more than the first message")
	}
	if st := rs.sub.State(); st.Restarts != 1 {
		t.Errorf("Restarts = %d; want 1", st.Restarts)
	}
}

// TestSubscriberReconnectToSamePublisherIsNotARestart: a connection cut
// with the same publisher behind it verifies, delivers only what was
// missed, and marks nothing Restarted.
func TestSubscriberReconnectToSamePublisherIsNotARestart(t *testing.T) {
	p := startPublisher(t, PublisherConfig{ReplayEndpoint: "tcp://127.0.0.1:0"})
	proxy := newCutProxy(t, p.Addr().String())
	rs := startSubscriber(t, SubscriberConfig{Endpoint: "tcp://" + proxy.ln.Addr().String(), ReplayEndpoint: endpointOf(p.ReplayAddr())})
	waitLive(t, p, rs)
	p.Publish([]byte("x-0"))
	last := rs.next(t)
	proxy.cut(true)
	waitState(t, rs, "disconnect", func(st SubscriberState) bool { return !st.Connected })
	seq, _ := p.Publish([]byte("x-1"))
	proxy.unblock()
	m := rs.next(t)
	if m.Restarted || m.Seq != seq || m.Seq != last.Seq+1 {
		t.Errorf("after reconnect: seq %d restarted=%v; want seq %d, not restarted", m.Seq, m.Restarted, seq)
	}
	if st := rs.sub.State(); st.Restarts != 0 {
		t.Errorf("Restarts = %d; want 0", st.Restarts)
	}
}
