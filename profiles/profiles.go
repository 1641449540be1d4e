// Package profiles is llmgw's model catalog: the pinned engine version tuple
// and the evaluation profiles (model, tokenizer and chat-template facts, block
// size and hash algorithm per engine, launch specs, known-BLOCKED tuples).
//
// The catalog is YAML embedded in the binary (catalog/). It is decoded
// strictly (unknown or repeated keys are errors) and validated on load, so a
// broken profile never reaches a runbook: the error names the file and the
// field path.
//
// The package is a leaf: engines are plain strings ("vllm", "sglang",
// "trtllm", "llamacpp") so it imports nothing of llmgw's.
package profiles

import (
	"bytes"
	"embed"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"path"
	"slices"
	"sort"
	"strings"

	"go.yaml.in/yaml/v3"
)

// Engine names used as keys throughout the catalog.
const (
	EngineVLLM     = "vllm"
	EngineSGLang   = "sglang"
	EngineTRTLLM   = "trtllm"
	EngineLlamaCpp = "llamacpp"
)

// Engines returns the engine names every profile must describe, in the
// catalog's fixed order. The slice is a fresh copy.
func Engines() []string {
	return []string{EngineVLLM, EngineSGLang, EngineTRTLLM, EngineLlamaCpp}
}

// BlockedCodes are the reason codes a BLOCKED tuple may carry: the reference
// catalog's vocabulary for tuples refused before anything is launched.
var BlockedCodes = []string{
	"architecture_unsupported", // the engine has no implementation of the model's architecture
	"hardware_unsupported",     // the pinned hardware lacks a kernel the model needs
	"engine_renderer",          // the engine renders chat with its own encoder, not the template
	"checkpoint_format",        // the engine's loader cannot read the checkpoint's format
}

// Errors callers classify with errors.Is.
var (
	// ErrUnknownProfile: Get was asked for an ID the catalog does not hold.
	ErrUnknownProfile = errors.New("profiles: unknown profile")
	// ErrUnknownEngine: an engine name outside Engines().
	ErrUnknownEngine = errors.New("profiles: unknown engine")
	// ErrBlocked: the tuple is known-BLOCKED; the error text carries the code.
	ErrBlocked = errors.New("profiles: tuple is blocked")
	// ErrInvalid: the catalog failed strict decoding or validation.
	ErrInvalid = errors.New("profiles: invalid catalog")
)

//go:embed catalog
var embedded embed.FS

// Catalog is a loaded, validated model catalog. It is immutable after Load
// and safe for concurrent use.
type Catalog struct {
	schema   string
	seed     string
	versions Versions
	profiles []Profile // sorted by ID
}

// EngineVersion is one engine's pinned identity in the version tuple.
type EngineVersion struct {
	// Version is the engine release (vLLM "0.31.0"; llama.cpp's build_info,
	// "b0-unknown" for the captured build).
	Version string `yaml:"version" json:"version"`
	// Source says where Version was established.
	Source VersionSource `yaml:"source" json:"source"`
	// Backend is set when the engine has several (TensorRT-LLM "pytorch").
	Backend string `yaml:"backend,omitempty" json:"backend,omitempty"`
	// Image is the container image a docker launcher starts by default.
	Image string `yaml:"image" json:"image"`
	// Contract names the engine wire contract the gateway applies.
	Contract string `yaml:"contract" json:"contract"`
}

// Where a catalog version was established (VersionSource.Kind).
const (
	// SourceCapture: a build was run and its answers recorded.
	SourceCapture = "capture"
	// SourceRevision: a public source revision was read.
	SourceRevision = "source"
	// SourceDocumentation: the reference's documentation names it; no build
	// of it was run.
	SourceDocumentation = "documentation"
)

// VersionSource is where a version came from: Kind (SourceCapture,
// SourceRevision or SourceDocumentation) and Ref, the capture, revision or
// document it was read from.
type VersionSource struct {
	Kind string `yaml:"kind" json:"kind"`
	Ref  string `yaml:"ref" json:"ref"`
}

