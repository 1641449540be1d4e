package kvevents

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"github.com/cespare/xxhash/v2"
	"sync"
	"time"

	"github.com/go-zeromq/zmq4"
)

// Message is one batch as received: the raw payload with its topic and
// sequence number. Replayed is true for batches fetched from the replay
// socket after a (re)connect.
type Message struct {
	Topic    []byte
	Seq      uint64
	Payload  []byte
	Replayed bool
	// Restarted reports that the publisher's stream is not the one this
	// subscriber delivered before the reconnect: its replay buffer holds a
	// different batch under the last delivered sequence number, or no longer
	// holds it. The publisher restarted (sequence numbers start over) even if
	// its new sequence numbers already ran past the old ones, so everything
	// built from earlier batches is stale. Set on the first message after
	// such a reconnect.
	Restarted bool
}

// SubscriberConfig configures a Subscriber.
type SubscriberConfig struct {
	// Endpoint is the engine's PUB address to dial, e.g. "tcp://10.0.0.5:5557".
	Endpoint string
	// ReplayEndpoint is the engine's ROUTER replay address; "" = no replay.
	ReplayEndpoint string
	// Topic is the subscription prefix ("" = every topic).
	Topic string
	// MinBackoff and MaxBackoff bound the exponential reconnect delay;
	// zero values mean 100 ms and 5 s.
	MinBackoff, MaxBackoff time.Duration
	// ReplayTimeout bounds one replay exchange (connect, request, every
	// reply); zero means 5 s. A replay that fails or times out is skipped
	// (fail-open): live delivery continues and the gap is visible in the
	// sequence numbers.
	ReplayTimeout time.Duration
}

// SubscriberState is a snapshot of a Subscriber's connection and counters.
type SubscriberState struct {
	// Connected is true while a SUB connection is established.
	Connected bool
	// LastSeq is the sequence number of the last delivered batch, -1 before
	// the first.
	LastSeq int64
	// Reconnects counts connection attempts after the first.
	Reconnects uint64
	// Gaps counts deliveries whose seq skipped ahead of LastSeq+1 (after any
	// repair from the replay buffer).
	Gaps uint64
	// GapsRepaired counts live forward gaps that were filled from the
	// replay buffer before the live batch was delivered.
	GapsRepaired uint64
	// Regressions counts deliveries whose seq was not above LastSeq (a
	// restarted publisher counts from 0 again).
	Regressions uint64
	// Restarts counts reconnects after which the publisher's replay buffer
	// did not hold the last delivered batch unchanged (see
	// Message.Restarted).
	Restarts uint64
	// Malformed counts live or replayed messages skipped for bad framing.
	Malformed uint64
	// ReplayErrors counts replay exchanges that failed or timed out.
	ReplayErrors uint64
}

// Subscriber receives KV-event batches from one engine publisher, with
// replay of missed batches after reconnects. It does not interpret sequence
// numbers beyond counting: whether a gap or a regression invalidates an
// inventory is the consumer's decision, so every seq is delivered as sent.
type Subscriber struct {
	cfg SubscriberConfig

	mu    sync.Mutex
	state SubscriberState
	// lastHash is the xxhash of the last delivered payload; touched only by
	// Run's goroutine.
	lastHash uint64
}

// NewSubscriber returns a Subscriber for cfg; Run starts it.
func NewSubscriber(cfg SubscriberConfig) *Subscriber {
	if cfg.MinBackoff <= 0 {
		cfg.MinBackoff = 100 * time.Millisecond
	}
	if cfg.MaxBackoff <= 0 {
		cfg.MaxBackoff = 5 * time.Second
	}
	cfg.MaxBackoff = max(cfg.MaxBackoff, cfg.MinBackoff)
	if cfg.ReplayTimeout <= 0 {
		cfg.ReplayTimeout = 5 * time.Second
	}
	return &Subscriber{cfg: cfg, state: SubscriberState{LastSeq: -1}}
}

// State returns a snapshot of the subscriber's state. Safe for concurrent use.
func (s *Subscriber) State() SubscriberState {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.state
}

func (s *Subscriber) update(f func(*SubscriberState)) {
	s.mu.Lock()
	f(&s.state)
	s.mu.Unlock()
}

