package labkit

import (
	"errors"
	"fmt"

	"github.com/llmgw/llmgw/engines"
	"github.com/llmgw/llmgw/profiles"
)

// LaunchFacts converts a profile's spec for one engine into what the
// engine's adapter judges (profiles imports nothing of llmgw's, so the
// conversion lives at this boundary).
func LaunchFacts(p profiles.Profile, es profiles.EngineSpec, seed string) engines.LaunchFacts {
	f := engines.LaunchFacts{BlockSize: es.BlockSize, HashAlgo: es.HashAlgo, HashSeed: seed, ServedName: p.Model.ServedName, Revision: p.Model.Revision}
	if l := es.Launch; l != nil {
		f.Launch = &engines.Launch{Command: l.Command, Args: l.Args, Env: l.Env, Ports: map[string]int{}}
		for _, pt := range l.Ports {
			f.Launch.Ports[pt.Name] = pt.Port
		}
		for _, fl := range l.Files {
			f.Launch.Files = append(f.Launch.Files, engines.LaunchFile{Path: fl.Path, Content: fl.Content})
		}
	}
	return f
}

// CheckCatalog asks each engine's adapter whether every profile's spec for
// it is coherent with the engine's contract (engines.CheckSpec: block size
// and hash algorithm against the KV contract, launch flags against the
// block size, seed and model). The first problem is an error wrapping
// profiles.ErrInvalid, worded like the catalog's own load errors
// ("profiles/<id>.yaml: engines.<engine>.<field>: <why>").
func CheckCatalog(c *profiles.Catalog) error {
	for _, p := range c.Profiles() {
		for _, e := range profiles.Engines() {
			es, err := p.Engine(e)
			if err != nil {
				return err
			}
			where := fmt.Sprintf("profiles/%s.yaml: engines.%s", p.ID, e)
			a, err := engines.For(engines.Kind(e))
			if err != nil {
				return fmt.Errorf("%w: %s: %v", profiles.ErrInvalid, where, err)
			}
			if err := engines.CheckSpec(a, LaunchFacts(p, es, c.KVHashSeed())); err != nil {
				var le *engines.LaunchError
				if errors.As(err, &le) {
					return fmt.Errorf("%w: %s.%s: %s", profiles.ErrInvalid, where, le.Field, le.Msg)
				}
				return fmt.Errorf("%w: %s: %v", profiles.ErrInvalid, where, err)
			}
		}
	}
	return nil
}
