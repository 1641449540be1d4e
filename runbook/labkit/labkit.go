// Package labkit holds what the lab runbooks (converged and pd) share: the
// evidence-keeping HTTP exchange, OpenAI answer and receipt parsing, rule
// read-back comparison, the embedded gateway and owned-rule lifecycle, and
// the small outcome helpers their steps are built from.
//
// labkit knows no topology: step names, outcome codes and evidence file
// names are chosen by its callers, except where a helper documents the
// evidence files it adds. Functions are safe for concurrent use unless a
// doc comment says otherwise; values such as Exchange are plain data.
package labkit

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"time"

	"github.com/llmgw/llmgw/profiles"
	"github.com/llmgw/llmgw/results"
	"github.com/llmgw/llmgw/runbook"
)

// Default timeouts of the lab runbooks' options.
const (
	DefaultHealthTimeout = 60 * time.Second
	DefaultReadyTimeout  = 20 * time.Second
)

// pollEvery is how often WaitFor re-checks its condition.
const pollEvery = 25 * time.Millisecond

// MustJSON is v as indented JSON with a trailing newline, for evidence
// files. A value that cannot be encoded yields the quoted error instead of
// failing: evidence must never abort a step.
func MustJSON(v any) []byte {
	b, err := json.MarshalIndent(v, "", "  ")
	if err != nil {
		return []byte(fmt.Sprintf("%q\n", err.Error()))
	}
	return append(b, '\n')
}

// WaitFor polls cond until it reports ok, returns an error, ctx ends or
// timeout passes, and returns cond's last description of the state. A
// timeout error wraps nothing (it says what was not reached); a context
// end returns ctx.Err(); an error from cond is returned as is.
func WaitFor(ctx context.Context, timeout time.Duration, cond func() (ok bool, last string, err error)) (string, error) {
	deadline := time.NewTimer(timeout)
	defer deadline.Stop()
	tick := time.NewTicker(pollEvery)
	defer tick.Stop()
	for {
		ok, last, err := cond()
		if err != nil {
			return last, err
		}
		if ok {
			return last, nil
		}
		select {
		case <-ctx.Done():
			return last, ctx.Err()
		case <-deadline.C:
			return last, fmt.Errorf("labkit: not reached within %v", timeout)
		case <-tick.C:
		}
	}
}

// WaitClosed waits until nothing accepts TCP connections at addr
// (host:port), within timeout: the proof that a stopped worker is gone.
func WaitClosed(ctx context.Context, addr string, timeout time.Duration) error {
	_, err := WaitFor(ctx, timeout, func() (bool, string, error) {
		c, err := net.DialTimeout("tcp", addr, time.Second)
		if err != nil {
			return true, "", nil
		}
		c.Close()
		return false, "still accepting connections", nil
	})
	return err
}

// LoadCatalog returns c, or the embedded catalog when c is nil, once the
// engines' adapters found every profile coherent (CheckCatalog): a profile
// an engine would reject never reaches a runbook.
func LoadCatalog(c *profiles.Catalog) (*profiles.Catalog, error) {
	if c == nil {
		var err error
		if c, err = profiles.Load(); err != nil {
			return nil, fmt.Errorf("labkit: %w", err)
		}
	}
	if err := CheckCatalog(c); err != nil {
		return nil, fmt.Errorf("labkit: %w", err)
	}
	return c, nil
}

// FillDefaults sets the shared optional fields of a runbook's options:
// zero or negative timeouts become DefaultHealthTimeout and
// DefaultReadyTimeout, a nil logger one that discards. Any pointer may be
// nil (that field is left alone).
func FillDefaults(health, ready *time.Duration, logger **slog.Logger) {
	if health != nil && *health <= 0 {
		*health = DefaultHealthTimeout
	}
	if ready != nil && *ready <= 0 {
		*ready = DefaultReadyTimeout
	}
	if logger != nil && *logger == nil {
		*logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
}

// CompleteTuple fills t's engine version and served model name from the
// catalog; what the catalog does not know stays empty.
func CompleteTuple(c *profiles.Catalog, t results.Tuple) results.Tuple {
	if v, err := c.Versions().For(t.Engine); err == nil {
		t.EngineVersion = v.Version
	}
	if p, err := c.Get(t.Profile); err == nil {
		t.Model = p.Model.ServedName
	}
	return t
}

// Hooked is a step named name running fn, after calling hook(name) when
// hook is non-nil (tests cancel the run from the hook, as Ctrl-C would).
func Hooked(hook func(string), name string, fn func(context.Context, *runbook.Run) runbook.Outcome) runbook.Step {
	return runbook.NewStep(name, func(ctx context.Context, r *runbook.Run) runbook.Outcome {
		if hook != nil {
			hook(name)
		}
		return fn(ctx, r)
	})
}

// ExecuteInto runs rb into w with runner rn, with an ownership ledger under
// outDir (for `llmgw cleanup`) that is finished whatever the outcome.
func ExecuteInto(ctx context.Context, rb runbook.Runbook, launcher string, w *results.RunWriter, outDir string, rn runbook.Runner) (runbook.Report, error) {
	led, err := runbook.OpenLedger(outDir, w.ID(), launcher)
	if err != nil {
		return runbook.Report{}, fmt.Errorf("labkit: %w", err)
	}
	rep, err := rn.Execute(ctx, rb, w, led)
	if ferr := led.Finish(); ferr != nil {
		err = errors.Join(err, ferr)
	}
	return rep, err
}

// LedgerOf is the run's ownership ledger (nil when the run has none).
func LedgerOf(r *runbook.Run) *runbook.Ledger {
	l, _ := r.Vars.(*runbook.Ledger)
	return l
}

// NewClient is the HTTP client of one run; the run's cleanup closes its
// idle connections (step "close HTTP client").
func NewClient(r *runbook.Run) *http.Client {
	c := &http.Client{Timeout: 60 * time.Second, Transport: &http.Transport{MaxIdleConnsPerHost: 16}}
	r.Defer("close HTTP client", func(context.Context) error {
		c.CloseIdleConnections()
		return nil
	})
	return c
}
