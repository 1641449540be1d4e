package profiles

import (
	"encoding/json"
	"fmt"
	"regexp"
	"slices"
	"strconv"
	"strings"

	"go.yaml.in/yaml/v3"
)

// fieldError is one validation failure: the dotted field path and what is
// wrong with it.
type fieldError struct {
	field string
	msg   string
}

func fieldErr(field, format string, a ...any) *fieldError {
	return &fieldError{field: field, msg: fmt.Sprintf(format, a...)}
}

// invalid builds the load error: "profiles: invalid catalog: <file>: <field>: <msg>".
func invalid(file, field, format string, a ...any) error {
	where := file
	if field != "" {
		where += ": " + field
	}
	return fmt.Errorf("%w: %s: %s", ErrInvalid, where, fmt.Sprintf(format, a...))
}

var (
	idPattern   = regexp.MustCompile(`^[a-z0-9][a-z0-9.-]{0,62}$`)
	repoPattern = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._-]*/[A-Za-z0-9][A-Za-z0-9._-]*$`)
	envPattern  = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]*$`)
)

// hashAlgos lists the coherent block-hash algorithms per engine (the
// gateway's admission rules; "none" for llama.cpp, which has no KV plane).
var hashAlgos = map[string][]string{
	EngineVLLM:     {"sha256_cbor", "xxhash_cbor"},
	EngineSGLang:   {"sha256_sglang"},
	EngineTRTLLM:   {"blockhash_trtllm"},
	EngineLlamaCpp: {"none"},
}

func (v EngineVersion) validate() *fieldError {
	switch {
	case v.Version == "":
		return fieldErr("version", "must be set")
	case v.Image == "":
		return fieldErr("image", "must be set")
	case v.Contract == "":
		return fieldErr("contract", "must be set")
	}
	return nil
}

// Validate checks a profile against the catalog rules with the gateway's
// default kvHashSeed "0". A Catalog validates every profile on load with its
// own seed; Validate is for profiles built or edited by hand.
func (p Profile) Validate() error {
	if fe := p.validate("0"); fe != nil {
		return invalid("profile "+p.ID, fe.field, "%s", fe.msg)
	}
	return nil
}

// validate returns the first problem, in field order, so errors are stable.
func (p Profile) validate(seed string) *fieldError {
	if !idPattern.MatchString(p.ID) {
		return fieldErr("id", "must be lowercase letters, digits, '.' and '-' (got %q)", p.ID)
	}
	if p.Name == "" {
		return fieldErr("name", "must be set")
	}
	if !repoPattern.MatchString(p.Model.Repo) {
		return fieldErr("model.repo", "must be \"org/name\" (got %q)", p.Model.Repo)
	}
	if fe := checkRevision("model.revision", p.Model.Revision); fe != nil {
		return fe
	}
	if p.Model.ServedName == "" {
		return fieldErr("model.served_name", "must be set")
	}
	if p.Model.ModelType == "" {
		return fieldErr("model.model_type", "must be set")
	}
	if p.Model.Architecture == "" {
		return fieldErr("model.architecture", "must be set")
	}
	if !repoPattern.MatchString(p.Tokenizer.Repo) {
		return fieldErr("tokenizer.repo", "must be \"org/name\" (got %q)", p.Tokenizer.Repo)
	}
	if fe := checkRevision("tokenizer.revision", p.Tokenizer.Revision); fe != nil {
		return fe
	}
	if p.Tokenizer.TemplateFamily == "" {
		return fieldErr("tokenizer.template_family", "must be set")
	}
	if (p.Tokenizer.AddBOS || p.Tokenizer.TemplateBOS) && p.Tokenizer.BOSToken == "" {
		return fieldErr("tokenizer.bos_token", "must be set when add_bos or template_bos is true")
	}
	if p.Tokenizer.EOSToken == "" {
		return fieldErr("tokenizer.eos_token", "must be set")
	}
	if !slices.Contains([]string{"completions", "chat", "both"}, p.APIMode) {
		return fieldErr("api_mode", "must be completions, chat or both (got %q)", p.APIMode)
	}
	for name := range p.Engines {
		if !slices.Contains(Engines(), name) {
			return fieldErr("engines."+name, "unknown engine (valid: %s)", strings.Join(Engines(), ", "))
		}
	}
	for _, name := range Engines() {
		es, ok := p.Engines[name]
		if !ok {
			return fieldErr("engines."+name, "missing (every profile describes %s)", strings.Join(Engines(), ", "))
		}
		if fe := es.validate(name, p, seed); fe != nil {
			fe.field = "engines." + name + "." + fe.field
			return fe
		}
	}
	return nil
}

