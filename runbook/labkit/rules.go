package labkit

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/llmgw/llmgw/gateway"
	"github.com/llmgw/llmgw/gateway/adminclient"
	"github.com/llmgw/llmgw/gateway/rule"
	"github.com/llmgw/llmgw/runbook"
)

// ShortID is the random tail of a run ID, lower-cased, for rule and model
// names ("run" when the ID has none).
func ShortID(id string) string {
	if i := strings.LastIndexByte(id, '-'); i >= 0 && i+1 < len(id) {
		return strings.ToLower(id[i+1:])
	}
	return "run"
}

// ProbeConfig is the health probe of a lab rule on path.
func ProbeConfig(path string) rule.ProbeConfig {
	return rule.ProbeConfig{Path: path, Interval: rule.Duration(time.Second), Timeout: rule.Duration(500 * time.Millisecond)}
}

// Endpoint is the rule endpoint of worker id at httpAddr (host:port); a
// malformed address leaves the host or port zero, which the gateway
// refuses.
func Endpoint(id, httpAddr string) rule.Endpoint {
	host, port, _ := net.SplitHostPort(httpAddr)
	p, _ := strconv.Atoi(port)
	return rule.Endpoint{ID: id, EndpointIP: host, TargetPort: p}
}

// DataAddress is the data-plane address to send traffic to: the rule's
// listener addr, with an unspecified host replaced by the admin API's.
func DataAddress(addr, adminBase string) string {
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		return addr
	}
	if ip := net.ParseIP(host); host == "" || (ip != nil && ip.IsUnspecified()) {
		if u, err := url.Parse(adminBase); err == nil {
			host = u.Hostname()
		}
	}
	return net.JoinHostPort(host, port)
}

// DiffJSON compares want and got leaf by leaf through their JSON form and
// returns the differing paths ("a.b[2].c: applied X, read back Y"), in key
// order, and the number of leaves compared. A side that does not encode is
// a difference, never a match, and so is nothing on both sides (null equals
// null proves nothing about a read-back).
func DiffJSON(want, got any) (diffs []string, compared int) {
	var a, b any
	for _, side := range []struct {
		name string
		v    any
		dst  *any
	}{{"applied", want, &a}, {"read back", got, &b}} {
		j, err := json.Marshal(side.v)
		if err == nil {
			err = json.Unmarshal(j, side.dst)
		}
		if err != nil {
			diffs = append(diffs, fmt.Sprintf("(root): the %s value does not encode: %v", side.name, err))
		}
	}
	if len(diffs) > 0 {
		return diffs, 0
	}
	if a == nil && b == nil {
		return []string{"(root): applied and read back are both null: nothing to compare"}, 0
	}
	var walk func(path string, x, y any)
	walk = func(path string, x, y any) {
		switch xv := x.(type) {
		case map[string]any:
			yv, ok := y.(map[string]any)
			if !ok {
				diffs = append(diffs, fmt.Sprintf("%s: applied %v, read back %v", path, x, y))
				return
			}
			keys := make([]string, 0, len(xv)+len(yv))
			for k := range xv {
				keys = append(keys, k)
			}
			for k := range yv {
				if _, ok := xv[k]; !ok {
					keys = append(keys, k)
				}
			}
			slices.Sort(keys)
			for _, k := range keys {
				walk(joinPath(path, k), xv[k], yv[k])
			}
		case []any:
			yv, ok := y.([]any)
			if !ok || len(xv) != len(yv) {
				diffs = append(diffs, fmt.Sprintf("%s: applied %d items, read back %v", path, len(xv), y))
				return
			}
			for i := range xv {
				walk(fmt.Sprintf("%s[%d]", path, i), xv[i], yv[i])
			}
		default:
			compared++
			if fmt.Sprint(x) != fmt.Sprint(y) {
				diffs = append(diffs, fmt.Sprintf("%s: applied %v, read back %v", path, x, y))
			}
		}
	}
	walk("", a, b)
	return diffs, compared
}

func joinPath(p, k string) string {
	if p == "" {
		return k
	}
	return p + "." + k
}

