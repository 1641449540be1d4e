package pd

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

func (e exchange) json() []byte { return mustJSON(e) }

// do sends body to url and reads the whole answer; a transport error is
// recorded in the exchange and returned.
func do(ctx context.Context, c *http.Client, method, url string, body []byte, hdr map[string]string) (exchange, error) {
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
		return ex, fmt.Errorf("pd: %s %s: %w", method, url, err)
	}
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	for k, v := range hdr {
		req.Header.Set(k, v)
	}
	resp, err := c.Do(req)
	if err != nil {
		ex.Error = err.Error()
		return ex, fmt.Errorf("pd: %s %s: %w", method, url, err)
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
		return ex, fmt.Errorf("pd: %s %s: reading body: %w", method, url, err)
	}
	return ex, nil
}

// errNotCompletion: an answer body is not an OpenAI completion.
var errNotCompletion = errors.New("pd: not an OpenAI completion")

// completion is what the runbook reads from an answer.
type completion struct {
	Text         string
	Chunks       int
	Done         bool
	CachedTokens int // -1 when absent
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
		Details *struct {
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
	if b.Usage != nil && b.Usage.Details != nil {
		c.CachedTokens = b.Usage.Details.Cached
	}
}

// ParseCompletion reads a non-streaming completion body (untrusted bytes
// from a worker or the gateway).
func ParseCompletion(body string) (text string, cached int, err error) {
	c := completion{CachedTokens: -1}
	var b openaiBody
	if err := json.Unmarshal([]byte(body), &b); err != nil {
		return "", -1, fmt.Errorf("%w: %w", errNotCompletion, err)
	}
	if len(b.Choices) == 0 {
		return "", -1, fmt.Errorf("%w: no choices", errNotCompletion)
	}
	c.add(b)
	return c.Text, c.CachedTokens, nil
}

// ParseSSE folds an SSE completion stream: every "data:" event is JSON
// until the final "data: [DONE]"; it returns the text and the number of
// events.
func ParseSSE(body string) (text string, events int, err error) {
	c := completion{CachedTokens: -1}
	sc := bufio.NewScanner(strings.NewReader(body))
	sc.Buffer(make([]byte, 64<<10), 8<<20)
	for sc.Scan() {
		data, ok := strings.CutPrefix(strings.TrimRight(sc.Text(), "\r"), "data:")
		if !ok {
			continue
		}
		data = strings.TrimSpace(data)
		if c.Done {
			return c.Text, c.Chunks, fmt.Errorf("%w: event after [DONE]", errNotCompletion)
		}
		if data == "[DONE]" {
			c.Done = true
			continue
		}
		var b openaiBody
		if err := json.Unmarshal([]byte(data), &b); err != nil {
			return c.Text, c.Chunks, fmt.Errorf("%w: SSE event %d: %w", errNotCompletion, c.Chunks+1, err)
		}
		c.Chunks++
		c.add(b)
	}
	if err := sc.Err(); err != nil {
		return c.Text, c.Chunks, fmt.Errorf("%w: %w", errNotCompletion, err)
	}
	if c.Chunks == 0 || !c.Done {
		return c.Text, c.Chunks, fmt.Errorf("%w: %d events, [DONE] seen: %v", errNotCompletion, c.Chunks, c.Done)
	}
	return c.Text, c.Chunks, nil
}

// ParseReceipts decodes a simulator's receipt log (GET /_sim/receipts).
func ParseReceipts(b []byte) ([]sim.Receipt, error) {
	var out []sim.Receipt
	if err := json.Unmarshal(b, &out); err != nil {
		return nil, fmt.Errorf("pd: receipts: %w", err)
	}
	if out == nil {
		return nil, fmt.Errorf("pd: receipts: not a list")
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

// waitFor polls cond every tick until it holds, ctx ends or timeout
// passes; last describes the final state.
func waitFor(ctx context.Context, timeout time.Duration, cond func() (ok bool, last string)) (string, error) {
	deadline := time.NewTimer(timeout)
	defer deadline.Stop()
	tick := time.NewTicker(25 * time.Millisecond)
	defer tick.Stop()
	for {
		ok, last := cond()
		if ok {
			return last, nil
		}
		select {
		case <-ctx.Done():
			return last, ctx.Err()
		case <-deadline.C:
			return last, fmt.Errorf("pd: not reached within %v", timeout)
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
