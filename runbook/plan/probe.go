// Package plan inspects a running pool of inference endpoints and answers
// the deployment guide's questions ("Choose an Inference Engine") with
// evidence: which engine and version, which roles, whether KV events are
// reachable (and, for a destructive endpoint, whether the gateway could be
// its only consumer), and whether model, build, tokenizer, block size, hash
// and context length agree across the pool. From the answers it stages a
// recommendation, one capability at a time, each stage a rule the gateway
// admits and the runbook command that qualifies it.
//
// Every request the planner sends is read-only: GETs of health, version,
// model-list, metrics and self-description surfaces, a POST to a tokenize
// surface, and ZeroMQ SUB / replay reads, which take nothing from other
// subscribers. It never POSTs a destructive event endpoint, never sends an
// inference request and never resets a cache. Each probe has its own
// deadline; one that does not answer in time is an unknown, never a hang.
//
// Engine knowledge comes from the adapters (engines.For), their
// engines.Describer and engines.Guide: this package never switches on an
// engine's name.
package plan

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/llmgw/llmgw/engines"
	"github.com/llmgw/llmgw/engines/kvevents"
	"github.com/llmgw/llmgw/engines/kvhash"
)

// Defaults of Options.
const (
	DefaultProbeTimeout = 2 * time.Second
	DefaultName         = "plan"
	// DefaultCanary is the text every tokenizing endpoint is asked to
	// tokenize; equal tokenizers give equal ids.
	DefaultCanary = "The quick brown fox jumps over the lazy dog. 1234567890 — naïve café, 日本語, emoji 🦊."
	// maxBody bounds every answer read from an endpoint.
	maxBody = 4 << 20
)

// errNoAnswer: a probe's deadline passed without an answer.
var errNoAnswer = errors.New("no answer")

// ErrInvalid classifies invalid Options (the CLI maps it to a usage error).
var ErrInvalid = errors.New("plan: invalid options")

// Target is one endpoint to inspect.
type Target struct {
	// Addr is the engine's HTTP host:port.
	Addr string `json:"addr"`
	// Events and Replay override where the KV event PUB and replay sockets
	// are (tcp://host:port); "" = what the engine reports, else the
	// adapter's default port on Addr's host.
	Events string `json:"events,omitempty"`
	Replay string `json:"replay,omitempty"`
	// Role is the operator's declared role, for engines that report none
	// (vLLM); an engine that reports its role is checked against it.
	Role engines.Role `json:"declared_role,omitempty"`
}

// ParseRole reads a declared role name.
func ParseRole(s string) (engines.Role, error) {
	for _, r := range []engines.Role{engines.RoleConverged, engines.RolePrefill, engines.RoleDecode, engines.RoleContext, engines.RoleGeneration} {
		if string(r) == s {
			return r, nil
		}
	}
	return "", fmt.Errorf("%w: role %q: want converged, prefill, decode, context or generation", ErrInvalid, s)
}

// Options configure Probe.
type Options struct {
	Targets []Target
	// Engine, when set, is checked against what each endpoint serves
	// instead of being fingerprinted.
	Engine engines.Kind
	// Profile is a catalog profile ID; its served model name is checked
	// against the pool, and it is passed to the runbook commands.
	Profile string
	// ProfileModel is the profile's served model name ("" = no check).
	ProfileModel string
	// Name is the rule name of every stage; default DefaultName.
	Name string
	// ProbeTimeout bounds each probe (one HTTP request, one ZeroMQ
	// exchange); default DefaultProbeTimeout.
	ProbeTimeout time.Duration
	// HashSeed is the PYTHONHASHSEED published hashes are checked against
	// (vLLM); "" means "0", the gateway's default.
	HashSeed string
	// Canary is the tokenizer canary text; "" means DefaultCanary.
	Canary string
	// KVTokenizer is the kvTokenizer the KV-exact stages use (a
	// tokenizer.json or .gguf path, or a models directory, on the gateway
	// host). "" means "engine" where every endpoint tokenizes the canary
	// alike; without either, the KV-exact stages are blocked.
	KVTokenizer string
	// Client is the HTTP client; nil builds one without keep-alive reuse
	// across endpoints.
	Client *http.Client
}

