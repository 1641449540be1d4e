package cli

import (
	"context"
	"fmt"
	"net"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/cobra"
	"k8s.io/client-go/kubernetes"

	"github.com/llmgw/llmgw/k8s"
	"github.com/llmgw/llmgw/results"
	"github.com/llmgw/llmgw/runbook"
	"github.com/llmgw/llmgw/runbook/converged"
	"github.com/llmgw/llmgw/runbook/launcher"
)

// RunbookOptions are the inputs of `llmgw runbook converged`.
type RunbookOptions struct {
	IO                    *IOStreams
	Engine                string
	Profile               string
	Mode                  string
	Workers               int
	workersSet            bool
	Launcher              string
	Endpoints             string
	EndpointsFrom         string
	Kubeconfig            string
	KVEvents              string
	KVTokenizer           string
	AcceptVersionMismatch bool
	Gateway               string
	GatewayTokenFile      string
	Out                   string
	ImageOverrides        []string
	DockerNetwork         string
	HealthTimeout         time.Duration
	LogLevel              string
	// Plan is an 'llmgw plan -o json' file the tuple is taken from.
	Plan string
	// Output is -o: table, json or yaml.
	Output string
}

// launcherNames are the valid --launcher values.
var launcherNames = []string{results.LauncherSim, results.LauncherDocker, results.LauncherAttach}

