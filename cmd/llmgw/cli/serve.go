package cli

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/spf13/cobra"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/rest"

	"github.com/llmgw/llmgw/gateway"
	"github.com/llmgw/llmgw/gateway/rule"
	"github.com/llmgw/llmgw/k8s"
)

// ServeOptions are the inputs of `llmgw serve`.
type ServeOptions struct {
	IO             *IOStreams
	Listen         string
	Admin          string
	StateDir       string
	RulesFile      string
	AdminTokenFile string
	MaxBodyBytes   int
	KVMaxBlocks    int
	KVTokenCache   int
	WriteTimeout   time.Duration
	BufferBudget   int64
	ReleaseIdle    bool
	TLSCert        string
	TLSKey         string
	LogLevel       string
	LogPayloads    bool
	Pprof          bool
	// Procs is GOMAXPROCS for the process; 0 keeps the runtime's choice.
	Procs int
	// DataPlane is gateway.Config.DataPlane ("" the default), Loops its
	// event loops (0 the default).
	DataPlane string
	Loops     int
	// IOURing is the negation of gateway.Config.NoIOURing.
	IOURing bool
	// EndpointsSource "" or "kubernetes": where rules with endpoints_from
	// discover their endpoints; Kubeconfig is its client configuration.
	EndpointsSource string
	Kubeconfig      string
	// RulesFrom "" (local disk) or "kubernetes" (Rule objects in
	// RulesNamespace).
	RulesFrom      string
	RulesNamespace string
	// ReadyzStrict is gateway.Config.ReadyzStrict.
	ReadyzStrict bool
	// DrainWindow is how long the data plane keeps accepting after
	// SIGTERM, with /readyz unready; ShutdownTimeout how long in-flight
	// requests then get.
	DrainWindow     time.Duration
	ShutdownTimeout time.Duration
	// AllowAdminRuleWrites lets the admin API write rules under
	// --rules-from kubernetes.
	AllowAdminRuleWrites bool
}

// Stop defaults. Kubernetes' default terminationGracePeriodSeconds is 30 s:
// the pod gets SIGKILL 30 s after it is marked terminating. The drain
// window takes 20 s of it, which covers the endpoint removal reaching
// every node's kube-proxy and every Ingress or mesh (seconds, more on a
// busy cluster); the in-flight requests and streams then get 8 s; 2 s are
// left for the exit itself.
const (
	defaultDrainWindow     = 20 * time.Second
	defaultShutdownTimeout = 8 * time.Second
)

