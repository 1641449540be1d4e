package llamacpp_test

import (
	"testing"
	"time"

	"github.com/llmgw/llmgw/engines/llamacpp"
	"github.com/llmgw/llmgw/engines/sim"
)

// TestNagleStall: with the option on, a non-streamed answer on a reused
// connection comes no earlier than llamacpp.ReusedConnStall after its
// request (the server writes the body that long after the head), and its
// head is complete before its body.
func TestNagleStall(t *testing.T) {
	s := startSim(t, sim.Config{NagleStall: true})
	c := dial(t, s.Addrs().HTTP)
	first := c.roundTrip("GET", "/health", nil, "")
	if first.status != 200 {
		t.Fatalf("first /health: %d", first.status)
	}
	for _, path := range []string{"/health", "/v1/models"} {
		sent := time.Now()
		r := c.roundTrip("GET", path, nil, "")
		if r.status != 200 {
			t.Fatalf("%s: %d", path, r.status)
		}
		if got := r.bodyAt.Sub(sent); got < llamacpp.ReusedConnStall {
			t.Errorf("%s on a reused connection: body after %v, want >= %v", path, got, llamacpp.ReusedConnStall)
		}
		if !r.headAt.Before(r.bodyAt) {
			t.Errorf("%s: head not received before the body", path)
		}
	}
}