// checkRevision accepts a full 40-hex commit, or "main" for a repo the
// references pin no revision for (recorded as unpinned).
func checkRevision(field, rev string) *fieldError {
	if rev == "main" {
		return nil
	}
	if len(rev) != 40 || strings.Trim(rev, "0123456789abcdef") != "" {
		return fieldErr(field, "must be a 40-hex commit or \"main\" (got %q)", rev)
	}
	return nil
}

func (es EngineSpec) validate(engine string, p Profile, seed string) *fieldError {
	if engine == EngineLlamaCpp {
		if es.BlockSize != 0 {
			return fieldErr("block_size", "must be 0: llama.cpp publishes no KV blocks")
		}
	} else if es.BlockSize < 1 {
		return fieldErr("block_size", "must be ≥ 1")
	}
	if !slices.Contains(hashAlgos[engine], es.HashAlgo) {
		return fieldErr("hash_algo", "must be one of %s for %s (got %q)", strings.Join(hashAlgos[engine], ", "), engine, es.HashAlgo)
	}
	if es.Blocked != nil {
		if !slices.Contains(BlockedCodes, es.Blocked.Code) {
			return fieldErr("blocked.code", "must be one of %s (got %q)", strings.Join(BlockedCodes, ", "), es.Blocked.Code)
		}
		if es.Blocked.Detail == "" {
			return fieldErr("blocked.detail", "must say why the tuple is blocked")
		}
		if es.Launch != nil {
			return fieldErr("launch", "must be absent for a blocked tuple (it is never launched)")
		}
		return nil
	}
	if es.Launch == nil {
		return fieldErr("launch", "must be set unless the tuple is blocked")
	}
	if fe := es.Launch.validate(); fe != nil {
		fe.field = "launch." + fe.field
		return fe
	}
	var fe *fieldError
	switch engine {
	case EngineVLLM:
		fe = checkVLLM(es, p, seed)
	case EngineSGLang:
		fe = checkSGLang(es, p)
	case EngineTRTLLM:
		fe = checkTRTLLM(es, p)
	case EngineLlamaCpp:
		fe = checkLlamaCpp(es)
	}
	return fe
}

func (l *LaunchSpec) validate() *fieldError {
	if len(l.Command) == 0 || l.Command[0] == "" {
		return fieldErr("command", "must name the entry point")
	}
	if len(l.Ports) == 0 {
		return fieldErr("ports", "must list at least the HTTP port")
	}
	seen := map[string]bool{}
	for i, pt := range l.Ports {
		if pt.Name == "" {
			return fieldErr(fmt.Sprintf("ports[%d].name", i), "must be set")
		}
		if seen[pt.Name] {
			return fieldErr(fmt.Sprintf("ports[%d].name", i), "repeats %q", pt.Name)
		}
		seen[pt.Name] = true
		if pt.Port < 1 || pt.Port > 65535 {
			return fieldErr(fmt.Sprintf("ports[%d].port", i), "must be in 1..65535 (got %d)", pt.Port)
		}
	}
	if !seen["http"] {
		return fieldErr("ports", "must include a port named \"http\"")
	}
	for k := range l.Env {
		if !envPattern.MatchString(k) {
			return fieldErr("env."+k, "is not a valid environment variable name")
		}
	}
	for i, m := range l.Mounts {
		if m.Source == "" || !strings.HasPrefix(m.Target, "/") {
			return fieldErr(fmt.Sprintf("mounts[%d]", i), "needs a source role and an absolute target")
		}
	}
	for i, f := range l.Files {
		if !strings.HasPrefix(f.Path, "/") {
			return fieldErr(fmt.Sprintf("files[%d].path", i), "must be absolute (got %q)", f.Path)
		}
	}
	if l.GPUs < 0 {
		return fieldErr("gpus", "must be ≥ 0")
	}
	if !strings.HasPrefix(l.HealthPath, "/") {
		return fieldErr("health_path", "must be an absolute URL path (got %q)", l.HealthPath)
	}
	return nil
}

