package sglang

import "github.com/llmgw/llmgw/engines"

// CheckLaunch: SGLang's --page-size is the block size; its
// --kv-events-config is vLLM's JSON without enable_kv_cache_events; its
// --served-model-name and --revision must be the profile's (the identity
// probe reads them back).
func (*Adapter) CheckLaunch(f engines.LaunchFacts) error {
	l := f.Launch
	args := l.Args
	if err := engines.CheckIntArg(args, "--page-size", f.BlockSize); err != nil {
		return err
	}
	ec, err := engines.ParseEventsConfig(args, "SGLang")
	if err != nil {
		return err
	}
	if ec.EnableKVCacheEvents != nil {
		return engines.LaunchErrorf("launch.args", "--kv-events-config: SGLang has no enable_kv_cache_events field")
	}
	if v, ok := engines.ArgValue(args, "--served-model-name"); !ok || v != f.ServedName {
		return engines.LaunchErrorf("launch.args", "--served-model-name %q must equal model.served_name %q", v, f.ServedName)
	}
	if v, _ := engines.ArgValue(args, "--revision"); v != f.Revision {
		return engines.LaunchErrorf("launch.args", "--revision %q must equal model.revision %q (the identity probe fails otherwise)", v, f.Revision)
	}
	return engines.CheckEventPorts(l, ec)
}
