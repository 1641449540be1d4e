package labkit

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/llmgw/llmgw/engines"
	"github.com/llmgw/llmgw/engines/sim"
	"github.com/llmgw/llmgw/runbook"
)

// Evidence source names, as lanes record them (results lane_sources).
const (
	// SourceReceipts: the simulator's own receipt log (GET /_sim/receipts),
	// one receipt per request, correlated by request id.
	SourceReceipts = "sim_receipts"
	// SourceMetrics: an engine-native Prometheus work counter, read before
	// and after each request (the lab sends one request at a time). A
	// counter cannot tell whose request it counted, so this proof holds
	// only while the lab's traffic is the only traffic on the workers
	// (attach dedicated workers): foreign traffic shows up as work on more
	// than one worker and fails the lane rather than passing it, except
	// when the lab's request went to no witnessed worker at all while the
	// named one served someone else.
	SourceMetrics = "engine_metrics"
	// SourceSlots: llama.cpp's /slots, whose largest id_task rises with
	// every completion.
	SourceSlots = "engine_slots"
	// SourceAnswer: the worker's own well-formed completion.
	SourceAnswer = "worker_answer"
	// SourceUsage: engine-reported cached tokens in each answer (usage or
	// llama.cpp timings).
	SourceUsage = "engine_usage"
	// SourceDecisions: the gateway's decision log (GET /v1/decisions),
	// cross-checked against a worker-side source, never alone.
	SourceDecisions = "gateway_decisions"
)

// ErrNoEvidence classifies a worker no evidence source can witness; its
// message names the fix (e.g. "start llama-server with --metrics").
var ErrNoEvidence = errors.New("labkit: no evidence source")

// NoEvidenceError says why no source could witness a worker's work.
type NoEvidenceError struct {
	Code   string // engine_metrics_disabled, no_evidence_source
	Worker string
	Detail string
}

func (e *NoEvidenceError) Error() string {
	return fmt.Sprintf("%s: worker %s: %s", e.Code, e.Worker, e.Detail)
}

func (e *NoEvidenceError) Is(target error) bool { return target == ErrNoEvidence }

// Reading is one look at a worker's evidence source.
type Reading struct {
	// Work rises with every completion the worker runs (receipt count,
	// counter value or largest slot task id).
	Work float64
	// Receipts are the worker's receipts (receipt source only).
	Receipts []sim.Receipt
}

// Witness reads one worker's gateway-independent evidence source.
type Witness interface {
	// Source names it (SourceReceipts, SourceMetrics, SourceSlots), with
	// the series or path read ("engine_metrics vllm:request_success_total").
	Source() string
	Read(ctx context.Context) (Reading, error)
}

type receiptWitness struct {
	c *http.Client
	w runbook.Worker
}

func (r receiptWitness) Source() string { return SourceReceipts }
func (r receiptWitness) Read(ctx context.Context) (Reading, error) {
	recs, err := Receipts(ctx, r.c, r.w)
	if err != nil {
		return Reading{}, err
	}
	return Reading{Work: float64(len(recs)), Receipts: recs}, nil
}

type metricsWitness struct {
	c            *http.Client
	url, counter string
}

func (m metricsWitness) Source() string { return SourceMetrics + " " + m.counter }
func (m metricsWitness) Read(ctx context.Context) (Reading, error) {
	v, err := ReadCounter(ctx, m.c, m.url, m.counter)
	return Reading{Work: v}, err
}

// ReadCounter reads Prometheus series name (summed over its labels) from
// the metrics page at url.
func ReadCounter(ctx context.Context, c *http.Client, url, name string) (float64, error) {
	ex, err := Do(ctx, c, http.MethodGet, url, nil, nil)
	if err != nil {
		return 0, err
	}
	if ex.Status != http.StatusOK {
		return 0, fmt.Errorf("labkit: GET %s answered %d", url, ex.Status)
	}
	v, ok, err := ParseCounter([]byte(ex.Body), name)
	if err != nil {
		return 0, fmt.Errorf("labkit: GET %s: %w", url, err)
	}
	if !ok {
		return 0, fmt.Errorf("labkit: GET %s: no series %s", url, name)
	}
	return v, nil
}

type slotsWitness struct {
	c   *http.Client
	url string
}

func (s slotsWitness) Source() string {
	return SourceSlots + " " + s.url[strings.LastIndex(s.url, "/"):]
}
func (s slotsWitness) Read(ctx context.Context) (Reading, error) {
	ex, err := Do(ctx, s.c, http.MethodGet, s.url, nil, nil)
	if err != nil {
		return Reading{}, err
	}
	if ex.Status != http.StatusOK {
		return Reading{}, fmt.Errorf("labkit: GET %s answered %d", s.url, ex.Status)
	}
	top, err := engines.ParseSlotsTask([]byte(ex.Body))
	if err != nil {
		return Reading{}, err
	}
	return Reading{Work: float64(top)}, nil
}

