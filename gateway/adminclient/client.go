// Package adminclient is the one client of a gateway's management API
// (docs/admin-api.md): `llmgw rule`, the runbooks, their gates and
// `llmgw cleanup` all call the gateway through it, so a path, a header or
// the error body is decoded in one place.
package adminclient

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/llmgw/llmgw/gateway"
)

// ErrAPI classifies an answer that is not 2xx; the *Error carries it.
var ErrAPI = errors.New("admin API error")

// ErrURL classifies a base URL that is not http(s)://host[:port].
var ErrURL = errors.New("admin API URL")

// Error is a non-2xx management API answer. Code and Message are the
// gateway's error body ({"error":{"code":..., "message":...}}) when it sent
// one.
type Error struct {
	Method  string
	Path    string
	Status  int
	Code    string // e.g. "invalid_rule", "not_found"
	Message string
	Body    []byte
}

func (e *Error) Error() string {
	if e.Code != "" {
		return fmt.Sprintf("admin API %s %s: %d %s: %s", e.Method, e.Path, e.Status, e.Code, e.Message)
	}
	return fmt.Sprintf("admin API %s %s: %d: %.200s", e.Method, e.Path, e.Status, strings.TrimSpace(string(e.Body)))
}

// Is makes errors.Is(err, ErrAPI) hold.
func (e *Error) Is(target error) bool { return target == ErrAPI }

// MaxBody bounds an answer read into memory. Inventories with every key
// (sample=0) are the largest answers the gateway sends; the gateway bounds
// the inventory itself with --kv-max-blocks.
const MaxBody = 64 << 20

// Client calls one gateway's management API. Safe for concurrent use.
type Client struct {
	base  string
	token string
	hc    *http.Client
}

// New returns a client for the admin API at base ("http://host:port"; a
// trailing slash is dropped). token, when set, is sent as a bearer token on
// every call (the gateway requires it on mutating calls when started with
// --admin-token-file). hc nil uses a client with a 30 s timeout.
func New(base, token string, hc *http.Client) (*Client, error) {
	u, err := url.Parse(base)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return nil, fmt.Errorf("%w %q: want http://host:port", ErrURL, base)
	}
	if hc == nil {
		hc = &http.Client{Timeout: 30 * time.Second}
	}
	return &Client{base: strings.TrimRight(base, "/"), token: token, hc: hc}, nil
}

// Base is the admin API base URL, without a trailing slash.
func (c *Client) Base() string { return c.base }

// Do performs one call and returns the answer's body and status. A non-2xx
// status is an *Error (the body is returned as well); a transport failure
// is wrapped with the method and path.
func (c *Client) Do(ctx context.Context, method, path string, body []byte) ([]byte, int, error) {
	var rd io.Reader
	if body != nil {
		rd = bytes.NewReader(body)
	}
	req, err := http.NewRequestWithContext(ctx, method, c.base+path, rd)
	if err != nil {
		return nil, 0, fmt.Errorf("admin API %s %s: %w", method, path, err)
	}
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	if c.token != "" {
		req.Header.Set("Authorization", "Bearer "+c.token)
	}
	resp, err := c.hc.Do(req)
	if err != nil {
		return nil, 0, fmt.Errorf("admin API at %s: %s %s: %w", c.base, method, path, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, MaxBody))
	if err != nil {
		return nil, resp.StatusCode, fmt.Errorf("admin API %s %s: reading the answer: %w", method, path, err)
	}
	if resp.StatusCode/100 != 2 {
		var e struct {
			Error struct {
				Code    string `json:"code"`
				Message string `json:"message"`
			} `json:"error"`
		}
		_ = json.Unmarshal(b, &e) // a body that is not the error JSON is kept raw in Body
		return b, resp.StatusCode, &Error{Method: method, Path: path, Status: resp.StatusCode, Code: e.Error.Code, Message: e.Error.Message, Body: b}
	}
	return b, resp.StatusCode, nil
}

