package trtllm

import (
	"fmt"
	"slices"

	"go.yaml.in/yaml/v3"

	"github.com/llmgw/llmgw/engines"
)

// options is the part of TensorRT-LLM's extra LLM API options YAML the
// check reads; other keys are allowed (the engine owns that schema).
type options struct {
	KVCacheConfig struct {
		EnableBlockReuse   *bool `yaml:"enable_block_reuse"`
		EventBufferMaxSize int   `yaml:"event_buffer_max_size"`
		TokensPerBlock     int   `yaml:"tokens_per_block"`
	} `yaml:"kv_cache_config"`
}

// CheckLaunch: trtllm-serve with the pinned --backend pytorch, the
// profile's --served_model_name, and --extra_llm_api_options naming a file
// whose kv_cache_config enables block reuse (no stored events without it),
// keeps an event buffer and uses the profile's block size.
func (*Adapter) CheckLaunch(f engines.LaunchFacts) error {
	l := f.Launch
	if !slices.Contains(l.Command, "trtllm-serve") {
		return engines.LaunchErrorf("launch.command", "must run trtllm-serve")
	}
	if v, _ := engines.ArgValue(l.Args, "--backend"); v != "pytorch" {
		return engines.LaunchErrorf("launch.args", "must pass --backend pytorch (the pinned backend; got %q)", v)
	}
	if v, ok := engines.ArgValue(l.Args, "--served_model_name"); !ok || v != f.ServedName {
		return engines.LaunchErrorf("launch.args", "--served_model_name %q must equal model.served_name %q", v, f.ServedName)
	}
	optPath, ok := engines.ArgValue(l.Args, "--extra_llm_api_options")
	if !ok {
		return engines.LaunchErrorf("launch.args", "must pass --extra_llm_api_options (block reuse and the event buffer live there)")
	}
	i := slices.IndexFunc(l.Files, func(f engines.LaunchFile) bool { return f.Path == optPath })
	if i < 0 {
		return engines.LaunchErrorf("launch.files", "must provide %s, the file --extra_llm_api_options names", optPath)
	}
	field := fmt.Sprintf("launch.files[%d].content", i)
	var opts options
	if err := yaml.Unmarshal([]byte(l.Files[i].Content), &opts); err != nil {
		return engines.LaunchErrorf(field, "is not YAML: %v", err)
	}
	kc := opts.KVCacheConfig
	switch {
	case kc.EnableBlockReuse == nil || !*kc.EnableBlockReuse:
		return engines.LaunchErrorf(field, "kv_cache_config.enable_block_reuse must be true (no stored events without it)")
	case kc.EventBufferMaxSize < 1:
		return engines.LaunchErrorf(field, "kv_cache_config.event_buffer_max_size must be ≥ 1 (0 turns events off)")
	case kc.TokensPerBlock != f.BlockSize:
		return engines.LaunchErrorf(field, "kv_cache_config.tokens_per_block %d must equal block_size %d", kc.TokensPerBlock, f.BlockSize)
	}
	return nil
}
