package labkit

import (
	"context"
	"encoding/json"
	"net/http"

	"github.com/llmgw/llmgw/runbook"
)

// CompletionPath is the OpenAI path a profile is served on: chat
// completions when chat, else completions.
func CompletionPath(chat bool) string {
	if chat {
		return "/v1/chat/completions"
	}
	return "/v1/completions"
}

// RequestBody is a small greedy completion request (8 tokens) for
// CompletionPath(chat). The nonce travels in "user", which the simulators'
// receipts record; a stream asks for usage in its last event.
func RequestBody(chat bool, model, prompt, nonce string, stream bool) []byte {
	m := map[string]any{"model": model, "max_tokens": 8, "temperature": 0, "user": nonce}
	if chat {
		m["messages"] = []map[string]string{{"role": "user", "content": prompt}}
	} else {
		m["prompt"] = prompt
	}
	if stream {
		m["stream"] = true
		m["stream_options"] = map[string]bool{"include_usage": true}
	}
	b, _ := json.Marshal(m)
	return b
}

// Negative is a request the gateway itself must refuse with Status,
// reaching no worker.
type Negative struct {
	Name   string // evidence file negative-<Name>.json; request id <run>-negative-<Name>
	Body   []byte
	Status int
}

// Negatives are the deliver step's negative requests for run runID: an
// unknown model (404) and a malformed body (400).
func Negatives(chat bool, runID, model string) []Negative {
	return []Negative{
		{"unknown-model", RequestBody(chat, "llmgw-no-such-model-"+ShortID(runID), "must not be delivered", runID+"-negative-unknown-model", false), http.StatusNotFound},
		{"malformed-body", []byte(`{"model": "` + model + `", "prompt": `), http.StatusBadRequest},
	}
}

// SendNegatives sends each negative request to url (the gateway's data
// plane) with request id <runID>-negative-<name>, adding its exchange to
// out. It returns the request ids sent (for the caller to prove that no
// receipt holds them) and out; ok false means out is the step's FAIL
// (DELIVERY_FAILED, NEGATIVE_NOT_REFUSED or INTERRUPTED).
func SendNegatives(ctx context.Context, c *http.Client, url, runID string, negs []Negative, out runbook.Outcome) (rids []string, _ runbook.Outcome, ok bool) {
	for _, n := range negs {
		rid := runID + "-negative-" + n.Name
		rids = append(rids, rid)
		ex, err := Do(ctx, c, http.MethodPost, url, n.Body, map[string]string{"X-Request-Id": rid})
		out = out.With("negative-"+n.Name+".json", ex.JSON())
		if err != nil {
			return rids, WithEvidence(FailErr(ctx, "DELIVERY_FAILED", err), out), false
		}
		if ex.Status != n.Status {
			return rids, WithEvidence(runbook.Fail("NEGATIVE_NOT_REFUSED", "negative request %s answered %d, want %d", n.Name, ex.Status, n.Status), out), false
		}
	}
	return rids, out, true
}

// Kind names a delivery by its answer form: "sse" for a stream, else
// "json". It prefixes the exchange's evidence file <kind>-exchange.json.
func Kind(stream bool) string {
	if stream {
		return "sse"
	}
	return "json"
}

// Deliver sends one positive request (body, request id rid) to url, the
// gateway's data plane, adding its exchange to out as
// <Kind(stream)>-exchange.json. The answer must be 200, a well-formed
// completion of the asked form (CheckAnswer) and carry X-Request-Id rid;
// ok false means out is the step's FAIL (DELIVERY_FAILED,
// DELIVERY_BAD_BODY, DELIVERY_REQUEST_ID or INTERRUPTED). Which endpoint
// answered is the caller's check.
func Deliver(ctx context.Context, c *http.Client, url, rid string, body []byte, stream bool, out runbook.Outcome) (Exchange, runbook.Outcome, bool) {
	kind := Kind(stream)
	ex, err := Do(ctx, c, http.MethodPost, url, body, map[string]string{"X-Request-Id": rid})
	out = out.With(kind+ExchangeSuffix, ex.JSON())
	if err != nil {
		return ex, WithEvidence(FailErr(ctx, "DELIVERY_FAILED", err), out), false
	}
	if ex.Status != http.StatusOK {
		return ex, WithEvidence(runbook.Fail("DELIVERY_FAILED", "%s request through the gateway answered %d: %.200s", kind, ex.Status, ex.Body), out), false
	}
	if perr := CheckAnswer(ex, stream); perr != nil {
		return ex, WithEvidence(runbook.Fail("DELIVERY_BAD_BODY", "%s answer: %v", kind, perr), out), false
	}
	if got := ex.Get("X-Request-Id"); got != rid {
		return ex, WithEvidence(runbook.Fail("DELIVERY_REQUEST_ID", "%s answer carries X-Request-Id %q, want %q", kind, got, rid), out), false
	}
	return ex, out, true
}

// NegativesLeaveNoWork sends the run's negative requests (an unknown model,
// a malformed body) through the gateway at url and proves from w's evidence
// that none reached a worker: every positive request's evidence must have
// been awaited before, so that a rise between the two snapshots is the
// negatives'. It returns out with the exchanges, or the failing outcome and
// false.
func NegativesLeaveNoWork(ctx context.Context, c *http.Client, w *Witnesses, url, runID string, chat bool, model string, out runbook.Outcome) (runbook.Outcome, bool) {
	before, err := w.Snapshot(ctx)
	if err != nil {
		return WithEvidence(FailErr(ctx, "EVIDENCE_READ_FAILED", err), out), false
	}
	negRIDs, out, ok := SendNegatives(ctx, c, url, runID, Negatives(chat, runID, model), out)
	if !ok {
		return out, false
	}
	after, err := w.Snapshot(ctx)
	if err != nil {
		return WithEvidence(FailErr(ctx, "EVIDENCE_READ_FAILED", err), out), false
	}
	for _, rid := range negRIDs {
		if h := w.Servers(before, after, rid); len(h) > 0 {
			return WithEvidence(runbook.Fail("NEGATIVE_LEFT_RECEIPT", "negative request %s was refused but the evidence (%s) shows work on %v", rid, w.Source(), h), out), false
		}
	}
	return out, true
}
