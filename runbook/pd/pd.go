// Package pd is the prefill/decode (P/D) runbook: prefill and decode
// workers, one rule with pd_disagg_mode in front of them (optionally
// kvExactMode 1, KV-exact scoring of the prefill endpoints), and evidence
// that the gateway splits each request into the engine's two legs.
//
// The steps, in order (each PASS, FAIL, BLOCKED or SKIPPED with evidence):
//
//  1. select tuple      engine × profile from the catalog; a known-BLOCKED
//     tuple ends here with its reason code, nothing launched
//  2. launch workers    prefill p1..pN and decode d1..dM (SGLang prefills
//     with their bootstrap servers); health and /v1/models wait
//  3. prove direct inference  every worker answers without the gateway, as
//     its role needs: each prefill is driven with a decode in the engine's
//     own P/D shape through its adapter (vLLM hand-off then decode, SGLang
//     both legs at once with a bootstrap triple, TensorRT-LLM context then
//     generation); a simulator's receipt must record each leg
//     (direct-worker lane). Each worker's evidence source is chosen here:
//     its receipt log, else the engine-native counters its adapter names;
//     without a receipt log steps 6 and 9 attribute each leg to the worker
//     whose engine counter shows it, step 7 (which reads the legs' bodies)
//     is SKIPPED with the reason, and KV-exact cache reuse is shown by the
//     warmed prefill's cache counter (sglang:cached_tokens_total,
//     vllm:prefix_cache_hits_total, trtllm_prompt_cached_tokens_total),
//     BLOCKED engine_cache_unreported where the engine exports none
//  4. apply rule        pd_disagg_mode, ep_role 1/2, each SGLang prefill's
//     bootstrapPort, kvExactMode 1 with the prefills' event streams
//  5. read back         the effective rule equals the applied one; every
//     endpoint healthy and available, prefill event streams connected
//  6. deliver through the gateway  JSON and SSE answered by a decode
//     endpoint; each request id on exactly one prefill and one decode
//     receipt; negative requests leave no receipt (delivery lane)
//  7. hand-off evidence  from the receipts of the delivered requests: both
//     legs carried one request id; vLLM: the prefill leg had max_tokens 1
//     and its hand-off went out and came back into the decode leg;
//     SGLang: the same bootstrap triple (host, port, room) on both legs, its
//     port the chosen prefill's bootstrap port; TensorRT-LLM: context_only
//     on the prefill leg, generation_only carrying the context state on the
//     decode leg (routing-evidence lane: the split is proven)
//  8. hash parity       KV-exact only: the gateway's canary hashes are
//     published by a prefill, a one-token red arm misses (gates package)
//  9. routing evidence  KV-exact: same-prefix follow-ups pick the warmed
//     prefill by a kv-exact hit while its cached tokens rise (routing and
//     cache-reuse lanes); otherwise the route named by the gateway matches
//     the receipts for every request
//  10. cleanup          rule deleted, gateway closed, workers stopped
package pd

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"slices"
	"strings"
	"time"

	"github.com/llmgw/llmgw/engines"
	_ "github.com/llmgw/llmgw/engines/all" // Engines asks the registry at init
	"github.com/llmgw/llmgw/gateway"
	"github.com/llmgw/llmgw/gateway/adminclient"
	"github.com/llmgw/llmgw/gateway/rule"
	"github.com/llmgw/llmgw/profiles"
	"github.com/llmgw/llmgw/results"
	"github.com/llmgw/llmgw/runbook"
	"github.com/llmgw/llmgw/runbook/gates"
	"github.com/llmgw/llmgw/runbook/labkit"
)

// Engines are the engines whose adapter has a P/D protocol (llama.cpp has
// none).
var Engines = engines.Names(func(a engines.Adapter) bool { return a.PD() != nil })

// Defaults of Options.
const (
	DefaultEngine  = string(engines.VLLM)
	DefaultProfile = "qwen3-0.6b"
	DefaultPrefill = 2
	DefaultDecode  = 1
)

