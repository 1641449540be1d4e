// Package converged is the converged (single-pool) runbook: N workers that
// each do prefill and decode, one rule in front of them, and evidence that
// the gateway delivers and routes as the mode promises.
//
// The steps, in order (each PASS, FAIL, BLOCKED or SKIPPED with evidence):
//
//  1. select tuple      engine × profile × mode from the catalog; a
//     known-BLOCKED tuple ends here with its reason code, nothing launched
//  2. launch workers    through the Launcher; health and /v1/models wait
//  3. prove direct inference  each worker answers a nonce request, bypassing
//     the gateway, with a well-formed completion (direct-worker lane); each
//     worker's evidence source is chosen here: its receipt log when it is
//     a simulator that keeps one (the receipt must record the request),
//     else the engine-native surfaces its adapter names (a work counter on
//     /metrics, llama.cpp's /slots). A worker with none leaves the lanes
//     that need one BLOCKED with the reason, not this step
//  4. apply rule        POST /v1/rules (the embedded gateway is started
//     first when no external one is given)
//  5. read back         the effective rule equals what was applied, field by
//     field with defaults resolved, and the readiness conditions hold (every
//     endpoint healthy and available; for KV-exact also its event stream
//     connected). Read-back is never delivery proof.
//  6. deliver through the gateway  JSON and SSE, request ids correlated with
//     the receipt on exactly the worker the gateway names; negative requests
//     (unknown model, malformed body) leave no receipt anywhere
//  7. routing evidence  rr: every worker gets traffic; chwbl: a repeated
//     prefix sticks to one worker; exact: a same-prefix follow-up lands on the
//     warmed worker with a kv-exact hit while engine-reported cached tokens
//     rise. Every request is attributed to the worker whose evidence
//     source shows it, and the gateway's decision log must agree
//  8. drain             one endpoint drained, its in-flight reaches 0 and it
//     receives nothing new (checked on its receipts, not only headers)
//  9. cleanup           the runner's deferred cleanups (rule deleted with
//     drain, gateway closed, workers stopped), then absence is verified
//
// llama.cpp has no KV event plane, so mode exact on llamacpp is refused by
// Validate before anything starts (the CLI maps it to a usage error, exit 2).
package converged

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
	_ "github.com/llmgw/llmgw/engines/all" // the adapters the lab asks
	"github.com/llmgw/llmgw/gateway"
	"github.com/llmgw/llmgw/gateway/adminclient"
	"github.com/llmgw/llmgw/gateway/rule"
	"github.com/llmgw/llmgw/profiles"
	"github.com/llmgw/llmgw/results"
	"github.com/llmgw/llmgw/runbook"
	"github.com/llmgw/llmgw/runbook/gates"
	"github.com/llmgw/llmgw/runbook/labkit"
)

// Modes are the routing modes the runbook qualifies.
var Modes = []string{"rr", "chwbl", "exact"}

// Defaults of Options.
const (
	DefaultEngine  = string(engines.VLLM)
	DefaultProfile = "qwen3-0.6b"
	// DefaultMode is the mode for engines that publish KV events;
	// DefaultModeNoKV for those that publish none (llama.cpp).
	DefaultMode     = "exact"
	DefaultModeNoKV = "chwbl"
	DefaultWorkers  = 3
)

// Step names, in order. They are part of the results contract (run.json,
// golden files, docs).
const (
	StepSelect   = "select tuple"
	StepLaunch   = "launch workers"
	StepDirect   = "prove direct inference"
	StepApply    = "apply rule"
	StepReadBack = "read back"
	StepDeliver  = "deliver through the gateway"
	StepRouting  = "routing evidence"
	StepDrain    = "drain"
	StepCleanup  = "cleanup"
)

// ErrInvalid classifies bad Options (unknown engine, profile or mode,
// unsupported combination); nothing was started.
var ErrInvalid = errors.New("converged: invalid options")

// Options configure one converged run.
type Options struct {
	Engine  string // vllm, sglang, trtllm or llamacpp
	Profile string // a catalog profile ID
	Mode    string // rr, chwbl or exact
	Workers int    // ≥ 1 (rr and chwbl need ≥ 2 to show routing)
	// Catalog is the profile catalog; nil loads the embedded one.
	Catalog *profiles.Catalog
	// Tokenizer is the KV-exact rule's kvTokenizer (a tokenizer.json or
	// .gguf path, a models directory, or "engine"); "" takes the
	// simulators' embedded Qwen3 tokenizer with simulated workers, else
	// "engine" (runbook.KVTokenizer).
	Tokenizer string
	// Launcher starts the workers; required.
	Launcher runbook.Launcher
	// GatewayAdmin is the admin API base URL of an external gateway; ""
	// starts an embedded gateway on loopback ports.
	GatewayAdmin string
	// GatewayToken is the external gateway's admin bearer token.
	GatewayToken string
	// GatewayTokenFile is the file GatewayToken was read from; its path
	// (never the token) goes into the ownership ledger for `llmgw cleanup`.
	GatewayTokenFile string
	// HealthTimeout bounds the wait for workers to be healthy; 0 means 60 s.
	HealthTimeout time.Duration
	// ReadyTimeout bounds waits for gateway-side conditions (readiness,
	// event streams, inventory, drain); 0 means 20 s.
	ReadyTimeout time.Duration
	// RuleHook, when set, may change the rule before it is applied. Tests
	// use it to provoke a rejected rule or a rule that contradicts the mode.
	RuleHook func(r *rule.Rule)
	// AcceptVersionMismatch lets a run go on when real workers report an
	// engine version other than the catalog tuple's (the mismatch is still
	// recorded on the row).
	AcceptVersionMismatch bool
	// StepHook, when set, is called before each step runs (tests use it to
	// cancel the context mid-run, as Ctrl-C would).
	StepHook func(step string)
	// Logger receives the embedded gateway's logs; nil discards them.
	Logger *slog.Logger
}

