package runbook

import (
	"context"
	"errors"
	"fmt"

	"github.com/llmgw/llmgw/engines/tokenizer"
	"github.com/llmgw/llmgw/profiles"
)

// Launcher starts the workers of one run. Implementations live in
// runbook/launcher (sim, docker, attach).
//
// Launch starts spec.Workers workers and returns them once their sockets
// exist (the runbook waits for health itself). A launcher that cannot run on
// this host returns a *BlockedError (no_docker, no_gpu, image_unavailable),
// never a plain error, so the step ends BLOCKED rather than FAIL. Stop stops
// and removes everything Launch started; it is idempotent and safe to call
// when Launch failed half-way. A Launcher is used by one run at a time.
type Launcher interface {
	// Name is results.LauncherSim, LauncherDocker or LauncherAttach.
	Name() string
	// Simulated reports whether the workers are llmgw simulators (their
	// results qualify the gateway, not an engine).
	Simulated() bool
	Launch(ctx context.Context, spec LaunchSpec) ([]Worker, error)
	Stop(ctx context.Context) error
}

// LaunchSpec is what a run asks a launcher for.
type LaunchSpec struct {
	// RunID labels everything the launcher creates (llmgw.run=<RunID>).
	RunID string
	// Engine is vllm, sglang, trtllm or llamacpp.
	Engine string
	// Profile is the catalog profile; Launch its launch spec for Engine
	// (zero for launchers that ignore it).
	Profile profiles.Profile
	Launch  profiles.LaunchSpec
	// Model is the served model name every worker must answer to.
	Model string
	// Workers is how many workers to start (≥ 1).
	Workers int
	// BlockSize, HashSeed and EventEncoding configure simulators coherently
	// with the rule the runbook applies (real engines take them from the
	// profile's launch arguments).
	BlockSize     int
	HashSeed      string
	EventEncoding string
	// KVEvents asks for a KV event publisher per worker (vLLM and SGLang).
	KVEvents bool
	// Ledger, when set, receives every resource as soon as it exists, so
	// `llmgw cleanup` can find it even if this process dies.
	Ledger *Ledger
}

// Worker is one launched (or attached) worker, as the gateway reaches it.
type Worker struct {
	// ID is the endpoint id used in the rule ("w1", "w2", ...).
	ID string `json:"id"`
	// HTTP is the host:port of the OpenAI-compatible server.
	HTTP string `json:"http"`
	// Events and Replay are the KV event PUB and replay ROUTER endpoints
	// (tcp://host:port); "" when the worker has none or they are unknown.
	Events string `json:"events,omitempty"`
	Replay string `json:"replay,omitempty"`
	// HealthPath is the engine's health endpoint, e.g. "/health".
	HealthPath string `json:"health_path"`
	// Owner says who owns the worker's process: "sim:in-process",
	// "docker:<container id>" or "attach" (nobody here: never stopped).
	Owner string `json:"owner"`
}

// BlockedError says the host cannot provide what the launcher needs. The
// launch step turns it into BLOCKED with Code.
type BlockedError struct {
	Code   string // no_docker, no_gpu, image_unavailable, ...
	Detail string
	Err    error // the underlying cause, may be nil
}

func (e *BlockedError) Error() string {
	if e.Err != nil {
		return fmt.Sprintf("runbook: blocked (%s): %s: %v", e.Code, e.Detail, e.Err)
	}
	return fmt.Sprintf("runbook: blocked (%s): %s", e.Code, e.Detail)
}

func (e *BlockedError) Unwrap() error { return e.Err }

// AsBlocked returns the *BlockedError in err's chain, or nil.
func AsBlocked(err error) *BlockedError {
	var b *BlockedError
	if errors.As(err, &b) {
		return b
	}
	return nil
}

// KVTokenizer is the kvTokenizer a runbook's KV-exact rule uses: explicit
// when given (a tokenizer.json or .gguf path, a models directory, or
// "engine"); else, for simulated workers, the simulators' default tokenizer
// (the embedded Qwen3 one, exported under dir so that the gateway reads the
// same files); else "engine", the real workers' own /tokenize (a failure is
// a visible KV miss, never a wrong hash).
func KVTokenizer(simulated bool, explicit, dir string) (string, error) {
	switch {
	case explicit != "":
		return explicit, nil
	case simulated:
		p, err := tokenizer.ExportQwen3(dir)
		if err != nil {
			return "", fmt.Errorf("runbook: %w", err)
		}
		return p, nil
	default:
		return "engine", nil
	}
}
