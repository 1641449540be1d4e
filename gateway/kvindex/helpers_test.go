package kvindex

import (
	"context"
	"errors"
	"net"
	"testing"
	"time"

	"github.com/llmgw/llmgw/engines/kvevents"
	"github.com/llmgw/llmgw/internal/wait"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) {
	// Two process-wide goroutines are owned by libraries, not by the code
	// under test: fasthttp's Date-header refresher (started by the engine
	// simulator) and zmq4 v0.17.0's PUB writer, which can miss its close
	// signal and park forever holding no socket (kvevents' and sim's own
	// tests ignore it for the same reason).
	goleak.VerifyTestMain(m,
		goleak.IgnoreAnyFunction("github.com/valyala/fasthttp.updateServerDate.func1"),
		goleak.IgnoreAnyFunction("github.com/go-zeromq/zmq4.(*pubMWriter).run"))
}

// waitLimit bounds every awaited condition: it only detects a hang.
const waitLimit = 15 * time.Second

// runIngester runs g until the test ends and checks that Run returns the
// context's error.
func runIngester(t *testing.T, g *Ingester) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- g.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		select {
		case err := <-done:
			if !errors.Is(err, context.Canceled) {
				t.Errorf("Run: got %v, want context.Canceled", err)
			}
		case <-time.After(waitLimit):
			t.Error("Run did not return after cancel")
		}
	})
}

// startPub binds a kvevents publisher on 127.0.0.1 with kernel-chosen ports.
func startPub(t *testing.T, endpoint, replay string) *kvevents.Publisher {
	t.Helper()
	var p *kvevents.Publisher
	// A port just released by a closed publisher can take a moment to be
	// bindable again.
	wait.ForErr(t, waitLimit, "NewPublisher("+endpoint+")", func() error {
		var err error
		p, err = kvevents.NewPublisher(context.Background(), kvevents.PublisherConfig{Endpoint: endpoint, ReplayEndpoint: replay, Bind: true})
		return err
	})
	t.Cleanup(func() { p.Close() })
	return p
}

func tcpOf(a net.Addr) string { return "tcp://" + a.String() }

// encode builds one batch payload.
func encode(t testing.TB, enc kvevents.Encoding, evs ...kvevents.Event) []byte {
	t.Helper()
	rank := int64(0)
	b, err := kvevents.AppendBatch(nil, &kvevents.Batch{TS: 1.5, Events: evs, DPRank: &rank}, enc)
	if err != nil {
		t.Fatalf("AppendBatch: %v", err)
	}
	return b
}

func stored(bs int, keys ...uint64) kvevents.Event {
	toks := make([]uint32, bs*len(keys))
	for i := range toks {
		toks[i] = uint32(i + 1)
	}
	return kvevents.Event{Kind: kvevents.BlockStored, BlockHashes: keys, TokenIDs: toks, BlockSize: bs}
}

func removed(keys ...uint64) kvevents.Event {
	return kvevents.Event{Kind: kvevents.BlockRemoved, BlockHashes: keys}
}

func cleared() kvevents.Event { return kvevents.Event{Kind: kvevents.AllBlocksCleared} }

func holdsAll(x *Index, ep int, keys ...uint64) bool {
	for _, k := range keys {
		if !x.Contains(ep, k) {
			return false
		}
	}
	return true
}

func holdsNone(x *Index, ep int, keys ...uint64) bool {
	for _, k := range keys {
		if x.Contains(ep, k) {
			return false
		}
	}
	return true
}
