package kvevents

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"strings"
	"sync"

	"github.com/go-zeromq/zmq4"
)

// EndSeq is the sequence frame that ends a replay: -1 as 8 big-endian bytes,
// sent with an empty payload.
const EndSeq uint64 = 1<<64 - 1

// DefaultBufferSteps is vLLM's default replay buffer length (batches).
const DefaultBufferSteps = 10000

// defaultHWM is vLLM's default PUB high-water mark (queued messages).
const defaultHWM = 100000

// ErrClosed is returned by Publish after Close.
var ErrClosed = errors.New("kvevents: publisher closed")

// PublisherConfig configures a Publisher like an engine's --kv-events-config.
type PublisherConfig struct {
	// Endpoint is the PUB socket address, e.g. "tcp://*:5557". Whether the
	// socket binds or connects follows ShouldBind, unless Bind is set.
	Endpoint string
	// ReplayEndpoint is the ROUTER replay socket address, always bound; ""
	// disables replay.
	ReplayEndpoint string
	// Topic is sent as frame 0 of every message ("" = empty frame).
	Topic string
	// BufferSteps is how many past batches are kept for replay; 0 means
	// DefaultBufferSteps.
	BufferSteps int
	// ReplayWithTopic selects the replay framing of vLLM >= 0.26, which puts
	// the topic frame before each replayed seq (and an empty topic before the
	// end marker). Older vLLM and SGLang send [seq, payload].
	ReplayWithTopic bool
	// Bind forces the PUB socket to bind even when ShouldBind would connect
	// (e.g. "tcp://127.0.0.1:0" in tests, which the engines would dial).
	Bind bool
}

// ShouldBind reports whether an engine binds its PUB socket to endpoint
// rather than connecting to it: vLLM binds when the endpoint contains "*" or
// "::" or uses ipc:// or inproc://, and SGLang's newest copy also binds
// 0.0.0.0. Everything else (tcp://host:port) is dialled.
func ShouldBind(endpoint string) bool {
	return strings.Contains(endpoint, "*") || strings.Contains(endpoint, "::") ||
		strings.HasPrefix(endpoint, "ipc://") || strings.HasPrefix(endpoint, "inproc://") ||
		strings.Contains(endpoint, "0.0.0.0")
}

// listenAddr rewrites the wildcard host "*" of a tcp endpoint to 0.0.0.0 so
// that zmq4 does not depend on its own wildcard parsing; a "*" port (libzmq's
// "any port") becomes 0.
func listenAddr(endpoint string) string {
	const tcp = "tcp://"
	if !strings.HasPrefix(endpoint, tcp) {
		return endpoint
	}
	host, port, err := net.SplitHostPort(endpoint[len(tcp):])
	if err != nil {
		return endpoint
	}
	if host == "*" {
		host = "0.0.0.0"
	}
	if port == "*" {
		port = "0"
	}
	return tcp + net.JoinHostPort(host, port)
}

// Publisher publishes KV-event batches like an engine: 3-frame PUB messages
// [topic, seq, payload] with seq counting from 0, and, when configured, a
// ROUTER socket that replays the last BufferSteps batches on request.
//
// Publish is safe for concurrent use; sequence numbers follow the order in
// which Publish calls take the publisher's lock. One goroutine serves replay
// requests; it is stopped by Close or when the context given to NewPublisher
// ends.
type Publisher struct {
	cfg    PublisherConfig
	topic  []byte
	pub    zmq4.Socket
	replay zmq4.Socket
	cancel context.CancelFunc
	wg     sync.WaitGroup

	mu     sync.Mutex
	next   uint64
	buf    []buffered // ring of the last BufferSteps batches
	head   int        // index of the oldest entry once the ring is full
	closed bool

	closeOnce sync.Once
	closeErr  error
}

type buffered struct {
	seq     uint64
	payload []byte
}

// NewPublisher opens the PUB socket (and the ROUTER replay socket when
// cfg.ReplayEndpoint is set). When ctx ends the sockets stop working and
// Publish fails; Close must still be called to release the ports.
func NewPublisher(ctx context.Context, cfg PublisherConfig) (*Publisher, error) {
	if cfg.Endpoint == "" {
		return nil, errors.New("kvevents: publisher endpoint is empty")
	}
	if cfg.BufferSteps < 0 {
		return nil, fmt.Errorf("kvevents: buffer steps %d is negative", cfg.BufferSteps)
	}
	if cfg.BufferSteps == 0 {
		cfg.BufferSteps = DefaultBufferSteps
	}
	ctx, cancel := context.WithCancel(ctx)
	p := &Publisher{cfg: cfg, topic: []byte(cfg.Topic), cancel: cancel}
	p.pub = zmq4.NewPub(ctx)
	if err := p.pub.SetOption(zmq4.OptionHWM, defaultHWM); err != nil {
		p.closeSockets()
		return nil, fmt.Errorf("kvevents: set PUB high-water mark: %w", err)
	}
	var err error
	if cfg.Bind || ShouldBind(cfg.Endpoint) {
		err = p.pub.Listen(listenAddr(cfg.Endpoint))
	} else {
		err = p.pub.Dial(cfg.Endpoint)
	}
	if err != nil {
		p.closeSockets()
		return nil, fmt.Errorf("kvevents: open PUB %s: %w", cfg.Endpoint, err)
	}
	if cfg.ReplayEndpoint != "" {
		p.replay = zmq4.NewRouter(ctx)
		if err := p.replay.Listen(listenAddr(cfg.ReplayEndpoint)); err != nil {
			p.closeSockets()
			return nil, fmt.Errorf("kvevents: bind replay ROUTER %s: %w", cfg.ReplayEndpoint, err)
		}
		p.wg.Add(1)
		go func() {
			defer p.wg.Done()
			p.serveReplay(ctx)
		}()
	}
	return p, nil
}

