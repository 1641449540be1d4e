// Command llmgw is the LLM inference gateway and its qualification lab in one
// binary. See README.md and `llmgw --help`.
package main

import (
	"context"
	"os"
	"os/signal"
	"syscall"

	"github.com/llmgw/llmgw/cmd/llmgw/cli"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := cli.Main(ctx, os.Args[1:], cli.SystemIO())
	stop()
	os.Exit(int(code))
}
