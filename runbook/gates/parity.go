// Package gates holds runbook gates that more than one runbook applies. The
// first is the hash-parity gate of KV-exact routing: proof that the block
// hashes the gateway computes for a prompt are the ones the worker publishes
// after serving it, and that the proof discriminates (a one-token change
// must miss).
//
// Where the observed hashes come from: the gateway's inventory API
// (GET /v1/rules/{name}/inventory?sample=0, every key of every scored
// endpoint). That is the gateway's view of what the workers published over
// their KV event streams (ZMQ for vLLM and SGLang, HTTP polling for
// TensorRT-LLM), not a second subscription to the workers: a worker's
// publisher may accept only one consumer (TensorRT-LLM does), and the
// inventory is what routing actually uses. A key present in the inventory
// was published by the worker; the gateway never inserts keys it computed
// itself.
package gates

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"time"

	"github.com/llmgw/llmgw/engines/kvhash"
	"github.com/llmgw/llmgw/gateway"
	"github.com/llmgw/llmgw/gateway/adminclient"
	"github.com/llmgw/llmgw/gateway/rule"
	"github.com/llmgw/llmgw/runbook"
)

// StepHashParity is the name of the hash-parity step in every runbook that
// applies it (part of the results contract).
const StepHashParity = "hash parity"

// SourceInventory says where the observed hashes are read from.
const SourceInventory = "gateway inventory API: GET /v1/rules/{name}/inventory?sample=0 (the gateway's view of the worker's KV events)"

// Failure and blocked codes of the gate.
const (
	CodeParityMiss       = "HASH_PARITY_MISS"      // the canary's hashes are not all published
	CodeRedArmHit        = "HASH_PARITY_RED_HIT"   // a flipped token still matched: the check cannot discriminate
	CodeCanaryFailed     = "HASH_PARITY_CANARY"    // the canary request itself failed
	CodeParityRead       = "HASH_PARITY_READ"      // rule or inventory could not be read
	CodeCanaryTooShort   = "HASH_PARITY_SHORT"     // the canary is shorter than one block
	CodeParityBadRule    = "HASH_PARITY_BAD_RULE"  // the effective rule names an unknown algorithm
	CodeNotKVExact       = "not_kv_exact"          // BLOCKED: the rule keeps no inventory
	CodeTokenizerUnknown = "tokenizer_unsupported" // BLOCKED: the gateway cannot say how it tokenizes (no tokenize endpoint)
	codeInterrupted      = "INTERRUPTED"           // the run's context ended during the gate
)

const (
	// defaultParityTimeout: events are asynchronous; wait this long for them.
	defaultParityTimeout = 15 * time.Second
	// canaryRepeats sentences make the canary span several blocks.
	canaryRepeats = 6
	maxAnswerBody = 8 << 20
	tickParity    = 25 * time.Millisecond
	// The red arm flips the low bit of token 0: block 0 changes, so every
	// chained key after it changes too.
	redFlipIndex = 0
	// sampleKeysInEvidence observed keys are kept per endpoint in evidence.
	sampleKeysInEvidence = 64
)

// ErrParity classifies errors of the gate's own plumbing (reading the rule
// or the inventory, sending the canary). A parity miss is not an error: it
// is a FAIL outcome with evidence.
var ErrParity = errors.New("gates: hash parity")

// Target is what the gate checks: a KV-exact rule on a gateway.
type Target struct {
	// AdminBase is the gateway's admin API base URL ("http://host:port").
	AdminBase string
	// AdminToken is the admin bearer token; "" sends none.
	AdminToken string
	// Rule is the rule's name.
	Rule string
	// DataAddr is the gateway's data-plane host:port for the rule; "" takes
	// it from the rule status (its listener address).
	DataAddr string
	// Model is the model name the canary asks for; "" takes the rule's.
	Model string
	// Chat sends the canary as a chat completion (the model's chat template
	// is part of what is hashed); false sends a text completion.
	Chat bool
	// Nonce makes the canary prompt unique (the run ID), so no earlier
	// request warmed its blocks by chance.
	Nonce string
	// Timeout bounds the wait for the worker's events to reach the
	// inventory; 0 means 15 s.
	Timeout time.Duration
	// Client sends every request; nil uses a client with a 30 s timeout.
	Client *http.Client
}