// Addr returns the address the PUB socket is bound to, or nil when it
// connected instead.
func (p *Publisher) Addr() net.Addr { return p.pub.Addr() }

// ReplayAddr returns the address of the replay socket, or nil when replay is
// not configured.
func (p *Publisher) ReplayAddr() net.Addr {
	if p.replay == nil {
		return nil
	}
	return p.replay.Addr()
}

// Publish sends payload (an encoded EventBatch) as the next batch and keeps
// it for replay. It returns the batch's sequence number. The payload is
// copied, so the caller may reuse it.
//
// Like the engines, it does not wait for subscribers: a batch published
// before a subscriber's subscription reaches the socket is lost to that
// subscriber (ZeroMQ's slow-joiner behaviour), though still replayable.
func (p *Publisher) Publish(payload []byte) (uint64, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return 0, ErrClosed
	}
	seq := p.next
	var seqb [8]byte
	binary.BigEndian.PutUint64(seqb[:], seq)
	own := append([]byte(nil), payload...)
	if err := p.pub.SendMulti(zmq4.NewMsgFrom(p.topic, seqb[:], own)); err != nil {
		return 0, fmt.Errorf("kvevents: publish seq %d: %w", seq, err)
	}
	p.next++
	p.keep(seq, own)
	return seq, nil
}

// SkipSeq consumes n sequence numbers without sending or buffering anything:
// subscribers see a gap that replay cannot fill, as after batches lost
// inside an engine. Simulators use it for fault injection. After Close it
// does nothing.
func (p *Publisher) SkipSeq(n uint64) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if !p.closed {
		p.next += n
	}
}

// PublishDropped assigns payload the next sequence number and keeps it for
// replay without sending it, as when an engine's PUB socket drops a batch at
// its high-water mark: subscribers see a gap that replay can fill. It exists
// for fault injection.
func (p *Publisher) PublishDropped(payload []byte) (uint64, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return 0, ErrClosed
	}
	seq := p.next
	p.next++
	p.keep(seq, append([]byte(nil), payload...))
	return seq, nil
}

// keep adds a batch to the replay ring. The caller holds p.mu.
func (p *Publisher) keep(seq uint64, payload []byte) {
	if len(p.buf) < p.cfg.BufferSteps {
		p.buf = append(p.buf, buffered{seq, payload})
		return
	}
	p.buf[p.head] = buffered{seq, payload}
	p.head = (p.head + 1) % len(p.buf)
}

// since returns the buffered batches with seq >= start, oldest first.
func (p *Publisher) since(start uint64) []buffered {
	p.mu.Lock()
	defer p.mu.Unlock()
	var out []buffered
	for i := range p.buf {
		b := p.buf[(p.head+i)%len(p.buf)]
		if b.seq >= start {
			out = append(out, b)
		}
	}
	return out
}

// serveReplay answers replay requests until ctx ends. A request is
// [identity, "", start_seq(8B BE)]; anything else is ignored, as the engines
// do.
func (p *Publisher) serveReplay(ctx context.Context) {
	var end [8]byte
	binary.BigEndian.PutUint64(end[:], EndSeq)
	for {
		msg, err := p.replay.Recv()
		if ctx.Err() != nil {
			return
		}
		if err != nil || len(msg.Frames) != 3 || len(msg.Frames[1]) != 0 || len(msg.Frames[2]) != 8 {
			continue
		}
		id := msg.Frames[0]
		start := binary.BigEndian.Uint64(msg.Frames[2])
		for _, b := range p.since(start) {
			var seqb [8]byte
			binary.BigEndian.PutUint64(seqb[:], b.seq)
			if err := p.replay.SendMulti(p.replayFrames(id, p.topic, seqb[:], b.payload)); err != nil {
				break // the client is gone or the socket is closing
			}
		}
		_ = p.replay.SendMulti(p.replayFrames(id, nil, end[:], nil))
	}
}

func (p *Publisher) replayFrames(id, topic, seq, payload []byte) zmq4.Msg {
	if p.cfg.ReplayWithTopic {
		return zmq4.NewMsgFrom(id, []byte{}, orEmpty(topic), seq, orEmpty(payload))
	}
	return zmq4.NewMsgFrom(id, []byte{}, seq, orEmpty(payload))
}

func orEmpty(b []byte) []byte {
	if b == nil {
		return []byte{}
	}
	return b
}

// Close closes the sockets and stops the replay goroutine. It is idempotent
// and safe to call concurrently with Publish (which then fails with
// ErrClosed).
func (p *Publisher) Close() error {
	p.closeOnce.Do(func() {
		p.mu.Lock()
		p.closed = true
		p.mu.Unlock()
		p.cancel()
		p.closeErr = p.closeSockets()
		p.wg.Wait()
	})
	return p.closeErr
}

func (p *Publisher) closeSockets() error {
	var errs []error
	if p.replay != nil {
		errs = append(errs, p.replay.Close())
	}
	errs = append(errs, p.pub.Close())
	p.cancel()
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("kvevents: close publisher: %w", err)
	}
	return nil
}
