package labkit

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"

	"github.com/llmgw/llmgw/runbook"
)

// MaxBody bounds how much of an answer Do reads.
const MaxBody = 8 << 20

// Exchange is one HTTP request and its answer, kept as evidence (its JSON
// form is the *-exchange.json files). Headers hold one value per
// canonical key.
type Exchange struct {
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

// Get is the answer's header k ("" when absent or when there was no
// answer).
func (e Exchange) Get(k string) string { return e.Header[http.CanonicalHeaderKey(k)] }

// ExchangeSuffix ends the name of every evidence file that holds an
// Exchange's JSON (renderers show such files as request and answer).
const ExchangeSuffix = "-exchange.json"

// JSON is the exchange as an evidence file.
func (e Exchange) JSON() []byte { return MustJSON(e) }

// Do sends body (nil for none; sent as application/json) to url with the
// headers hdr and reads the whole answer, up to MaxBody. The exchange is
// filled as far as it got: a transport or read error is recorded in its
// Error field and returned wrapped. A non-2xx status is not an error.
func Do(ctx context.Context, c *http.Client, method, url string, body []byte, hdr map[string]string) (Exchange, error) {
	ex := Exchange{Method: method, URL: url, ReqHeader: hdr}
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
		return ex, fmt.Errorf("labkit: %s %s: %w", method, url, err)
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
		return ex, fmt.Errorf("labkit: %s %s: %w", method, url, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, MaxBody))
	ex.Status, ex.Body = resp.StatusCode, string(b)
	ex.Header = map[string]string{}
	for k := range resp.Header {
		ex.Header[k] = resp.Header.Get(k)
	}
	if err != nil {
		ex.Error = err.Error()
		return ex, fmt.Errorf("labkit: %s %s: reading body: %w", method, url, err)
	}
	return ex, nil
}

// Probe is what ProbeServing saw of one worker.
type Probe struct {
	// Health is the health path's status (0 when it did not answer) and
	// HealthErr the transport error, if any.
	Health    int
	HealthErr error
	// Models is the GET /v1/models exchange; zero when health failed.
	Models Exchange
	// Last says why the worker is not serving yet ("" when Models answered
	// 200): "health: <error>", "health answered N" or "/v1/models answered
	// N". The model check itself is the caller's.
	Last string
}

// ProbeServing asks w's health path and then /v1/models once. It never
// fails: what went wrong is in the Probe.
func ProbeServing(ctx context.Context, c *http.Client, w runbook.Worker) Probe {
	var p Probe
	ex, err := Do(ctx, c, http.MethodGet, "http://"+w.HTTP+w.HealthPath, nil, nil)
	if err != nil {
		p.HealthErr, p.Last = err, "health: "+err.Error()
		return p
	}
	p.Health = ex.Status
	if ex.Status != http.StatusOK {
		p.Last = fmt.Sprintf("health answered %d", ex.Status)
		return p
	}
	p.Models, err = Do(ctx, c, http.MethodGet, "http://"+w.HTTP+"/v1/models", nil, nil)
	if err != nil || p.Models.Status != http.StatusOK {
		p.Last = fmt.Sprintf("/v1/models answered %d", p.Models.Status)
	}
	return p
}

// ModelIDs are the model ids a /v1/models body lists (nil when it is not
// a model list).
func ModelIDs(body string) []string {
	var ml struct {
		Data []struct {
			ID string `json:"id"`
		} `json:"data"`
	}
	_ = json.Unmarshal([]byte(body), &ml)
	var ids []string
	for _, m := range ml.Data {
		ids = append(ids, m.ID)
	}
	return ids
}
