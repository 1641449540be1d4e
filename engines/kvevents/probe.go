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
	"github.com/go-zeromq/zmq4/transport"
)

// This file answers "are this engine's KV events reachable?" without
// consuming anything: a SUB connection and a replay request read, they take
// nothing away from other subscribers. Every exchange is bounded by the
// caller's context deadline, the ZMTP handshake included (zmq4 has no
// handshake timeout of its own; see probeTransport).

// ErrNoDeadline is returned by the probes when ctx has no deadline: a probe
// must never wait forever.
var ErrNoDeadline = errors.New("kvevents: probe needs a context deadline")

// ReplayAnswer is what a replay socket returned.
type ReplayAnswer struct {
	// Batches are the batches it still holds from the requested seq on.
	Batches []Message
	// Ended: the end-of-replay marker arrived (seq EndSeq or an empty
	// payload): the socket answered completely.
	Ended bool
}

// ProbeReplay asks the replay ROUTER at endpoint for every batch from seq
// from on and collects them until the end marker or ctx's deadline. An
// answer with Ended false and an error means the socket did not answer in
// time.
func ProbeReplay(ctx context.Context, endpoint string, from uint64) (ReplayAnswer, error) {
	var ans ReplayAnswer
	ep, err := probeEndpoint(ctx, endpoint)
	if err != nil {
		return ans, err
	}
	dealer := zmq4.NewDealer(ctx, zmq4.WithDialerMaxRetries(0))
	defer dealer.Close()
	if err := dealer.Dial(ep); err != nil {
		return ans, fmt.Errorf("kvevents: replay %s: %w", endpoint, err)
	}
	var req [8]byte
	binary.BigEndian.PutUint64(req[:], from)
	if err := dealer.SendMulti(zmq4.NewMsgFrom([]byte{}, req[:])); err != nil {
		return ans, fmt.Errorf("kvevents: replay %s: send: %w", endpoint, err)
	}
	for {
		msg, err := dealer.Recv()
		if err != nil {
			return ans, fmt.Errorf("kvevents: replay %s: no end marker: %w", endpoint, err)
		}
		topic, seq, payload, err := parseReplayReply(msg.Frames)
		if err != nil {
			return ans, fmt.Errorf("kvevents: replay %s: %w", endpoint, err)
		}
		if seq == EndSeq || len(payload) == 0 {
			ans.Ended = true
			return ans, nil
		}
		ans.Batches = append(ans.Batches, Message{Topic: topic, Seq: seq, Payload: payload, Replayed: true})
	}
}

// PubAnswer is what a PUB socket did within the probe's deadline.
type PubAnswer struct {
	// Handshake: a ZMTP peer accepted a SUB connection (it is a PUB or
	// XPUB socket; zmq4 refuses incompatible socket types).
	Handshake bool
	// First is the first batch received, nil when none arrived in time (an
	// idle engine publishes nothing).
	First *Message
}

// ProbePub connects a SUB socket to endpoint and waits until ctx's deadline
// for a first batch. A deadline without a batch is not an error: the
// handshake alone proves the publisher is there.
func ProbePub(ctx context.Context, endpoint, topic string) (PubAnswer, error) {
	var ans PubAnswer
	ep, err := probeEndpoint(ctx, endpoint)
	if err != nil {
		return ans, err
	}
	sub := zmq4.NewSub(ctx, zmq4.WithDialerMaxRetries(0))
	defer sub.Close()
	if err := sub.SetOption(zmq4.OptionSubscribe, topic); err != nil {
		return ans, fmt.Errorf("kvevents: subscribe: %w", err)
	}
	if err := sub.Dial(ep); err != nil {
		return ans, fmt.Errorf("kvevents: %s: %w", endpoint, err)
	}
	ans.Handshake = true
	msg, err := sub.Recv()
	if err != nil || len(msg.Frames) != 3 || len(msg.Frames[1]) != 8 {
		return ans, nil
	}
	ans.First = &Message{Topic: msg.Frames[0], Seq: binary.BigEndian.Uint64(msg.Frames[1]), Payload: msg.Frames[2]}
	return ans, nil
}

// probeScheme is a zmq4 transport that is TCP whose connections carry the
// dialling context's deadline, so a peer that accepts TCP but never greets
// cannot hold the probe past it.
const probeScheme = "llmgwprobe"

var registerProbe sync.Once

func probeEndpoint(ctx context.Context, endpoint string) (string, error) {
	if _, ok := ctx.Deadline(); !ok {
		return "", ErrNoDeadline
	}
	addr, ok := strings.CutPrefix(endpoint, "tcp://")
	if !ok {
		return "", fmt.Errorf("kvevents: probe %q: want tcp://host:port", endpoint)
	}
	if _, _, err := net.SplitHostPort(addr); err != nil {
		return "", fmt.Errorf("kvevents: probe %q: %w", endpoint, err)
	}
	var err error
	registerProbe.Do(func() { err = zmq4.RegisterTransport(probeScheme, probeTransport{}) })
	if err != nil {
		return "", fmt.Errorf("kvevents: probe transport: %w", err)
	}
	return probeScheme + "://" + addr, nil
}

type probeTransport struct{}

func (probeTransport) Dial(ctx context.Context, d transport.Dialer, addr string) (net.Conn, error) {
	c, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		return nil, err
	}
	if dl, ok := ctx.Deadline(); ok {
		if err := c.SetDeadline(dl); err != nil {
			c.Close()
			return nil, err
		}
	}
	return c, nil
}

func (probeTransport) Listen(context.Context, string) (net.Listener, error) {
	return nil, errors.New("kvevents: the probe transport only dials")
}

func (probeTransport) Addr(ep string) (string, error) {
	// zmq4 passes either the whole endpoint or its address part.
	addr, _ := strings.CutPrefix(ep, probeScheme+"://")
	if _, _, err := net.SplitHostPort(addr); err != nil {
		return "", fmt.Errorf("kvevents: probe endpoint %q: %w", ep, err)
	}
	return addr, nil
}
