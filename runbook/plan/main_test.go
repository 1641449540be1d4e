package plan

import (
	"fmt"
	"os"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/llmgw/llmgw/internal/wait"
)

// TestMain fails the run when goroutines outlive the tests: every probe
// (HTTP request, SUB socket, replay exchange) must end with Probe.
func TestMain(m *testing.M) {
	code := m.Run()
	if code == 0 {
		code = checkLeaks()
	}
	os.Exit(code)
}

func checkLeaks() int {
	opts := []goleak.Option{
		// fasthttp's process-wide Date refresher (the simulators') never stops.
		goleak.IgnoreAnyFunction("github.com/valyala/fasthttp.updateServerDate.func1"),
		// zmq4 v0.17.0's PUB writer can miss its Close signal (the
		// simulators' publishers; engines/sim and kvevents ignore it too).
		goleak.IgnoreAnyFunction("github.com/go-zeromq/zmq4.(*pubMWriter).run"),
	}
	// Closed servers' goroutines exit asynchronously: goleak.Find retries
	// for a while itself (backing off between looks); repeat it until a
	// deadline before calling it a leak.
	if _, err := wait.Until(5*time.Second, func() error { return goleak.Find(opts...) }); err != nil {
		fmt.Fprintf(os.Stderr, "goleak: %v\n", err)
		return 1
	}
	return 0
}