// Versions is the catalog's version tuple, one entry per engine.
type Versions struct {
	VLLM     EngineVersion `yaml:"vllm" json:"vllm"`
	SGLang   EngineVersion `yaml:"sglang" json:"sglang"`
	TRTLLM   EngineVersion `yaml:"trtllm" json:"trtllm"`
	LlamaCpp EngineVersion `yaml:"llamacpp" json:"llamacpp"`
}

// For returns the entry for engine, or an error wrapping ErrUnknownEngine.
func (v Versions) For(engine string) (EngineVersion, error) {
	switch engine {
	case EngineVLLM:
		return v.VLLM, nil
	case EngineSGLang:
		return v.SGLang, nil
	case EngineTRTLLM:
		return v.TRTLLM, nil
	case EngineLlamaCpp:
		return v.LlamaCpp, nil
	}
	return EngineVersion{}, unknownEngine(engine)
}

// Profile is one evaluation profile. Values returned by a Catalog are deep
// copies: callers may modify them without affecting the catalog.
type Profile struct {
	// ID is the stable key (also the file name), e.g. "qwen3-0.6b".
	ID string `yaml:"id" json:"id"`
	// Name is the human name, e.g. "Qwen3-0.6B".
	Name      string    `yaml:"name" json:"name"`
	Model     Model     `yaml:"model" json:"model"`
	Tokenizer Tokenizer `yaml:"tokenizer" json:"tokenizer"`
	// APIMode is the surface the gateway hashes for KV-exact routing:
	// "completions", "chat" or "both" (the reference kvExactApiMode values).
	APIMode string `yaml:"api_mode" json:"api_mode"`
	// Engines holds one entry per engine in Engines().
	Engines map[string]EngineSpec `yaml:"engines" json:"engines"`
}

// Model identifies the weights.
type Model struct {
	Repo     string `yaml:"repo" json:"repo"`         // "org/name"
	Revision string `yaml:"revision" json:"revision"` // a commit, or "main" when not yet pinned
	// ServedName is the model id clients send and /v1/models lists.
	ServedName   string `yaml:"served_name" json:"served_name"`
	ModelType    string `yaml:"model_type" json:"model_type"`
	Architecture string `yaml:"architecture" json:"architecture"`
	Gated        bool   `yaml:"gated" json:"gated"` // downloading needs an accepted licence and a token
}

// Tokenizer holds the tokenizer and chat-template facts that decide whether
// the gateway's token ids (and so its block hashes) match the engine's.
type Tokenizer struct {
	Repo     string `yaml:"repo" json:"repo"`
	Revision string `yaml:"revision" json:"revision"`
	// TemplateFamily names the chat-template dialect: "chatml", "llama3",
	// "exaone", "gemma".
	TemplateFamily string `yaml:"template_family" json:"template_family"`
	// AddBOS: the tokenizer prepends BOSToken when encoding a completions
	// prompt with special tokens (engines do so on /v1/completions).
	AddBOS bool `yaml:"add_bos" json:"add_bos"`
	// TemplateBOS: the chat template itself writes BOSToken, so chat is
	// tokenized without adding special tokens again.
	TemplateBOS bool   `yaml:"template_bos" json:"template_bos"`
	BOSToken    string `yaml:"bos_token" json:"bos_token"` // "" when the model defines none
	EOSToken    string `yaml:"eos_token" json:"eos_token"`
	Notes       string `yaml:"notes,omitempty" json:"notes,omitempty"`
}

// EngineSpec is how one engine serves the profile.
type EngineSpec struct {
	// BlockSize is the KV block (page) size in tokens; 0 for llama.cpp, which
	// publishes no KV events.
	BlockSize int `yaml:"block_size" json:"block_size"`
	// HashAlgo is the block-hash algorithm the gateway must use: one of the
	// engine adapter's KV().HashAlgos, "none" for an engine without KV
	// events (checked at the boundary, runbook/labkit.CheckCatalog).
	HashAlgo string `yaml:"hash_algo" json:"hash_algo"`
	// Blocked is non-nil when the tuple is known-BLOCKED; Launch is then
	// optional and never used.
	Blocked *Blocked `yaml:"blocked,omitempty" json:"blocked,omitempty"`
	// Launch is nil only for a blocked tuple.
	Launch *LaunchSpec `yaml:"launch,omitempty" json:"launch,omitempty"`
}