// argValue returns the value of flag in args ("--flag value" or
// "--flag=value") and whether the flag is present.
func argValue(args []string, flag string) (string, bool) {
	for i, a := range args {
		if a == flag {
			if i+1 < len(args) {
				return args[i+1], true
			}
			return "", true
		}
		if v, ok := strings.CutPrefix(a, flag+"="); ok {
			return v, true
		}
	}
	return "", false
}

func hasArg(args []string, flag string) bool {
	_, ok := argValue(args, flag)
	return ok
}

// checkIntArg requires flag to be present with the integer value want.
func checkIntArg(args []string, flag string, want int) *fieldError {
	v, ok := argValue(args, flag)
	if !ok {
		return fieldErr("launch.args", "must pass %s %d", flag, want)
	}
	if n, err := strconv.Atoi(v); err != nil || n != want {
		return fieldErr("launch.args", "%s %q must equal block_size %d", flag, v, want)
	}
	return nil
}

// eventsConfig is the JSON both vLLM and SGLang take in --kv-events-config
// (vLLM's KVEventsConfig; SGLang's copy has no enable_kv_cache_events).
type eventsConfig struct {
	EnableKVCacheEvents *bool   `json:"enable_kv_cache_events"`
	Publisher           string  `json:"publisher"`
	Endpoint            string  `json:"endpoint"`
	ReplayEndpoint      *string `json:"replay_endpoint"`
	Topic               *string `json:"topic"`
}

func parseEventsConfig(args []string, engine string) (eventsConfig, *fieldError) {
	var ec eventsConfig
	raw, ok := argValue(args, "--kv-events-config")
	if !ok {
		return ec, fieldErr("launch.args", "must pass --kv-events-config (the engine publishes no KV events otherwise)")
	}
	dec := json.NewDecoder(strings.NewReader(raw))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&ec); err != nil {
		return ec, fieldErr("launch.args", "--kv-events-config is not valid %s KV events JSON: %v", engine, err)
	}
	if ec.Publisher != "zmq" {
		return ec, fieldErr("launch.args", "--kv-events-config publisher must be \"zmq\" (got %q)", ec.Publisher)
	}
	if !strings.HasPrefix(ec.Endpoint, "tcp://") {
		return ec, fieldErr("launch.args", "--kv-events-config endpoint must be a tcp:// address (got %q)", ec.Endpoint)
	}
	return ec, nil
}

func checkVLLM(es EngineSpec, p Profile, seed string) *fieldError {
	args := es.Launch.Args
	if fe := checkIntArg(args, "--block-size", es.BlockSize); fe != nil {
		return fe
	}
	if v, _ := argValue(args, "--prefix-caching-hash-algo"); v != es.HashAlgo {
		return fieldErr("launch.args", "--prefix-caching-hash-algo %q must equal hash_algo %q", v, es.HashAlgo)
	}
	if !hasArg(args, "--enable-prefix-caching") {
		return fieldErr("launch.args", "must pass --enable-prefix-caching (no KV events without it)")
	}
	ec, fe := parseEventsConfig(args, "vLLM")
	if fe != nil {
		return fe
	}
	if ec.EnableKVCacheEvents == nil || !*ec.EnableKVCacheEvents {
		return fieldErr("launch.args", "--kv-events-config must set enable_kv_cache_events: true")
	}
	if got, ok := es.Launch.Env["PYTHONHASHSEED"]; !ok || got != seed {
		return fieldErr("launch.env.PYTHONHASHSEED", "must be %q, the gateway's kvHashSeed (got %q)", seed, got)
	}
	if v, ok := argValue(args, "--served-model-name"); !ok || v != p.Model.ServedName {
		return fieldErr("launch.args", "--served-model-name %q must equal model.served_name %q", v, p.Model.ServedName)
	}
	return checkEventPorts(es.Launch, ec)
}

func checkSGLang(es EngineSpec, p Profile) *fieldError {
	args := es.Launch.Args
	if fe := checkIntArg(args, "--page-size", es.BlockSize); fe != nil {
		return fe
	}
	ec, fe := parseEventsConfig(args, "SGLang")
	if fe != nil {
		return fe
	}
	if ec.EnableKVCacheEvents != nil {
		return fieldErr("launch.args", "--kv-events-config: SGLang has no enable_kv_cache_events field")
	}
	if v, ok := argValue(args, "--served-model-name"); !ok || v != p.Model.ServedName {
		return fieldErr("launch.args", "--served-model-name %q must equal model.served_name %q", v, p.Model.ServedName)
	}
	if v, _ := argValue(args, "--revision"); v != p.Model.Revision {
		return fieldErr("launch.args", "--revision %q must equal model.revision %q (the identity probe fails otherwise)", v, p.Model.Revision)
	}
	return checkEventPorts(es.Launch, ec)
}

