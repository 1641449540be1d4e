package sim

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/llmgw/llmgw/engines"
	"github.com/llmgw/llmgw/engines/kvevents"
)

// batchPublisher is the transport of KV event batches: a ZMQ PUB socket
// sending [topic, seq, payload] plus a ROUTER replay socket.
type batchPublisher interface {
	// Publish sends payload with the next sequence number and returns it.
	Publish(payload []byte) (uint64, error)
	// SkipSeq consumes n sequence numbers without sending or keeping
	// anything (a gap replay cannot fill: the sequence-gap fault).
	SkipSeq(n uint64)
	// PublishDropped numbers and keeps payload for replay without sending
	// it (a batch lost at the PUB socket: the dropped-events fault).
	PublishDropped(payload []byte) (uint64, error)
	// Addr and ReplayAddr are the bound endpoints ("" when not bound here).
	Addr() string
	ReplayAddr() string
	Close() error
}

// eventHub encodes the sim's cache events in the persona's msgpack layout
// and publishes them, applying event faults. It is safe for concurrent use;
// batches are published in the order publish is called.
type eventHub struct {
	cfg    Config
	rank   int64
	enc    kvevents.Encoding
	faults *faultState

	mu       sync.Mutex
	pub      batchPublisher
	endpoint string // where a restarted publisher binds or connects
	bound    bool   // the PUB socket binds endpoint
	replay   string
	buf      []byte
}

// eventTopic is the topic frame; vLLM's default is "" (empty frame).
const eventTopic = ""

func newEventHub(ctx context.Context, cfg Config, faults *faultState, rank int) (*eventHub, error) {
	h := &eventHub{cfg: cfg, faults: faults, endpoint: offsetEndpointPort(cfg.KVEvents, rank), rank: int64(rank)}
	switch {
	case cfg.Engine == engines.SGLang && cfg.EventEncoding == EncodingArray:
		h.enc = kvevents.ArraySGLang
	case cfg.EventEncoding == EncodingArray:
		h.enc = kvevents.ArrayV011
	case cfg.Engine == engines.SGLang:
		h.enc = kvevents.MapSGLang
	default:
		h.enc = kvevents.Map
	}
	// The replay socket always binds; put it on the publisher's host.
	if replayable(cfg.KVEvents) {
		h.replay = replayEndpointFor(h.endpoint)
	}
	pub, err := newBatchPublisher(ctx, h.endpoint, h.replay, eventTopic, h.replayWithTopic(), false)
	if err != nil {
		return nil, fmt.Errorf("sim: kv events %s: %w", cfg.KVEvents, err)
	}
	h.pub = pub
	// Restarts rebind the ports the kernel chose (a connecting PUB keeps
	// its endpoint and reconnects).
	if a := pub.Addr(); a != "" && (kernelChosenPort(h.endpoint) || kvevents.ShouldBind(h.endpoint)) {
		h.endpoint, h.bound = a, true
	}
	if a := pub.ReplayAddr(); a != "" {
		h.replay = a
	}
	return h, nil
}

// offsetEndpointPort is vLLM's offset_endpoint_port: data-parallel rank r
// publishes on the base TCP port + r (a kernel-chosen port 0 stays 0), or on
// "<endpoint>_dp<r>" for inproc/ipc endpoints. Rank 0 is unchanged.
func offsetEndpointPort(endpoint string, rank int) string {
	if rank == 0 {
		return endpoint
	}
	hostport, ok := strings.CutPrefix(endpoint, "tcp://")
	if !ok {
		return endpoint + "_dp" + strconv.Itoa(rank)
	}
	i := strings.LastIndex(hostport, ":")
	if i < 0 {
		return endpoint
	}
	port, err := strconv.Atoi(hostport[i+1:])
	if err != nil || port == 0 {
		return endpoint
	}
	return "tcp://" + hostport[:i+1] + strconv.Itoa(port+rank)
}

// replayWithTopic: vLLM's map encoding era (≥ 0.26 for replay) puts a topic
// frame in replay replies; older vLLM (array events) and SGLang do not.
func (h *eventHub) replayWithTopic() bool {
	return h.cfg.Engine == engines.VLLM && h.enc == kvevents.Map
}

