package sim

import (
	"fmt"
	"sync"

	"github.com/llmgw/llmgw/engines"
	"github.com/llmgw/llmgw/profiles"
)

// catalogVersions loads the catalog's version tuple once: the one home of
// the engine releases llmgw targets (profiles/catalog/catalog.yaml), which
// the personas report from their version endpoints.
var catalogVersions = sync.OnceValues(func() (profiles.Versions, error) {
	c, err := profiles.Load()
	if err != nil {
		return profiles.Versions{}, err
	}
	return c.Versions(), nil
})

// engineVersion is the catalog's release of engine k (vLLM "0.31.0").
func engineVersion(k engines.Kind) (string, error) {
	v, err := catalogVersions()
	if err != nil {
		return "", fmt.Errorf("sim: catalog versions: %w", err)
	}
	ev, err := v.For(string(k))
	if err != nil {
		return "", fmt.Errorf("sim: catalog versions: %w", err)
	}
	return ev.Version, nil
}
