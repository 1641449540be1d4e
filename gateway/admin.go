package gateway

import (
	"crypto/sha256"
	"crypto/subtle"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/pprof"
	"strconv"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/llmgw/llmgw/gateway/rule"
)

// maxAdminBody bounds admin request bodies.
const maxAdminBody = 1 << 20

// errUnauthorized: a mutating admin call without the right bearer token.
var errUnauthorized = errors.New("gateway: a valid bearer token is required for this call (Authorization: Bearer <token>)")

// errAdminBadRequest: a malformed admin call (bad query, name mismatch...).
var errAdminBadRequest = errors.New("gateway: bad request")

func (s *Server) startAdmin() error {
	ln, err := net.Listen("tcp", s.cfg.Admin)
	if err != nil {
		return fmt.Errorf("gateway: admin listen %s: %w", s.cfg.Admin, err)
	}
	s.adminLn = ln
	s.adminSrv = &http.Server{
		Handler:           s.adminHandler(),
		ReadHeaderTimeout: 10 * time.Second,
		ReadTimeout:       30 * time.Second,
		IdleTimeout:       120 * time.Second,
		MaxHeaderBytes:    64 << 10,
	}
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		if err := s.adminSrv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			s.log.Error("admin listener stopped", "err", err)
		}
	}()
	return nil
}

func (s *Server) adminHandler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("POST /v1/rules", s.mutating(s.handleCreate))
	mux.HandleFunc("PUT /v1/rules/{name}", s.mutating(s.handlePut))
	mux.HandleFunc("GET /v1/rules", s.handleList)
	mux.HandleFunc("GET /v1/rules/{name}", s.handleGet)
	mux.HandleFunc("DELETE /v1/rules/{name}", s.mutating(s.handleDelete))
	mux.HandleFunc("POST /v1/rules/{name}/drain", s.mutating(s.handleDrain(true)))
	mux.HandleFunc("POST /v1/rules/{name}/undrain", s.mutating(s.handleDrain(false)))
	mux.HandleFunc("POST /v1/rules/{name}/endpoints/{id}/drain", s.mutating(s.handleDrain(true)))
	mux.HandleFunc("POST /v1/rules/{name}/endpoints/{id}/undrain", s.mutating(s.handleDrain(false)))
	mux.HandleFunc("GET /v1/rules/{name}/inventory", s.handleInventory)
	mux.HandleFunc("POST /v1/rules/{name}/tokenize", s.mutating(s.handleKVTokenize))
	mux.HandleFunc("GET /v1/decisions", s.handleDecisions)
	mux.Handle("GET /metrics", promhttp.HandlerFor(s.metrics.reg, promhttp.HandlerOpts{}))
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) {
		writeJSON(w, http.StatusOK, map[string]string{"status": "ok"})
	})
	mux.HandleFunc("GET /readyz", s.handleReady)
	if s.cfg.Pprof {
		mux.HandleFunc("GET /debug/pprof/", s.mutating(pprof.Index))
		mux.HandleFunc("GET /debug/pprof/cmdline", s.mutating(pprof.Cmdline))
		mux.HandleFunc("GET /debug/pprof/profile", s.mutating(pprof.Profile))
		mux.HandleFunc("GET /debug/pprof/symbol", s.mutating(pprof.Symbol))
		mux.HandleFunc("GET /debug/pprof/trace", s.mutating(pprof.Trace))
	}
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		// The catch-all hides net/http's own 405: a path that exists under
		// other methods (PATCH /v1/rules/x, OPTIONS /readyz) is a 405 with
		// Allow, not a 404.
		if allow := allowedMethods(mux, r); len(allow) > 0 {
			w.Header().Set("Allow", strings.Join(allow, ", "))
			writeAdminError(w, fmt.Errorf("%w: %s %s; use %s", ErrMethodNotAllowed, r.Method, r.URL.Path, strings.Join(allow, " or ")))
			return
		}
		writeAdminError(w, fmt.Errorf("%w: %s %s", ErrNotFound, r.Method, r.URL.Path))
	})
	return mux
}