// replayable reports whether a replay socket can be placed next to
// endpoint: only for TCP endpoints (ipc/inproc get none).
func replayable(endpoint string) bool { return strings.HasPrefix(endpoint, "tcp://") }

// replayEndpointFor binds the replay ROUTER on the same host as the PUB
// socket with a kernel-chosen port.
func replayEndpointFor(endpoint string) string {
	hostport := strings.TrimPrefix(endpoint, "tcp://")
	host := hostport
	if i := strings.LastIndex(hostport, ":"); i >= 0 {
		host = hostport[:i]
	}
	if host == "*" || host == "" || host == "0.0.0.0" {
		host = "127.0.0.1"
	}
	return "tcp://" + host + ":0"
}

func (h *eventHub) addrs() (events, replay string) {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.pub.Addr(), h.pub.ReplayAddr()
}

// publish encodes evs as one batch and sends it (or drops it / skips
// sequence numbers, as the faults say). Encoding errors cannot happen for
// the events the sim builds; they are counted as dropped batches.
func (h *eventHub) publish(evs []simEvent) {
	batch := kvevents.Batch{TS: float64(h.cfg.Clock().UnixNano()) / 1e9, Events: make([]kvevents.Event, len(evs))}
	rank := h.rank
	batch.DPRank = &rank
	gpu := "GPU"
	for i, e := range evs {
		ke := &batch.Events[i]
		switch e.kind {
		case evStored:
			ke.Kind = kvevents.BlockStored
			ke.BlockHashes = e.hashes
			ke.ParentHash, ke.HasParent = e.parent, e.hasParent
			ke.TokenIDs = e.tokens
			ke.BlockSize = len(e.tokens) / max(len(e.hashes), 1)
			ke.Medium = &gpu
			if h.cfg.Engine == engines.SGLang {
				ke.DPRank = &rank // SGLang's trailing attn_dp_rank element
			}
			if h.enc == kvevents.Map && h.cfg.Engine == engines.VLLM {
				// Current vLLM fills extra_keys (one nil per block),
				// group_idx and the cache spec kind.
				ke.ExtraKeys = kvevents.NilExtraKeys(len(e.hashes))
				g, kind := int64(0), "full_attention"
				ke.GroupIdx, ke.KVCacheSpecKind = &g, &kind
			}
		case evRemoved:
			ke.Kind = kvevents.BlockRemoved
			ke.BlockHashes = e.hashes
			ke.Medium = &gpu
			if h.enc == kvevents.Map && h.cfg.Engine == engines.VLLM {
				g := int64(0)
				ke.GroupIdx = &g
			}
		case evCleared:
			ke.Kind = kvevents.AllBlocksCleared
		}
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	drop, gap := h.faults.takeEventFaults()
	if gap > 0 {
		h.pub.SkipSeq(uint64(gap))
	}
	var err error
	h.buf, err = kvevents.AppendBatch(h.buf[:0], &batch, h.enc)
	if err != nil {
		return
	}
	if drop {
		_, _ = h.pub.PublishDropped(h.buf)
		return
	}
	// Publish copies or sends synchronously; a send failure loses the batch
	// as a ZMQ PUB under back-pressure would.
	_, _ = h.pub.Publish(append([]byte(nil), h.buf...))
}

// restart closes the publisher and opens a new one on the same endpoints.
func (h *eventHub) restart(ctx context.Context) error {
	h.mu.Lock()
	defer h.mu.Unlock()
	_ = h.pub.Close()
	var err error
	// The old sockets' ports can take a moment to be released.
	deadline := time.Now().Add(2 * time.Second)
	for {
		var pub batchPublisher
		pub, err = newBatchPublisher(ctx, h.endpoint, h.replay, eventTopic, h.replayWithTopic(), h.bound)
		if err == nil {
			h.pub = pub
			return nil
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			return fmt.Errorf("sim: restart kv event publisher: %w", err)
		}
		t := time.NewTimer(20 * time.Millisecond)
		select {
		case <-t.C:
		case <-ctx.Done():
			t.Stop()
		}
	}
}

func (h *eventHub) close() {
	h.mu.Lock()
	defer h.mu.Unlock()
	_ = h.pub.Close()
}