func (o *Options) validate() error {
	if len(o.Targets) == 0 {
		return fmt.Errorf("%w: no endpoints", ErrInvalid)
	}
	seen := map[string]bool{}
	for _, t := range o.Targets {
		host, port, err := net.SplitHostPort(t.Addr)
		if err != nil || host == "" {
			return fmt.Errorf("%w: endpoint %q: want host:port", ErrInvalid, t.Addr)
		}
		if n, err := strconv.Atoi(port); err != nil || n < 1 || n > 65535 {
			return fmt.Errorf("%w: endpoint %q: port must be 1..65535", ErrInvalid, t.Addr)
		}
		if seen[t.Addr] {
			return fmt.Errorf("%w: endpoint %q is listed twice", ErrInvalid, t.Addr)
		}
		seen[t.Addr] = true
		if t.Role != engines.RoleUnknown {
			if _, err := ParseRole(string(t.Role)); err != nil {
				return err
			}
		}
		for _, z := range []string{t.Events, t.Replay} {
			if z != "" && !validZMQ(z) {
				return fmt.Errorf("%w: event endpoint %q: want tcp://host:port", ErrInvalid, z)
			}
		}
	}
	if o.Engine != "" {
		if _, err := engines.For(o.Engine); err != nil {
			return fmt.Errorf("%w: %w", ErrInvalid, err)
		}
	}
	if o.Name == "" {
		o.Name = DefaultName
	}
	if o.ProbeTimeout <= 0 {
		o.ProbeTimeout = DefaultProbeTimeout
	}
	if o.HashSeed == "" {
		o.HashSeed = "0"
	}
	if o.Canary == "" {
		o.Canary = DefaultCanary
	}
	if o.Client == nil {
		o.Client = &http.Client{Transport: &http.Transport{DisableKeepAlives: true}}
	}
	return nil
}

func validZMQ(s string) bool {
	hp, ok := strings.CutPrefix(s, "tcp://")
	if !ok {
		return false
	}
	h, p, err := net.SplitHostPort(hp)
	n, perr := strconv.Atoi(p)
	return err == nil && h != "" && perr == nil && n >= 1 && n <= 65535
}

// Observation is everything one endpoint answered, with where each fact
// came from.
type Observation struct {
	Addr string `json:"addr"`
	// DeclaredRole is the operator's --endpoints role, if any.
	DeclaredRole engines.Role `json:"declared_role,omitempty"`
	// Health is the health surface's status ("200 GET /health") or why it
	// is unknown.
	Health  string `json:"health"`
	Healthy bool   `json:"healthy"`
	// Engine is the engine this endpoint looks like; "" when it matched
	// none. EngineWhy is the fingerprint evidence.
	Engine    engines.Kind `json:"engine,omitempty"`
	EngineWhy []string     `json:"engine_evidence,omitempty"`
	OwnedBy   string       `json:"owned_by,omitempty"`
	Version   string       `json:"version,omitempty"`
	Models    []string     `json:"models,omitempty"`
	// Tokenizer is the hash of the canary's token ids ("" = not tokenized)
	// and TokenCount their number.
	Tokenizer  string              `json:"tokenizer,omitempty"`
	TokenCount int                 `json:"token_count,omitempty"`
	Desc       engines.Description `json:"self_description"`
	Events     EventsObservation   `json:"events"`
	Problems   []string            `json:"problems,omitempty"`
	// NoEvidence, when set, is why no surface lets a runbook attribute a
	// request to this worker without a receipt log (its work counter and
	// slots pages did not answer).
	NoEvidence string               `json:"no_evidence,omitempty"`
	kv         *engines.KVContract  // nil: none
	adapter    engines.Adapter      // nil: unknown engine
	describer  engines.Describer    // nil: adapter has none
	blockSizes map[int]int          // from published events: size -> count
	parity     map[parityKey][2]int // (algo, seed) -> reproduced, checked
}

