package rule

import (
	"github.com/llmgw/llmgw/engines"
	// Every adapter is registered wherever rules are admitted.
	_ "github.com/llmgw/llmgw/engines/all"
)

// adapterOf returns the adapter of the rule's engine ("" is the default
// engine), or nil for an engine no adapter serves (admission refuses it).
func adapterOf(r *Rule) engines.Adapter {
	a, err := engines.For(engines.Kind(engineOf(r)))
	if err != nil {
		return nil
	}
	return a
}

// adapterFor is adapterOf for an engine name.
func adapterFor(engine string) engines.Adapter {
	if engine == "" {
		engine = DefaultKVEngineType
	}
	a, err := engines.For(engines.Kind(engine))
	if err != nil {
		return nil
	}
	return a
}