// checkEventPorts requires the ports named kv-events (and kv-replay when a
// replay endpoint is configured) to match the endpoints' port numbers.
func checkEventPorts(l *LaunchSpec, ec eventsConfig) *fieldError {
	if fe := checkEndpointPort(l, "kv-events", ec.Endpoint); fe != nil {
		return fe
	}
	if ec.ReplayEndpoint != nil && *ec.ReplayEndpoint != "" {
		return checkEndpointPort(l, "kv-replay", *ec.ReplayEndpoint)
	}
	return nil
}

func checkEndpointPort(l *LaunchSpec, name, endpoint string) *fieldError {
	i := strings.LastIndexByte(endpoint, ':')
	n, err := strconv.Atoi(endpoint[i+1:])
	if i < 0 || err != nil {
		return fieldErr("launch.args", "%s endpoint %q has no port", name, endpoint)
	}
	if got := l.Port(name); got != n {
		return fieldErr("launch.ports", "port %q is %d, but the events config uses %d", name, got, n)
	}
	return nil
}

// trtllmOptions is the part of TensorRT-LLM's extra LLM API options YAML the
// catalog checks; other keys are allowed (the engine owns that schema).
type trtllmOptions struct {
	KVCacheConfig struct {
		EnableBlockReuse   *bool `yaml:"enable_block_reuse"`
		EventBufferMaxSize int   `yaml:"event_buffer_max_size"`
		TokensPerBlock     int   `yaml:"tokens_per_block"`
	} `yaml:"kv_cache_config"`
}

func checkTRTLLM(es EngineSpec, p Profile) *fieldError {
	l := es.Launch
	if !slices.Contains(l.Command, "trtllm-serve") {
		return fieldErr("launch.command", "must run trtllm-serve")
	}
	if v, _ := argValue(l.Args, "--backend"); v != "pytorch" {
		return fieldErr("launch.args", "must pass --backend pytorch (the pinned backend; got %q)", v)
	}
	if v, ok := argValue(l.Args, "--served_model_name"); !ok || v != p.Model.ServedName {
		return fieldErr("launch.args", "--served_model_name %q must equal model.served_name %q", v, p.Model.ServedName)
	}
	optPath, ok := argValue(l.Args, "--extra_llm_api_options")
	if !ok {
		return fieldErr("launch.args", "must pass --extra_llm_api_options (block reuse and the event buffer live there)")
	}
	i := slices.IndexFunc(l.Files, func(f File) bool { return f.Path == optPath })
	if i < 0 {
		return fieldErr("launch.files", "must provide %s, the file --extra_llm_api_options names", optPath)
	}
	var opts trtllmOptions
	if err := yaml.Unmarshal([]byte(l.Files[i].Content), &opts); err != nil {
		return fieldErr(fmt.Sprintf("launch.files[%d].content", i), "is not YAML: %v", err)
	}
	kc := opts.KVCacheConfig
	switch {
	case kc.EnableBlockReuse == nil || !*kc.EnableBlockReuse:
		return fieldErr(fmt.Sprintf("launch.files[%d].content", i), "kv_cache_config.enable_block_reuse must be true (no stored events without it)")
	case kc.EventBufferMaxSize < 1:
		return fieldErr(fmt.Sprintf("launch.files[%d].content", i), "kv_cache_config.event_buffer_max_size must be ≥ 1 (0 turns events off)")
	case kc.TokensPerBlock != es.BlockSize:
		return fieldErr(fmt.Sprintf("launch.files[%d].content", i), "kv_cache_config.tokens_per_block %d must equal block_size %d", kc.TokensPerBlock, es.BlockSize)
	}
	return nil
}

func checkLlamaCpp(es EngineSpec) *fieldError {
	if es.Launch.Command[0] != "llama-server" {
		return fieldErr("launch.command", "must run llama-server (got %q)", es.Launch.Command[0])
	}
	return nil
}