// Parity is the gate's evidence: what was computed, what was observed, and
// the verdicts of both arms. It is written as parity.json.
type Parity struct {
	Rule      string `json:"rule"`
	Source    string `json:"observed_source"`
	Tokenizer string `json:"tokenizer"`
	Template  string `json:"chat_template,omitempty"`
	Algo      string `json:"hash_algo"`
	BlockSize int    `json:"block_size"`
	Seed      string `json:"hash_seed"`
	API       string `json:"api"`
	Prompt    string `json:"prompt"`
	RequestID string `json:"request_id"`
	// ServedBy is the endpoint the gateway named for the canary (for P/D
	// the decode endpoint; the prefill is in Route).
	ServedBy string   `json:"served_by"`
	Route    string   `json:"route"`
	Tokens   []uint32 `json:"tokens"`
	// Computed are the canary's block keys as the gateway computes them.
	Computed []uint64 `json:"computed_keys"`
	// Holder is the endpoint whose published inventory holds every computed
	// key ("" when none does).
	Holder string `json:"holder,omitempty"`
	// Present counts, per endpoint, how many computed keys it holds.
	Present map[string]int `json:"present_per_endpoint"`
	// RedIndex and RedTokens describe the red arm: the canary's tokens with
	// one id flipped; RedKeys its block keys; RedPresent how many of them any
	// endpoint holds (must be 0).
	RedIndex   int      `json:"red_flipped_index"`
	RedFrom    uint32   `json:"red_flipped_from"`
	RedTo      uint32   `json:"red_flipped_to"`
	RedKeys    []uint64 `json:"red_keys"`
	RedPresent int      `json:"red_present"`
	// Observed is a sample of each endpoint's published keys (most recent
	// first) and its total, for the evidence file.
	Observed map[string]ObservedKeys `json:"observed"`
	GreenHit bool                    `json:"green_hit"`
	RedMiss  bool                    `json:"red_miss"`
}

// ObservedKeys is one endpoint's inventory as the gate saw it.
type ObservedKeys struct {
	Total  int      `json:"total"`
	Sample []uint64 `json:"sample"`
}

// Pass reports whether both arms hold: every computed key is published by
// one endpoint, and no key of the red arm is published anywhere.
func (p *Parity) Pass() bool { return p.GreenHit && p.RedMiss }

// CanaryPrompt is the gate's canary text for nonce: several sentences, so
// it spans more than one block of every engine's block size.
func CanaryPrompt(nonce string) string {
	var b strings.Builder
	for i := 0; i < canaryRepeats; i++ {
		fmt.Fprintf(&b, "Hash parity canary %s, sentence %d: the gateway and the engine must hash the same token blocks. ", nonce, i)
	}
	return b.String()
}

// canaryBody is the request the canary sends (and asks the gateway to
// tokenize): a text completion of prompt, or a chat of one user turn.
func canaryBody(model, prompt string, chat bool) []byte {
	body := map[string]any{"model": model, "max_tokens": 1, "temperature": 0, "stream": false}
	if chat {
		body["messages"] = []map[string]string{{"role": "user", "content": prompt}}
	} else {
		body["prompt"] = prompt
	}
	b, err := json.Marshal(body)
	if err != nil { // a map of strings and numbers always marshals
		panic(err)
	}
	return b
}

