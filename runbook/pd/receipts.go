package pd

import (
	"context"

	"github.com/llmgw/llmgw/engines/sim"
	"github.com/llmgw/llmgw/runbook"
	"github.com/llmgw/llmgw/runbook/labkit"
)

// allReceipts reads every worker's own receipt log, by worker ID.
func (s *state) allReceipts(ctx context.Context) (map[string][]sim.Receipt, error) {
	ws := make([]runbook.Worker, len(s.workers))
	for i, w := range s.workers {
		ws[i] = w.Worker
	}
	return labkit.AllReceipts(ctx, s.client, ws)
}
