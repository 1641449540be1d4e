package engines

import (
	"encoding/json"
	"fmt"
	"slices"
	"strconv"
	"strings"
)

// LaunchFacts is what a profile says about serving a model on one engine.
// The profiles package imports nothing of llmgw's, so the boundary
// (runbook/labkit) converts a profiles.EngineSpec into LaunchFacts and asks
// CheckSpec; Launch is nil for a tuple that is never launched (blocked).
type LaunchFacts struct {
	BlockSize int
	HashAlgo  string
	// HashSeed is the gateway's kvHashSeed the engine must be started with.
	HashSeed string
	// ServedName and Revision are the profile's model facts.
	ServedName, Revision string
	Launch               *Launch
}

// Launch is one worker process's launch spec.
type Launch struct {
	Command, Args []string
	Env           map[string]string
	// Files are the files placed in the worker's filesystem, in order.
	Files []LaunchFile
	// Ports by name ("http", "kv-events", "kv-replay").
	Ports map[string]int
}

// LaunchFile is a file a launch spec places.
type LaunchFile struct{ Path, Content string }

// LaunchError is an incoherent launch spec: Field is the path inside the
// engine's spec ("block_size", "launch.args", "launch.files[0].content").
type LaunchError struct{ Field, Msg string }

func (e *LaunchError) Error() string { return e.Field + ": " + e.Msg }

// LaunchErrorf returns a LaunchError.
func LaunchErrorf(field, format string, a ...any) error {
	return &LaunchError{Field: field, Msg: fmt.Sprintf(format, a...)}
}

// LaunchChecker is implemented by adapters whose engines can be launched
// from a profile: it checks the engine-specific coherence of a launch spec
// (flags that must agree with the block size, hash algorithm, seed, model
// name and event ports).
type LaunchChecker interface {
	CheckLaunch(f LaunchFacts) error
}

// NoHashAlgo is the hash_algo of an engine without a KV event plane.
const NoHashAlgo = "none"

// CheckSpec checks f against a's contract: the block size and hash
// algorithm against the KV contract, then (when there is a launch) the
// adapter's CheckLaunch. The error is a *LaunchError.
func CheckSpec(a Adapter, f LaunchFacts) error {
	kv := a.KV()
	if kv == nil {
		if f.BlockSize != 0 {
			return LaunchErrorf("block_size", "must be 0: %s publishes no KV blocks", a.Display())
		}
		if f.HashAlgo != NoHashAlgo {
			return LaunchErrorf("hash_algo", "must be one of %s for %s (got %q)", NoHashAlgo, a.Kind(), f.HashAlgo)
		}
	} else {
		if f.BlockSize < 1 {
			return LaunchErrorf("block_size", "must be ≥ 1")
		}
		if !slices.Contains(kv.HashAlgos, f.HashAlgo) {
			return LaunchErrorf("hash_algo", "must be one of %s for %s (got %q)", strings.Join(kv.HashAlgos, ", "), a.Kind(), f.HashAlgo)
		}
	}
	if f.Launch == nil {
		return nil
	}
	if c, ok := a.(LaunchChecker); ok {
		return c.CheckLaunch(f)
	}
	return nil
}

// ArgValue returns the value of flag in args ("--flag value" or
// "--flag=value") and whether the flag is present.
func ArgValue(args []string, flag string) (string, bool) {
	for i, a := range args {
		if a == flag {
			if i+1 < len(args) {
				return args[i+1], true
			}
			return "", true
		}
		if v, ok := strings.CutPrefix(a, flag+"="); ok {
			return v, true
		}
	}
	return "", false
}

// HasArg reports whether flag is in args.
func HasArg(args []string, flag string) bool {
	_, ok := ArgValue(args, flag)
	return ok
}

// CheckIntArg requires flag to be present with the integer value want (the
// block size).
func CheckIntArg(args []string, flag string, want int) error {
	v, ok := ArgValue(args, flag)
	if !ok {
		return LaunchErrorf("launch.args", "must pass %s %d", flag, want)
	}
	if n, err := strconv.Atoi(v); err != nil || n != want {
		return LaunchErrorf("launch.args", "%s %q must equal block_size %d", flag, v, want)
	}
	return nil
}

// EventsConfig is the JSON vLLM and SGLang take in --kv-events-config
// (vLLM's KVEventsConfig; SGLang's copy has no enable_kv_cache_events).
type EventsConfig struct {
	EnableKVCacheEvents *bool   `json:"enable_kv_cache_events"`
	Publisher           string  `json:"publisher"`
	Endpoint            string  `json:"endpoint"`
	ReplayEndpoint      *string `json:"replay_endpoint"`
	Topic               *string `json:"topic"`
}

// ParseEventsConfig reads --kv-events-config from args: strict JSON, a
// "zmq" publisher on a tcp:// endpoint.
func ParseEventsConfig(args []string, display string) (EventsConfig, error) {
	var ec EventsConfig
	raw, ok := ArgValue(args, "--kv-events-config")
	if !ok {
		return ec, LaunchErrorf("launch.args", "must pass --kv-events-config (the engine publishes no KV events otherwise)")
	}
	dec := json.NewDecoder(strings.NewReader(raw))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&ec); err != nil {
		return ec, LaunchErrorf("launch.args", "--kv-events-config is not valid %s KV events JSON: %v", display, err)
	}
	if ec.Publisher != "zmq" {
		return ec, LaunchErrorf("launch.args", "--kv-events-config publisher must be \"zmq\" (got %q)", ec.Publisher)
	}
	if !strings.HasPrefix(ec.Endpoint, "tcp://") {
		return ec, LaunchErrorf("launch.args", "--kv-events-config endpoint must be a tcp:// address (got %q)", ec.Endpoint)
	}
	return ec, nil
}

// CheckEventPorts requires the ports named kv-events (and kv-replay when a
// replay endpoint is configured) to match the events config's endpoints.
func CheckEventPorts(l *Launch, ec EventsConfig) error {
	if err := checkEndpointPort(l, "kv-events", ec.Endpoint); err != nil {
		return err
	}
	if ec.ReplayEndpoint != nil && *ec.ReplayEndpoint != "" {
		return checkEndpointPort(l, "kv-replay", *ec.ReplayEndpoint)
	}
	return nil
}

func checkEndpointPort(l *Launch, name, endpoint string) error {
	i := strings.LastIndexByte(endpoint, ':')
	if i < 0 {
		return LaunchErrorf("launch.args", "%s endpoint %q has no port", name, endpoint)
	}
	n, err := strconv.Atoi(endpoint[i+1:])
	if err != nil {
		return LaunchErrorf("launch.args", "%s endpoint %q has no port", name, endpoint)
	}
	if got := l.Ports[name]; got != n {
		return LaunchErrorf("launch.ports", "port %q is %d, but the events config uses %d", name, got, n)
	}
	return nil
}