// Tokenize asks the gateway what it computes for body under rule t.Rule
// (POST /v1/rules/{name}/tokenize): the rendered prompt, the token ids and
// the block keys, exactly as it routes the request, whatever the rule's
// tokenizer. A gateway without the endpoint gives an error wrapping
// errTokenizer.
func Tokenize(ctx context.Context, t Target, body []byte) (*gateway.KVTokenization, error) {
	c, err := adminOf(t)
	if err != nil {
		return nil, err
	}
	// A non-2xx answer is an *adminclient.Error; its status and body are
	// returned as well and classified here.
	b, status, err := c.Do(ctx, http.MethodPost, "/v1/rules/"+url.PathEscape(t.Rule)+"/tokenize", body)
	var apiErr *adminclient.Error
	if err != nil && !errors.As(err, &apiErr) {
		return nil, fmt.Errorf("%w: %w", ErrParity, err)
	}
	switch {
	case status == http.StatusNotFound && !bytes.Contains(b, []byte("rule not found")):
		// Not the rule missing (gateway.ErrRuleNotFound) but the route:
		// a gateway from before the endpoint.
		return nil, fmt.Errorf("%w: %w: the gateway has no POST /v1/rules/{name}/tokenize (%.200s)", ErrParity, errTokenizer, b)
	case status != http.StatusOK:
		return nil, fmt.Errorf("%w: POST /v1/rules/%s/tokenize answered %d: %.200s", ErrParity, t.Rule, status, b)
	}
	var tk gateway.KVTokenization
	if err := json.Unmarshal(b, &tk); err != nil {
		return nil, fmt.Errorf("%w: tokenize answer: %w", ErrParity, err)
	}
	return &tk, nil
}

// BlockKeys hashes tokens with the rule's algorithm, block size and seed,
// exactly as the gateway does.
func BlockKeys(eff *rule.Rule, tokens []uint32) ([]uint64, error) {
	algo, err := kvhash.ParseAlgo(eff.KVHashAlgo)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrParity, err)
	}
	seed := ""
	if eff.KVHashSeed != nil {
		seed = *eff.KVHashSeed
	}
	h, err := kvhash.New(algo, eff.KVBlockSize, seed)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrParity, err)
	}
	return h.BlockKeys(nil, tokens), nil
}

// Flip returns a copy of tokens with the id at i changed (its low bit
// flipped), and the old and new ids.
func Flip(tokens []uint32, i int) ([]uint32, uint32, uint32) {
	out := slices.Clone(tokens)
	from := out[i]
	out[i] ^= 1
	return out, from, out[i]
}

// ParseInventory decodes an inventory answer into each endpoint's keys, in
// the order given. It rejects a body that is not an inventory (no rule
// name, an endpoint without an ID, a duplicate endpoint).
func ParseInventory(b []byte) (map[string][]uint64, *gateway.InventoryStatus, error) {
	var inv gateway.InventoryStatus
	if err := json.Unmarshal(b, &inv); err != nil {
		return nil, nil, fmt.Errorf("%w: inventory: %w", ErrParity, err)
	}
	if inv.Rule == "" {
		return nil, nil, fmt.Errorf("%w: inventory: no rule name", ErrParity)
	}
	out := make(map[string][]uint64, len(inv.Endpoints))
	for i, ep := range inv.Endpoints {
		if ep.ID == "" {
			return nil, nil, fmt.Errorf("%w: inventory: endpoint %d has no id", ErrParity, i)
		}
		if _, dup := out[ep.ID]; dup {
			return nil, nil, fmt.Errorf("%w: inventory: endpoint %q listed twice", ErrParity, ep.ID)
		}
		out[ep.ID] = ep.Sample
	}
	return out, &inv, nil
}