// ChooseWitness picks w's evidence source, best first: the simulator's
// receipts, the adapter's work counter on its metrics endpoint, its slots
// page. A worker with none is a *NoEvidenceError naming the flag that would
// give one.
func ChooseWitness(ctx context.Context, c *http.Client, w runbook.Worker, a engines.Adapter) (Witness, error) {
	rw := receiptWitness{c: c, w: w}
	if _, err := rw.Read(ctx); err == nil {
		return rw, nil
	} else if ctx.Err() != nil {
		return nil, err
	}
	ev, ok := engines.EvidenceOf(a)
	if !ok {
		return nil, &NoEvidenceError{Code: "no_evidence_source", Worker: w.ID, Detail: fmt.Sprintf("no receipt log and the %s adapter names no engine evidence", a.Display())}
	}
	e := ev.Evidence()
	var tried []string
	if path := a.Surfaces().Metrics; path != "" && e.WorkCounter != "" {
		mw := metricsWitness{c: c, url: "http://" + w.HTTP + path, counter: e.WorkCounter}
		if _, err := mw.Read(ctx); err == nil {
			return mw, nil
		} else {
			tried = append(tried, err.Error())
		}
	}
	if e.Slots != "" {
		sw := slotsWitness{c: c, url: "http://" + w.HTTP + e.Slots}
		if _, err := sw.Read(ctx); err == nil {
			return sw, nil
		} else {
			tried = append(tried, err.Error())
		}
	}
	if ctx.Err() != nil {
		return nil, ctx.Err()
	}
	if e.MetricsFlag != "" {
		return nil, &NoEvidenceError{Code: "engine_metrics_disabled", Worker: w.ID,
			Detail: fmt.Sprintf("start %s with %s (tried: %s)", a.Display(), e.MetricsFlag, strings.Join(tried, "; "))}
	}
	return nil, &NoEvidenceError{Code: "no_evidence_source", Worker: w.ID,
		Detail: fmt.Sprintf("no receipt log, no %s work counter %q (tried: %s)", a.Display(), e.WorkCounter, strings.Join(tried, "; "))}
}

// ParseCounter sums the samples of Prometheus series name in a text
// exposition (untrusted bytes): every sample line whose metric name is
// exactly name, whatever its labels. ok is false when no such sample
// exists. A malformed sample of that name is an error; other lines are not
// read.
func ParseCounter(body []byte, name string) (float64, bool, error) {
	sc := bufio.NewScanner(bytes.NewReader(body))
	sc.Buffer(make([]byte, 64<<10), MaxBody)
	var sum float64
	found := false
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		if line == "" || line[0] == '#' || !strings.HasPrefix(line, name) {
			continue
		}
		rest := line[len(name):]
		switch {
		case rest == "":
			return 0, false, fmt.Errorf("labkit: sample %s has no value", name)
		case rest[0] == '{':
			end := strings.LastIndexByte(rest, '}')
			if end < 0 {
				return 0, false, fmt.Errorf("labkit: sample %s: unterminated labels", name)
			}
			rest = rest[end+1:]
		case rest[0] != ' ' && rest[0] != '\t':
			continue // a longer name sharing the prefix
		}
		fields := strings.Fields(rest)
		if len(fields) == 0 {
			return 0, false, fmt.Errorf("labkit: sample %s has no value", name)
		}
		v, err := strconv.ParseFloat(fields[0], 64)
		if err != nil || math.IsNaN(v) {
			return 0, false, fmt.Errorf("labkit: sample %s: value %q is not a number", name, fields[0])
		}
		sum += v
		found = true
	}
	if err := sc.Err(); err != nil {
		return 0, false, fmt.Errorf("labkit: metrics: %w", err)
	}
	return sum, found, nil
}

// Witnesses are the evidence sources of a run's workers, by worker ID.
type Witnesses struct {
	ByWorker map[string]Witness
	// Missing holds why a worker has no source (by worker ID).
	Missing map[string]error
	order   []string
}

// ChooseWitnesses picks every worker's source.
func ChooseWitnesses(ctx context.Context, c *http.Client, ws []runbook.Worker, a engines.Adapter) *Witnesses {
	out := &Witnesses{ByWorker: map[string]Witness{}, Missing: map[string]error{}}
	for _, w := range ws {
		out.order = append(out.order, w.ID)
		wt, err := ChooseWitness(ctx, c, w, a)
		if err != nil {
			out.Missing[w.ID] = err
			continue
		}
		out.ByWorker[w.ID] = wt
	}
	return out
}

