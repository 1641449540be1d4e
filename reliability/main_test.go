package reliability

import (
	"fmt"
	"os"
	"testing"

	"go.uber.org/goleak"
)

// setupHooks run before the tests (the fault suite's binary build, under
// the faults tag); each returns its cleanup.
var setupHooks []func() (cleanup func(), err error)

// cleanups run after the tests, before the leak check (the relay fuzz
// target's shared gateway).
var cleanups []func()

func TestMain(m *testing.M) {
	os.Exit(runMain(m))
}

func runMain(m *testing.M) int {
	for _, h := range setupHooks {
		cleanup, err := h()
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
		defer cleanup()
	}
	code := m.Run()
	for _, c := range cleanups {
		c()
	}
	if code == 0 {
		// Every child, reader goroutine, server and client connection of
		// the package's tests must be gone by now.
		if err := goleak.Find(goleak.IgnoreAnyFunction("github.com/valyala/fasthttp.(*HostClient).connsCleaner"),
			goleak.IgnoreAnyFunction("github.com/valyala/fasthttp.(*workerPool).Start.func2"),
			goleak.IgnoreAnyFunction("github.com/valyala/fasthttp.(*TCPDialer).tcpAddrsClean"),
			goleak.IgnoreAnyFunction("github.com/valyala/fasthttp.updateServerDate.func1")); err != nil {
			fmt.Fprintf(os.Stderr, "goleak: %v\n", err)
			return 1
		}
	}
	return code
}