// Run connects a SUB socket subscribed to the topic prefix and delivers
// batches until ctx ends, then returns ctx.Err(). On every (re)connect, when
// a replay endpoint is configured and a batch has been delivered before, it
// first asks the replay socket for everything after the last delivered seq
// and delivers those batches (Replayed = true); live batches follow in
// arrival order. When a live batch skips ahead of the last delivered seq and
// a replay endpoint is configured, the missing batches are fetched from
// the replay buffer first (Replayed = true), so a batch lost to ZeroMQ's
// slow-joiner window is still delivered, in order. Connection errors are retried with exponential backoff
// between MinBackoff and MaxBackoff. Malformed messages (not 3 frames, seq
// not 8 bytes) are counted and skipped.
//
// deliver is called from Run's goroutine only; Message slices are owned by
// the callee. Run must not be called twice concurrently.
func (s *Subscriber) Run(ctx context.Context, deliver func(Message)) error {
	backoff := s.cfg.MinBackoff
	for attempt := 0; ; attempt++ {
		if attempt > 0 {
			s.update(func(st *SubscriberState) { st.Reconnects++ })
			t := time.NewTimer(backoff)
			select {
			case <-ctx.Done():
				t.Stop()
				return ctx.Err()
			case <-t.C:
			}
			backoff = min(2*backoff, s.cfg.MaxBackoff)
		}
		if ctx.Err() != nil {
			return ctx.Err()
		}
		received, _ := s.session(ctx, deliver)
		if received {
			// The connection worked; start the next backoff from the bottom.
			backoff = s.cfg.MinBackoff
		}
	}
}

// session runs one connection: dial, optional replay, live loop. It reports
// whether any message arrived, and why the connection ended.
func (s *Subscriber) session(ctx context.Context, deliver func(Message)) (bool, error) {
	sctx, cancel := context.WithCancel(ctx)
	defer cancel()
	// zmq4's own dial retries would block without honouring ctx; Run does the
	// retrying.
	sub := zmq4.NewSub(sctx, zmq4.WithDialerMaxRetries(0))
	defer sub.Close()
	if err := sub.SetOption(zmq4.OptionSubscribe, s.cfg.Topic); err != nil {
		return false, fmt.Errorf("kvevents: subscribe: %w", err)
	}
	if err := sub.Dial(s.cfg.Endpoint); err != nil {
		return false, fmt.Errorf("kvevents: dial %s: %w", s.cfg.Endpoint, err)
	}
	s.update(func(st *SubscriberState) { st.Connected = true })
	defer s.update(func(st *SubscriberState) { st.Connected = false })

	// After a replay of [first, last], live messages in that range are
	// duplicates of what was just replayed (the SUB socket was already
	// connected while replay ran) and are dropped, until a live message
	// outside the range shows the stream has moved on. A publisher restart
	// is therefore still seen as soon as its seq leaves the replayed range.
	var dedupe bool
	var first, last uint64
	received := false
	restarted := false
	if s.cfg.ReplayEndpoint != "" {
		if from := s.State().LastSeq; from >= 0 {
			// Replay from the last delivered batch itself: the publisher
			// must still hold it, byte for byte, or it is not the stream
			// delivered before (a restart whose new sequence numbers caught
			// up with the old ones would otherwise pass for a continuation).
			var n int
			var verified bool
			first, last, n, verified = s.replayVerified(sctx, uint64(from), s.lastHash, deliver)
			dedupe = n > 0 || verified
			if verified && n == 0 {
				first, last = uint64(from), uint64(from)
			}
			received = n > 0 || verified
			restarted = !verified && n == 0
		}
	}
	for {
		msg, err := sub.Recv()
		if err != nil {
			if ctx.Err() != nil {
				return received, ctx.Err()
			}
			return received, fmt.Errorf("kvevents: receive: %w", err)
		}
		received = true
		if len(msg.Frames) != 3 || len(msg.Frames[1]) != 8 {
			s.update(func(st *SubscriberState) { st.Malformed++ })
			continue
		}
		seq := binary.BigEndian.Uint64(msg.Frames[1])
		if dedupe {
			if seq >= first && seq <= last {
				continue
			}
			dedupe = false
		}
		if s.cfg.ReplayEndpoint != "" {
			// A forward gap means batches were lost on the way (the
			// subscription was not live yet after a reconnect, or the PUB
			// socket dropped them); fetch them from the replay buffer before
			// delivering this one, so the consumer sees no gap at all when
			// the publisher still has them.
			if prev := s.State().LastSeq; prev >= 0 && seq > uint64(prev)+1 {
				if _, _, n := s.replay(sctx, uint64(prev)+1, seq, deliver); n > 0 {
					s.update(func(st *SubscriberState) { st.GapsRepaired++ })
				}
			}
		}
		s.deliver(deliver, Message{Topic: msg.Frames[0], Seq: seq, Payload: msg.Frames[2], Restarted: restarted})
		restarted = false
	}
}