// Blocked records why a tuple cannot run.
type Blocked struct {
	Code   string `yaml:"code" json:"code"` // one of BlockedCodes
	Detail string `yaml:"detail" json:"detail"`
}

// LaunchSpec describes one worker process of an engine. It starts nothing;
// a launcher turns it into a container or process.
type LaunchSpec struct {
	// Engine and Image are filled in by Profile.Launch from the version
	// tuple when the YAML does not override Image.
	Engine string `yaml:"-" json:"engine,omitempty"`
	Image  string `yaml:"image,omitempty" json:"image,omitempty"`
	// Command is the entry point and its fixed leading words.
	Command []string `yaml:"command" json:"command"`
	// Args follow Command, in order.
	Args []string `yaml:"args,omitempty" json:"args,omitempty"`
	// Env is set in the worker's environment. nil means none.
	Env map[string]string `yaml:"env,omitempty" json:"env,omitempty"`
	// Ports the worker listens on inside its container.
	Ports []Port `yaml:"ports" json:"ports"`
	// Mounts name host directories by role; the launcher resolves Source.
	Mounts []Mount `yaml:"mounts,omitempty" json:"mounts,omitempty"`
	// Files are written into the container before start (config files the
	// args refer to).
	Files []File `yaml:"files,omitempty" json:"files,omitempty"`
	// GPUs is the number of GPUs the worker needs; 0 runs on CPU.
	GPUs int `yaml:"gpus" json:"gpus"`
	// HealthPath answers 200 once the worker serves inference.
	HealthPath string `yaml:"health_path" json:"health_path"`
}

// Port is a named container port.
type Port struct {
	Name string `yaml:"name" json:"name"` // "http", "kv-events", "kv-replay"
	Port int    `yaml:"port" json:"port"`
}

// Mount is a directory the worker needs. Source is a role ("weights",
// "hf-cache", "torch-extensions") that the launcher maps to a host path.
type Mount struct {
	Source   string `yaml:"source" json:"source"`
	Target   string `yaml:"target" json:"target"`
	ReadOnly bool   `yaml:"read_only,omitempty" json:"read_only,omitempty"`
}

// File is a file placed in the worker's filesystem.
type File struct {
	Path    string `yaml:"path" json:"path"`
	Content string `yaml:"content" json:"content"`
}

// Port returns the container port named name, or 0.
func (l LaunchSpec) Port(name string) int {
	for _, p := range l.Ports {
		if p.Name == name {
			return p.Port
		}
	}
	return 0
}

// EmbeddedFS is the catalog embedded in the binary, as LoadFS reads it
// (tests build broken copies of it).
func EmbeddedFS() (fs.FS, error) { return fs.Sub(embedded, "catalog") }

// Load returns the catalog embedded in the binary.
func Load() (*Catalog, error) {
	sub, err := fs.Sub(embedded, "catalog")
	if err != nil {
		return nil, fmt.Errorf("profiles: embedded catalog: %w", err)
	}
	return LoadFS(sub)
}

// catalogFile is the strict shape of catalog.yaml.
type catalogFile struct {
	Schema     string   `yaml:"schema"`
	KVHashSeed *string  `yaml:"kv_hash_seed"`
	Versions   Versions `yaml:"versions"`
}

// SchemaVersion is the only catalog schema this package reads.
const SchemaVersion = "llmgw.profiles/v1"

