package pd

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strconv"
	"sync"
	"time"

	"github.com/llmgw/llmgw/engines"
	"github.com/llmgw/llmgw/engines/sim"
	"github.com/llmgw/llmgw/results"
	"github.com/llmgw/llmgw/runbook"
)

// Roles of P/D workers, as the simulators and the results name them.
const (
	RolePrefill = sim.RolePrefill
	RoleDecode  = sim.RoleDecode
)

// Worker is one P/D worker: a runbook worker with its role and, for an
// SGLang prefill, its bootstrap server's host:port.
type Worker struct {
	runbook.Worker
	Role string `json:"role"`
	// Bootstrap is the SGLang prefill's bootstrap server (host:port); ""
	// for other roles and engines.
	Bootstrap string `json:"bootstrap,omitempty"`
}

// Launcher starts the prefill and decode workers of one P/D run. The
// contract is runbook.Launcher's (BlockedError when the host cannot
// provide the workers; Stop idempotent and safe after a failed launch),
// with roles: prefill workers are named p1..pN, decode workers d1..dM.
type Launcher interface {
	Name() string
	Simulated() bool
	LaunchPD(ctx context.Context, spec runbook.LaunchSpec, prefill, decode int) ([]Worker, error)
	Stop(ctx context.Context) error
}

// Sim launches in-process simulators with P/D roles on kernel-chosen
// loopback ports: SGLang prefills run their bootstrap server, and with
// spec.KVEvents the prefills (the only endpoints kvExactMode 1 scores)
// publish KV events. The zero value is ready; it is used by one run at a
// time, and Stop is safe at any time.
type Sim struct {
	// HashSeed, when set, overrides the spec's seed on every worker (tests
	// use it to prove that an incoherent worker is caught).
	HashSeed string

	mu   sync.Mutex
	sims []*sim.Sim
}

// Name implements Launcher.
func (l *Sim) Name() string { return results.LauncherSim }

// Simulated implements Launcher.
func (l *Sim) Simulated() bool { return true }

// LaunchPD implements Launcher.
func (l *Sim) LaunchPD(ctx context.Context, spec runbook.LaunchSpec, prefill, decode int) ([]Worker, error) {
	kind, err := engines.ParseKind(spec.Engine)
	if err != nil {
		return nil, fmt.Errorf("pd: sim launcher: %w", err)
	}
	seed := spec.HashSeed
	if l.HashSeed != "" {
		seed = l.HashSeed
	}
	var out []Worker
	for _, g := range []struct {
		role, prefix string
		n            int
	}{{RolePrefill, "p", prefill}, {RoleDecode, "d", decode}} {
		for i := 1; i <= g.n; i++ {
			cfg := sim.Config{Engine: kind, Model: spec.Model, Role: g.role, BlockSize: spec.BlockSize, HashSeed: seed,
				EventEncoding: spec.EventEncoding, KVEvents: sim.KVEventsOff}
			zmq := engines.KVOf(kind).PublishesZMQ()
			if spec.KVEvents && g.role == RolePrefill && zmq {
				cfg.KVEvents = "tcp://127.0.0.1:0"
			}
			if !zmq {
				cfg.EventEncoding = ""
			}
			// The simulators outlive the launch step: Stop closes them.
			s, err := sim.Start(context.WithoutCancel(ctx), cfg)
			if err != nil {
				return nil, fmt.Errorf("pd: sim %s worker %d: %w", g.role, i, err)
			}
			l.mu.Lock()
			l.sims = append(l.sims, s)
			l.mu.Unlock()
			a := s.Addrs()
			w := Worker{Worker: runbook.Worker{ID: fmt.Sprintf("%s%d", g.prefix, i), HTTP: a.HTTP, Events: a.Events, Replay: a.Replay,
				HealthPath: healthPath(spec), Owner: "sim:in-process"}, Role: g.role}
			if g.role == RolePrefill && a.Bootstrap != "" {
				// Only a rendezvous-shape prefill (SGLang) runs a bootstrap
				// server.
				w.Bootstrap = a.Bootstrap
			}
			out = append(out, w)
		}
	}
	return out, nil
}