// allowedMethods lists the methods under which mux serves r's path with a
// handler other than the catch-all.
func allowedMethods(mux *http.ServeMux, r *http.Request) []string {
	var allow []string
	for _, m := range []string{http.MethodGet, http.MethodPost, http.MethodPut, http.MethodDelete} {
		if m == r.Method {
			continue
		}
		probe := r.Clone(r.Context())
		probe.Method = m
		if _, pattern := mux.Handler(probe); pattern != "/" && pattern != "" {
			allow = append(allow, m)
		}
	}
	return allow
}

// mutating guards a handler with the bearer token when one is configured.
// The comparison is constant-time over SHA-256 digests of equal length, so
// neither the token's content nor its length leaks through timing.
func (s *Server) mutating(h http.HandlerFunc) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		if s.cfg.AdminToken != "" {
			got, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
			gd, wd := sha256.Sum256([]byte(got)), sha256.Sum256([]byte(s.cfg.AdminToken))
			if !ok || subtle.ConstantTimeCompare(gd[:], wd[:]) != 1 {
				w.Header().Set("WWW-Authenticate", `Bearer realm="llmgw"`)
				writeAdminError(w, errUnauthorized)
				return
			}
		}
		h(w, r)
	}
}

func readRuleBody(r *http.Request) (*rule.Rule, error) {
	body, err := io.ReadAll(io.LimitReader(r.Body, maxAdminBody+1))
	if err != nil {
		return nil, fmt.Errorf("%w: reading body: %v", errAdminBadRequest, err)
	}
	if len(body) > maxAdminBody {
		return nil, fmt.Errorf("%w: the limit is %d bytes", ErrBodyTooLarge, maxAdminBody)
	}
	return rule.Decode(body)
}

// ErrRulesManaged refuses an admin API rule write on a server whose rules
// are written elsewhere (Config.RuleOwner); 409.
var ErrRulesManaged = errors.New("gateway: rules are managed elsewhere")

// refuseManaged answers 409 when rule name is owned elsewhere.
func (s *Server) refuseManaged(w http.ResponseWriter, name string) bool {
	if s.cfg.RuleOwner == nil {
		return false
	}
	writeAdminError(w, fmt.Errorf("%w: rule %q is %s; change it there (llmgw serve --allow-admin-rule-writes lets the admin API write rules too)", ErrRulesManaged, name, s.cfg.RuleOwner(name)))
	return true
}

func (s *Server) handleCreate(w http.ResponseWriter, r *http.Request) {
	rl, err := readRuleBody(r)
	if err != nil {
		writeAdminError(w, err)
		return
	}
	if s.refuseManaged(w, rl.Name) {
		return
	}
	eff, err := s.Apply(rl, true)
	if err != nil {
		writeAdminError(w, err)
		return
	}
	w.Header().Set("Location", "/v1/rules/"+eff.Name)
	writeJSON(w, http.StatusCreated, eff)
}

func (s *Server) handlePut(w http.ResponseWriter, r *http.Request) {
	rl, err := readRuleBody(r)
	if err != nil {
		writeAdminError(w, err)
		return
	}
	name := r.PathValue("name")
	if s.refuseManaged(w, name) {
		return
	}
	if rl.Name == "" {
		rl.Name = name
	}
	if rl.Name != name {
		writeAdminError(w, fmt.Errorf("%w: the body names rule %q but the path names %q", errAdminBadRequest, rl.Name, name))
		return
	}
	eff, err := s.Apply(rl, false)
	if err != nil {
		writeAdminError(w, err)
		return
	}
	writeJSON(w, http.StatusOK, eff)
}

func (s *Server) handleList(w http.ResponseWriter, _ *http.Request) {
	writeJSON(w, http.StatusOK, map[string]any{"rules": s.Rules()})
}