// StartGateway starts an embedded gateway on loopback ports with a fresh
// state directory (named after dirPattern, see os.MkdirTemp) recorded in
// the run's ledger. It registers the cleanup "close embedded gateway",
// which closes the gateway, removes the directory and its ledger entry,
// also when the start failed half-way. The gateway outlives ctx's
// cancellation: only the cleanup stops it.
func StartGateway(ctx context.Context, r *runbook.Run, dirPattern string, cfg gateway.Config) (*gateway.Server, error) {
	led := LedgerOf(r)
	dir, err := os.MkdirTemp("", dirPattern)
	if err != nil {
		return nil, fmt.Errorf("state dir: %w", err)
	}
	if err := led.Update(func(st *runbook.LedgerState) { st.Dirs = append(st.Dirs, dir) }); err != nil {
		// Unrecorded, `llmgw cleanup` could not find it: do not use it.
		return nil, errors.Join(fmt.Errorf("labkit: record state dir in the ledger: %w", err), os.RemoveAll(dir))
	}
	cfg.Listen, cfg.Admin, cfg.StateDir = "127.0.0.1:0", "127.0.0.1:0", dir
	gw, err := gateway.New(cfg)
	if err == nil {
		err = gw.Start(context.WithoutCancel(ctx))
	}
	started := err == nil
	r.Defer("close embedded gateway", func(context.Context) error {
		if started {
			gw.Close()
		}
		if rerr := os.RemoveAll(dir); rerr != nil {
			return rerr
		}
		return led.Update(func(st *runbook.LedgerState) {
			st.Dirs = slices.DeleteFunc(st.Dirs, func(d string) bool { return d == dir })
		})
	})
	if err != nil {
		return nil, err
	}
	return gw, nil
}

// OwnRule records rule name on admin as the run's (embedded says it lives
// on the run's embedded gateway) and registers the cleanup "delete rule
// <name>": delete with drain, prove absence by reading back 404, then drop
// the ledger entry. Call it before creating the rule so that a create that
// half-succeeded is cleaned up too. tokenFile is the path of the admin
// token file (recorded so that `llmgw cleanup` can authenticate; never the
// token). An error means the ledger could not record the rule: the caller
// must not create it, since nothing could clean it up after a crash.
func OwnRule(r *runbook.Run, admin *adminclient.Client, name string, embedded bool, tokenFile string) error {
	led := LedgerOf(r)
	if tokenFile != "" {
		if abs, err := filepath.Abs(tokenFile); err == nil {
			tokenFile = abs
		}
	}
	if err := led.Update(func(st *runbook.LedgerState) {
		st.Rules = append(st.Rules, runbook.OwnedRule{Admin: admin.Base(), Name: name, Embedded: embedded, TokenFile: tokenFile})
	}); err != nil {
		return fmt.Errorf("labkit: record rule %s in the ledger: %w", name, err)
	}
	r.Defer("delete rule "+name, func(ctx context.Context) error {
		if _, err := admin.Delete(ctx, name, 5*time.Second); err != nil {
			return err
		}
		if _, _, err := admin.Rule(ctx, name); !IsStatus(err, http.StatusNotFound) {
			return fmt.Errorf("labkit: rule %s still readable after delete (%v)", name, err)
		}
		return led.Update(func(st *runbook.LedgerState) {
			st.Rules = slices.DeleteFunc(st.Rules, func(x runbook.OwnedRule) bool { return x.Name == name && x.Admin == admin.Base() })
		})
	})
	return nil
}

// CreateRule posts the rule body to admin. The returned outcome carries
// the evidence (rule-request.json, then rule-effective.json, or
// rule-response.json and, on a refusal, readback-after-refusal.json). ok
// false means the outcome is the step's FAIL: RULE_REJECTED (with the
// gateway's message), RULE_REJECTED_STATE_LEFT when a refused rule is
// nonetheless readable, RULE_APPLY_FAILED or INTERRUPTED otherwise. With
// ok true the caller sets the verdict (the evidence outcome has none).
func CreateRule(ctx context.Context, admin *adminclient.Client, name string, body []byte) (out runbook.Outcome, ok bool) {
	resp, err := admin.Create(ctx, body)
	out = runbook.Outcome{}.With("rule-request.json", body)
	if err == nil {
		return out.With("rule-effective.json", resp), true
	}
	out = out.With("rule-response.json", resp)
	var ae *adminclient.Error
	if !errors.As(err, &ae) {
		return WithEvidence(FailErr(ctx, "RULE_APPLY_FAILED", err), out), false
	}
	// A refusal must leave no state: prove it by reading back.
	_, rb, gerr := admin.Rule(ctx, name)
	out = out.With("readback-after-refusal.json", rb)
	if !IsStatus(gerr, http.StatusNotFound) {
		return WithEvidence(runbook.Fail("RULE_REJECTED_STATE_LEFT", "gateway refused the rule (%d %s) but a rule named %s is readable", ae.Status, ae.Code, name), out), false
	}
	return WithEvidence(runbook.Fail("RULE_REJECTED", "gateway refused the rule: %d %s: %s", ae.Status, ae.Code, errMessage(ae.Body)), out), false
}

