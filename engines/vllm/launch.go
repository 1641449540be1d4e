package vllm

import "github.com/llmgw/llmgw/engines"

// CheckLaunch: vLLM serves KV events only with --enable-prefix-caching and
// --kv-events-config {enable_kv_cache_events: true, publisher "zmq"}; its
// --block-size and --prefix-caching-hash-algo must be the profile's, its
// PYTHONHASHSEED the gateway's kvHashSeed (the hash chain's root), and its
// --served-model-name the profile's.
func (*Adapter) CheckLaunch(f engines.LaunchFacts) error {
	l := f.Launch
	args := l.Args
	if err := engines.CheckIntArg(args, "--block-size", f.BlockSize); err != nil {
		return err
	}
	if v, _ := engines.ArgValue(args, "--prefix-caching-hash-algo"); v != f.HashAlgo {
		return engines.LaunchErrorf("launch.args", "--prefix-caching-hash-algo %q must equal hash_algo %q", v, f.HashAlgo)
	}
	if !engines.HasArg(args, "--enable-prefix-caching") {
		return engines.LaunchErrorf("launch.args", "must pass --enable-prefix-caching (no KV events without it)")
	}
	ec, err := engines.ParseEventsConfig(args, "vLLM")
	if err != nil {
		return err
	}
	if ec.EnableKVCacheEvents == nil || !*ec.EnableKVCacheEvents {
		return engines.LaunchErrorf("launch.args", "--kv-events-config must set enable_kv_cache_events: true")
	}
	if got, ok := l.Env["PYTHONHASHSEED"]; !ok || got != f.HashSeed {
		return engines.LaunchErrorf("launch.env.PYTHONHASHSEED", "must be %q, the gateway's kvHashSeed (got %q)", f.HashSeed, got)
	}
	if v, ok := engines.ArgValue(args, "--served-model-name"); !ok || v != f.ServedName {
		return engines.LaunchErrorf("launch.args", "--served-model-name %q must equal model.served_name %q", v, f.ServedName)
	}
	return engines.CheckEventPorts(l, ec)
}