func (s *Server) handleGet(w http.ResponseWriter, r *http.Request) {
	st, err := s.Rule(r.PathValue("name"))
	if err != nil {
		writeAdminError(w, err)
		return
	}
	writeJSON(w, http.StatusOK, st)
}

func (s *Server) handleDelete(w http.ResponseWriter, r *http.Request) {
	if s.refuseManaged(w, r.PathValue("name")) {
		return
	}
	var drain time.Duration
	if v := r.URL.Query().Get("drain"); v != "" {
		d, err := time.ParseDuration(v)
		if err != nil || d < 0 || d > time.Hour {
			writeAdminError(w, fmt.Errorf("%w: drain=%q must be a duration between 0s and 1h, e.g. drain=30s", errAdminBadRequest, v))
			return
		}
		drain = d
	}
	abandoned, err := s.Delete(r.PathValue("name"), drain)
	if err != nil {
		writeAdminError(w, err)
		return
	}
	if abandoned > 0 {
		w.Header().Set("X-Llmgw-Abandoned-Requests", fmt.Sprint(abandoned))
	}
	w.WriteHeader(http.StatusNoContent)
}

func (s *Server) handleDrain(drain bool) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		name, id := r.PathValue("name"), r.PathValue("id")
		if err := s.SetDraining(name, id, drain); err != nil {
			writeAdminError(w, err)
			return
		}
		st, err := s.Rule(name)
		if err != nil {
			writeAdminError(w, err)
			return
		}
		writeJSON(w, http.StatusOK, st)
	}
}

func (s *Server) handleInventory(w http.ResponseWriter, r *http.Request) {
	sample := 16
	if v := r.URL.Query().Get("sample"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 0 || n > 100000 {
			writeAdminError(w, fmt.Errorf("%w: sample=%q must be a number of keys in 0..100000", errAdminBadRequest, v))
			return
		}
		sample = n
	}
	inv, err := s.Inventory(r.PathValue("name"), sample)
	if err != nil {
		writeAdminError(w, err)
		return
	}
	writeJSON(w, http.StatusOK, inv)
}

func (s *Server) handleDecisions(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	var since time.Time
	if v := q.Get("since"); v != "" {
		t, err := time.Parse(time.RFC3339Nano, v)
		if err != nil {
			d, derr := time.ParseDuration(v)
			if derr != nil || d < 0 {
				writeAdminError(w, fmt.Errorf("%w: since=%q must be an RFC 3339 time or a duration such as 5m", errAdminBadRequest, v))
				return
			}
			t = time.Now().Add(-d)
		}
		since = t
	}
	writeJSON(w, http.StatusOK, map[string]any{"decisions": s.decisions.list(q.Get("rule"), since)})
}

