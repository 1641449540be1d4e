package labkit

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"sort"

	"github.com/llmgw/llmgw/engines/sim"
	"github.com/llmgw/llmgw/runbook"
)

// ErrNoReceipts classifies a worker without a usable receipt log (not an
// llmgw simulator, or one that answers something else than a list).
var ErrNoReceipts = errors.New("labkit: no receipt log")

// ParseReceipts decodes a simulator's receipt log (GET /_sim/receipts;
// untrusted bytes). Anything but a JSON list, null included, is an error
// wrapping ErrNoReceipts; an empty list is not.
func ParseReceipts(b []byte) ([]sim.Receipt, error) {
	var out []sim.Receipt
	if err := json.Unmarshal(b, &out); err != nil {
		return nil, fmt.Errorf("%w: %w", ErrNoReceipts, err)
	}
	if out == nil {
		return nil, fmt.Errorf("%w: not a list", ErrNoReceipts)
	}
	return out, nil
}

// Receipts reads w's own receipt log. A worker without one is an error
// wrapping ErrNoReceipts: the runbook then has no delivery oracle
// independent of the gateway, and must say so instead of trusting it.
func Receipts(ctx context.Context, c *http.Client, w runbook.Worker) ([]sim.Receipt, error) {
	ex, err := Do(ctx, c, http.MethodGet, "http://"+w.HTTP+"/_sim/receipts", nil, nil)
	if err != nil {
		return nil, err
	}
	if ex.Status != http.StatusOK {
		return nil, fmt.Errorf("%w: worker %s answered GET /_sim/receipts with %d", ErrNoReceipts, w.ID, ex.Status)
	}
	recs, err := ParseReceipts([]byte(ex.Body))
	if err != nil {
		return nil, fmt.Errorf("worker %s: %w", w.ID, err)
	}
	return recs, nil
}

// AllReceipts reads every worker's receipts, by worker ID; the first
// failure ends it.
func AllReceipts(ctx context.Context, c *http.Client, ws []runbook.Worker) (map[string][]sim.Receipt, error) {
	out := map[string][]sim.Receipt{}
	for _, w := range ws {
		recs, err := Receipts(ctx, c, w)
		if err != nil {
			return nil, err
		}
		out[w.ID] = recs
	}
	return out, nil
}

// ReceiptFor finds the receipt of request id rid.
func ReceiptFor(recs []sim.Receipt, rid string) (sim.Receipt, bool) {
	for _, r := range recs {
		if r.RequestID == rid {
			return r, true
		}
	}
	return sim.Receipt{}, false
}

// Holders are the IDs of the workers whose receipts hold request rid,
// sorted.
func Holders(all map[string][]sim.Receipt, rid string) []string {
	var out []string
	for id, recs := range all {
		if _, ok := ReceiptFor(recs, rid); ok {
			out = append(out, id)
		}
	}
	sort.Strings(out)
	return out
}
