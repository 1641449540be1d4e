package cli

import (
	"errors"
	"fmt"
	"os"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/llmgw/llmgw/engines"
	_ "github.com/llmgw/llmgw/engines/all" // the planner asks every adapter
	"github.com/llmgw/llmgw/profiles"
	"github.com/llmgw/llmgw/runbook/plan"
)

// PlanOptions are the inputs of `llmgw plan`.
type PlanOptions struct {
	IO        *IOStreams
	Endpoints string
	Events    string
	Replay    string
	Engine    string
	Profile   string
	Name      string
	Output    string
	Stage     int
	Timeout   time.Duration
	HashSeed  string
	// KVTokenizer is the KV-exact stages' kvTokenizer ("" = engine where it can).
	KVTokenizer string
}

func newPlanCmd(ios *IOStreams) *cobra.Command {
	o := &PlanOptions{IO: ios}
	cmd := &cobra.Command{
		Use:   "plan --endpoints host:port,...",
		Short: "Inspect a running pool read-only and stage its rules, as the guide's decision procedure does",
		Long: `Probe every endpoint with read-only requests (health, version, model list,
metrics and self-description GETs, one tokenize POST of a canary text, ZeroMQ
SUB and replay reads; never an inference request, never the destructive
TensorRT-LLM drain) and answer the deployment guide's questions, each marked
known, unknown or inconsistent with the endpoint that disagrees:

  engine and version   from each engine's own surfaces (or --engine, checked)
  roles                converged, prefill/decode, context/generation, as the
                       engine reports them; vLLM reports none, so declare
                       them (host:port=prefill) or the pool is planned converged
  KV events            reachable (ZMTP handshake, first batch or replay answer);
                       for a destructive endpoint, whether another consumer
                       drains it (it cannot be told; the plan says so)
  consistency          served models, build, tokenizer (canary ids hashed),
                       block size, hash algorithm and published-hash parity,
                       context length

The recommendation is staged, one capability at a time: stage 1 is always
health-checked fullproxy (round robin, or CHWBL where the guide says affinity
helps), then what the answers allow (CHWBL, KV-exact after the parity gate,
P/D). Every stage updates the same rule name. An inconsistent pool gets no
KV-exact or P/D stage; the plan names the blocking fact.

Each probe has its own deadline (--timeout); one that does not answer is an
unknown, never a hang.

Output: -o table (default), -o json (the whole plan; 'llmgw runbook converged
--plan FILE' and 'llmgw runbook pd --plan FILE' read it), -o yaml (the rule of
--stage N, default 1, with the plan as comments: pipe it to
'llmgw rule apply -f -').

Exit codes, the same for -o table, json and yaml: 0 plan made with at
least one stage, 3 pool inconsistent, 2 bad flags, 1 no stage to apply (the
engine is unknown, the pool cannot be staged, --stage names a stage the plan
lacks) or the context was cancelled.`,
		Example: `  llmgw plan --endpoints 10.0.0.5:8000,10.0.0.6:8000,10.0.0.7:8000
  llmgw plan --endpoints 127.0.0.1:8001,127.0.0.1:8002 --events tcp://127.0.0.1:5601,tcp://127.0.0.1:5602
  llmgw plan --endpoints 10.0.0.5:8085,10.0.0.6:8085 -o yaml | llmgw rule apply -f -
  llmgw plan --endpoints ... -o json > plan.json && llmgw runbook converged --plan plan.json`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error { return runPlan(cmd, o) },
	}
	f := cmd.Flags()
	f.StringVar(&o.Endpoints, "endpoints", "", "the pool's engine HTTP addresses, host:port[=role],... (role: converged, prefill, decode, context, generation; for engines that report none, e.g. vLLM)")
	f.StringVar(&o.Events, "events", "", "KV event PUB sockets, tcp://host:port per endpoint in --endpoints order (empty item: what the engine reports, else its default port)")
	f.StringVar(&o.Replay, "replay", "", "KV event replay sockets, tcp://host:port per endpoint (empty item: reported or default)")
	f.StringVar(&o.Engine, "engine", "", "check the endpoints against this engine instead of fingerprinting: vllm, sglang, trtllm, llamacpp")
	f.StringVar(&o.Profile, "profile", "", "catalog profile ID: its served model is checked against the pool and passed to the runbooks")
	f.StringVar(&o.Name, "name", plan.DefaultName, "rule name of every stage")
	addOutputFlag(cmd, &o.Output, outputTable)
	completeFlag(cmd, "engine", completeEngines())
	completeFlag(cmd, "profile", completeProfiles)
	f.IntVar(&o.Stage, "stage", 1, "-o yaml: the stage whose rule is written")
	f.DurationVar(&o.Timeout, "timeout", plan.DefaultProbeTimeout, "deadline of each probe")
	f.StringVar(&o.KVTokenizer, "kv-tokenizer", "", "kvTokenizer of the KV-exact stages: the model's tokenizer.json or .gguf path, or a models directory, on the gateway host (default engine, when every endpoint tokenizes alike)")
	f.StringVar(&o.HashSeed, "hash-seed", "", "PYTHONHASHSEED published vLLM hashes are checked against (default 0, the gateway's)")
	return cmd
}