// Stop closes every simulator this launcher started. Idempotent.
func (l *Sim) Stop(context.Context) error {
	l.mu.Lock()
	sims := l.sims
	l.sims = nil
	l.mu.Unlock()
	var errs []error
	for _, s := range sims {
		if err := s.Close(); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// Attach uses prefill and decode workers that already run. It launches and
// stops nothing. A worker that is an llmgw simulator (it answers GET
// /_sim/addrs) gives its KV event and bootstrap addresses from there;
// otherwise an SGLang prefill's bootstrap server is assumed on
// BootstrapPort of its host.
type Attach struct {
	Prefill, Decode []string
	// BootstrapPort is the SGLang prefills' bootstrap port when they do not
	// say; 0 means SGLang's default 8998.
	BootstrapPort int
	// BootstrapPorts, when set, are the prefills' bootstrap ports one per
	// Prefill endpoint, in order (each SGLang prefill may be started with
	// its own --disaggregation-bootstrap-port); they win over BootstrapPort.
	BootstrapPorts []int
	// Events, when set, are the prefills' KV event PUB endpoints
	// (tcp://host:port), one per Prefill endpoint in order: a real engine,
	// or a simulator without its /_sim/addrs, does not report them.
	Events []string
	// Simulator says the workers are llmgw simulators.
	Simulator bool
}

// Name implements Launcher.
func (a *Attach) Name() string { return results.LauncherAttach }

// Simulated implements Launcher.
func (a *Attach) Simulated() bool { return a.Simulator }

// LaunchPD implements Launcher; the counts must match the lists.
func (a *Attach) LaunchPD(ctx context.Context, spec runbook.LaunchSpec, prefill, decode int) ([]Worker, error) {
	if prefill != len(a.Prefill) || decode != len(a.Decode) {
		return nil, fmt.Errorf("pd: attach: %d prefill and %d decode workers asked for, %d and %d given", prefill, decode, len(a.Prefill), len(a.Decode))
	}
	// The engine's default bootstrap port (0: its P/D shape has none).
	var defaultBoot int
	if ad, err := engines.For(engines.Kind(spec.Engine)); err == nil && ad.PD() != nil {
		defaultBoot = ad.PD().BootstrapPort()
	}
	bp := a.BootstrapPort
	if bp == 0 {
		bp = defaultBoot
	}
	if len(a.BootstrapPorts) > 0 && len(a.BootstrapPorts) != len(a.Prefill) {
		return nil, fmt.Errorf("pd: attach: %d bootstrap ports given for %d prefill endpoints", len(a.BootstrapPorts), len(a.Prefill))
	}
	if len(a.Events) > 0 && len(a.Events) != len(a.Prefill) {
		return nil, fmt.Errorf("pd: attach: %d KV event endpoints given for %d prefill endpoints", len(a.Events), len(a.Prefill))
	}
	var out []Worker
	for _, g := range []struct {
		role, prefix string
		eps          []string
	}{{RolePrefill, "p", a.Prefill}, {RoleDecode, "d", a.Decode}} {
		for i, ep := range g.eps {
			w := Worker{Worker: runbook.Worker{ID: fmt.Sprintf("%s%d", g.prefix, i+1), HTTP: ep, HealthPath: healthPath(spec), Owner: "attach"}, Role: g.role}
			sa, isSim := simAddrs(ctx, ep)
			switch {
			case !spec.KVEvents || g.role != RolePrefill:
			case len(a.Events) > 0:
				w.Events = a.Events[i]
			case isSim:
				w.Events, w.Replay = sa.Events, sa.Replay
			}
			if g.role == RolePrefill && defaultBoot != 0 {
				if isSim && sa.Bootstrap != "" {
					w.Bootstrap = sa.Bootstrap
				} else if host, _, err := net.SplitHostPort(ep); err == nil {
					port := bp
					if len(a.BootstrapPorts) > 0 {
						port = a.BootstrapPorts[i]
					}
					w.Bootstrap = net.JoinHostPort(host, strconv.Itoa(port))
				}
			}
			out = append(out, w)
		}
	}
	return out, nil
}

// Stop does nothing: attached workers are not ours.
func (a *Attach) Stop(context.Context) error { return nil }

// Unsupported is the launcher for a host or launcher kind that cannot start
// P/D roles: LaunchPD is BLOCKED with Code, nothing is started.
type Unsupported struct {
	Kind   string // results.LauncherDocker, ...
	Code   string
	Detail string
}

// Name implements Launcher.
func (u *Unsupported) Name() string { return u.Kind }

// Simulated implements Launcher.
func (u *Unsupported) Simulated() bool { return false }

// LaunchPD implements Launcher: always BLOCKED.
func (u *Unsupported) LaunchPD(context.Context, runbook.LaunchSpec, int, int) ([]Worker, error) {
	return nil, &runbook.BlockedError{Code: u.Code, Detail: u.Detail}
}

// Stop implements Launcher; there is nothing to stop.
func (u *Unsupported) Stop(context.Context) error { return nil }

var (
	_ Launcher = (*Sim)(nil)
	_ Launcher = (*Attach)(nil)
	_ Launcher = (*Unsupported)(nil)
)

func healthPath(spec runbook.LaunchSpec) string {
	if spec.Launch.HealthPath != "" {
		return spec.Launch.HealthPath
	}
	return "/health"
}

// simAddrs asks a worker for its simulator addresses; ok is false when it
// is not an llmgw simulator.
func simAddrs(ctx context.Context, addr string) (a sim.Addrs, ok bool) {
	ctx, cancel := context.WithTimeout(ctx, 3*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+addr+"/_sim/addrs", nil)
	if err != nil {
		return a, false
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return a, false
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return a, false
	}
	if err := json.NewDecoder(io.LimitReader(resp.Body, 4096)).Decode(&a); err != nil || a.HTTP == "" {
		return a, false
	}
	return a, true
}
