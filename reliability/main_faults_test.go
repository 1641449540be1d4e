//go:build faults

package reliability

import (
	"context"
	"os"
	"time"

	"github.com/llmgw/llmgw/reliability/harness"
)

// llmgwBin is the binary every fault test runs as gateway and simulators;
// it is built once before the tests.
var llmgwBin string

func init() {
	setupHooks = append(setupHooks, func() (func(), error) {
		dir, err := os.MkdirTemp("", "llmgw-faults-")
		if err != nil {
			return nil, err
		}
		cleanup := func() { os.RemoveAll(dir) }
		root, err := harness.ModuleRoot()
		if err != nil {
			cleanup()
			return nil, err
		}
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
		defer cancel()
		if llmgwBin, err = harness.Build(ctx, root, dir, false); err != nil {
			cleanup()
			return nil, err
		}
		return cleanup, nil
	})
}
