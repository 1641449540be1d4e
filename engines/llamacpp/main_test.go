package llamacpp_test

import (
	"fmt"
	"os"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/llmgw/llmgw/internal/wait"
)

// TestMain fails the run if goroutines outlive the tests: every simulator
// the tests start, and every connection its transport hijacks, must be
// gone once they are closed. fasthttp's idle-worker cleaner exits shortly
// after Shutdown, so the check retries until a deadline.
func TestMain(m *testing.M) {
	code := m.Run()
	if code == 0 {
		opts := []goleak.Option{
			// fasthttp's process-wide Date refresher never stops.
			goleak.IgnoreAnyFunction("github.com/valyala/fasthttp.updateServerDate.func1"),
		}
		if _, err := wait.Until(5*time.Second, func() error { return goleak.Find(opts...) }); err != nil {
			fmt.Fprintf(os.Stderr, "goleak: %v\n", err)
			code = 1
		}
	}
	os.Exit(code)
}
