package labkit

import (
	"context"
	"errors"
	"slices"

	"github.com/llmgw/llmgw/engines"
	_ "github.com/llmgw/llmgw/engines/all" // the adapters the lab asks
	"github.com/llmgw/llmgw/gateway/adminclient"
	"github.com/llmgw/llmgw/runbook"
)

// CodeInterrupted is the outcome code of a step cut short by the run's
// context (Ctrl-C).
const CodeInterrupted = "INTERRUPTED"

// FailErr is the FAIL outcome of err: INTERRUPTED when ctx has ended (the
// error is then the cancellation's consequence), code otherwise.
//
// A worker without a receipt log (ErrNoReceipts: a real engine, not an
// llmgw simulator) is BLOCKED no_receipt_source, not FAIL: the check could
// not be made, since nothing independent of the gateway records what the
// worker served, and a FAIL would claim the engine misbehaved.
func FailErr(ctx context.Context, code string, err error) runbook.Outcome {
	if ctx.Err() != nil {
		return runbook.Fail(CodeInterrupted, "interrupted: %v", err)
	}
	if errors.Is(err, ErrNoReceipts) {
		return runbook.Blocked(CodeNoReceiptSource, "%v: this worker keeps no receipt log (only llmgw simulators do), so delivery cannot be proven independently of the gateway", err)
	}
	return runbook.Fail(code, "%v", err)
}

// CodeNoReceiptSource is the BLOCKED code of a step that needs worker
// receipts from a worker that keeps none.
const CodeNoReceiptSource = "no_receipt_source"

// WithEvidence is o carrying base's evidence files before its own, and
// base's lanes: a step's verdict keeps what the step gathered so far.
func WithEvidence(o, base runbook.Outcome) runbook.Outcome {
	o.Evidence = append(slices.Clone(base.Evidence), o.Evidence...)
	o.Lanes = base.Lanes
	return o
}

// IsStatus reports whether err is an admin API answer with HTTP status
// code.
func IsStatus(err error, code int) bool {
	var ae *adminclient.Error
	return errors.As(err, &ae) && ae.Status == code
}

// LaunchFailed is the outcome of a launcher error, with the error kept as
// launch-error.txt: BLOCKED with the launcher's code when the host cannot
// provide the workers, else ENGINE_LAUNCH_FAILED (or INTERRUPTED).
func LaunchFailed(ctx context.Context, launcher string, err error) runbook.Outcome {
	ev := []byte(err.Error() + "\n")
	if b := runbook.AsBlocked(err); b != nil {
		return runbook.Blocked(b.Code, "%s launcher: %s", launcher, b.Detail).With("launch-error.txt", ev)
	}
	return FailErr(ctx, "ENGINE_LAUNCH_FAILED", err).With("launch-error.txt", ev)
}

// EventEncoding is the KV event layout the simulators of engine publish:
// the engine adapter's KV().Layout ("" for an engine whose events have one
// form only, or none).
func EventEncoding(engine string) string {
	a, err := engines.For(engines.Kind(engine))
	if err != nil || a.KV() == nil {
		return ""
	}
	return a.KV().Layout
}

// PublishesZMQ reports whether engine's workers publish KV events over ZMQ
// (the adapter's KV().Transport), so that a launcher gives them a
// publisher endpoint.
func PublishesZMQ(engine string) bool { return engines.KVOf(engines.Kind(engine)).PublishesZMQ() }