func newRunbookCmd(io *IOStreams, runF func(*cobra.Command, *RunbookOptions) error) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "runbook",
		Short: "Run an ordered, evidence-backed deployment runbook",
		Args:  cobra.NoArgs,
		RunE:  func(cmd *cobra.Command, _ []string) error { return cmd.Help() },
	}
	opts := &RunbookOptions{IO: io}
	conv := &cobra.Command{
		Use:   "converged",
		Short: "Qualify N converged workers behind one rule: launch, direct proof, apply, read back, deliver, route, drain, clean up",
		Long: `Run the converged runbook. Each step ends PASS, FAIL, BLOCKED or SKIPPED with a
reason and evidence files, recorded under <out>/runs/<run-id>/ (see 'llmgw
results'):

  1 select tuple                 engine x profile x mode from the catalog; a known-BLOCKED
                                 tuple stops here with its reason code, nothing launched
  2 launch workers               through --launcher; health and /v1/models wait
  3 prove direct inference       each worker answers a nonce request and its receipt is kept
  4 apply rule                   on the embedded gateway, or --gateway's admin API
  5 read back                    effective rule equals what was applied; readiness holds
  6 deliver through the gateway  JSON and SSE correlated with worker receipts; negative
                                 requests (unknown model, malformed body) leave no receipt
  7 hash parity                  mode exact only: the gateway's block hashes of a canary
                                 are among those the worker publishes, a one-token red
                                 arm misses
  8 routing evidence             rr spread, chwbl stickiness, or exact: a same-prefix
                                 follow-up lands on the warmed worker, cached tokens rise
  9 drain                        in-flight reaches 0, the drained worker gets nothing new
 10 cleanup                      always, also on FAIL and Ctrl-C

Launchers:
  sim     in-process simulators on kernel-chosen loopback ports (default)
  docker  containers through the local docker daemon; the image comes from the
          profile, never pulled. --image-override sim=IMAGE runs 'llmgw sim' workers
          from an image of this binary instead (GPU-free). No daemon, no GPU or no
          image is BLOCKED (no_docker, no_gpu, image_unavailable). A simulator image:
            d=$(mktemp -d) && CGO_ENABLED=0 go build -o $d/llmgw ./cmd/llmgw &&
            printf 'FROM scratch\nCOPY llmgw /llmgw\nENTRYPOINT ["/llmgw"]\n' > $d/Dockerfile &&
            docker build -t llmgw-sim:test $d
  attach  --endpoints host:port,... already running; nothing launched or stopped
          --endpoints-from kubernetes:NAMESPACE/SERVICE takes them instead from the
          Service's ready EndpointSlice addresses at launch (the discovery of a rule's
          endpoints_from; pods' llmgw.io/kv-events-endpoint annotations give --kv-events)

llamacpp has no KV events: --mode exact with --engine llamacpp is a usage error.

Output: progress on standard error; the run's detail and summary row on
standard output, as tables sized to the terminal (-o table, tab-separated when
not a terminal) or one document (-o json, -o yaml: kind RunbookRun, the run
as 'llmgw results show -o json' prints it and its summary row).

Exit codes: 0 every step PASS, 3 some step FAIL, 4 BLOCKED, 130 interrupted
(cleanup done first), 2 bad flags (nothing started). What a run owns is
recorded under <out>/owned/ until cleaned up; 'llmgw cleanup' removes leftovers.`,
		Example: `  # simulated vLLM workers, KV-exact, embedded gateway
  llmgw runbook converged

  # SGLang persona, round robin, 2 workers
  llmgw runbook converged --engine sglang --mode rr --workers 2

  # sim workers in containers built from this binary
  llmgw runbook converged --launcher docker --image-override sim=llmgw-sim:test

  # workers and a gateway that already run
  llmgw runbook converged --launcher attach --endpoints 10.0.0.5:8000,10.0.0.6:8000 --gateway http://10.0.0.2:8081

  # workers behind a Kubernetes Service
  llmgw runbook converged --launcher attach --endpoints-from kubernetes:llm/vllm --gateway http://10.0.0.2:8081`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			opts.workersSet = cmd.Flags().Changed("workers")
			if opts.Plan != "" {
				if err := applyPlanConverged(cmd, opts, opts.Plan); err != nil {
					return err
				}
			}
			if runF != nil {
				return runF(cmd, opts)
			}
			return runbookConvergedRun(cmd, opts)
		},
	}
	f := conv.Flags()
	f.StringVar(&opts.Engine, "engine", converged.DefaultEngine, "engine: vllm, sglang, trtllm or llamacpp")
	f.StringVar(&opts.Profile, "profile", converged.DefaultProfile, "catalog profile ID (see 'llmgw profiles list')")
	f.StringVar(&opts.Mode, "mode", "", "routing mode: rr, chwbl or exact (default "+converged.DefaultMode+"; "+converged.DefaultModeNoKV+" for an engine without KV events)")
	f.IntVar(&opts.Workers, "workers", converged.DefaultWorkers, "number of workers (attach: defaults to the number of --endpoints)")
	f.StringVar(&opts.Launcher, "launcher", results.LauncherSim, "how workers are obtained: sim, docker or attach")
	f.StringVar(&opts.Endpoints, "endpoints", "", "attach: running workers as host:port,...")
	f.StringVar(&opts.EndpointsFrom, "endpoints-from", "", "attach: take the workers from a Service's ready EndpointSlice addresses, kubernetes:NAMESPACE/SERVICE (the set at launch; a pod's llmgw.io/kv-events-endpoint annotation gives its KV events)")
	f.StringVar(&opts.Kubeconfig, "kubeconfig", "", "kubeconfig for --endpoints-from (default $KUBECONFIG, ~/.kube/config, else the in-cluster service account)")
	f.StringVar(&opts.KVEvents, "kv-events", "", "attach, mode exact: the workers' KV event endpoints as tcp://host:port,... (one per --endpoints entry; default: what a simulator reports, else the rule's kvZmqPort)")
	f.BoolVar(&opts.AcceptVersionMismatch, "accept-version-mismatch", false, "qualify real workers that report an engine version other than the catalog tuple's (the mismatch stays on the row)")
	f.StringVar(&opts.KVTokenizer, "kv-tokenizer", "", "exact mode: the rule's kvTokenizer (a tokenizer.json or .gguf path, a models directory, or engine); \"\" = the simulators' Qwen3 tokenizer with --launcher sim, else engine")
	addLabFlags(f, &opts.Gateway, &opts.GatewayTokenFile, &opts.Out)
	f.StringSliceVar(&opts.ImageOverrides, "image-override", nil, "docker: KEY=IMAGE with KEY an engine or sim (repeatable)")
	f.StringVar(&opts.DockerNetwork, "docker-network", "", "docker: join this network instead of creating one for the run")
	f.DurationVar(&opts.HealthTimeout, "health-timeout", 0, "how long workers may take to become healthy (default 60s; docker 10m)")
	addLabLogFlag(f, &opts.LogLevel)
	f.StringVar(&opts.Plan, "plan", "", "take engine, profile, attached endpoints, their KV event endpoints, the KV-exact stage's kvTokenizer and (without --mode) stage 1's mode from 'llmgw plan -o json' output")
	addLabOutputFlag(conv, &opts.Output)
	completeFlag(conv, "engine", completeEngines())
	completeFlag(conv, "profile", completeProfiles)
	completeFlag(conv, "mode", fixedCompletion(converged.Modes...))
	completeFlag(conv, "launcher", fixedCompletion(launcherNames...))
	cmd.AddCommand(conv)
	return cmd
}