type parityKey struct{ algo, seed string }

// EventsObservation is what the KV event probes found on one endpoint.
type EventsObservation struct {
	// Transport: "zmq", "http-poll" or "none".
	Transport string `json:"transport"`
	Endpoint  string `json:"endpoint,omitempty"`
	Replay    string `json:"replay,omitempty"`
	// EndpointFrom says where Endpoint came from: "given", the engine's
	// surface, or "adapter default".
	EndpointFrom string `json:"endpoint_from,omitempty"`
	Reachable    Status `json:"reachable"`
	How          string `json:"how"`
	// Batches is how many batches the replay socket returned (and the live
	// stream delivered within the probe).
	Batches int `json:"batches,omitempty"`
	// Parity is the outcome of recomputing published root-block hashes.
	Parity string `json:"parity,omitempty"`
}

func (o *Observation) problem(format string, args ...any) {
	o.Problems = append(o.Problems, fmt.Sprintf(format, args...))
}

// Probe inspects every target concurrently and returns the plan. It fails
// only on invalid options or a cancelled ctx; every endpoint failure is an
// answer ("unknown", with the reason).
func Probe(ctx context.Context, opts Options) (*Plan, error) {
	if err := opts.validate(); err != nil {
		return nil, err
	}
	obs := make([]*Observation, len(opts.Targets))
	var wg sync.WaitGroup
	for i, t := range opts.Targets {
		wg.Add(1)
		go func() {
			defer wg.Done()
			obs[i] = observe(ctx, &opts, t)
		}()
	}
	wg.Wait()
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	return analyze(&opts, obs), nil
}

