package labkit

import (
	"github.com/llmgw/llmgw/profiles"
	"github.com/llmgw/llmgw/runbook"
)

// Tuple is what a select step is asked to resolve.
type Tuple struct {
	Engine, Profile, Topology string
	// Launcher is the run's launcher, by name and simulation.
	Launcher interface {
		Name() string
		Simulated() bool
	}
	Workers  int  // all workers of the run
	KVEvents bool // workers publish KV events
	// Extra are the topology's own tuple.json fields, added to the shared
	// ones (engine, version, image, backend, profile, model, revision,
	// served name, API mode, topology, launcher, seed, block size, hash).
	Extra map[string]any
}

// Selection is a resolved tuple.
type Selection struct {
	Profile profiles.Profile
	Version profiles.EngineVersion
	Launch  profiles.LaunchSpec
	// Spec is the launch spec for the run's launcher, with the run's
	// ledger attached.
	Spec runbook.LaunchSpec
	// Info is the content of tuple.json.
	Info map[string]any
}

// Select is the shared select step: t from catalog c for run r. With ok
// the caller writes its PASS (with tuple.json, MustJSON(sel.Info)).
// Otherwise fail is the step's verdict: FAIL UNKNOWN_PROFILE (no
// evidence), BLOCKED with the catalog's reason code for a known-blocked
// tuple (nothing may be launched), FAIL UNKNOWN_ENGINE or
// PROFILE_NO_LAUNCH, the last three with tuple.json.
func Select(r *runbook.Run, c *profiles.Catalog, t Tuple) (sel Selection, fail runbook.Outcome, ok bool) {
	p, err := c.Get(t.Profile)
	if err != nil {
		return sel, runbook.Fail("UNKNOWN_PROFILE", "%v", err), false
	}
	sel.Profile = p
	ver, _ := c.Versions().For(t.Engine)
	sel.Version = ver
	info := map[string]any{
		"engine": t.Engine, "engine_version": ver.Version, "engine_image": ver.Image, "backend": ver.Backend,
		"profile": p.ID, "model": p.Model.Repo, "revision": p.Model.Revision, "served_name": p.Model.ServedName,
		"api_mode": p.APIMode, "topology": t.Topology, "launcher": t.Launcher.Name(), "simulated_workers": t.Launcher.Simulated(),
		"kv_hash_seed": c.KVHashSeed(),
	}
	for k, v := range t.Extra {
		info[k] = v
	}
	sel.Info = info
	if code, detail, blocked := c.Blocked(t.Engine, p.ID); blocked {
		info["blocked"] = map[string]string{"code": code, "detail": detail}
		return sel, runbook.Blocked(code, "%s on %s %s: %s; nothing launched", p.ID, t.Engine, ver.Version, detail).With("tuple.json", MustJSON(info)), false
	}
	es, err := p.Engine(t.Engine)
	if err != nil {
		return sel, runbook.Fail("UNKNOWN_ENGINE", "%v", err).With("tuple.json", MustJSON(info)), false
	}
	sel.Launch, err = p.Launch(t.Engine)
	if err != nil {
		return sel, runbook.Fail("PROFILE_NO_LAUNCH", "%v", err).With("tuple.json", MustJSON(info)), false
	}
	info["block_size"], info["hash_algo"] = es.BlockSize, es.HashAlgo
	sel.Spec = runbook.LaunchSpec{
		RunID: r.ID, Engine: t.Engine, Profile: p, Launch: sel.Launch, Model: p.Model.ServedName, Workers: t.Workers,
		BlockSize: es.BlockSize, HashSeed: c.KVHashSeed(), EventEncoding: EventEncoding(t.Engine), KVEvents: t.KVEvents,
		Ledger: LedgerOf(r),
	}
	return sel, runbook.Outcome{}, true
}
