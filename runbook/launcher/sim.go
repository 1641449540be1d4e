// Package launcher holds the runbook's Launcher implementations: sim
// (in-process simulators, the default), docker (containers through
// dockertest, labelled with their run) and attach (workers that already
// run), plus Cleanup, which removes what a run's ownership ledger lists.
package launcher

import (
	"context"
	"errors"
	"fmt"
	"sync"

	"github.com/llmgw/llmgw/engines"
	"github.com/llmgw/llmgw/engines/sim"
	"github.com/llmgw/llmgw/results"
	"github.com/llmgw/llmgw/runbook"
)

// Sim launches in-process engine simulators on loopback ports chosen by
// the kernel. The simulators are configured coherently with the rule the
// runbook applies: the spec's block size, hash seed and event encoding
// (vLLM map events, SGLang array events), and a KV event publisher with
// replay when asked for.
//
// The zero value is ready to use. Sim is not safe for concurrent Launch
// calls; Stop is idempotent and safe at any time.
type Sim struct {
	// HashSeed, when set, overrides the spec's seed for every simulator.
	// It exists to prove that an incoherent worker is caught (the routing
	// step FAILs); leave it empty otherwise.
	HashSeed string
	// Faults maps a worker index (0-based) to a /_sim/faults body applied
	// right after that worker starts, e.g. `{"health_fail":true}`.
	Faults map[int]string
	// AfterStart, when set, is called with each started simulator (tests
	// use it to wrap or inspect workers).
	AfterStart func(i int, s *sim.Sim)

	mu   sync.Mutex
	sims []*sim.Sim
}

// Name implements runbook.Launcher.
func (l *Sim) Name() string { return results.LauncherSim }

// Simulated implements runbook.Launcher.
func (l *Sim) Simulated() bool { return true }

// Launch implements runbook.Launcher.
func (l *Sim) Launch(ctx context.Context, spec runbook.LaunchSpec) ([]runbook.Worker, error) {
	kind, err := engines.ParseKind(spec.Engine)
	if err != nil {
		return nil, fmt.Errorf("launcher: sim: %w", err)
	}
	if spec.Workers < 1 {
		return nil, fmt.Errorf("launcher: sim: %d workers: want at least 1", spec.Workers)
	}
	seed := spec.HashSeed
	if l.HashSeed != "" {
		seed = l.HashSeed
	}
	var out []runbook.Worker
	for i := 0; i < spec.Workers; i++ {
		cfg := sim.Config{
			Engine: kind, Model: spec.Model, BlockSize: spec.BlockSize, HashSeed: seed,
			EventEncoding: spec.EventEncoding, KVEvents: sim.KVEventsOff,
		}
		zmq := engines.KVOf(kind).PublishesZMQ()
		if spec.KVEvents && zmq {
			cfg.KVEvents = "tcp://127.0.0.1:0"
		}
		if !zmq {
			cfg.EventEncoding = ""
		}
		// The simulators outlive the launch step: they are owned by the
		// launcher and stopped by Stop, not by ctx.
		s, err := sim.Start(context.WithoutCancel(ctx), cfg)
		if err != nil {
			return nil, fmt.Errorf("launcher: sim worker %d: %w", i+1, err)
		}
		l.mu.Lock()
		l.sims = append(l.sims, s)
		l.mu.Unlock()
		if body, ok := l.Faults[i]; ok {
			if err := postFault(ctx, s.Addrs().HTTP, body); err != nil {
				return nil, fmt.Errorf("launcher: sim worker %d: %w", i+1, err)
			}
		}
		if l.AfterStart != nil {
			l.AfterStart(i, s)
		}
		a := s.Addrs()
		out = append(out, runbook.Worker{
			ID: fmt.Sprintf("w%d", i+1), HTTP: a.HTTP, Events: a.Events, Replay: a.Replay,
			HealthPath: healthPath(spec), Owner: "sim:in-process",
		})
	}
	return out, nil
}

// Stop closes every simulator this launcher started. Idempotent.
func (l *Sim) Stop(context.Context) error {
	l.mu.Lock()
	sims := l.sims
	l.sims = nil
	l.mu.Unlock()
	// Close them together: each waits for its own listeners to wind down.
	errs := make([]error, len(sims))
	var wg sync.WaitGroup
	for i, s := range sims {
		wg.Go(func() { errs[i] = s.Close() })
	}
	wg.Wait()
	return errors.Join(errs...)
}

// healthPath is the profile's health path for the engine, or /health.
func healthPath(spec runbook.LaunchSpec) string {
	if spec.Launch.HealthPath != "" {
		return spec.Launch.HealthPath
	}
	return "/health"
}

var _ runbook.Launcher = (*Sim)(nil)