// convergedOptions validates the flags and builds the runbook options.
// Every error is a usage error: nothing has been started yet.
func convergedOptions(o *RunbookOptions) (*converged.Options, error) {
	logger, err := labLogger(o.IO, o.LogLevel)
	if err != nil {
		return nil, err
	}
	co := &converged.Options{
		Engine: o.Engine, Profile: o.Profile, Mode: o.Mode, Workers: o.Workers, GatewayAdmin: o.Gateway,
		HealthTimeout: o.HealthTimeout, Logger: logger, AcceptVersionMismatch: o.AcceptVersionMismatch, Tokenizer: o.KVTokenizer,
	}
	if o.Workers < 1 || o.Workers > 64 {
		return nil, usageErrorf("--workers %d: want 1..64", o.Workers)
	}
	if o.Endpoints != "" && o.Launcher != results.LauncherAttach {
		return nil, usageErrorf("--endpoints needs --launcher attach (got --launcher %s)", o.Launcher)
	}
	if o.EndpointsFrom != "" && o.Launcher != results.LauncherAttach {
		return nil, usageErrorf("--endpoints-from needs --launcher attach (got --launcher %s)", o.Launcher)
	}
	if len(o.ImageOverrides) > 0 && o.Launcher != results.LauncherDocker {
		return nil, usageErrorf("--image-override needs --launcher docker (got --launcher %s)", o.Launcher)
	}
	if o.DockerNetwork != "" && o.Launcher != results.LauncherDocker {
		return nil, usageErrorf("--docker-network needs --launcher docker (got --launcher %s)", o.Launcher)
	}
	switch o.Launcher {
	case results.LauncherSim:
		co.Launcher = &launcher.Sim{}
	case results.LauncherDocker:
		ov, err := launcher.ParseImageOverrides(o.ImageOverrides)
		if err != nil {
			return nil, usageErrorf("%v", err)
		}
		co.Launcher = &launcher.Docker{ImageOverride: ov, Network: o.DockerNetwork}
		if co.HealthTimeout == 0 {
			co.HealthTimeout = 10 * time.Minute // real engines load weights first
			if ov[launcher.SimImageKey] != "" {
				co.HealthTimeout = time.Minute
			}
		}
	case results.LauncherAttach:
		var eps, discoveredEvents []string
		switch {
		case o.Endpoints != "" && o.EndpointsFrom != "":
			return nil, usageErrorf("--endpoints and --endpoints-from exclude each other")
		case o.EndpointsFrom != "":
			if eps, discoveredEvents, err = attachFromCluster(o.EndpointsFrom, o.Kubeconfig); err != nil {
				return nil, err
			}
		case o.Endpoints == "":
			return nil, usageErrorf("--launcher attach needs --endpoints host:port,... or --endpoints-from kubernetes:NAMESPACE/SERVICE")
		default:
			if eps, err = launcher.ParseEndpoints(o.Endpoints); err != nil {
				return nil, usageErrorf("--endpoints: %v", err)
			}
		}
		if o.workersSet && o.Workers != len(eps) {
			return nil, usageErrorf("--workers %d conflicts with %d --endpoints", o.Workers, len(eps))
		}
		co.Workers = len(eps)
		var evs []string
		if o.KVEvents != "" {
			for _, e := range strings.Split(o.KVEvents, ",") {
				if e = strings.TrimSpace(e); !strings.HasPrefix(e, "tcp://") {
					return nil, usageErrorf("--kv-events %q: want tcp://host:port,...", o.KVEvents)
				}
				evs = append(evs, strings.TrimSpace(e))
			}
			if len(evs) != len(eps) {
				return nil, usageErrorf("--kv-events lists %d endpoints for %d --endpoints", len(evs), len(eps))
			}
		}
		if evs == nil {
			evs = discoveredEvents
		}
		co.Launcher = &launcher.Attach{Endpoints: eps, Events: evs}
	default:
		return nil, usageErrorf("--launcher %q: valid launchers are %s", o.Launcher, strings.Join(launcherNames, ", "))
	}
	if co.GatewayToken, err = labGatewayToken(o.Gateway, o.GatewayTokenFile); err != nil {
		return nil, err
	}
	co.GatewayTokenFile = o.GatewayTokenFile
	if err := labValidated(co.Validate(), converged.ErrInvalid); err != nil {
		return nil, err
	}
	return co, nil
}

