package profiles

import (
	"fmt"
	"regexp"
	"slices"
	"strings"
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

func (v EngineVersion) validate() *fieldError {
	switch {
	case v.Version == "":
		return fieldErr("version", "must be set")
	case v.Source.Kind != SourceCapture && v.Source.Kind != SourceRevision && v.Source.Kind != SourceDocumentation:
		return fieldErr("source.kind", "must be capture, source or documentation, got %q", v.Source.Kind)
	case v.Source.Ref == "":
		return fieldErr("source.ref", "must name the capture, revision or document the version was read from")
	case v.Image == "":
		return fieldErr("image", "must be set")
	case v.Contract == "":
		return fieldErr("contract", "must be set")
	}
	return nil
}

// Validate checks a profile against the catalog's own rules (a Catalog
// validates every profile on load); Validate is for profiles built or
// edited by hand. Coherence with each engine's contract is checked by the
// engines' adapters at the boundary (runbook/labkit.CheckCatalog).
func (p Profile) Validate() error {
	if fe := p.validate(); fe != nil {
		return invalid("profile "+p.ID, fe.field, "%s", fe.msg)
	}
	return nil
}

// validate returns the first problem, in field order, so errors are stable.
func (p Profile) validate() *fieldError {
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
		if fe := es.validate(); fe != nil {
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

// validate checks what the catalog itself can know about an engine spec.
// Its coherence with the engine (block size and hash algorithm against the
// engine's KV contract, launch flags against the block size, seed and model)
// is the engine adapter's to judge: this package imports nothing of llmgw's,
// so runbook/labkit.CheckCatalog asks the adapters at the boundary, before
// any runbook uses the catalog.
func (es EngineSpec) validate() *fieldError {
	if es.BlockSize < 0 {
		return fieldErr("block_size", "must be ≥ 0")
	}
	if es.HashAlgo == "" {
		return fieldErr("hash_algo", "must be set (\"none\" for an engine without KV events)")
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
	return nil
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