// planOptions validates the flags; every error is a usage error.
func planOptions(o *PlanOptions) (plan.Options, error) {
	po := plan.Options{Name: o.Name, ProbeTimeout: o.Timeout, HashSeed: o.HashSeed, Profile: o.Profile, KVTokenizer: o.KVTokenizer}
	if o.Endpoints == "" {
		return po, usageErrorf("plan needs --endpoints host:port,...")
	}
	if err := checkOutput(o.Output); err != nil {
		return po, err
	}
	if o.Timeout <= 0 {
		return po, usageErrorf("--timeout %s: want a positive duration", o.Timeout)
	}
	addrs := splitList(o.Endpoints)
	events, replay := splitList(o.Events), splitList(o.Replay)
	if o.Events != "" && len(events) != len(addrs) {
		return po, usageErrorf("--events has %d items for %d --endpoints (leave an item empty for the default)", len(events), len(addrs))
	}
	if o.Replay != "" && len(replay) != len(addrs) {
		return po, usageErrorf("--replay has %d items for %d --endpoints (leave an item empty for the default)", len(replay), len(addrs))
	}
	for i, a := range addrs {
		t := plan.Target{Addr: a}
		if addr, role, ok := strings.Cut(a, "="); ok {
			r, err := plan.ParseRole(role)
			if err != nil {
				return po, usageErrorf("--endpoints %s: %v", a, err)
			}
			t.Addr, t.Role = addr, r
		}
		if i < len(events) {
			t.Events = events[i]
		}
		if i < len(replay) {
			t.Replay = replay[i]
		}
		po.Targets = append(po.Targets, t)
	}
	if o.Engine != "" {
		k, err := engines.ParseKind(o.Engine)
		if err != nil {
			return po, usageErrorf("--engine: %v", err)
		}
		po.Engine = k
	}
	if o.Profile != "" {
		cat, err := profiles.Load()
		if err != nil {
			return po, err
		}
		pr, err := cat.Get(o.Profile)
		if err != nil {
			return po, usageErrorf("--profile: %v", err)
		}
		po.ProfileModel = pr.Model.ServedName
	}
	return po, nil
}

// splitList splits a comma list keeping empty items (positional lists).
func splitList(s string) []string {
	if strings.TrimSpace(s) == "" {
		return nil
	}
	parts := strings.Split(s, ",")
	for i := range parts {
		parts[i] = strings.TrimSpace(parts[i])
	}
	return parts
}

func runPlan(cmd *cobra.Command, o *PlanOptions) error {
	po, err := planOptions(o)
	if err != nil {
		return err
	}
	p, err := plan.Probe(cmd.Context(), po)
	if err != nil {
		if errors.Is(err, plan.ErrInvalid) {
			return &UsageError{Err: err}
		}
		return err
	}
	switch o.Output {
	case "json":
		err = p.WriteJSON(o.IO.Out)
	case "yaml":
		err = p.WriteYAML(o.IO.Out, o.Stage)
	default:
		err = p.WriteTable(o.IO.Out)
	}
	if err != nil && !errors.Is(err, plan.ErrNoStage) {
		return err
	}
	return planExit(p, o.Stage, o.Output == "yaml" || cmd.Flags().Changed("stage"))
}

// planExit is the plan's exit, the same for every output format: 3 when
// the pool is inconsistent, else 1 when there is no stage to apply (or the
// asked --stage is missing), else 0.
func planExit(p *plan.Plan, stage int, stageAsked bool) error {
	if !p.Consistent {
		return &ExitCodeError{Code: ExitFail, Err: fmt.Errorf("pool inconsistent: %s", inconsistentFacts(p))}
	}
	if len(p.Stages) == 0 {
		var why []string
		for _, b := range p.Blocked {
			why = append(why, b.Capability+": "+b.Reason)
		}
		return &ExitCodeError{Code: ExitError, Err: fmt.Errorf("no stage to apply (%s)", strings.Join(why, "; "))}
	}
	if stageAsked && (stage < 1 || stage > len(p.Stages)) {
		return &ExitCodeError{Code: ExitError, Err: fmt.Errorf("no stage %d (the plan has %d)", stage, len(p.Stages))}
	}
	return nil
}

