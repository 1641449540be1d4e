package converged

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"time"

	"github.com/llmgw/llmgw/engines/sim"
	"github.com/llmgw/llmgw/runbook"
)

// exchange is one HTTP request and its answer, kept as evidence.
type exchange struct {
	Method    string            `json:"method"`
	URL       string            `json:"url"`
	ReqHeader map[string]string `json:"request_headers,omitempty"`
	ReqBody   json.RawMessage   `json:"request_body,omitempty"`
	ReqRaw    string            `json:"request_raw,omitempty"`
	Status    int               `json:"status"`
	Header    map[string]string `json:"response_headers,omitempty"`
	Body      string            `json:"response_body"`
	Error     string            `json:"error,omitempty"`
}

func (e exchange) header(k string) string { return e.Header[http.CanonicalHeaderKey(k)] }

func (e exchange) json() []byte {
	b, _ := json.MarshalIndent(e, "", "  ")
	return append(b, '\n')
}

// do sends body to url with the given headers and reads the whole answer.
// A transport error is recorded in the exchange and returned.
func (s *state) do(ctx context.Context, method, url string, body []byte, hdr map[string]string) (exchange, error) {
	ex := exchange{Method: method, URL: url, ReqHeader: hdr}
	if json.Valid(body) {
		ex.ReqBody = body
	} else if body != nil {
		ex.ReqRaw = string(body)
	}
	var rd io.Reader
	if body != nil {
		rd = bytes.NewReader(body)
	}
	req, err := http.NewRequestWithContext(ctx, method, url, rd)
	if err != nil {
		ex.Error = err.Error()
		return ex, fmt.Errorf("converged: %s %s: %w", method, url, err)
	}
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	for k, v := range hdr {
		req.Header.Set(k, v)
	}
	resp, err := s.client.Do(req)
	if err != nil {
		ex.Error = err.Error()
		return ex, fmt.Errorf("converged: %s %s: %w", method, url, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, 8<<20))
	ex.Status, ex.Body = resp.StatusCode, string(b)
	ex.Header = map[string]string{}
	for k := range resp.Header {
		ex.Header[k] = resp.Header.Get(k)
	}
	if err != nil {
		ex.Error = err.Error()
		return ex, fmt.Errorf("converged: %s %s: reading body: %w", method, url, err)
	}
	return ex, nil
}

// completion is what the runbook reads from an OpenAI answer (JSON or the
// SSE stream folded).
type completion struct {
	Text         string
	Chunks       int
	Done         bool // SSE ended with data: [DONE]
	CachedTokens int  // usage.prompt_tokens_details.cached_tokens; -1 when absent
	PromptTokens int
}

type openaiBody struct {
	Choices []struct {
		Text    string `json:"text"`
		Message *struct {
			Content string `json:"content"`
		} `json:"message"`
		Delta *struct {
			Content string `json:"content"`
		} `json:"delta"`
	} `json:"choices"`
	Usage *struct {
		PromptTokens int `json:"prompt_tokens"`
		Details      *struct {
			Cached int `json:"cached_tokens"`
		} `json:"prompt_tokens_details"`
	} `json:"usage"`
}

func (c *completion) add(b openaiBody) {
	for _, ch := range b.Choices {
		c.Text += ch.Text
		if ch.Message != nil {
			c.Text += ch.Message.Content
		}
		if ch.Delta != nil {
			c.Text += ch.Delta.Content
		}
	}
	if b.Usage != nil {
		c.PromptTokens = b.Usage.PromptTokens
		if b.Usage.Details != nil {
			c.CachedTokens = b.Usage.Details.Cached
		}
	}
}

// errNotCompletion: the body is not an OpenAI completion.
var errNotCompletion = errors.New("converged: not an OpenAI completion")

