package converged

import (
	"context"

	"github.com/llmgw/llmgw/engines/sim"
	"github.com/llmgw/llmgw/runbook/labkit"
)

// allReceipts reads every worker's own receipt log, by worker ID.
func (s *state) allReceipts(ctx context.Context) (map[string][]sim.Receipt, error) {
	return labkit.AllReceipts(ctx, s.client, s.workers)
}