func inconsistentFacts(p *plan.Plan) string {
	var out []string
	for _, a := range p.Answers {
		if a.Status != plan.Inconsistent {
			continue
		}
		s := a.Key
		for _, d := range a.Disagree {
			s += fmt.Sprintf(" (%s says %s, the pool %s)", d.Endpoint, d.Value, a.Value)
		}
		out = append(out, s)
	}
	return strings.Join(out, "; ")
}

// readPlanFile reads `llmgw plan -o json` output for the runbooks' --plan.
func readPlanFile(path string) (*plan.Plan, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, usageErrorf("--plan: %v", err)
	}
	p, err := plan.ReadJSON(data)
	if err != nil {
		return nil, usageErrorf("--plan %s: %v (want the output of 'llmgw plan -o json')", path, err)
	}
	if p.Engine == "" {
		return nil, usageErrorf("--plan %s: the plan found no engine; there is no tuple to run", path)
	}
	return p, nil
}

// applyPlanConverged fills the converged runbook's tuple from a plan:
// engine, profile, attached endpoints, their KV event endpoints and, unless
// --mode is given, stage 1's mode. Flags given explicitly win; --launcher must be attach (or unset).
func applyPlanConverged(cmd *cobra.Command, o *RunbookOptions, path string) error {
	p, err := readPlanFile(path)
	if err != nil {
		return err
	}
	if p.Topology != "converged" || len(p.Stages) == 0 || p.Stages[0].RunbookMode == "pd" {
		return usageErrorf("--plan %s: the plan has no converged stage (topology %s); see its blocked list", path, p.Topology)
	}
	f := cmd.Flags()
	if f.Changed("launcher") && o.Launcher != "attach" || f.Changed("endpoints") {
		return usageErrorf("--plan attaches the plan's endpoints: drop --launcher and --endpoints")
	}
	o.Launcher, o.Endpoints = "attach", strings.Join(p.Converged, ",")
	if !f.Changed("engine") {
		o.Engine = string(p.Engine)
	}
	if !f.Changed("profile") && p.Profile != "" {
		o.Profile = p.Profile
	}
	if !f.Changed("mode") {
		o.Mode = p.Stages[0].RunbookMode
	}
	if ev := p.EventsOf(p.Converged); !f.Changed("kv-events") && ev != nil {
		o.KVEvents = strings.Join(ev, ",")
	}
	if tok := p.KVTokenizer(); !f.Changed("kv-tokenizer") && tok != "" {
		o.KVTokenizer = tok
	}
	return nil
}

// applyPlanPD fills the P/D runbook's tuple from a plan: engine, profile,
// prefill and decode endpoints, the bootstrap ports the prefills reported
// and their KV event endpoints. --kv-exact stays the operator's choice (stage 2 of the plan).
func applyPlanPD(cmd *cobra.Command, o *RunbookPDOptions, path string) error {
	p, err := readPlanFile(path)
	if err != nil {
		return err
	}
	if p.Topology != "pd" || len(p.Stages) == 0 {
		return usageErrorf("--plan %s: the plan has no P/D stage (topology %s); see its blocked list", path, p.Topology)
	}
	f := cmd.Flags()
	if f.Changed("launcher") && o.Launcher != "attach" || f.Changed("prefill-endpoints") || f.Changed("decode-endpoints") {
		return usageErrorf("--plan attaches the plan's endpoints: drop --launcher, --prefill-endpoints and --decode-endpoints")
	}
	o.Launcher = "attach"
	o.PrefillEndpoints, o.DecodeEndpoints = strings.Join(p.Prefill, ","), strings.Join(p.Decode, ",")
	if !f.Changed("engine") {
		o.Engine = string(p.Engine)
	}
	if !f.Changed("profile") && p.Profile != "" {
		o.Profile = p.Profile
	}
	if !f.Changed("bootstrap-port") {
		o.BootstrapPort = p.BootstrapPortFlag()
	}
	if ev := p.EventsOf(p.Prefill); !f.Changed("kv-events") && ev != nil {
		o.KVEvents = strings.Join(ev, ",")
	}
	if tok := p.KVTokenizer(); !f.Changed("kv-tokenizer") && tok != "" {
		o.KVTokenizer = tok
	}
	return nil
}