// handleReady answers /readyz: 200 while the server can serve, 503
// otherwise, with a JSON object saying why. Not ready: before the rules
// given at start are installed ("starting", Config.AwaitInitialRules),
// from Drain on ("draining"), while a data listener cannot accept
// connections ("listeners_not_accepting", with its latest accept error,
// e.g. "accept4: too many open files"), and when no rule can serve (with
// Config.ReadyzStrict: when any rule cannot). A server with no rules is
// ready: no rule fails. "rules" maps every rule to its readiness and
// "rules_not_ready" names those that cannot serve, with the reason.
//
// ?model=NAME asks for one model: ready when a rule serving NAME (its
// model_name, else the default rule, model_name "") can serve, and only
// those rules are listed; 503 when no rule serves NAME.
func (s *Server) handleReady(w http.ResponseWriter, r *http.Request) {
	model, perModel := r.URL.Query().Get("model"), r.URL.Query().Has("model")
	rules := s.Rules()
	if perModel {
		rules = rulesServing(rules, model)
	}
	detail := map[string]bool{}
	notReady := map[string]string{}
	anyReady := false
	for _, st := range rules {
		detail[st.Rule.Name] = st.Status.Ready
		anyReady = anyReady || st.Status.Ready
		if !st.Status.Ready {
			notReady[st.Rule.Name] = st.Status.NotReady
		}
	}
	ready := anyReady || (len(rules) == 0 && !perModel)
	mode := "any"
	if s.cfg.ReadyzStrict {
		mode = "strict"
		ready = len(notReady) == 0 && (len(rules) > 0 || !perModel)
	}
	body := map[string]any{"ready": false, "rules": detail, "mode": mode}
	if len(notReady) > 0 {
		body["rules_not_ready"] = notReady
	}
	if perModel {
		body["model"] = model
		if len(rules) == 0 {
			body["model_not_served"] = true
		}
	}
	if !s.initialDone.Load() {
		ready = false
		body["starting"] = "the rules given at start are not installed yet"
	}
	if s.draining.Load() {
		ready = false
		body["draining"] = true
	}
	// A degraded rule is a warning beside the verdict, never part of it.
	if d := degradedRules(rules); len(d) > 0 {
		body["degraded"] = d
	}
	if failing := s.acceptFailures(); len(failing) > 0 {
		ready = false
		body["listeners_not_accepting"] = failing
	}
	body["ready"] = ready
	code := http.StatusOK
	if !ready {
		code = http.StatusServiceUnavailable
	}
	writeJSON(w, code, body)
}

// rulesServing keeps the rules that would serve model: those whose
// model_name is model, else the default rules (model_name "").
func rulesServing(rules []*RuleStatus, model string) []*RuleStatus {
	var named, def []*RuleStatus
	for _, st := range rules {
		switch st.Rule.ModelName {
		case model:
			named = append(named, st)
		case "":
			def = append(def, st)
		}
	}
	if len(named) > 0 {
		return named
	}
	return def
}

func writeJSON(w http.ResponseWriter, code int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	_ = enc.Encode(v)
}

// adminStatusFor maps a management-plane error to its HTTP status and code.
// It is the only place that does so.
func adminStatusFor(err error) (int, string) {
	var ae *rule.AdmissionError
	var fe *rule.FieldError
	switch {
	case errors.As(err, &ae):
		if ae.Conflict {
			return http.StatusConflict, ae.Code
		}
		return http.StatusBadRequest, ae.Code
	case errors.As(err, &fe):
		return http.StatusBadRequest, "invalid_rule"
	case errors.Is(err, rule.ErrSyntax):
		return http.StatusBadRequest, "invalid_rule"
	case errors.Is(err, rule.ErrTooLarge), errors.Is(err, ErrBodyTooLarge):
		return http.StatusRequestEntityTooLarge, "request_too_large"
	case errors.Is(err, errUnauthorized):
		return http.StatusUnauthorized, "unauthorized"
	case errors.Is(err, errAdminBadRequest):
		return http.StatusBadRequest, "bad_request"
	case errors.Is(err, ErrRuleNotFound):
		return http.StatusNotFound, "rule_not_found"
	case errors.Is(err, ErrEndpointNotFound):
		return http.StatusNotFound, "endpoint_not_found"
	case errors.Is(err, ErrNotFound):
		return http.StatusNotFound, "not_found"
	case errors.Is(err, ErrMethodNotAllowed):
		return http.StatusMethodNotAllowed, "method_not_allowed"
	case errors.Is(err, ErrRuleExists):
		return http.StatusConflict, "rule_exists"
	case errors.Is(err, ErrRulesManaged):
		return http.StatusConflict, "rules_managed"
	default:
		return http.StatusInternalServerError, "internal_error"
	}
}

func writeAdminError(w http.ResponseWriter, err error) {
	code, tok := adminStatusFor(err)
	writeJSON(w, code, map[string]any{"error": map[string]string{"code": tok, "message": err.Error()}})
}