// errMessage is an OpenAI-style error body's message, or the body itself.
func errMessage(body []byte) string {
	var e struct {
		Error struct {
			Message string `json:"message"`
		} `json:"error"`
	}
	if json.Unmarshal(body, &e) == nil && e.Error.Message != "" {
		return e.Error.Message
	}
	return strings.TrimSpace(string(body))
}

// ApplyOptions say where and how a run applies its rule.
type ApplyOptions struct {
	// AdminURL is an external gateway's admin base URL; "" starts an
	// embedded gateway (StartGateway with DirPattern and Logger).
	AdminURL string
	Token    string // the admin bearer token; "" for none
	// TokenFile is the file Token was read from, recorded in the ledger.
	TokenFile  string
	DirPattern string
	Logger     *slog.Logger
	Client     *http.Client // the run's client (NewClient)
	// Name is the rule's name; Build makes the rule and Hook, when set,
	// may change it before it is applied.
	Name  string
	Build func(name string) *rule.Rule
	Hook  func(*rule.Rule)
	// MarkEmbedded records the rule in the ledger as living on the
	// embedded gateway when it does (cleanup then knows the rule died
	// with the process).
	MarkEmbedded bool
}

// Applied is what Apply set up; fields are nil when the step failed
// before reaching them.
type Applied struct {
	Gateway *gateway.Server // the embedded gateway; nil with AdminURL
	Admin   *adminclient.Client
	Rule    *rule.Rule // the rule as sent (after Hook)
}

// Apply is the shared apply step: the gateway (embedded or external), the
// owned rule's cleanup (OwnRule) and its creation (CreateRule). With ok
// the caller writes the PASS verdict onto out (WithEvidence); otherwise
// out is the FAIL (GATEWAY_START_FAILED, GATEWAY_URL or CreateRule's).
func Apply(ctx context.Context, r *runbook.Run, o ApplyOptions) (a Applied, out runbook.Outcome, ok bool) {
	adminBase := o.AdminURL
	if adminBase == "" {
		gw, err := StartGateway(ctx, r, o.DirPattern, gateway.Config{Logger: o.Logger})
		if err != nil {
			return a, runbook.Fail("GATEWAY_START_FAILED", "%v", err), false
		}
		a.Gateway = gw
		adminBase = "http://" + gw.AdminAddr()
	}
	admin, err := adminclient.New(adminBase, o.Token, o.Client)
	if err != nil {
		return a, runbook.Fail("GATEWAY_URL", "%v", err), false
	}
	a.Admin = admin
	a.Rule = o.Build(o.Name)
	if o.Hook != nil {
		o.Hook(a.Rule)
	}
	body := MustJSON(a.Rule)
	if err := OwnRule(r, admin, o.Name, o.MarkEmbedded && a.Gateway != nil, o.TokenFile); err != nil {
		return a, runbook.Fail("LEDGER_WRITE_FAILED", "%v", err), false
	}
	out, ok = CreateRule(ctx, admin, o.Name, body)
	return a, out, ok
}

// AwaitReady polls rule name on admin until ready holds for its status or
// timeout passes, and adds the last status seen to out as readiness.json.
// With ok it returns that status and the data-plane address to send
// traffic to (DataAddress); otherwise out is the step's FAIL NOT_READY
// (or INTERRUPTED), saying what last did not hold. A failing read is
// retried: readiness may follow a restart of the admin API.
func AwaitReady(ctx context.Context, admin *adminclient.Client, name string, timeout time.Duration, ready func(*gateway.RuleStatus) (bool, string), out runbook.Outcome) (last *gateway.RuleStatus, dataAddr string, _ runbook.Outcome, ok bool) {
	why, err := WaitFor(ctx, timeout, func() (bool, string, error) {
		st, _, err := admin.Rule(ctx, name)
		if err != nil {
			return false, err.Error(), nil
		}
		last = st
		ok, why := ready(st)
		return ok, why, nil
	})
	if last != nil {
		out = out.With("readiness.json", MustJSON(last.Status))
	}
	if err != nil {
		return last, "", WithEvidence(FailErr(ctx, "NOT_READY", fmt.Errorf("readiness conditions did not hold within %v: %s", timeout, why)), out), false
	}
	return last, DataAddress(last.Status.Address, admin.Base()), out, true
}
