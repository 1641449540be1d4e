package cli

import (
	"context"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/llmgw/llmgw/results"
	"github.com/llmgw/llmgw/runbook"
	"github.com/llmgw/llmgw/runbook/launcher"
	"github.com/llmgw/llmgw/runbook/pd"
)

// RunbookPDOptions are the inputs of `llmgw runbook pd`.
type RunbookPDOptions struct {
	IO                    *IOStreams
	Engine                string
	Profile               string
	KVExact               bool
	KVTokenizer           string
	Prefill               int
	Decode                int
	Launcher              string
	PrefillEndpoints      string
	DecodeEndpoints       string
	BootstrapPort         string
	KVEvents              string
	AcceptVersionMismatch bool
	Gateway               string
	GatewayTokenFile      string
	Out                   string
	HealthTimeout         time.Duration
	LogLevel              string
	// Plan is an 'llmgw plan -o json' file the tuple is taken from.
	Plan string
	// Output is -o: table, json or yaml.
	Output string
}

// withRunbookPD adds the pd subcommand to the runbook command.
func withRunbookPD(cmd *cobra.Command, io *IOStreams) *cobra.Command {
	cmd.AddCommand(newRunbookPDCmd(io, nil))
	return cmd
}

func newRunbookPDCmd(io *IOStreams, runF func(*cobra.Command, *RunbookPDOptions) error) *cobra.Command {
	opts := &RunbookPDOptions{IO: io}
	cmd := &cobra.Command{
		Use:   "pd",
		Short: "Qualify prefill/decode disaggregation: launch, direct proof, apply, read back, deliver, hand-off evidence, hash parity, route, clean up",
		Long: `Run the P/D runbook: prefill and decode workers behind one rule with
pd_disagg_mode (and kvExactMode 1 with --kv-exact). Each step ends PASS, FAIL,
BLOCKED or SKIPPED with a reason and evidence files under <out>/runs/<run-id>/:

  1 select tuple                 engine x profile from the catalog; known-BLOCKED stops here
  2 launch workers               prefill p1..pN, decode d1..dM (SGLang prefills with their
                                 bootstrap servers, each endpoint's own bootstrapPort)
  3 prove direct inference       each worker answers a nonce request, receipt kept
  4 apply rule                   pd_disagg_mode, ep_role 1/2, optional kvExactMode 1
  5 read back                    effective rule equals the applied one; readiness holds
  6 deliver through the gateway  JSON and SSE answered by a decode; one prefill and one
                                 decode receipt per request; negatives leave no receipt
  7 hand-off evidence            both legs carried one request id; vLLM prefill leg
                                 max_tokens 1 and its NIXL hand-off carried; SGLang same
                                 bootstrap triple (room) on both legs; TRT-LLM context_only
                                 then generation_only with the context state
  8 hash parity                  --kv-exact: the gateway's canary hashes are published by a
                                 prefill, a one-token red arm misses
  9 routing evidence             --kv-exact: follow-ups pick the warmed prefill, cached
                                 tokens rise; else the routed prefill matches the receipts
 10 cleanup                      always, also on FAIL and Ctrl-C

Launchers: sim (default), attach (--prefill-endpoints and --decode-endpoints);
docker cannot start P/D roles yet and is recorded BLOCKED (launcher_no_pd_roles).

Output: as 'llmgw runbook converged' (-o table, json or yaml; kind RunbookRun).

Exit codes: 0 every step PASS, 3 some step FAIL, 4 BLOCKED, 130 interrupted
(cleanup done first), 2 bad flags (nothing started).`,
		Example: `  # simulated vLLM prefill/decode, KV-exact prefill scoring
  llmgw runbook pd --engine vllm --kv-exact

  # SGLang persona: bootstrap rooms
  llmgw runbook pd --engine sglang`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if opts.Plan != "" {
				if err := applyPlanPD(cmd, opts, opts.Plan); err != nil {
					return err
				}
			}
			if runF != nil {
				return runF(cmd, opts)
			}
			return runbookPDRun(cmd, opts)
		},
	}
	f := cmd.Flags()
	f.StringVar(&opts.Engine, "engine", pd.DefaultEngine, "engine: vllm, sglang or trtllm")
	f.StringVar(&opts.Profile, "profile", pd.DefaultProfile, "catalog profile ID (see 'llmgw profiles list')")
	f.BoolVar(&opts.KVExact, "kv-exact", false, "kvExactMode 1: KV-exact scoring of the prefill endpoints, with the hash-parity gate")
	f.StringVar(&opts.KVTokenizer, "kv-tokenizer", "", "with --kv-exact: the rule's kvTokenizer (a tokenizer.json or .gguf path, a models directory, or engine); \"\" = the simulators' Qwen3 tokenizer with --launcher sim, else engine")
	f.IntVar(&opts.Prefill, "prefill", pd.DefaultPrefill, "prefill workers (attach: the number of --prefill-endpoints)")
	f.IntVar(&opts.Decode, "decode", pd.DefaultDecode, "decode workers (attach: the number of --decode-endpoints)")
	f.StringVar(&opts.Launcher, "launcher", results.LauncherSim, "how workers are obtained: sim, docker or attach")
	f.StringVar(&opts.PrefillEndpoints, "prefill-endpoints", "", "attach: running prefill workers as host:port,...")
	f.StringVar(&opts.DecodeEndpoints, "decode-endpoints", "", "attach: running decode workers as host:port,...")
	f.StringVar(&opts.BootstrapPort, "bootstrap-port", "", "attach, sglang: the prefills' bootstrap port when they do not report it, one for all or one per --prefill-endpoints entry (P or P1,P2,...; default 8998)")
	f.StringVar(&opts.KVEvents, "kv-events", "", "attach, --kv-exact: the prefills' KV event endpoints as tcp://host:port,... (one per --prefill-endpoints entry; default: what a simulator reports, else the rule's kvZmqPort)")
	addLabFlags(f, &opts.Gateway, &opts.GatewayTokenFile, &opts.Out)
	f.DurationVar(&opts.HealthTimeout, "health-timeout", 0, "how long workers may take to become healthy (default 60s)")
	f.BoolVar(&opts.AcceptVersionMismatch, "accept-version-mismatch", false, "qualify real workers that report an engine version other than the catalog tuple's (the mismatch stays on the row)")
	addLabLogFlag(f, &opts.LogLevel)
	f.StringVar(&opts.Plan, "plan", "", "take engine, profile, prefill/decode endpoints, each prefill's bootstrap port and KV event endpoint, and the KV-exact stage's kvTokenizer from 'llmgw plan -o json' output")
	addLabOutputFlag(cmd, &opts.Output)
	completeFlag(cmd, "engine", fixedCompletion(pd.Engines...))
	completeFlag(cmd, "profile", completeProfiles)
	completeFlag(cmd, "launcher", fixedCompletion(results.LauncherSim, results.LauncherAttach))
	return cmd
}