// parseCompletion reads a non-streaming completion body.
func parseCompletion(body string) (completion, error) {
	c := completion{CachedTokens: -1}
	var b openaiBody
	if err := json.Unmarshal([]byte(body), &b); err != nil {
		return c, fmt.Errorf("%w: %w", errNotCompletion, err)
	}
	if len(b.Choices) == 0 {
		return c, fmt.Errorf("%w: no choices", errNotCompletion)
	}
	c.add(b)
	return c, nil
}

// parseSSE folds an SSE completion stream: every "data:" event must be JSON
// until the final "data: [DONE]".
func parseSSE(body string) (completion, error) {
	c := completion{CachedTokens: -1}
	sc := bufio.NewScanner(strings.NewReader(body))
	sc.Buffer(make([]byte, 64<<10), 8<<20)
	for sc.Scan() {
		line := strings.TrimRight(sc.Text(), "\r")
		data, ok := strings.CutPrefix(line, "data:")
		if !ok {
			continue
		}
		data = strings.TrimSpace(data)
		if c.Done {
			return c, fmt.Errorf("%w: event after [DONE]", errNotCompletion)
		}
		if data == "[DONE]" {
			c.Done = true
			continue
		}
		var b openaiBody
		if err := json.Unmarshal([]byte(data), &b); err != nil {
			return c, fmt.Errorf("%w: SSE event %d: %w", errNotCompletion, c.Chunks+1, err)
		}
		c.Chunks++
		c.add(b)
	}
	if err := sc.Err(); err != nil {
		return c, fmt.Errorf("%w: %w", errNotCompletion, err)
	}
	if c.Chunks == 0 || !c.Done {
		return c, fmt.Errorf("%w: %d events, [DONE] seen: %v", errNotCompletion, c.Chunks, c.Done)
	}
	return c, nil
}

// receipts reads a worker's own receipt log (GET /_sim/receipts). A worker
// without one (not an llmgw simulator) is an error: the runbook then has no
// independent delivery oracle, and says so instead of trusting the gateway.
func (s *state) receipts(ctx context.Context, w runbook.Worker) ([]sim.Receipt, error) {
	ex, err := s.do(ctx, http.MethodGet, "http://"+w.HTTP+"/_sim/receipts", nil, nil)
	if err != nil {
		return nil, err
	}
	if ex.Status != http.StatusOK {
		return nil, fmt.Errorf("converged: worker %s has no receipt log (GET /_sim/receipts answered %d)", w.ID, ex.Status)
	}
	var out []sim.Receipt
	if err := json.Unmarshal([]byte(ex.Body), &out); err != nil {
		return nil, fmt.Errorf("converged: worker %s receipts: %w", w.ID, err)
	}
	return out, nil
}

// receiptFor finds the receipt with request id rid.
func receiptFor(recs []sim.Receipt, rid string) (sim.Receipt, bool) {
	for _, r := range recs {
		if r.RequestID == rid {
			return r, true
		}
	}
	return sim.Receipt{}, false
}

// allReceipts reads every worker's receipts, by worker ID.
func (s *state) allReceipts(ctx context.Context) (map[string][]sim.Receipt, error) {
	out := map[string][]sim.Receipt{}
	for _, w := range s.workers {
		recs, err := s.receipts(ctx, w)
		if err != nil {
			return nil, err
		}
		out[w.ID] = recs
	}
	return out, nil
}

// waitFor polls cond every tick until it reports true, it errors, ctx ends
// or timeout passes. last describes the final state for the error.
func waitFor(ctx context.Context, timeout time.Duration, cond func() (ok bool, last string, err error)) (string, error) {
	deadline := time.NewTimer(timeout)
	defer deadline.Stop()
	tick := time.NewTicker(25 * time.Millisecond)
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
			return last, fmt.Errorf("converged: not reached within %v", timeout)
		case <-tick.C:
		}
	}
}

func mustJSON(v any) []byte {
	b, err := json.MarshalIndent(v, "", "  ")
	if err != nil {
		return []byte(fmt.Sprintf("%q\n", err.Error()))
	}
	return append(b, '\n')
}
