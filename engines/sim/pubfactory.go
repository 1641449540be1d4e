package sim

import (
	"context"
	"errors"
)

// errNoPublisher is returned while engines/kvevents has no ZMQ publisher.
var errNoPublisher = errors.New("sim: the kvevents ZMQ publisher is not available in this build; use kv events \"off\"")

// newBatchPublisher opens the PUB socket at endpoint (bind or connect by
// vLLM's rule) and, when replay is not "", a ROUTER replay socket bound there.
// replayWithTopic selects vLLM ≥ 0.26 replay framing (a topic frame).
func newBatchPublisher(ctx context.Context, endpoint, replay, topic string, replayWithTopic bool) (batchPublisher, error) {
	_, _, _, _, _ = ctx, endpoint, replay, topic, replayWithTopic
	return nil, errNoPublisher
}