// pdOptions validates the flags; every error is a usage error.
func pdOptions(o *RunbookPDOptions) (*pd.Options, error) {
	logger, err := labLogger(o.IO, o.LogLevel)
	if err != nil {
		return nil, err
	}
	po := &pd.Options{
		Engine: o.Engine, Profile: o.Profile, KVExact: o.KVExact, Prefill: o.Prefill, Decode: o.Decode, GatewayAdmin: o.Gateway,
		HealthTimeout: o.HealthTimeout, Logger: logger, AcceptVersionMismatch: o.AcceptVersionMismatch, Tokenizer: o.KVTokenizer,
	}
	if (o.PrefillEndpoints != "" || o.DecodeEndpoints != "" || o.BootstrapPort != "" || o.KVEvents != "") && o.Launcher != results.LauncherAttach {
		return nil, usageErrorf("--prefill-endpoints, --decode-endpoints, --bootstrap-port and --kv-events need --launcher attach (got --launcher %s)", o.Launcher)
	}
	switch o.Launcher {
	case results.LauncherSim:
		po.Launcher = &pd.Sim{}
	case results.LauncherDocker:
		po.Launcher = &pd.Unsupported{Kind: results.LauncherDocker, Code: "launcher_no_pd_roles",
			Detail: "the docker launcher starts converged workers only; P/D roles are not wired into it yet"}
	case results.LauncherAttach:
		if o.PrefillEndpoints == "" || o.DecodeEndpoints == "" {
			return nil, usageErrorf("--launcher attach needs --prefill-endpoints and --decode-endpoints host:port,...")
		}
		pe, err := launcher.ParseEndpoints(o.PrefillEndpoints)
		if err != nil {
			return nil, usageErrorf("--prefill-endpoints: %v", err)
		}
		de, err := launcher.ParseEndpoints(o.DecodeEndpoints)
		if err != nil {
			return nil, usageErrorf("--decode-endpoints: %v", err)
		}
		att := &pd.Attach{Prefill: pe, Decode: de}
		if o.BootstrapPort != "" {
			var ports []int
			for _, f := range strings.Split(o.BootstrapPort, ",") {
				n, err := strconv.Atoi(strings.TrimSpace(f))
				if err != nil || n < 1 || n > 65535 {
					return nil, usageErrorf("--bootstrap-port %q: want a port 1..65535, or one per --prefill-endpoints entry", o.BootstrapPort)
				}
				ports = append(ports, n)
			}
			switch len(ports) {
			case 1:
				att.BootstrapPort = ports[0]
			case len(pe):
				att.BootstrapPorts = ports
			default:
				return nil, usageErrorf("--bootstrap-port lists %d ports for %d --prefill-endpoints (give one for all, or one each)", len(ports), len(pe))
			}
		}
		if o.KVEvents != "" {
			for _, e := range strings.Split(o.KVEvents, ",") {
				if e = strings.TrimSpace(e); !strings.HasPrefix(e, "tcp://") {
					return nil, usageErrorf("--kv-events %q: want tcp://host:port,...", o.KVEvents)
				}
				att.Events = append(att.Events, strings.TrimSpace(e))
			}
			if len(att.Events) != len(pe) {
				return nil, usageErrorf("--kv-events lists %d endpoints for %d --prefill-endpoints", len(att.Events), len(pe))
			}
		}
		po.Prefill, po.Decode = len(pe), len(de)
		po.Launcher = att
	default:
		return nil, usageErrorf("--launcher %q: valid launchers are %s", o.Launcher, strings.Join(launcherNames, ", "))
	}
	if po.GatewayToken, err = labGatewayToken(o.Gateway, o.GatewayTokenFile); err != nil {
		return nil, err
	}
	po.GatewayTokenFile = o.GatewayTokenFile
	if err := labValidated(po.Validate(), pd.ErrInvalid); err != nil {
		return nil, err
	}
	return po, nil
}

func runbookPDRun(cmd *cobra.Command, o *RunbookPDOptions) error {
	po, err := pdOptions(o)
	if err != nil {
		return err
	}
	return runLab(cmd, o.IO, o.Out, o.Output, func(ctx context.Context, store *results.Store, prog runbook.Progress) (runbook.Report, error) {
		return pd.Execute(ctx, po, store, o.Out, prog)
	})
}
