package engines

import (
	"errors"
	"fmt"
)

// ErrNoVersion: the engine has no version endpoint, or its answer names no
// version.
var ErrNoVersion = errors.New("engines: no version")

var registry = map[Kind]Adapter{}

// Register adds an adapter. Each engine package calls it from init; the
// registry is complete once engines/all is imported (cmd and tests do).
// Registering a kind twice panics: one home per engine.
func Register(a Adapter) {
	if _, dup := registry[a.Kind()]; dup {
		panic(fmt.Sprintf("engines: adapter %q registered twice", a.Kind()))
	}
	registry[a.Kind()] = a
}

// For returns the adapter of kind k, or an error naming the known kinds.
func For(k Kind) (Adapter, error) {
	if a, ok := registry[k]; ok {
		return a, nil
	}
	if _, err := ParseKind(string(k)); err != nil {
		return nil, err
	}
	return nil, fmt.Errorf("engines: no adapter registered for %q (import engines/all)", k)
}

// MustFor is For for kinds already validated (admission, flag parsing).
func MustFor(k Kind) Adapter {
	a, err := For(k)
	if err != nil {
		panic(err)
	}
	return a
}

// Registered lists the registered adapters in Kinds order.
func Registered() []Adapter {
	out := make([]Adapter, 0, len(registry))
	for _, k := range Kinds() {
		if a, ok := registry[k]; ok {
			out = append(out, a)
		}
	}
	return out
}

// KVOf is the KV contract of kind k: nil for an engine that publishes no
// KV events or has no registered adapter.
func KVOf(k Kind) *KVContract {
	if a, ok := registry[k]; ok {
		return a.KV()
	}
	return nil
}

// PublishesZMQ reports whether the contract's events go over ZMQ, so that
// a launcher gives the engine a publisher endpoint and a rule subscribes to
// it; false for a nil contract. This is the one place that decides it.
func (c *KVContract) PublishesZMQ() bool { return c != nil && c.Transport == EventsZMQ }

// Names lists, in Kinds order, the kinds of the registered adapters that
// keep (nil keep: all), as plain strings for flags and help text.
func Names(keep func(Adapter) bool) []string {
	var out []string
	for _, a := range Registered() {
		if keep == nil || keep(a) {
			out = append(out, string(a.Kind()))
		}
	}
	return out
}