// Step names, in order; part of the results contract.
const (
	StepSelect   = "select tuple"
	StepLaunch   = "launch workers"
	StepDirect   = "prove direct inference"
	StepApply    = "apply rule"
	StepReadBack = "read back"
	StepDeliver  = "deliver through the gateway"
	StepHandOff  = "hand-off evidence"
	StepParity   = gates.StepHashParity
	StepRouting  = "routing evidence"
	StepCleanup  = "cleanup"
)

// Topology is the results topology of a P/D run.
const Topology = "pd"

// ErrInvalid classifies bad Options; nothing was started.
var ErrInvalid = errors.New("pd: invalid options")

// Options configure one P/D run.
type Options struct {
	Engine  string // vllm, sglang or trtllm
	Profile string // a catalog profile ID
	// KVExact adds kvExactMode 1 (KV-exact scoring of prefill endpoints)
	// and the hash-parity gate.
	KVExact bool
	// Prefill and Decode are the worker counts (≥ 1 each).
	Prefill, Decode int
	// Catalog is the profile catalog; nil loads the embedded one.
	Catalog *profiles.Catalog
	// Tokenizer is the KV-exact rule's kvTokenizer (a tokenizer.json or
	// .gguf path, a models directory, or "engine"); "" takes the
	// simulators' embedded Qwen3 tokenizer with simulated workers, else
	// "engine" (runbook.KVTokenizer).
	Tokenizer string
	// Launcher starts the workers; required.
	Launcher Launcher
	// GatewayAdmin is an external gateway's admin base URL; "" starts an
	// embedded gateway on loopback ports.
	GatewayAdmin string
	GatewayToken string
	// GatewayTokenFile is the file GatewayToken was read from; its path
	// (never the token) goes into the ownership ledger for `llmgw cleanup`.
	GatewayTokenFile string
	// HealthTimeout bounds the wait for healthy workers; 0 means 60 s.
	HealthTimeout time.Duration
	// ReadyTimeout bounds waits for gateway-side conditions; 0 means 20 s.
	ReadyTimeout time.Duration
	// RuleHook may change the rule before it is applied (tests).
	RuleHook func(r *rule.Rule)
	// StepHook is called before each step runs (tests cancel the context
	// from it, as Ctrl-C would).
	StepHook func(step string)
	// AcceptVersionMismatch lets a run go on when real workers report an
	// engine version other than the catalog tuple's (recorded on the row).
	AcceptVersionMismatch bool
	// Logger receives the embedded gateway's logs; nil discards them.
	Logger *slog.Logger
}

// Mode is the results mode of a run: "exact" with kvExactMode 1, else
// "rr" (the prefill is picked by the rule's policy).
func (o *Options) Mode() string {
	if o.KVExact {
		return "exact"
	}
	return "rr"
}

// Validate checks o and fills defaults. The error wraps ErrInvalid and
// lists the valid values.
func (o *Options) Validate() error {
	if o.Engine == "" {
		o.Engine = DefaultEngine
	}
	if o.Profile == "" {
		o.Profile = DefaultProfile
	}
	if o.Prefill == 0 {
		o.Prefill = DefaultPrefill
	}
	if o.Decode == 0 {
		o.Decode = DefaultDecode
	}
	c, err := labkit.LoadCatalog(o.Catalog)
	if err != nil {
		return fmt.Errorf("pd: %w", err)
	}
	o.Catalog = c
	if !slices.Contains(Engines, o.Engine) {
		return fmt.Errorf("%w: engine %q has no P/D hand-off (valid: %s)", ErrInvalid, o.Engine, strings.Join(Engines, ", "))
	}
	if _, err := o.Catalog.Get(o.Profile); err != nil {
		return fmt.Errorf("%w: unknown profile %q (valid: %s)", ErrInvalid, o.Profile, strings.Join(o.Catalog.IDs(), ", "))
	}
	if o.Prefill < 1 || o.Prefill > 16 || o.Decode < 1 || o.Decode > 16 {
		return fmt.Errorf("%w: %d prefill and %d decode workers: want 1..16 of each", ErrInvalid, o.Prefill, o.Decode)
	}
	if o.Launcher == nil {
		return fmt.Errorf("%w: no launcher", ErrInvalid)
	}
	labkit.FillDefaults(&o.HealthTimeout, &o.ReadyTimeout, &o.Logger)
	return nil
}