// get fetches path with its own deadline; status 0 means no answer.
func get(ctx context.Context, o *Options, method, addr, path string, body []byte) (int, []byte, error) {
	pctx, cancel := context.WithTimeout(ctx, o.ProbeTimeout)
	defer cancel()
	var rd io.Reader
	if body != nil {
		rd = bytes.NewReader(body)
	}
	req, err := http.NewRequestWithContext(pctx, method, "http://"+addr+path, rd)
	if err != nil {
		return 0, nil, err
	}
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := o.Client.Do(req)
	if err != nil {
		if pctx.Err() != nil && ctx.Err() == nil {
			return 0, nil, fmt.Errorf("%w within %s", errNoAnswer, o.ProbeTimeout)
		}
		return 0, nil, err
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(io.LimitReader(resp.Body, maxBody))
	if err != nil {
		return resp.StatusCode, nil, fmt.Errorf("reading the answer: %w", err)
	}
	return resp.StatusCode, data, nil
}

func observe(ctx context.Context, o *Options, t Target) *Observation {
	ob := &Observation{Addr: t.Addr, DeclaredRole: t.Role, Events: EventsObservation{Transport: "none", Reachable: Unknown}}

	// The OpenAI model list is common to every engine; its owned_by is the
	// first fingerprint.
	status, body, err := get(ctx, o, http.MethodGet, t.Addr, "/v1/models", nil)
	var models struct {
		Data []struct {
			ID      string `json:"id"`
			OwnedBy string `json:"owned_by"`
		} `json:"data"`
	}
	switch {
	case err != nil:
		ob.problem("GET /v1/models: %v", err)
	case status != http.StatusOK:
		ob.problem("GET /v1/models: %d", status)
	case json.Unmarshal(body, &models) != nil:
		ob.problem("GET /v1/models: not an OpenAI model list")
	default:
		for _, m := range models.Data {
			ob.Models = append(ob.Models, m.ID)
			if ob.OwnedBy == "" {
				ob.OwnedBy = m.OwnedBy
			}
		}
		sort.Strings(ob.Models)
	}
	modelsBody := body
	if err != nil && errors.Is(err, errNoAnswer) && o.Engine == "" {
		// A peer that holds the connection without answering would cost a
		// deadline per engine's version surface; it is unknown already.
		ob.problem("engine unknown: the endpoint does not answer")
		return ob
	}

	ob.adapter = fingerprint(ctx, o, ob)
	if ob.adapter == nil {
		// The engine is not known, but its health is still a fact: the
		// health surfaces of the engines it might be are asked.
		var paths []string
		for _, a := range candidatesOf(o) {
			if h := a.Surfaces().Health; h != "" && !contains(paths, h) {
				paths = append(paths, h)
			}
		}
		for _, h := range paths {
			if probeHealth(ctx, o, ob, h) {
				break
			}
		}
		return ob
	}
	ob.Engine = ob.adapter.Kind()
	ob.describer, _ = ob.adapter.(engines.Describer)
	s := ob.adapter.Surfaces()
	probeHealth(ctx, o, ob, s.Health)

	if ob.describer != nil {
		for _, p := range ob.describer.DescribePaths() {
			b := modelsBody
			if p != "/v1/models" || b == nil {
				st, bb, err := get(ctx, o, http.MethodGet, t.Addr, p, nil)
				if err != nil || st != http.StatusOK {
					ob.problem("GET %s: %s", p, answerText(st, err))
					continue
				}
				b = bb
			}
			if err := ob.describer.Describe(p, b, &ob.Desc); err != nil {
				ob.problem("%v", err)
			}
		}
		if tb := ob.describer.TokenizeBody(firstOf(ob.Models), o.Canary); tb != nil && s.Tokenize != "" {
			st, b, err := get(ctx, o, http.MethodPost, t.Addr, s.Tokenize, tb)
			if err != nil || st != http.StatusOK {
				ob.problem("POST %s: %s", s.Tokenize, answerText(st, err))
			} else if ids, err := ob.describer.ParseTokens(b); err != nil {
				ob.problem("%v", err)
			} else {
				ob.Tokenizer, ob.TokenCount = hashTokens(ids), len(ids)
			}
		}
	}
	ob.kv = ob.adapter.KV()
	probeEvents(ctx, o, t, ob)
	probeEvidence(ctx, o, ob)
	return ob
}

// probeEvidence asks the surfaces that let a runbook attribute each request
// to a worker without a receipt log (the engine's work counter page, else
// its slots page) and records why none answers, when none does.
func probeEvidence(ctx context.Context, o *Options, ob *Observation) {
	er, ok := engines.EvidenceOf(ob.adapter)
	if !ok {
		return
	}
	e := er.Evidence()
	var tried []string
	for _, sv := range []struct{ path, flag string }{{ob.adapter.Surfaces().Metrics, e.MetricsFlag}, {e.Slots, e.SlotsFlag}} {
		if sv.path == "" || (sv.path == ob.adapter.Surfaces().Metrics && e.WorkCounter == "") {
			continue
		}
		st, _, err := get(ctx, o, http.MethodGet, ob.Addr, sv.path, nil)
		if err == nil && st == http.StatusOK {
			return
		}
		why := fmt.Sprintf("GET %s: %s", sv.path, answerText(st, err))
		if sv.flag != "" {
			why += " (start it with " + sv.flag + ")"
		}
		tried = append(tried, why)
	}
	ob.NoEvidence = strings.Join(tried, "; ")
}

// probeHealth asks GET path and records the answer; it reports whether the
// endpoint answered 200.
func probeHealth(ctx context.Context, o *Options, ob *Observation, path string) bool {
	status, _, err := get(ctx, o, http.MethodGet, ob.Addr, path, nil)
	if err != nil {
		ob.Health = fmt.Sprintf("GET %s: %v", path, err)
		return false
	}
	ob.Health = fmt.Sprintf("GET %s: %d", path, status)
	ob.Healthy = status == http.StatusOK
	return ob.Healthy
}

func candidatesOf(o *Options) []engines.Adapter {
	if o.Engine != "" {
		return []engines.Adapter{engines.MustFor(o.Engine)}
	}
	return engines.Registered()
}

func answerText(status int, err error) string {
	if err != nil {
		return err.Error()
	}
	return strconv.Itoa(status)
}

func firstOf(s []string) string {
	if len(s) == 0 {
		return ""
	}
	return s[0]
}

// hashTokens is the first 12 hex digits of SHA-256 over the ids as
// little-endian uint32s.
func hashTokens(ids []uint32) string {
	h := sha256.New()
	var b [4]byte
	for _, id := range ids {
		binary.LittleEndian.PutUint32(b[:], id)
		h.Write(b[:])
	}
	return hex.EncodeToString(h.Sum(nil))[:12]
}

// fingerprint decides which engine the endpoint is: the adapter whose
// owned_by the model list carries, confirmed by its version surface; with
// opts.Engine, that adapter is checked instead of searched for.
func fingerprint(ctx context.Context, o *Options, ob *Observation) engines.Adapter {
	candidates := candidatesOf(o)
	var owned []engines.Adapter
	for _, a := range candidates {
		if d, ok := a.(engines.Describer); ok && ob.OwnedBy != "" && d.OwnedBy() == ob.OwnedBy {
			owned = append(owned, a)
		}
	}
	if len(owned) == 1 {
		a := owned[0]
		ob.EngineWhy = append(ob.EngineWhy, fmt.Sprintf("GET /v1/models owned_by %q", ob.OwnedBy))
		if v, why := versionOf(ctx, o, ob.Addr, a); v != "" {
			ob.Version = v
			ob.EngineWhy = append(ob.EngineWhy, why)
		} else {
			ob.problem("%s", why)
		}
		return a
	}
	// No owned_by match: the version surfaces decide, when exactly one
	// engine's parses.
	var hits []engines.Adapter
	var versions, whys []string
	for _, a := range candidates {
		if v, why := versionOf(ctx, o, ob.Addr, a); v != "" {
			hits, versions, whys = append(hits, a), append(versions, v), append(whys, why)
		}
	}
	switch {
	case len(hits) == 1 && o.Engine == "":
		ob.Version = versions[0]
		ob.EngineWhy = append(ob.EngineWhy, whys[0], fmt.Sprintf("owned_by %q names no engine", ob.OwnedBy))
		return hits[0]
	case o.Engine != "":
		if ob.OwnedBy != "" {
			ob.problem("--engine %s: this endpoint's /v1/models says owned_by %q, not %q", o.Engine, ob.OwnedBy, ownedBy(candidates[0]))
		} else {
			ob.problem("--engine %s: this endpoint does not answer as %s", o.Engine, candidates[0].Display())
		}
	case len(hits) > 1:
		ob.problem("engine ambiguous: the version surfaces of %d engines answer", len(hits))
	default:
		ob.problem("engine unknown: no adapter's owned_by or version surface matches")
	}
	return nil
}

func ownedBy(a engines.Adapter) string {
	if d, ok := a.(engines.Describer); ok {
		return d.OwnedBy()
	}
	return ""
}

func versionOf(ctx context.Context, o *Options, addr string, a engines.Adapter) (string, string) {
	p := a.Surfaces().Version
	if p == "" {
		return "", a.Display() + " has no version surface"
	}
	st, b, err := get(ctx, o, http.MethodGet, addr, p, nil)
	if err != nil || st != http.StatusOK {
		return "", fmt.Sprintf("GET %s: %s", p, answerText(st, err))
	}
	v, err := a.ParseVersion(b)
	if err != nil {
		return "", err.Error()
	}
	return v, fmt.Sprintf("GET %s: %s %s", p, a.Display(), v)
}

// probeEvents finds and tests the endpoint's KV event surface without
// consuming it.
func probeEvents(ctx context.Context, o *Options, t Target, ob *Observation) {
	ev := &ob.Events
	kv := ob.kv
	if kv == nil || kv.Transport == engines.EventsNone {
		ev.Transport, ev.Reachable = "none", Known
		ev.How = ob.adapter.Display() + " publishes no KV events"
		return
	}
	host, _, _ := net.SplitHostPort(t.Addr)
	// Dispatch on the event transport (a protocol, shared by engines), not
	// on the engine: HTTP-polled queues are probed by the adapter's
	// non-destructive request, ZeroMQ publishers by SUB and replay below.
	if kv.Transport == engines.EventsHTTPPoll {
		ev.Transport = "http-poll"
		ev.Endpoint = "http://" + t.Addr + kv.PollPath
		ev.EndpointFrom = "adapter"
		method, path, want := "", "", 0
		if ob.describer != nil {
			method, path, want = ob.describer.EventsProbe()
		}
		if method == "" {
			ev.Reachable = Unknown
			ev.How = "cannot be told without draining the queue: no non-destructive probe is known for this engine"
			return
		}
		st, _, err := get(ctx, o, method, t.Addr, path, nil)
		switch {
		case err != nil:
			ev.Reachable, ev.How = Unknown, fmt.Sprintf("%s %s: %v (the destructive POST was not sent)", method, path, err)
		case st == want:
			ev.Reachable = Known
			ev.How = fmt.Sprintf("%s %s answered %d: the drain route is served; the destructive POST was not sent, nothing was drained", method, path, st)
		default:
			ev.Reachable = Unknown
			ev.How = fmt.Sprintf("%s %s answered %d, not %d: the drain route may be absent (the destructive POST was not sent)", method, path, st, want)
		}
		return
	}
	ev.Transport = "zmq"
	switch {
	case t.Events != "":
		ev.Endpoint, ev.Replay, ev.EndpointFrom = t.Events, t.Replay, "given"
	case ob.Desc.EventsOff:
		ev.Reachable = Known
		ev.How = "the engine reports no event publisher (" + ob.Desc.From["events"] + ")"
		ev.Transport = "off"
		return
	case ob.Desc.Events != "":
		ev.Endpoint, ev.Replay, ev.EndpointFrom = onHost(ob.Desc.Events, host), onHost(ob.Desc.Replay, host), ob.Desc.From["events"]
	default:
		ev.Endpoint = fmt.Sprintf("tcp://%s:%d", hostForURL(host), kv.ZMQPort)
		ev.EndpointFrom = "adapter default port"
	}
	if ev.Replay == "" && t.Replay != "" {
		ev.Replay = t.Replay
	}
	if ev.Replay == "" && kv.ReplayOffset > 0 && ev.EndpointFrom == "adapter default port" {
		ev.Replay = fmt.Sprintf("tcp://%s:%d", hostForURL(host), kv.ZMQPort+kv.ReplayOffset)
	}
	// The SUB wait for a first batch and the replay exchange run at once,
	// each with its own deadline; both end before probeEvents returns.
	var (
		pub    kvevents.PubAnswer
		perr   error
		replay kvevents.ReplayAnswer
		rerr   = errors.New("no replay socket known")
		wg     sync.WaitGroup
	)
	wg.Add(1)
	go func() {
		defer wg.Done()
		pctx, cancel := context.WithTimeout(ctx, o.ProbeTimeout)
		defer cancel()
		pub, perr = kvevents.ProbePub(pctx, ev.Endpoint, "")
	}()
	if ev.Replay != "" {
		rctx, cancel := context.WithTimeout(ctx, o.ProbeTimeout)
		replay, rerr = kvevents.ProbeReplay(rctx, ev.Replay, 0)
		cancel()
	}
	wg.Wait()
	var how []string
	switch {
	case perr != nil:
		how = append(how, fmt.Sprintf("SUB %s: %v", ev.Endpoint, perr))
	case pub.First != nil:
		how = append(how, fmt.Sprintf("SUB %s: connected, first batch seq %d", ev.Endpoint, pub.First.Seq))
		ob.readBatch(pub.First.Payload, o.HashSeed)
		ev.Batches++
	default:
		how = append(how, fmt.Sprintf("SUB %s: ZMTP handshake done, no batch within %s (an idle engine publishes nothing)", ev.Endpoint, o.ProbeTimeout))
	}
	replayed := false
	if ev.Replay != "" {
		if rerr != nil {
			how = append(how, fmt.Sprintf("replay %s: %v", ev.Replay, rerr))
		} else {
			replayed = true
			how = append(how, fmt.Sprintf("replay %s: answered %d batches and the end marker", ev.Replay, len(replay.Batches)))
			for _, m := range replay.Batches {
				ob.readBatch(m.Payload, o.HashSeed)
			}
			ev.Batches += len(replay.Batches)
		}
	}
	ev.How = strings.Join(how, "; ")
	if perr == nil || replayed {
		ev.Reachable = Known
	} else {
		ev.Reachable = Unreachable
	}
	ev.Parity = ob.parityText()
}

func hostForURL(h string) string {
	if strings.Contains(h, ":") {
		return "[" + h + "]"
	}
	return h
}

// onHost replaces a wildcard bind host ("*", "0.0.0.0", "::") in a
// tcp:// endpoint with the endpoint's own host.
func onHost(ep, host string) string {
	hp, ok := strings.CutPrefix(ep, "tcp://")
	if !ok {
		return ep
	}
	h, p, err := net.SplitHostPort(hp)
	if err != nil {
		return ep
	}
	if h == "*" || h == "0.0.0.0" || h == "::" || h == "" {
		h = host
	}
	return "tcp://" + net.JoinHostPort(h, p)
}

// readBatch folds one published batch into the observation: block sizes,
// and the parity of root blocks (no parent) recomputed with the engine's
// hash algorithm and the expected seed.
func (o *Observation) readBatch(payload []byte, seed string) {
	var b kvevents.Batch
	if _, err := kvevents.DecodeBatch(payload, &b); err != nil {
		o.problem("a published batch does not decode: %v", err)
		return
	}
	algo := kvhash.Algo(o.Desc.HashAlgo)
	if _, err := kvhash.ParseAlgo(string(algo)); err != nil && o.kv != nil {
		algo = kvhash.Algo(o.kv.HashAlgo)
	}
	for i := range b.Events {
		e := &b.Events[i]
		if e.Kind != kvevents.BlockStored || e.BlockSize <= 0 {
			continue
		}
		if o.blockSizes == nil {
			o.blockSizes = map[int]int{}
		}
		o.blockSizes[e.BlockSize]++
		if e.HasParent || len(e.BlockHashes) == 0 || len(e.TokenIDs) < e.BlockSize {
			continue
		}
		h, err := kvhash.New(algo, e.BlockSize, seed)
		if err != nil {
			continue
		}
		keys := h.BlockKeys(nil, e.TokenIDs[:e.BlockSize])
		if o.parity == nil {
			o.parity = map[parityKey][2]int{}
		}
		k := parityKey{string(algo), seed}
		c := o.parity[k]
		c[1]++
		if len(keys) == 1 && keys[0] == e.BlockHashes[0] {
			c[0]++
		}
		o.parity[k] = c
	}
}

// parityText summarises the root-block recomputation ("" when no root
// block was published).
func (o *Observation) parityText() string {
	for k, c := range o.parity {
		if c[0] == c[1] {
			return fmt.Sprintf("reproduced: %d/%d published root blocks hash as %s seed %s", c[0], c[1], k.algo, k.seed)
		}
		return fmt.Sprintf("not reproduced: %d/%d published root blocks hash as %s seed %s (the engine's seed, algorithm or block size differs)", c[0], c[1], k.algo, k.seed)
	}
	return ""
}