// replayVerified replays from seq from, which the subscriber delivered last
// with payload hash want. When the publisher's batch at from matches, it is
// skipped (already delivered) and the rest is delivered; otherwise every
// replayed batch is delivered and the first carries Restarted. verified
// reports the match. A publisher without that batch (restarted, or its
// buffer moved on) is unverified; when it also returned nothing, the caller
// marks the next live message Restarted.
func (s *Subscriber) replayVerified(ctx context.Context, from uint64, want uint64, deliver func(Message)) (first, last uint64, n int, verified bool) {
	checked := false
	pending := false // the next delivered message starts a new stream
	emit := func(m Message) bool {
		if !checked {
			checked = true
			if m.Seq == from && xxhash.Sum64(m.Payload) == want {
				verified = true
				return false // already delivered before the reconnect
			}
			pending = true
			s.update(func(st *SubscriberState) { st.Restarts++ })
		}
		if pending {
			m.Restarted, pending = true, false
		}
		s.deliver(deliver, m)
		return true
	}
	first, last, n = s.replayFrom(ctx, from, EndSeq, emit)
	if !checked {
		s.update(func(st *SubscriberState) { st.Restarts++ })
	}
	return first, last, n, verified
}

// deliver updates the sequence counters and hands m to the callback.
func (s *Subscriber) deliver(deliver func(Message), m Message) {
	s.update(func(st *SubscriberState) {
		switch {
		case st.LastSeq < 0:
		case int64(m.Seq) > st.LastSeq+1:
			st.Gaps++
		case int64(m.Seq) <= st.LastSeq:
			st.Regressions++
		}
		st.LastSeq = int64(m.Seq)
	})
	s.lastHash = xxhash.Sum64(m.Payload)
	deliver(m)
}

// errReplayFraming marks a replay reply that is not [.., seq, payload].
var errReplayFraming = errors.New("kvevents: bad replay reply framing")

// replay fetches the batches from start on through a DEALER socket and
// delivers those with seq < limit (later ones are left to live delivery). It
// returns the seq range delivered and how many batches there were. Failures
// are counted and end the replay early.
func (s *Subscriber) replay(ctx context.Context, start, limit uint64, deliver func(Message)) (first, last uint64, n int) {
	return s.replayFrom(ctx, start, limit, func(m Message) bool { s.deliver(deliver, m); return true })
}

// replayFrom is replay with the delivery decided by emit, which reports
// whether it delivered the message (counted in first, last and n).
func (s *Subscriber) replayFrom(ctx context.Context, start, limit uint64, emit func(Message) bool) (first, last uint64, n int) {
	rctx, cancel := context.WithTimeout(ctx, s.cfg.ReplayTimeout)
	defer cancel()
	dealer := zmq4.NewDealer(rctx, zmq4.WithDialerMaxRetries(0))
	defer dealer.Close()
	fail := func() { s.update(func(st *SubscriberState) { st.ReplayErrors++ }) }
	if err := dealer.Dial(s.cfg.ReplayEndpoint); err != nil {
		fail()
		return 0, 0, 0
	}
	var req [8]byte
	binary.BigEndian.PutUint64(req[:], start)
	if err := dealer.SendMulti(zmq4.NewMsgFrom([]byte{}, req[:])); err != nil {
		fail()
		return 0, 0, 0
	}
	for {
		msg, err := dealer.Recv()
		if err != nil {
			fail()
			return first, last, n
		}
		topic, seq, payload, err := parseReplayReply(msg.Frames)
		if err != nil {
			s.update(func(st *SubscriberState) { st.Malformed++ })
			continue
		}
		if seq == EndSeq || len(payload) == 0 {
			return first, last, n
		}
		if seq < start || seq >= limit {
			continue
		}
		if !emit(Message{Topic: topic, Seq: seq, Payload: payload, Replayed: true}) {
			continue
		}
		if n == 0 {
			first = seq
		}
		last = seq
		n++
	}
}

// parseReplayReply accepts every replay framing a DEALER can see:
// ["", seq, payload] and [seq, payload] (vLLM <= 0.25, SGLang), and
// ["", topic, seq, payload] or [topic, seq, payload] (vLLM >= 0.26). The seq
// and payload are always the last two frames; a non-empty frame before them
// is the topic.
func parseReplayReply(frames [][]byte) (topic []byte, seq uint64, payload []byte, err error) {
	if len(frames) < 2 || len(frames) > 4 {
		return nil, 0, nil, errReplayFraming
	}
	seqFrame := frames[len(frames)-2]
	if len(seqFrame) != 8 {
		return nil, 0, nil, errReplayFraming
	}
	for _, f := range frames[:len(frames)-2] {
		if len(f) > 0 {
			if topic != nil {
				return nil, 0, nil, errReplayFraming
			}
			topic = f
		}
	}
	return topic, binary.BigEndian.Uint64(seqFrame), frames[len(frames)-1], nil
}