// Tuple is the results tuple of a run with these (validated) options.
func (o *Options) Tuple() results.Tuple {
	t := results.Tuple{
		Engine: o.Engine, Profile: o.Profile, Topology: Topology, Mode: o.Mode(),
		Launcher: o.Launcher.Name(), SimulatedWorkers: o.Launcher.Simulated(), Workers: o.Prefill + o.Decode,
	}
	return labkit.CompleteTuple(o.Catalog, t)
}

// Runbook returns the P/D runbook's steps for o (validated).
func Runbook(o *Options) runbook.Runbook {
	s := &state{o: o}
	step := func(name string, fn func(context.Context, *runbook.Run) runbook.Outcome) runbook.Step {
		return labkit.Hooked(o.StepHook, name, fn)
	}
	parity := gates.Step(func(r *runbook.Run) (gates.Target, error) {
		if o.StepHook != nil {
			o.StepHook(StepParity)
		}
		return s.parityTarget(r)
	})
	if !o.KVExact {
		parity = runbook.NewOptionalStep(StepParity, func(context.Context, *runbook.Run) runbook.Outcome {
			return runbook.Skip("no kvExactMode: the rule keeps no KV inventory, there is no hash to compare")
		})
	}
	return runbook.Runbook{
		Name: "pd",
		Steps: []runbook.Step{
			step(StepSelect, s.selectTuple),
			step(StepLaunch, s.launch),
			step(StepDirect, s.direct),
			step(StepApply, s.apply),
			step(StepReadBack, s.readBack),
			step(StepDeliver, s.deliver),
			step(StepHandOff, s.handOff),
			parity,
			step(StepRouting, s.routing),
		},
		CleanupStep: StepCleanup,
	}
}

// Execute runs the P/D runbook into store, persisting an ownership ledger
// under outDir for `llmgw cleanup`. The Options must be validated.
func Execute(ctx context.Context, o *Options, store *results.Store, outDir string, prog runbook.Progress) (runbook.Report, error) {
	w, err := store.NewRun(o.Tuple())
	if err != nil {
		return runbook.Report{}, fmt.Errorf("pd: %w", err)
	}
	return ExecuteInto(ctx, o, w, outDir, runbook.Runner{Progress: prog})
}

// ExecuteInto runs the runbook into an existing run writer with runner rn.
func ExecuteInto(ctx context.Context, o *Options, w *results.RunWriter, outDir string, rn runbook.Runner) (runbook.Report, error) {
	return labkit.ExecuteInto(ctx, Runbook(o), o.Launcher.Name(), w, outDir, rn)
}

// state is what the steps share within one run (touched only from the
// runner's goroutine).
type state struct {
	o *Options

	kvTokenizer string // the rule's kvTokenizer in KV-exact mode

	profile profiles.Profile
	spec    runbook.LaunchSpec
	seed    string
	workers []Worker
	client  *http.Client

	admin    *adminclient.Client
	gw       *gateway.Server
	ruleName string
	applied  *rule.Rule
	dataAddr string

	// delivered are the request ids of the deliver step, by kind.
	delivered map[string]string

	// adapter is the engine's contract; wit the workers' evidence sources
	// (chosen in the direct step; see evidence.go).
	adapter engines.Adapter
	wit     *labkit.Witnesses
}

func (s *state) byRole(role string) []Worker {
	var out []Worker
	for _, w := range s.workers {
		if w.Role == role {
			out = append(out, w)
		}
	}
	return out
}

func (s *state) ids(role string) []string {
	var out []string
	for _, w := range s.byRole(role) {
		out = append(out, w.ID)
	}
	return out
}

// parityTarget names the applied rule for the hash-parity gate.
func (s *state) parityTarget(r *runbook.Run) (gates.Target, error) {
	if s.admin == nil || s.ruleName == "" {
		return gates.Target{}, fmt.Errorf("pd: no rule applied")
	}
	return gates.Target{
		AdminBase: s.admin.Base(), AdminToken: s.o.GatewayToken, Rule: s.ruleName, DataAddr: s.dataAddr,
		Model: s.spec.Model, Chat: s.chat(), Nonce: r.ID, Timeout: s.o.ReadyTimeout, Client: s.client,
	}, nil
}