// Blocked is the BLOCKED outcome of a lane that needs every worker
// witnessed, or ok when all are.
func (ws *Witnesses) Blocked() (runbook.Outcome, bool) {
	for _, id := range ws.order {
		if err := ws.Missing[id]; err != nil {
			var ne *NoEvidenceError
			code := "no_evidence_source"
			if errors.As(err, &ne) {
				code = ne.Code
			}
			return runbook.Blocked(code, "%v", err), true
		}
	}
	return runbook.Outcome{}, false
}

// Source is the lane label: the one source every worker uses, or the
// distinct ones joined by "+".
func (ws *Witnesses) Source() string {
	var seen []string
	for _, id := range ws.order {
		if w, ok := ws.ByWorker[id]; ok && !containsStr(seen, w.Source()) {
			seen = append(seen, w.Source())
		}
	}
	return strings.Join(seen, "+")
}

// Receipts reports whether every worker is witnessed by its receipt log.
func (ws *Witnesses) Receipts() bool {
	for _, id := range ws.order {
		if w, ok := ws.ByWorker[id]; !ok || w.Source() != SourceReceipts {
			return false
		}
	}
	return true
}

func containsStr(s []string, v string) bool {
	for _, x := range s {
		if x == v {
			return true
		}
	}
	return false
}

// Snapshot reads every worker, by ID.
func (ws *Witnesses) Snapshot(ctx context.Context) (map[string]Reading, error) {
	out := make(map[string]Reading, len(ws.order))
	for _, id := range ws.order {
		w, ok := ws.ByWorker[id]
		if !ok {
			return nil, ws.Missing[id]
		}
		r, err := w.Read(ctx)
		if err != nil {
			return nil, fmt.Errorf("labkit: worker %s (%s): %w", id, w.Source(), err)
		}
		out[id] = r
	}
	return out, nil
}

// served reports whether worker id served request rid between before and
// after: by its receipt when the worker keeps receipts, else by its work
// reading rising.
func served(before, after Reading, rid string, receipts bool) bool {
	if receipts {
		_, now := ReceiptFor(after.Receipts, rid)
		_, then := ReceiptFor(before.Receipts, rid)
		return now && !then
	}
	return after.Work > before.Work
}

// Servers are the workers that served rid between two snapshots, in
// worker order.
func (ws *Witnesses) Servers(before, after map[string]Reading, rid string) []string {
	var out []string
	for _, id := range ws.order {
		w := ws.ByWorker[id]
		if w != nil && served(before[id], after[id], rid, w.Source() == SourceReceipts) {
			out = append(out, id)
		}
	}
	return out
}

// Observe sends one request through send and returns the workers that
// served it. Engine counters may be updated a little after the answer, so
// when send succeeded Observe waits (up to timeout) for some worker's
// source to show the request; the result may still be empty (nobody served
// it) or hold several workers (the caller decides what that proves).
func (ws *Witnesses) Observe(ctx context.Context, rid string, timeout time.Duration, send func() error) ([]string, error) {
	return ws.ObserveUntil(ctx, rid, timeout, send, func(got []string) bool { return len(got) > 0 })
}

// ObserveUntil is Observe waiting until enough holds for the workers seen
// so far (a P/D request shows on a prefill and a decode).
func (ws *Witnesses) ObserveUntil(ctx context.Context, rid string, timeout time.Duration, send func() error, enough func([]string) bool) ([]string, error) {
	before, err := ws.Snapshot(ctx)
	if err != nil {
		return nil, err
	}
	if err := send(); err != nil {
		return nil, err
	}
	var got []string
	var readErr error
	_, werr := WaitFor(ctx, timeout, func() (bool, string, error) {
		after, err := ws.Snapshot(ctx)
		if err != nil {
			readErr = err
			return false, "", err
		}
		got = ws.Servers(before, after, rid)
		return enough(got), fmt.Sprintf("evidence sources show request %s on %v", rid, got), nil
	})
	switch {
	case readErr != nil:
		return nil, readErr
	case ctx.Err() != nil:
		return nil, werr
	}
	// A timeout leaves got empty: nobody served the request.
	return got, nil
}

// Decisions is the gateway's decision log (GET /v1/decisions; untrusted
// bytes) as request id → endpoint.
func ParseDecisions(b []byte) (map[string]string, error) {
	var d struct {
		Decisions *[]struct {
			RequestID string `json:"request_id"`
			Endpoint  string `json:"endpoint"`
		} `json:"decisions"`
	}
	if err := json.Unmarshal(b, &d); err != nil {
		return nil, fmt.Errorf("labkit: decisions: %w", err)
	}
	if d.Decisions == nil {
		return nil, fmt.Errorf("labkit: decisions: no \"decisions\" list")
	}
	out := make(map[string]string, len(*d.Decisions))
	for _, x := range *d.Decisions {
		out[x.RequestID] = x.Endpoint
	}
	return out, nil
}