func rulePath(name string) string { return "/v1/rules/" + url.PathEscape(name) }

// Create POSTs a rule (JSON) and returns the effective rule's JSON. A rule
// of that name that exists already is a 409 rule_exists *Error.
func (c *Client) Create(ctx context.Context, ruleJSON []byte) ([]byte, error) {
	b, _, err := c.Do(ctx, http.MethodPost, "/v1/rules", ruleJSON)
	return b, err
}

// Put creates or replaces rule name (JSON) and returns the effective
// rule's JSON as the gateway read it back.
func (c *Client) Put(ctx context.Context, name string, ruleJSON []byte) ([]byte, error) {
	b, _, err := c.Do(ctx, http.MethodPut, rulePath(name), ruleJSON)
	return b, err
}

// Rule reads a rule back: its decoded status and the raw JSON.
func (c *Client) Rule(ctx context.Context, name string) (*gateway.RuleStatus, []byte, error) {
	b, _, err := c.Do(ctx, http.MethodGet, rulePath(name), nil)
	if err != nil {
		return nil, b, err
	}
	var st gateway.RuleStatus
	if err := json.Unmarshal(b, &st); err != nil {
		return nil, b, fmt.Errorf("admin API rule %s: %w", name, err)
	}
	return &st, b, nil
}

// Rules lists every rule with its live status.
func (c *Client) Rules(ctx context.Context) ([]gateway.RuleStatus, error) {
	b, _, err := c.Do(ctx, http.MethodGet, "/v1/rules", nil)
	if err != nil {
		return nil, err
	}
	var doc struct {
		Rules []gateway.RuleStatus `json:"rules"`
	}
	if err := json.Unmarshal(b, &doc); err != nil {
		return nil, fmt.Errorf("admin API rules: %w", err)
	}
	return doc.Rules, nil
}

// Delete deletes a rule, draining for up to drain first. A rule that does
// not exist is not an error (deleting is idempotent); existed reports
// whether it did.
func (c *Client) Delete(ctx context.Context, name string, drain time.Duration) (existed bool, err error) {
	path := rulePath(name)
	if drain > 0 {
		path += "?drain=" + drain.String()
	}
	_, status, err := c.Do(ctx, http.MethodDelete, path, nil)
	if status == http.StatusNotFound {
		return false, nil
	}
	return err == nil, err
}

// SetDraining drains (or with drain false undrains) endpoint id of rule
// name, every endpoint of the rule when id is "", and returns the rule
// status JSON after the change.
func (c *Client) SetDraining(ctx context.Context, name, id string, drain bool) ([]byte, error) {
	verb := "undrain"
	if drain {
		verb = "drain"
	}
	path := rulePath(name)
	if id != "" {
		path += "/endpoints/" + url.PathEscape(id)
	}
	b, _, err := c.Do(ctx, http.MethodPost, path+"/"+verb, nil)
	return b, err
}

// Inventory returns rule name's KV inventory with up to sample keys per
// endpoint (0: every key), decoded and raw.
func (c *Client) Inventory(ctx context.Context, name string, sample int) (*gateway.InventoryStatus, []byte, error) {
	b, _, err := c.Do(ctx, http.MethodGet, rulePath(name)+"/inventory?sample="+strconv.Itoa(sample), nil)
	if err != nil {
		return nil, b, err
	}
	var inv gateway.InventoryStatus
	if err := json.Unmarshal(b, &inv); err != nil {
		return nil, b, fmt.Errorf("admin API inventory %s: %w", name, err)
	}
	return &inv, b, nil
}

// Decisions returns the gateway's recent routing decisions for a rule (raw
// JSON, kept as evidence).
func (c *Client) Decisions(ctx context.Context, name string) ([]byte, error) {
	b, _, err := c.Do(ctx, http.MethodGet, "/v1/decisions?rule="+url.QueryEscape(name), nil)
	return b, err
}
