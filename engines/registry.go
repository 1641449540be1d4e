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