// Validate checks o against the catalog and fills defaults. The error wraps
// ErrInvalid and lists the valid values.
func (o *Options) Validate() error {
	if o.Engine == "" {
		o.Engine = DefaultEngine
	}
	if o.Profile == "" {
		o.Profile = DefaultProfile
	}
	if o.Mode == "" {
		o.Mode = DefaultMode
		if engines.KVOf(engines.Kind(o.Engine)) == nil {
			o.Mode = DefaultModeNoKV
		}
	}
	if o.Workers == 0 {
		o.Workers = DefaultWorkers
	}
	c, err := labkit.LoadCatalog(o.Catalog)
	if err != nil {
		return fmt.Errorf("converged: %w", err)
	}
	o.Catalog = c
	if !slices.Contains(engines.Names(nil), o.Engine) {
		return fmt.Errorf("%w: unknown engine %q (valid: %s)", ErrInvalid, o.Engine, strings.Join(engines.Names(nil), ", "))
	}
	if _, err := o.Catalog.Get(o.Profile); err != nil {
		return fmt.Errorf("%w: unknown profile %q (valid: %s)", ErrInvalid, o.Profile, strings.Join(o.Catalog.IDs(), ", "))
	}
	if !slices.Contains(Modes, o.Mode) {
		return fmt.Errorf("%w: unknown mode %q (valid: %s)", ErrInvalid, o.Mode, strings.Join(Modes, ", "))
	}
	if engines.KVOf(engines.Kind(o.Engine)) == nil && o.Mode == "exact" {
		return fmt.Errorf("%w: mode exact needs KV events and %s publishes none (valid modes for %s: rr, chwbl)", ErrInvalid, o.Engine, o.Engine)
	}
	if o.Workers < 1 || o.Workers > 64 {
		return fmt.Errorf("%w: --workers %d: want 1..64", ErrInvalid, o.Workers)
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
		Engine: o.Engine, Profile: o.Profile, Topology: "converged", Mode: o.Mode,
		Launcher: o.Launcher.Name(), SimulatedWorkers: o.Launcher.Simulated(), Workers: o.Workers,
	}
	return labkit.CompleteTuple(o.Catalog, t)
}

// Runbook returns the converged runbook's steps for o (validated).
func Runbook(o *Options) runbook.Runbook {
	s := &state{o: o}
	step := func(name string, fn func(context.Context, *runbook.Run) runbook.Outcome) runbook.Step {
		return labkit.Hooked(o.StepHook, name, fn)
	}
	steps := []runbook.Step{
		step(StepSelect, s.selectTuple),
		step(StepLaunch, s.launch),
		step(StepDirect, s.direct),
		step(StepApply, s.apply),
		step(StepReadBack, s.readBack),
		step(StepDeliver, s.deliver),
	}
	if o.Mode == "exact" {
		// The hash-parity gate: a canary's block hashes, computed as the
		// gateway does, must appear among those the worker publishes, and a
		// red arm with one token flipped must miss. It is optional (a
		// parity miss does not block the routing step, which records what
		// it sees) and speaks for the HashParity lane.
		steps = append(steps, gates.Step(func(r *runbook.Run) (gates.Target, error) {
			if o.StepHook != nil {
				o.StepHook(gates.StepHashParity)
			}
			if s.admin == nil || s.ruleName == "" {
				return gates.Target{}, fmt.Errorf("converged: no rule applied in run %s", r.ID)
			}
			return gates.Target{AdminBase: s.admin.Base(), AdminToken: o.GatewayToken, Rule: s.ruleName,
				DataAddr: s.dataAddr, Chat: s.chat(), Nonce: r.ID, Timeout: o.ReadyTimeout}, nil
		}))
	}
	steps = append(steps, step(StepRouting, s.routing), step(StepDrain, s.drain))
	return runbook.Runbook{Name: "converged", Steps: steps, CleanupStep: StepCleanup}
}

// Execute runs the converged runbook into store with progress reporting,
// persisting an ownership ledger under outDir for `llmgw cleanup`. The
// Options must be validated.
func Execute(ctx context.Context, o *Options, store *results.Store, outDir string, prog runbook.Progress) (runbook.Report, error) {
	w, err := store.NewRun(o.Tuple())
	if err != nil {
		return runbook.Report{}, fmt.Errorf("converged: %w", err)
	}
	return ExecuteInto(ctx, o, w, outDir, runbook.Runner{Progress: prog})
}

// ExecuteInto runs the runbook into an existing run writer with runner rn
// (tests pin its clock).
func ExecuteInto(ctx context.Context, o *Options, w *results.RunWriter, outDir string, rn runbook.Runner) (runbook.Report, error) {
	return labkit.ExecuteInto(ctx, Runbook(o), o.Launcher.Name(), w, outDir, rn)
}

// state is what the steps share within one run.
type state struct {
	o *Options

	kvTokenizer string // the rule's kvTokenizer in KV-exact mode

	profile    profiles.Profile
	launchSpec profiles.LaunchSpec
	spec       runbook.LaunchSpec
	seed       string

	workers []runbook.Worker
	client  *http.Client
	// adapter is the engine's contract; wit the workers' evidence sources
	// (chosen in the direct step).
	adapter engines.Adapter
	wit     *labkit.Witnesses

	admin    *adminclient.Client
	gw       *gateway.Server
	ruleName string
	applied  *rule.Rule
	dataAddr string

	// routing results kept for the drain step and the lanes
	warmID string
}
