package launcher

import (
	"context"
	"fmt"
	"net"
	"strconv"
	"strings"

	"github.com/llmgw/llmgw/results"
	"github.com/llmgw/llmgw/runbook"
)

// Attach uses workers that are already running (a fleet, a Kubernetes
// Service). It launches nothing and stops nothing. When a worker is an
// llmgw simulator (it answers GET /_sim/addrs) its KV event endpoints are
// taken from there; otherwise they are unknown and KV-exact rules fall back
// to the rule's kvZmqPort on each worker's host (the gateway's default).
type Attach struct {
	// Endpoints are the workers' host:port addresses.
	Endpoints []string
	// Simulator says the attached workers are llmgw simulators; results
	// then carry the simulated-workers note.
	Simulator bool
	// Events, when set, are the workers' KV event PUB endpoints
	// (tcp://host:port), one per endpoint in the same order: a real
	// engine, or a simulator without its /_sim/addrs, does not report them.
	Events []string
}

// ParseEndpoints splits and validates a comma-separated host:port list.
func ParseEndpoints(s string) ([]string, error) {
	var out []string
	for _, part := range strings.Split(s, ",") {
		part = strings.TrimSpace(part)
		if part == "" {
			continue
		}
		host, port, err := net.SplitHostPort(part)
		if err != nil || host == "" {
			return nil, fmt.Errorf("launcher: endpoint %q: want host:port", part)
		}
		if n, err := strconv.Atoi(port); err != nil || n < 1 || n > 65535 {
			return nil, fmt.Errorf("launcher: endpoint %q: port must be 1..65535", part)
		}
		out = append(out, part)
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("launcher: no endpoints given (want host:port,...)")
	}
	return out, nil
}

// Name implements runbook.Launcher.
func (a *Attach) Name() string { return results.LauncherAttach }

// Simulated implements runbook.Launcher.
func (a *Attach) Simulated() bool { return a.Simulator }

// Launch returns the attached workers; spec.Workers must equal their number.
func (a *Attach) Launch(ctx context.Context, spec runbook.LaunchSpec) ([]runbook.Worker, error) {
	if spec.Workers != len(a.Endpoints) {
		return nil, fmt.Errorf("launcher: attach: %d workers asked for but %d endpoints given", spec.Workers, len(a.Endpoints))
	}
	if len(a.Events) > 0 && len(a.Events) != len(a.Endpoints) {
		return nil, fmt.Errorf("launcher: attach: %d KV event endpoints given for %d endpoints", len(a.Events), len(a.Endpoints))
	}
	out := make([]runbook.Worker, len(a.Endpoints))
	for i, ep := range a.Endpoints {
		out[i] = runbook.Worker{ID: fmt.Sprintf("w%d", i+1), HTTP: ep, HealthPath: healthPath(spec), Owner: "attach"}
		switch sa, ok := simAddrs(ctx, ep); {
		case !spec.KVEvents:
		case len(a.Events) > 0:
			out[i].Events = a.Events[i]
		case ok:
			out[i].Events, out[i].Replay = sa.Events, sa.Replay
		}
	}
	return out, nil
}

// Stop does nothing: attached workers are not ours.
func (a *Attach) Stop(context.Context) error { return nil }

var _ runbook.Launcher = (*Attach)(nil)
