package labkit

import (
	"github.com/llmgw/llmgw/profiles"
	"github.com/llmgw/llmgw/runbook"
)

// Resolve is the shared part of a select step: profile p on engine from
// catalog c. With ok it returns the engine's KV spec and the launch spec,
// and adds "block_size" and "hash_algo" to info (the step's tuple.json).
// Otherwise fail is the step's verdict with tuple.json attached: BLOCKED
// with the catalog's reason code for a known-blocked tuple, FAIL
// UNKNOWN_ENGINE or PROFILE_NO_LAUNCH; info then also holds "blocked".
func Resolve(c *profiles.Catalog, engine string, p profiles.Profile, info map[string]any) (es profiles.EngineSpec, launch profiles.LaunchSpec, fail runbook.Outcome, ok bool) {
	if code, detail, blocked := c.Blocked(engine, p.ID); blocked {
		ver, _ := c.Versions().For(engine)
		info["blocked"] = map[string]string{"code": code, "detail": detail}
		return es, launch, runbook.Blocked(code, "%s on %s %s: %s; nothing launched", p.ID, engine, ver.Version, detail).With("tuple.json", MustJSON(info)), false
	}
	es, err := p.Engine(engine)
	if err != nil {
		return es, launch, runbook.Fail("UNKNOWN_ENGINE", "%v", err).With("tuple.json", MustJSON(info)), false
	}
	launch, err = p.Launch(engine)
	if err != nil {
		return es, launch, runbook.Fail("PROFILE_NO_LAUNCH", "%v", err).With("tuple.json", MustJSON(info)), false
	}
	info["block_size"], info["hash_algo"] = es.BlockSize, es.HashAlgo
	return es, launch, runbook.Outcome{}, true
}
