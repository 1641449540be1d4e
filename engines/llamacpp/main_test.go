package llamacpp_test

import (
	"fmt"
	"os"
	"testing"
	"time"

	"go.uber.org/goleak"
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
		deadline := time.Now().Add(5 * time.Second)
		for {
			err := goleak.Find(opts...)
			if err == nil {
				break
			}
			if time.Now().After(deadline) {
				fmt.Fprintf(os.Stderr, "goleak: %v\n", err)
				code = 1
				break
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
	os.Exit(code)
}