func newServeCmd(io *IOStreams, runF func(*cobra.Command, *ServeOptions) error) *cobra.Command {
	opts := &ServeOptions{IO: io}
	cmd := &cobra.Command{
		Use:   "serve",
		Short: "Run the gateway: OpenAI-compatible proxy, management API and metrics",
		Long: `Run the gateway.

The data plane listens on --listen and routes POST /v1/chat/completions and
POST /v1/completions by the body's "model" to the rule whose model_name
matches (a rule with model_name "" is the default). A rule with its own
"listen" address gets its own listener.

The management API listens on --admin (loopback by default): create rules with
'llmgw rule apply -f rule.yaml' or POST /v1/rules, read them back with
'llmgw rule get NAME'. Rules persist in --state-dir and survive restarts, even
kill -9. Metrics are at GET /metrics on the admin listener.

--rules FILE applies (creates or updates) the rules in FILE at start; a rule
that fails admission stops the start with the reason.

Readiness: GET /readyz on the admin listener is 200 while any rule can
serve (the body names the rules that cannot; --readyz-strict requires every
rule), 503 until the rules given at start (the state directory, --rules,
--rules-from kubernetes) are installed, and 503 from SIGTERM on.
GET /readyz?model=NAME asks for one model.

Stopping: on SIGTERM or SIGINT /readyz turns 503 at once; the data plane
keeps accepting and serving for --drain-window (each answer closes its
connection, so clients reconnect to another replica); then it stops
accepting and requests and streams in flight get --shutdown-timeout to
finish. A second SIGTERM or SIGINT ends the drain window at once.

--procs sets how many threads run Go code at once (GOMAXPROCS). Go's
default is one per CPU the process may use. On a CPU shared with busy
neighbours (an engine or another proxy pinned to the same core) a second
thread keeps the gateway's fair share of that CPU, as a second nginx worker
does, at a price: the collector's stop-the-world pauses then wait for the
kernel to run both threads, which lengthens the latency tail under an open
load. BENCHMARKS.md measures both.`,
		Example: `  # two local workers behind one gateway
  llmgw sim --engine vllm --listen 127.0.0.1:8001 &
  llmgw sim --engine vllm --listen 127.0.0.1:8002 &
  llmgw serve --state-dir /tmp/llmgw --rules examples/two-workers.yaml
  curl -s localhost:8080/v1/chat/completions -d '{"model":"Qwen/Qwen3-0.6B","messages":[{"role":"user","content":"hi"}]}'`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if runF != nil {
				return runF(cmd, opts)
			}
			return serveRun(cmd, opts)
		},
	}
	f := cmd.Flags()
	f.StringVar(&opts.Listen, "listen", "127.0.0.1:8080", "data-plane address (host:port; port 0 picks a free one)")
	f.StringVar(&opts.Admin, "admin", "127.0.0.1:8081", "management API address; a non-loopback address needs --admin-token-file")
	f.StringVar(&opts.StateDir, "state-dir", defaultStateDir(), "directory where rules are persisted")
	f.StringVar(&opts.RulesFile, "rules", "", "YAML or JSON file of rules to apply at start (one rule, a list, or rules: [...])")
	f.StringVar(&opts.AdminTokenFile, "admin-token-file", "", "file holding the bearer token required for mutating admin calls")
	f.IntVar(&opts.MaxBodyBytes, "max-body-bytes", 8<<20, "largest accepted request body; larger bodies get 413")
	f.IntVar(&opts.KVMaxBlocks, "kv-max-blocks", 1<<20, "KV-exact inventory cap per endpoint, in blocks (least recently stored blocks are dropped beyond it)")
	f.IntVar(&opts.KVTokenCache, "kv-token-cache-bytes", gateway.DefaultKVTokenCacheBytes, "memory each KV-exact rule's token cache takes once full, in bytes: an arena outside the Go heap holding tokenized prompt segments (or /tokenize answers for kvTokenizer engine); a segment asked for again stays, others go oldest first")
	f.DurationVar(&opts.WriteTimeout, "write-timeout", gateway.DefaultWriteTimeout, "longest a response write to a client may block; a streaming client that stops reading is cut off and its worker request cancelled after it")
	f.Int64Var(&opts.BufferBudget, "buffer-budget-bytes", gateway.DefaultBufferBudget, "memory all buffered response bodies together may hold; beyond it answers stream through, or get 503 when they cannot")
	f.BoolVar(&opts.ReleaseIdle, "release-idle-buffers", false, "give an idle keep-alive client connection's read and write buffers back until its next request: about 10 KB of memory per idle connection instead of about 22 KB, for about two more system calls per request (the first byte of each request is read alone)")
	f.StringVar(&opts.TLSCert, "tls-cert", "", "PEM certificate for TLS on the data plane (with --tls-key)")
	f.StringVar(&opts.TLSKey, "tls-key", "", "PEM private key for TLS on the data plane (with --tls-cert)")
	f.StringVar(&opts.LogLevel, "log-level", "info", "log level: debug, info, warn or error")
	f.BoolVar(&opts.LogPayloads, "log-payloads", false, "log prompt and completion bodies at debug level (off: payloads may hold personal data)")
	f.IntVar(&opts.Procs, "procs", 0, "OS threads running Go code at once (GOMAXPROCS); 0 keeps Go's choice: the CPUs this process may run on, or its container's CPU limit")
	f.StringVar(&opts.DataPlane, "data-plane", "", `how client connections are served: "loop" (event loops, each on a thread of its own; the default on Linux without --tls-cert) or "goroutine" (a goroutine per connection; the default elsewhere and with --tls-cert). The loop plane hands to the goroutine plane every connection whose request it does not serve itself (P/D and KV-exact rules, backend TLS, host-name endpoints, HTTP/1.0, chunked request bodies, requests the gateway refuses)`)
	f.IntVar(&opts.Loops, "loops", 0, "event loops of the loop plane; 0: one per CPU this process may run on, at most --procs")
	f.BoolVar(&opts.IOURing, "io-uring", true, "the loop plane submits the requests of each loop turn to the workers together, in one io_uring_enter(2), where the kernel offers io_uring (it falls back to a write(2) each, and logs why, where not); false: always a write(2) each")
	f.BoolVar(&opts.Pprof, "pprof", false, "serve Go profiles at /debug/pprof/ on the admin listener (behind the admin token when one is set)")
	f.StringVar(&opts.EndpointsSource, "endpoints-source", "", `"kubernetes": rules with endpoints_from discover their endpoints from the cluster's EndpointSlices or pods ("" refuses such rules)`)
	f.StringVar(&opts.Kubeconfig, "kubeconfig", "", "kubeconfig for --endpoints-source kubernetes (default $KUBECONFIG, ~/.kube/config, else the in-cluster service account)")
	f.StringVar(&opts.RulesFrom, "rules-from", "", `"kubernetes": apply the Rule objects (group llmgw.io, kind Rule: rules.llmgw.io) of --rules-namespace with the same admission and write each verdict to its status; the admin API then refuses rule writes (409 rules_managed); "" keeps rules on local disk only`)
	f.BoolVar(&opts.AllowAdminRuleWrites, "allow-admin-rule-writes", false, "with --rules-from kubernetes, let the admin API create, replace and delete rules too (a rule no Rule object names is deleted at the next start)")
	f.StringVar(&opts.RulesNamespace, "rules-namespace", "default", "namespace of the Rule objects read by --rules-from kubernetes")
	f.BoolVar(&opts.ReadyzStrict, "readyz-strict", false, "/readyz is ready only while every rule can serve (default: while any rule can; the body names those that cannot)")
	f.DurationVar(&opts.DrainWindow, "drain-window", defaultDrainWindow, "after SIGTERM, how long the data plane keeps accepting and serving while /readyz says 503, so that load balancers stop sending first; the default is Kubernetes' default terminationGracePeriodSeconds (30s) less --shutdown-timeout's default (8s) and 2s for the exit; with a longer grace period, raise it with the period (0: stop accepting at once)")
	f.DurationVar(&opts.ShutdownTimeout, "shutdown-timeout", defaultShutdownTimeout, "after the drain window, how long requests and streams in flight get to finish before they are cut")
	return cmd
}