// LoadFS loads a catalog from fsys: catalog.yaml at the root and one
// profiles/<id>.yaml per profile. Every file is decoded strictly and
// validated; the first problem is returned as an error wrapping ErrInvalid
// that names the file and the field path.
func LoadFS(fsys fs.FS) (*Catalog, error) {
	var cf catalogFile
	if err := decodeFile(fsys, "catalog.yaml", &cf); err != nil {
		return nil, err
	}
	c := &Catalog{schema: cf.Schema, versions: cf.Versions}
	if cf.Schema != SchemaVersion {
		return nil, invalid("catalog.yaml", "schema", "must be %q, got %q", SchemaVersion, cf.Schema)
	}
	if cf.KVHashSeed == nil || *cf.KVHashSeed == "" {
		return nil, invalid("catalog.yaml", "kv_hash_seed", "must be set (the gateway's kvHashSeed, default \"0\")")
	}
	c.seed = *cf.KVHashSeed
	for _, e := range Engines() {
		v, _ := cf.Versions.For(e)
		if err := v.validate(); err != nil {
			return nil, invalid("catalog.yaml", "versions."+e+"."+err.field, "%s", err.msg)
		}
	}
	if cf.Versions.TRTLLM.Backend != "pytorch" {
		return nil, invalid("catalog.yaml", "versions.trtllm.backend", "must be \"pytorch\" (the pinned backend), got %q", cf.Versions.TRTLLM.Backend)
	}

	names, err := fs.Glob(fsys, "profiles/*.yaml")
	if err != nil {
		return nil, fmt.Errorf("profiles: listing profiles: %w", err)
	}
	if len(names) == 0 {
		return nil, invalid("profiles/", "", "no profiles found")
	}
	for _, name := range names {
		var p Profile
		if err := decodeFile(fsys, name, &p); err != nil {
			return nil, err
		}
		if fe := p.validate(); fe != nil {
			return nil, invalid(name, fe.field, "%s", fe.msg)
		}
		if want := strings.TrimSuffix(path.Base(name), ".yaml"); p.ID != want {
			return nil, invalid(name, "id", "must equal the file name %q, got %q", want, p.ID)
		}
		for e, es := range p.Engines {
			if es.Launch != nil && es.Launch.Image == "" {
				v, _ := c.versions.For(e)
				es.Launch.Image = v.Image
			}
		}
		c.profiles = append(c.profiles, p)
	}
	sort.Slice(c.profiles, func(i, j int) bool { return c.profiles[i].ID < c.profiles[j].ID })
	return c, nil
}

// decodeFile strictly decodes one YAML document: unknown keys, repeated keys
// and trailing documents are errors.
func decodeFile(fsys fs.FS, name string, out any) error {
	data, err := fs.ReadFile(fsys, name)
	if err != nil {
		return fmt.Errorf("profiles: %s: %w", name, err)
	}
	dec := yaml.NewDecoder(bytes.NewReader(data))
	dec.KnownFields(true)
	if err := dec.Decode(out); err != nil {
		if errors.Is(err, io.EOF) {
			return invalid(name, "", "empty file")
		}
		return fmt.Errorf("%w: %s: %w", ErrInvalid, name, err)
	}
	var extra yaml.Node
	if err := dec.Decode(&extra); !errors.Is(err, io.EOF) {
		return invalid(name, "", "more than one YAML document")
	}
	return nil
}

// Profiles returns every profile, sorted by ID. The slice and its profiles
// are copies.
func (c *Catalog) Profiles() []Profile {
	out := make([]Profile, len(c.profiles))
	for i, p := range c.profiles {
		out[i] = p.clone()
	}
	return out
}

// IDs returns the profile IDs, sorted.
func (c *Catalog) IDs() []string {
	ids := make([]string, len(c.profiles))
	for i, p := range c.profiles {
		ids[i] = p.ID
	}
	return ids
}

// Get returns the profile with id. An unknown id is an error wrapping
// ErrUnknownProfile that lists the valid IDs.
func (c *Catalog) Get(id string) (Profile, error) {
	for _, p := range c.profiles {
		if p.ID == id {
			return p.clone(), nil
		}
	}
	return Profile{}, fmt.Errorf("%w %q (valid: %s)", ErrUnknownProfile, id, strings.Join(c.IDs(), ", "))
}

// Versions returns the version tuple.
func (c *Catalog) Versions() Versions { return c.versions }

// KVHashSeed returns the seed every vLLM launch exports as PYTHONHASHSEED
// and the gateway must use as its kvHashSeed.
func (c *Catalog) KVHashSeed() string { return c.seed }