// Check runs the gate against t: it reads the effective rule, computes the
// canary's block keys as the gateway does, sends the canary through the
// gateway, waits (up to t.Timeout) for one endpoint's published inventory
// to hold every computed key, and checks that none of the red arm's keys is
// published anywhere. It returns the evidence in every case; the error
// (wrapping ErrParity) is for plumbing failures only, and is nil when the
// gate ran to a verdict, passing or not.
func Check(ctx context.Context, t Target) (*Parity, error) {
	if t.Client == nil {
		t.Client = &http.Client{Timeout: 30 * time.Second}
	}
	if t.Timeout <= 0 {
		t.Timeout = defaultParityTimeout
	}
	st, err := readRule(ctx, t)
	if err != nil {
		return nil, err
	}
	eff := st.Rule.Effective()
	if eff.KVExactMode == 0 {
		return nil, fmt.Errorf("%w: rule %s has kvExactMode 0: %w", ErrParity, t.Rule, errNotKVExact)
	}
	p := &Parity{
		Rule: t.Rule, Source: SourceInventory, Tokenizer: tokName(eff.KVTokenizer), Algo: eff.KVHashAlgo,
		BlockSize: eff.KVBlockSize, API: "completions", Prompt: CanaryPrompt(t.Nonce),
		RequestID: "parity-" + t.Nonce, RedIndex: redFlipIndex, Present: map[string]int{}, Observed: map[string]ObservedKeys{},
	}
	if eff.KVHashSeed != nil {
		p.Seed = *eff.KVHashSeed
	}
	if t.Chat {
		p.API = "chat"
	}
	model := t.Model
	if model == "" {
		model = eff.ModelName
	}
	body := canaryBody(model, p.Prompt, t.Chat)
	tk, err := Tokenize(ctx, t, body)
	if err != nil {
		return p, err
	}
	p.Tokens, p.Computed, p.Tokenizer = tk.Tokens, tk.BlockKeys, tk.Tokenizer
	if t.Chat {
		p.Template = tk.Prompt
	}
	// The gate's own hasher must agree with the gateway's on these ids, or
	// the red arm below would be hashed differently from what routing does.
	if local, err := BlockKeys(eff, p.Tokens); err != nil {
		return p, err
	} else if !slices.Equal(local, p.Computed) {
		return p, fmt.Errorf("%w: %w: the gateway's block keys for the canary differ from kvhash's for the same ids", ErrParity, errBadAlgo)
	}
	if len(p.Computed) == 0 {
		return p, fmt.Errorf("%w: canary of %d tokens is shorter than one block of %d: %w", ErrParity, len(p.Tokens), eff.KVBlockSize, errShort)
	}
	red, from, to := Flip(p.Tokens, redFlipIndex)
	p.RedFrom, p.RedTo = from, to
	if p.RedKeys, err = BlockKeys(eff, red); err != nil {
		return p, err
	}

	data := t.DataAddr
	if data == "" {
		data = dataAddress(st.Status.Address, t.AdminBase)
	}
	if err := sendCanary(ctx, t, p, data, body); err != nil {
		return p, err
	}

	// Poll the inventory until one endpoint holds every computed key, or
	// the deadline passes (the verdict is then a miss, with evidence).
	deadline := time.NewTimer(t.Timeout)
	defer deadline.Stop()
	tick := time.NewTicker(tickParity)
	defer tick.Stop()
	var inv map[string][]uint64
	for {
		if inv, err = readInventory(ctx, t); err != nil {
			return p, err
		}
		evaluate(p, inv)
		if p.GreenHit {
			break
		}
		select {
		case <-ctx.Done():
			return p, fmt.Errorf("%w: waiting for the canary's blocks: %w", ErrParity, ctx.Err())
		case <-deadline.C:
		case <-tick.C:
			continue
		}
		break
	}
	return p, nil
}

// Sentinels under ErrParity that decide the outcome's status.
var (
	errNotKVExact = errors.New("no KV inventory")
	errTokenizer  = errors.New("the gateway cannot say how it tokenizes")
	errShort      = errors.New("canary too short")
)

func tokName(spec string) string {
	if spec == "" {
		return "none"
	}
	return spec
}

