package sim

import (
	"context"
	"net"
	"strings"

	"github.com/llmgw/llmgw/engines/kvevents"
)

// kvPublisher adapts kvevents.Publisher to batchPublisher.
type kvPublisher struct {
	p        *kvevents.Publisher
	endpoint string // reported when the PUB socket connected instead of binding
}

func (k *kvPublisher) Publish(payload []byte) (uint64, error) { return k.p.Publish(payload) }

func (k *kvPublisher) SkipSeq(n uint64) { k.p.SkipSeq(n) }

func (k *kvPublisher) PublishDropped(payload []byte) (uint64, error) {
	return k.p.PublishDropped(payload)
}

func (k *kvPublisher) Addr() string {
	if a := k.p.Addr(); a != nil {
		return "tcp://" + a.String()
	}
	return k.endpoint
}

func (k *kvPublisher) ReplayAddr() string {
	if a := k.p.ReplayAddr(); a != nil {
		return "tcp://" + a.String()
	}
	return ""
}

func (k *kvPublisher) Close() error { return k.p.Close() }

// newBatchPublisher opens the PUB socket at endpoint and, when replay is not
// "", a ROUTER replay socket bound there. The PUB socket binds or connects by
// vLLM's rule, except that a kernel-chosen port (":0") always binds, since
// nothing can be dialled there. replayWithTopic selects vLLM ≥ 0.26 replay
// framing (a topic frame before each seq).
//
// forceBind makes the socket bind whatever the endpoint looks like: a
// restarted publisher rebinds the port the kernel chose the first time.
func newBatchPublisher(ctx context.Context, endpoint, replay, topic string, replayWithTopic, forceBind bool) (batchPublisher, error) {
	p, err := kvevents.NewPublisher(ctx, kvevents.PublisherConfig{
		Endpoint:        endpoint,
		ReplayEndpoint:  replay,
		Topic:           topic,
		ReplayWithTopic: replayWithTopic,
		Bind:            forceBind || kernelChosenPort(endpoint),
	})
	if err != nil {
		return nil, err
	}
	return &kvPublisher{p: p, endpoint: endpoint}, nil
}

func kernelChosenPort(endpoint string) bool {
	hostport, ok := strings.CutPrefix(endpoint, "tcp://")
	if !ok {
		return false
	}
	_, port, err := net.SplitHostPort(hostport)
	return err == nil && port == "0"
}