func defaultStateDir() string {
	if d, err := os.UserHomeDir(); err == nil {
		return filepath.Join(d, ".local", "state", "llmgw")
	}
	return ".llmgw-state"
}

func parseLogLevel(s string) (slog.Level, error) {
	var l slog.Level
	if err := l.UnmarshalText([]byte(s)); err != nil {
		return 0, usageErrorf("--log-level %q: want debug, info, warn or error", s)
	}
	return l, nil
}

func serveRun(cmd *cobra.Command, opts *ServeOptions) error {
	level, err := parseLogLevel(opts.LogLevel)
	if err != nil {
		return err
	}
	if opts.MaxBodyBytes <= 0 {
		return usageErrorf("--max-body-bytes must be positive, got %d", opts.MaxBodyBytes)
	}
	if opts.WriteTimeout <= 0 {
		return usageErrorf("--write-timeout must be positive, got %v", opts.WriteTimeout)
	}
	if opts.BufferBudget <= 0 {
		return usageErrorf("--buffer-budget-bytes must be positive, got %d", opts.BufferBudget)
	}
	if opts.KVTokenCache <= 0 {
		return usageErrorf("--kv-token-cache-bytes must be positive, got %d", opts.KVTokenCache)
	}
	if opts.KVMaxBlocks <= 0 {
		return usageErrorf("--kv-max-blocks must be positive, got %d", opts.KVMaxBlocks)
	}
	if opts.Procs < 0 {
		return usageErrorf("--procs must be 0 (Go's choice) or positive, got %d", opts.Procs)
	}
	if opts.Loops < 0 {
		return usageErrorf("--loops must be 0 (one per CPU) or positive, got %d", opts.Loops)
	}
	if opts.DrainWindow < 0 {
		return usageErrorf("--drain-window must be 0 or positive, got %v", opts.DrainWindow)
	}
	if opts.ShutdownTimeout <= 0 {
		return usageErrorf("--shutdown-timeout must be positive, got %v", opts.ShutdownTimeout)
	}
	switch opts.DataPlane {
	case "", gateway.PlaneLoop, gateway.PlaneGoroutine:
	default:
		return usageErrorf("--data-plane %q: want %q or %q", opts.DataPlane, gateway.PlaneLoop, gateway.PlaneGoroutine)
	}
	if opts.Procs > 0 {
		runtime.GOMAXPROCS(opts.Procs)
	}
	log := slog.New(slog.NewTextHandler(opts.IO.ErrOut, &slog.HandlerOptions{Level: level}))
	var token string
	if opts.AdminTokenFile != "" {
		b, err := os.ReadFile(opts.AdminTokenFile)
		if err != nil {
			return usageErrorf("--admin-token-file: %v", err)
		}
		token = strings.TrimSpace(string(b))
		if token == "" {
			return usageErrorf("--admin-token-file %s is empty", opts.AdminTokenFile)
		}
	}
	var initial []*rule.Rule
	if opts.RulesFile != "" {
		b, err := os.ReadFile(opts.RulesFile)
		if err != nil {
			return usageErrorf("--rules: %v", err)
		}
		if initial, err = decodeRules(b); err != nil {
			return usageErrorf("--rules %s: %v", opts.RulesFile, err)
		}
	}
	switch opts.RulesFrom {
	case "":
	case "kubernetes":
		if opts.RulesFile != "" {
			return usageErrorf("--rules and --rules-from kubernetes exclude each other: the cluster's Rule objects are the rules")
		}
	default:
		return usageErrorf("--rules-from %q: want kubernetes or nothing", opts.RulesFrom)
	}
	if opts.AllowAdminRuleWrites && opts.RulesFrom != "kubernetes" {
		return usageErrorf("--allow-admin-rule-writes goes with --rules-from kubernetes (without it the admin API writes rules anyway)")
	}
	var kcfg *rest.Config
	if opts.EndpointsSource != "" || opts.RulesFrom != "" {
		if kcfg, err = k8s.RESTConfig(opts.Kubeconfig); err != nil {
			return usageErrorf("%v", err)
		}
	}
	var src *k8s.Source
	var health *k8s.Health
	if kcfg != nil {
		health = k8s.NewHealth(log)
	}
	switch opts.EndpointsSource {
	case "":
	case "kubernetes":
		if src, err = k8s.NewSourceFromConfig(kcfg, health); err != nil {
			return usageErrorf("--endpoints-source kubernetes: %v", err)
		}
		// After the server has stopped (deferred below, so run later):
		// the watches' contexts have ended; wait for their goroutines.
		defer src.Wait()
	default:
		return usageErrorf("--endpoints-source %q: want kubernetes or nothing", opts.EndpointsSource)
	}
	gcfg := gateway.Config{
		Listen: opts.Listen, Admin: opts.Admin, AdminToken: token, StateDir: opts.StateDir,
		MaxBodyBytes: opts.MaxBodyBytes, KVMaxBlocks: opts.KVMaxBlocks, KVTokenCacheBytes: opts.KVTokenCache, WriteTimeout: opts.WriteTimeout, BufferBudget: opts.BufferBudget, ReleaseIdleBuffers: opts.ReleaseIdle, TLSCert: opts.TLSCert, TLSKey: opts.TLSKey,
		DataPlane: opts.DataPlane, Loops: opts.Loops, NoIOURing: !opts.IOURing,
		LogPayloads: opts.LogPayloads, Pprof: opts.Pprof, Logger: log,
		ReadyzStrict: opts.ReadyzStrict, AwaitInitialRules: true,
	}
	if src != nil {
		gcfg.EndpointSource = src
	}
	if health != nil {
		gcfg.Collectors = health.Collectors()
	}
	if opts.RulesFrom == "kubernetes" && !opts.AllowAdminRuleWrites {
		ns := opts.RulesNamespace
		gcfg.RuleOwner = func(name string) string {
			return fmt.Sprintf("the Rule object %s/%s (rules.llmgw.io; kubectl -n %s edit rules.llmgw.io %s)", ns, name, ns, name)
		}
	}
	srv, err := gateway.New(gcfg)
	if err != nil {
		return usageErrorf("%v", err)
	}
	// The server and the rule sync run until the graceful stop below is
	// over, not until the signal: runCtx ends after it (or at once when
	// the signal comes before the start is done).
	ctx := cmd.Context()
	runCtx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	stopEarly := context.AfterFunc(ctx, cancel)
	if err := srv.Start(runCtx); err != nil {
		cancel()
		return err
	}
	defer srv.Close()
	var syncs sync.WaitGroup
	defer syncs.Wait()
	defer cancel()
	if opts.RulesFrom == "kubernetes" {
		dyn, err := dynamic.NewForConfig(kcfg)
		if err != nil {
			return usageErrorf("--rules-from kubernetes: %v", err)
		}
		var esrc gateway.EndpointSource
		if src != nil {
			esrc = src
		}
		if err := k8s.NewRuleSync(dyn, opts.RulesNamespace, srv, esrc, health, log).Run(runCtx, &syncs); err != nil {
			return fmt.Errorf("--rules-from kubernetes: %w", err)
		}
	}
	for _, r := range initial {
		if _, err := srv.Apply(r, false); err != nil {
			return fmt.Errorf("--rules %s: rule %q: %w", opts.RulesFile, r.Name, err)
		}
	}
	if !stopEarly() {
		return nil // signalled while starting: nothing was ready yet
	}
	srv.InitialRulesInstalled()
	fmt.Fprintf(opts.IO.ErrOut, "llmgw serving: data plane http://%s, admin http://%s, state %s, %d procs\n", srv.Addr(), srv.AdminAddr(), opts.StateDir, runtime.GOMAXPROCS(0))
	<-ctx.Done()
	gracefulStop(srv, log, opts.DrainWindow, opts.ShutdownTimeout)
	return nil
}

// gracefulStop drains srv for window (a second SIGTERM or SIGINT ends the
// window early), then shuts it down, giving in-flight requests timeout.
func gracefulStop(srv *gateway.Server, log *slog.Logger, window, timeout time.Duration) {
	// Registered after the first signal, so only a later one arrives.
	again := make(chan os.Signal, 1)
	signal.Notify(again, os.Interrupt, syscall.SIGTERM)
	defer signal.Stop(again)
	srv.Drain()
	log.Info("stopping: draining", "drain_window", window, "shutdown_timeout", timeout)
	t := time.NewTimer(window)
	select {
	case <-t.C:
	case sig := <-again:
		t.Stop()
		log.Info("stopping: drain window ended early", "signal", sig.String())
	}
	log.Info("stopping: no more connections accepted; waiting for the requests in flight", "shutdown_timeout", timeout)
	sctx, scancel := context.WithTimeout(context.Background(), timeout)
	defer scancel()
	if err := srv.Shutdown(sctx); err != nil {
		log.Warn("stopping: requests still in flight at the shutdown timeout were cut", "err", err)
		return
	}
	log.Info("stopped")
}