// evaluate fills the verdicts of p from one inventory snapshot.
func evaluate(p *Parity, inv map[string][]uint64) {
	p.Holder, p.GreenHit, p.RedPresent = "", false, 0
	ids := make([]string, 0, len(inv))
	for id := range inv {
		ids = append(ids, id)
	}
	slices.Sort(ids)
	red := make(map[uint64]bool, len(p.RedKeys))
	for _, k := range p.RedKeys {
		red[k] = true
	}
	for _, id := range ids {
		keys := inv[id]
		held := make(map[uint64]bool, len(keys))
		for _, k := range keys {
			held[k] = true
			if red[k] {
				p.RedPresent++
			}
		}
		n := 0
		for _, k := range p.Computed {
			if held[k] {
				n++
			}
		}
		p.Present[id] = n
		p.Observed[id] = ObservedKeys{Total: len(keys), Sample: keys[:min(len(keys), sampleKeysInEvidence)]}
		if n == len(p.Computed) && p.Holder == "" {
			p.Holder, p.GreenHit = id, true
		}
	}
	p.RedMiss = p.RedPresent == 0
}

// Outcome runs Check and turns it into the gate's step outcome, speaking for
// the hash-parity lane, with parity.json (computed and observed hashes) as
// evidence.
func Outcome(ctx context.Context, t Target) runbook.Outcome {
	p, err := Check(ctx, t)
	var out runbook.Outcome
	if p != nil {
		out = out.With("parity.json", mustJSON(p))
	}
	// The published hashes are the worker's own KV events, as the gateway's
	// inventory ingested them.
	out = out.For(runbook.LaneHashParity).From(runbook.LaneHashParity, SourceKVEvents)
	switch {
	case err != nil && ctx.Err() != nil:
		return merge(runbook.Fail(codeInterrupted, "interrupted: %v", err), out)
	case errors.Is(err, errNotKVExact):
		return merge(runbook.Blocked(CodeNotKVExact, "%v", err), out)
	case errors.Is(err, errTokenizer):
		return merge(runbook.Blocked(CodeTokenizerUnknown, "%v", err), out)
	case errors.Is(err, errShort):
		return merge(runbook.Fail(CodeCanaryTooShort, "%v", err), out)
	case errors.Is(err, errCanary):
		return merge(runbook.Fail(CodeCanaryFailed, "%v", err), out)
	case errors.Is(err, errBadAlgo):
		return merge(runbook.Fail(CodeParityBadRule, "%v", err), out)
	case err != nil:
		return merge(runbook.Fail(CodeParityRead, "%v", err), out)
	case !p.GreenHit:
		best, bestN := "", -1
		for id, n := range p.Present {
			if n > bestN || (n == bestN && id < best) {
				best, bestN = id, n
			}
		}
		return merge(runbook.Fail(CodeParityMiss, "the canary's %d block hashes (%s, block %d, seed %q, %s tokenizer) are not all published by any worker within %v (best: %s holds %d of them); check the hash seed, block size and tokenizer",
			len(p.Computed), p.Algo, p.BlockSize, p.Seed, p.Tokenizer, timeoutOf(t), best, max(bestN, 0)), out)
	case !p.RedMiss:
		return merge(runbook.Fail(CodeRedArmHit, "the red arm (token %d flipped %d→%d) still matched %d published hashes: the gate cannot tell prompts apart", p.RedIndex, p.RedFrom, p.RedTo, p.RedPresent), out)
	}
	return merge(runbook.Pass("all %d canary block hashes (%s, block %d, %s tokenizer) published by %s, read from the gateway inventory; the red arm (token %d flipped) matched none of %d",
		len(p.Computed), p.Algo, p.BlockSize, p.Tokenizer, p.Holder, p.RedIndex, len(p.RedKeys)), out)
}

func timeoutOf(t Target) time.Duration {
	if t.Timeout <= 0 {
		return defaultParityTimeout
	}
	return t.Timeout
}

// merge returns o carrying base's evidence and lanes.
func merge(o, base runbook.Outcome) runbook.Outcome {
	o.Evidence = append(slices.Clone(base.Evidence), o.Evidence...)
	o.Lanes = base.Lanes
	o.Sources = base.Sources
	return o
}

