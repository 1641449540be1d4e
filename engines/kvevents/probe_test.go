package kvevents

import (
	"context"
	"errors"
	"net"
	"testing"
	"time"
)

func TestProbeReplayAndPub(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	for _, withTopic := range []bool{false, true} {
		pub, err := NewPublisher(ctx, PublisherConfig{Endpoint: "tcp://127.0.0.1:0", ReplayEndpoint: "tcp://127.0.0.1:0", Bind: true, ReplayWithTopic: withTopic})
		if err != nil {
			t.Fatal(err)
		}
		defer pub.Close()
		ev, rp := "tcp://"+pub.Addr().String(), "tcp://"+pub.ReplayAddr().String()
		pctx, pcancel := context.WithTimeout(ctx, 2*time.Second)
		empty, err := ProbeReplay(pctx, rp, 0)
		pcancel()
		if err != nil || !empty.Ended || len(empty.Batches) != 0 {
			t.Fatalf("replay of an empty buffer = %+v, %v; want the end marker alone", empty, err)
		}
		for _, p := range [][]byte{[]byte("one"), []byte("two")} {
			if _, err := pub.Publish(p); err != nil {
				t.Fatal(err)
			}
		}
		pctx, pcancel = context.WithTimeout(ctx, 2*time.Second)
		ans, err := ProbeReplay(pctx, rp, 0)
		pcancel()
		if err != nil || !ans.Ended || len(ans.Batches) != 2 || string(ans.Batches[1].Payload) != "two" {
			t.Fatalf("replay (topic %v) = %+v, %v; want both batches and the end marker", withTopic, ans, err)
		}
		// An idle publisher: the handshake alone is the answer.
		pctx, pcancel = context.WithTimeout(ctx, 200*time.Millisecond)
		pa, err := ProbePub(pctx, ev, "")
		pcancel()
		if err != nil || !pa.Handshake {
			t.Fatalf("pub probe = %+v, %v; want a handshake", pa, err)
		}
	}
}

// A peer that accepts TCP and never speaks ZMTP cannot hold a probe past
// its deadline; a refused port is an error at once; no deadline is refused.
func TestProbeDeadlines(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	held := make(chan net.Conn, 4)
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			held <- c
		}
	}()
	defer func() {
		for {
			select {
			case c := <-held:
				c.Close()
			default:
				return
			}
		}
	}()
	silent := "tcp://" + ln.Addr().String()
	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	if pa, err := ProbePub(ctx, silent, ""); err == nil || pa.Handshake {
		t.Errorf("silent peer: %+v, %v; want a handshake failure", pa, err)
	}
	ctx2, cancel2 := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel2()
	if ans, err := ProbeReplay(ctx2, silent, 0); err == nil || ans.Ended {
		t.Errorf("silent replay: %+v, %v; want an error", ans, err)
	}
	dead, _ := net.Listen("tcp", "127.0.0.1:0")
	addr := "tcp://" + dead.Addr().String()
	dead.Close()
	ctx3, cancel3 := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel3()
	if _, err := ProbePub(ctx3, addr, ""); err == nil {
		t.Error("refused port: no error")
	}
	if _, err := ProbePub(context.Background(), addr, ""); !errors.Is(err, ErrNoDeadline) {
		t.Errorf("no deadline: %v; want ErrNoDeadline", err)
	}
	if _, err := ProbeReplay(ctx3, "ipc:///tmp/x", 0); err == nil {
		t.Error("non-tcp endpoint accepted")
	}
}
