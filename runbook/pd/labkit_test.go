package pd

import (
	"github.com/llmgw/llmgw/engines/sim"
	"github.com/llmgw/llmgw/runbook/labkit"
)

// The parsers moved to labkit; these adapters keep the package's fuzz
// targets exercising them with the results they were written against.

func ParseReceipts(b []byte) ([]sim.Receipt, error) { return labkit.ParseReceipts(b) }

func ParseCompletion(body string) (text string, cached int, err error) {
	c, err := labkit.ParseCompletion(body)
	return c.Text, c.CachedTokens, err
}

func ParseSSE(body string) (text string, events int, err error) {
	c, err := labkit.ParseSSE(body)
	return c.Text, c.Chunks, err
}
