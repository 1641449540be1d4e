package runbook

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"regexp"
	"strings"
	"time"

	"github.com/llmgw/llmgw/gateway"
)

// ErrAdmin classifies a management API answer that is not what the call
// expects (a non-2xx status); the *AdminError carries it.
var ErrAdmin = errors.New("runbook: admin API error")

// AdminError is a non-2xx management API answer.
type AdminError struct {
	Status int
	Code   string // the gateway's error code, e.g. "invalid_rule"
	Body   []byte
}

func (e *AdminError) Error() string {
	return fmt.Sprintf("runbook: admin API answered %d %s: %s", e.Status, e.Code, strings.TrimSpace(string(e.Body)))
}

// Is makes errors.Is(err, ErrAdmin) hold.
func (e *AdminError) Is(target error) bool { return target == ErrAdmin }

// Admin is a client of a gateway's management API (DESIGN §5). The runbooks
// use it for the embedded gateway too (on its loopback admin listener), so
// both paths are the same code. Safe for concurrent use.
type Admin struct {
	base  string
	token string
	hc    *http.Client
}

// NewAdmin returns a client for the admin API at base ("http://host:port").
// token, when set, is sent as a bearer token on every call.
func NewAdmin(base, token string, hc *http.Client) (*Admin, error) {
	u, err := url.Parse(base)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return nil, fmt.Errorf("runbook: admin URL %q: want http://host:port", base)
	}
	if hc == nil {
		hc = &http.Client{Timeout: 30 * time.Second}
	}
	return &Admin{base: strings.TrimSuffix(base, "/"), token: token, hc: hc}, nil
}

// Base is the admin API base URL.
func (a *Admin) Base() string { return a.base }

// do performs one call and returns the body; a non-2xx status is an
// *AdminError (the body is returned as well).
func (a *Admin) do(ctx context.Context, method, path string, body []byte) ([]byte, int, error) {
	var rd io.Reader
	if body != nil {
		rd = bytes.NewReader(body)
	}
	req, err := http.NewRequestWithContext(ctx, method, a.base+path, rd)
	if err != nil {
		return nil, 0, fmt.Errorf("runbook: admin %s %s: %w", method, path, err)
	}
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	if a.token != "" {
		req.Header.Set("Authorization", "Bearer "+a.token)
	}
	resp, err := a.hc.Do(req)
	if err != nil {
		return nil, 0, fmt.Errorf("runbook: admin %s %s: %w", method, path, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, 16<<20))
	if err != nil {
		return nil, resp.StatusCode, fmt.Errorf("runbook: admin %s %s: %w", method, path, err)
	}
	if resp.StatusCode/100 != 2 {
		var e struct {
			Error struct {
				Code string `json:"code"`
			} `json:"error"`
		}
		_ = json.Unmarshal(b, &e)
		return b, resp.StatusCode, &AdminError{Status: resp.StatusCode, Code: e.Error.Code, Body: b}
	}
	return b, resp.StatusCode, nil
}

// Create POSTs a rule (JSON) and returns the effective rule's JSON.
func (a *Admin) Create(ctx context.Context, ruleJSON []byte) ([]byte, error) {
	b, _, err := a.do(ctx, http.MethodPost, "/v1/rules", ruleJSON)
	return b, err
}

// Rule reads a rule back: its decoded status and the raw JSON.
func (a *Admin) Rule(ctx context.Context, name string) (*gateway.RuleStatus, []byte, error) {
	b, _, err := a.do(ctx, http.MethodGet, "/v1/rules/"+url.PathEscape(name), nil)
	if err != nil {
		return nil, b, err
	}
	var st gateway.RuleStatus
	if err := json.Unmarshal(b, &st); err != nil {
		return nil, b, fmt.Errorf("runbook: admin rule %s: %w", name, err)
	}
	return &st, b, nil
}

// Delete deletes a rule, draining for up to drain first. A rule that does
// not exist is not an error (deleting is idempotent); gone reports whether
// it existed.
func (a *Admin) Delete(ctx context.Context, name string, drain time.Duration) (existed bool, err error) {
	path := "/v1/rules/" + url.PathEscape(name)
	if drain > 0 {
		path += "?drain=" + drain.String()
	}
	_, status, err := a.do(ctx, http.MethodDelete, path, nil)
	if status == http.StatusNotFound {
		return false, nil
	}
	return err == nil, err
}

// SetDraining drains or undrains one endpoint and returns the rule status
// after the change.
func (a *Admin) SetDraining(ctx context.Context, name, id string, drain bool) ([]byte, error) {
	verb := "undrain"
	if drain {
		verb = "drain"
	}
	b, _, err := a.do(ctx, http.MethodPost, "/v1/rules/"+url.PathEscape(name)+"/endpoints/"+url.PathEscape(id)+"/"+verb, nil)
	return b, err
}

// Inventory returns the rule's KV inventory JSON.
func (a *Admin) Inventory(ctx context.Context, name string) (*gateway.InventoryStatus, []byte, error) {
	b, _, err := a.do(ctx, http.MethodGet, "/v1/rules/"+url.PathEscape(name)+"/inventory?sample=4", nil)
	if err != nil {
		return nil, b, err
	}
	var inv gateway.InventoryStatus
	if err := json.Unmarshal(b, &inv); err != nil {
		return nil, b, fmt.Errorf("runbook: admin inventory %s: %w", name, err)
	}
	return &inv, b, nil
}

// Decisions returns the gateway's recent routing decisions for a rule (raw
// JSON, kept as evidence).
func (a *Admin) Decisions(ctx context.Context, name string) ([]byte, error) {
	b, _, err := a.do(ctx, http.MethodGet, "/v1/decisions?rule="+url.QueryEscape(name), nil)
	return b, err
}

var runIDPattern = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$`)

// ValidRunID reports whether id is a well-formed run ID (as results
// accepts), so it can name files safely.
func ValidRunID(id string) bool {
	return runIDPattern.MatchString(id) && !strings.Contains(id, "..")
}