// Blocked reports whether the (engine, profile) tuple is known-BLOCKED, with
// its reason code and detail. An unknown engine or profile is not blocked
// (blocked=false): callers validate names with Get and Engines first.
func (c *Catalog) Blocked(engine, profileID string) (reasonCode, detail string, blocked bool) {
	for _, p := range c.profiles {
		if p.ID != profileID {
			continue
		}
		if es, ok := p.Engines[engine]; ok && es.Blocked != nil {
			return es.Blocked.Code, es.Blocked.Detail, true
		}
		return "", "", false
	}
	return "", "", false
}

// BlockedTuple is one known-BLOCKED (engine, profile) pair.
type BlockedTuple struct {
	Engine  string `json:"engine"`
	Profile string `json:"profile"`
	Code    string `json:"code"`
	Detail  string `json:"detail"`
}

// BlockedTuples lists every known-BLOCKED tuple, ordered by profile ID and
// then engine order.
func (c *Catalog) BlockedTuples() []BlockedTuple {
	var out []BlockedTuple
	for _, p := range c.profiles {
		for _, e := range Engines() {
			if b := p.Engines[e].Blocked; b != nil {
				out = append(out, BlockedTuple{Engine: e, Profile: p.ID, Code: b.Code, Detail: b.Detail})
			}
		}
	}
	return out
}

// Engine returns the profile's entry for engine (block size, hash algorithm,
// blocked status, launch spec), deep-copied. An engine outside Engines() is
// an error wrapping ErrUnknownEngine; a blocked tuple is returned without
// error (check Blocked).
func (p Profile) Engine(engine string) (EngineSpec, error) {
	if _, ok := p.Engines[engine]; !ok || !slices.Contains(Engines(), engine) {
		return EngineSpec{}, unknownEngine(engine)
	}
	return p.clone().Engines[engine], nil
}

// Launch returns the launch spec for engine, with Engine set and Image
// defaulted from the catalog's version tuple. It fails with ErrUnknownEngine
// for a name outside Engines() and with ErrBlocked for a blocked tuple.
// Profiles obtained from a Catalog always carry the image; a Profile built
// by hand gets the image it declares.
func (p Profile) Launch(engine string) (LaunchSpec, error) {
	if !slices.Contains(Engines(), engine) {
		return LaunchSpec{}, unknownEngine(engine)
	}
	es, ok := p.Engines[engine]
	if !ok {
		return LaunchSpec{}, fmt.Errorf("profiles: %s: no %s entry", p.ID, engine)
	}
	if es.Blocked != nil {
		return LaunchSpec{}, fmt.Errorf("%w: %s on %s: %s: %s", ErrBlocked, p.ID, engine, es.Blocked.Code, es.Blocked.Detail)
	}
	if es.Launch == nil {
		return LaunchSpec{}, fmt.Errorf("profiles: %s: %s has no launch spec", p.ID, engine)
	}
	l := es.Launch.clone()
	l.Engine = engine
	return l, nil
}

func unknownEngine(engine string) error {
	return fmt.Errorf("%w %q (valid: %s)", ErrUnknownEngine, engine, strings.Join(Engines(), ", "))
}

func (p Profile) clone() Profile {
	q := p
	q.Engines = make(map[string]EngineSpec, len(p.Engines))
	for k, es := range p.Engines {
		if es.Blocked != nil {
			b := *es.Blocked
			es.Blocked = &b
		}
		if es.Launch != nil {
			l := es.Launch.clone()
			es.Launch = &l
		}
		q.Engines[k] = es
	}
	return q
}

func (l LaunchSpec) clone() LaunchSpec {
	m := l
	m.Command = slices.Clone(l.Command)
	m.Args = slices.Clone(l.Args)
	m.Ports = slices.Clone(l.Ports)
	m.Mounts = slices.Clone(l.Mounts)
	m.Files = slices.Clone(l.Files)
	if l.Env != nil {
		m.Env = make(map[string]string, len(l.Env))
		for k, v := range l.Env {
			m.Env[k] = v
		}
	}
	return m
}