// attachFromCluster resolves --endpoints-from through the same discovery
// as a rule's endpoints_from: the Service's ready addresses now, as
// host:port, and their KV event endpoints when every pod's annotation
// names one (otherwise none: the rule's convention applies).
func attachFromCluster(ref, kubeconfig string) (eps, events []string, err error) {
	from, err := k8s.ParseServiceRef(ref)
	if err != nil {
		return nil, nil, usageErrorf("--endpoints-from: %v", err)
	}
	cfg, err := k8s.RESTConfig(kubeconfig)
	if err != nil {
		return nil, nil, usageErrorf("--endpoints-from: %v", err)
	}
	cs, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return nil, nil, usageErrorf("--endpoints-from: %v", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	found, err := k8s.Resolve(ctx, cs, from)
	if err != nil {
		return nil, nil, fmt.Errorf("--endpoints-from %s: %w", ref, err)
	}
	if len(found) == 0 {
		return nil, nil, fmt.Errorf("--endpoints-from %s: no ready endpoint", ref)
	}
	all := true
	for _, e := range found {
		eps = append(eps, net.JoinHostPort(e.EndpointIP, strconv.Itoa(e.TargetPort)))
		events = append(events, e.KVEventsEndpoint)
		all = all && e.KVEventsEndpoint != ""
	}
	if !all {
		events = nil
	}
	return eps, events, nil
}

func runbookConvergedRun(cmd *cobra.Command, o *RunbookOptions) error {
	co, err := convergedOptions(o)
	if err != nil {
		return err
	}
	return runLab(cmd, o.IO, o.Out, o.Output, func(ctx context.Context, store *results.Store, prog runbook.Progress) (runbook.Report, error) {
		return converged.Execute(ctx, co, store, o.Out, prog)
	})
}

// runbookExit maps a run to its exit code: interrupted 130 (cleanup has
// run), any FAIL 3, any BLOCKED 4, all PASS 0; a run that proved nothing
// (NOT_RUN) is an error.
func runbookExit(rep runbook.Report) error {
	switch {
	case rep.Interrupted:
		return &ExitCodeError{Code: ExitCancelled, Err: fmt.Errorf("runbook %s interrupted; cleanup done, partial results kept", rep.Summary.ID)}
	case rep.Summary.Verdict == results.StatusPass:
		return nil
	case rep.Summary.Verdict == results.StatusFail:
		return &ExitCodeError{Code: ExitFail, Err: fmt.Errorf("runbook %s: FAIL", rep.Summary.ID)}
	case rep.Summary.Verdict == results.StatusBlocked:
		return &ExitCodeError{Code: ExitBlocked, Err: fmt.Errorf("runbook %s: BLOCKED (%s)", rep.Summary.ID, rep.Summary.ReasonCode)}
	}
	return &ExitCodeError{Code: ExitError, Err: fmt.Errorf("runbook %s: %s: no step passed", rep.Summary.ID, rep.Summary.Verdict.Norm())}
}