// SourceKVEvents names the parity lane's evidence source: the engine's
// KV events, read from the gateway's inventory.
const SourceKVEvents = "engine_kv_events via gateway inventory"

// Step returns the hash-parity step. resolve is called when the step runs
// (after the rule is applied) and names the target; an error from it fails
// the step. The step is optional: a parity miss does not block the steps
// after it, so the routing and cache-reuse lanes still record what they
// see.
func Step(resolve func(r *runbook.Run) (Target, error)) runbook.Step {
	return runbook.NewOptionalStep(StepHashParity, func(ctx context.Context, r *runbook.Run) runbook.Outcome {
		t, err := resolve(r)
		if err != nil {
			return runbook.Fail(CodeParityRead, "%v", err).For(runbook.LaneHashParity)
		}
		return Outcome(ctx, t)
	})
}

var (
	errCanary  = errors.New("canary request failed")
	errBadAlgo = errors.New("bad rule")
)

func readRule(ctx context.Context, t Target) (*gateway.RuleStatus, error) {
	c, err := adminOf(t)
	if err != nil {
		return nil, err
	}
	st, _, err := c.Rule(ctx, t.Rule)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrParity, err)
	}
	if st.Rule == nil {
		return nil, fmt.Errorf("%w: rule %s: not a rule status", ErrParity, t.Rule)
	}
	if _, err := kvhash.ParseAlgo(st.Rule.Effective().KVHashAlgo); err != nil && st.Rule.Effective().KVExactMode != 0 {
		return nil, fmt.Errorf("%w: %w: %w", ErrParity, errBadAlgo, err)
	}
	return st, nil
}

func readInventory(ctx context.Context, t Target) (map[string][]uint64, error) {
	c, err := adminOf(t)
	if err != nil {
		return nil, err
	}
	_, b, err := c.Inventory(ctx, t.Rule, 0)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrParity, err)
	}
	inv, _, err := ParseInventory(b)
	return inv, err
}

// adminOf is the shared admin API client for t's gateway.
func adminOf(t Target) (*adminclient.Client, error) {
	c, err := adminclient.New(t.AdminBase, t.AdminToken, t.Client)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrParity, err)
	}
	return c, nil
}

// sendCanary sends the canary body through the gateway's data plane and
// records which endpoint answered.
func sendCanary(ctx context.Context, t Target, p *Parity, data string, body []byte) error {
	path := "/v1/completions"
	if t.Chat {
		path = "/v1/chat/completions"
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, "http://"+data+path, bytes.NewReader(body))
	if err != nil {
		return fmt.Errorf("%w: %w: %w", ErrParity, errCanary, err)
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("X-Request-Id", p.RequestID)
	resp, err := t.Client.Do(req)
	if err != nil {
		return fmt.Errorf("%w: %w: %w", ErrParity, errCanary, err)
	}
	defer resp.Body.Close()
	ans, _ := io.ReadAll(io.LimitReader(resp.Body, maxAnswerBody))
	p.ServedBy, p.Route = resp.Header.Get("X-Llmgw-Endpoint"), resp.Header.Get("X-Llmgw-Route")
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("%w: %w: the gateway answered %d: %.200s", ErrParity, errCanary, resp.StatusCode, ans)
	}
	return nil
}

// dataAddress is the rule's data-plane address with an unspecified host
// replaced by the admin API's host.
func dataAddress(addr, adminBase string) string {
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		return addr
	}
	if host == "" || host == "0.0.0.0" || host == "::" {
		if u, err := url.Parse(adminBase); err == nil {
			host = u.Hostname()
		}
	}
	return net.JoinHostPort(host, port)
}

func mustJSON(v any) []byte {
	b, err := json.MarshalIndent(v, "", "  ")
	if err != nil {
		return []byte(fmt.Sprintf("%q\n", err.Error()))
	}
	return append(b, '\n')
}
