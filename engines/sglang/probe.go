package sglang

import (
	"encoding/json"
	"fmt"
	"net"
	"strconv"
	"strings"

	"github.com/llmgw/llmgw/engines"
)

// Describer: what a running SGLang says about itself on GET
// /get_server_info, which answers the server's arguments (ServerArgs as a
// flat object: page_size, disaggregation_mode, disaggregation_bootstrap_port,
// kv_events_config as a JSON string, context_length) plus "version"
// (python/sglang/srt/entrypoints/http_server.py get_server_info at
// sgl-project/sglang 0025436eab0556737d615b36a4dd3e1e26e82f3d:
// {**dataclasses.asdict(server_args), **scheduler_info, "internal_states",
// "version"}; python/sglang/srt/server_args.py). It answers from start-up,
// before any request, so a fresh pool tells its page size, role, bootstrap
// port and event socket. The reference runbooks check the same fields
// (page_size 16, kv_events endpoint port 5557, version).
func (*Adapter) OwnedBy() string { return "sglang" }

func (*Adapter) DescribePaths() []string { return []string{"/get_server_info"} }

func (*Adapter) Describe(path string, body []byte, d *engines.Description) error {
	if path != "/get_server_info" {
		return fmt.Errorf("sglang: no description at %s", path)
	}
	var info struct {
		PageSize      *int            `json:"page_size"`
		Mode          *string         `json:"disaggregation_mode"`
		BootstrapPort int             `json:"disaggregation_bootstrap_port"`
		KVEvents      json.RawMessage `json:"kv_events_config"`
		ContextLength int             `json:"context_length"`
		Version       string          `json:"version"`
	}
	if err := json.Unmarshal(body, &info); err != nil {
		return fmt.Errorf("sglang: /get_server_info: %w", err)
	}
	if info.Version == "" && info.PageSize == nil {
		return fmt.Errorf("sglang: /get_server_info has neither version nor page_size")
	}
	const src = "GET /get_server_info "
	if info.PageSize != nil && *info.PageSize > 0 {
		d.BlockSize = *info.PageSize
		d.Said("block_size", src+"page_size")
	}
	d.HashAlgo = "sha256_sglang" // SGLang has one block-hash chain
	d.Said("hash_algo", "SGLang's only block hash (no option selects another)")
	if info.Mode != nil {
		switch *info.Mode {
		case "null", "":
			d.Role = engines.RoleConverged
		case "prefill":
			d.Role = engines.RolePrefill
		case "decode":
			d.Role = engines.RoleDecode
		default:
			return fmt.Errorf("sglang: /get_server_info: disaggregation_mode %q is not null, prefill or decode", *info.Mode)
		}
		d.Said("role", src+"disaggregation_mode")
	}
	// The bootstrap server runs on prefill workers only; other roles report
	// the default port they do not open.
	if d.Role == engines.RolePrefill && info.BootstrapPort > 0 && info.BootstrapPort <= 65535 {
		d.BootstrapPort = info.BootstrapPort
		d.Said("bootstrap_port", src+"disaggregation_bootstrap_port")
	}
	if info.ContextLength > 0 {
		d.ContextLength = info.ContextLength
		d.Said("context_length", src+"context_length")
	}
	ev, rp, off, err := kvEventsConfig(info.KVEvents)
	if err != nil {
		return err
	}
	switch {
	case off:
		d.EventsOff = true
		d.Said("events", src+"kv_events_config (null: no publisher)")
	case ev != "":
		d.Events, d.Replay = ev, rp
		d.Said("events", src+"kv_events_config")
	}
	return nil
}

// kvEventsConfig reads kv_events_config: null (no events), a JSON string
// holding the config object, or the object itself.
func kvEventsConfig(raw json.RawMessage) (events, replay string, off bool, err error) {
	s := strings.TrimSpace(string(raw))
	if s == "" || s == "null" {
		return "", "", true, nil
	}
	obj := []byte(s)
	if s[0] == '"' {
		var inner string
		if err := json.Unmarshal(obj, &inner); err != nil {
			return "", "", false, fmt.Errorf("sglang: kv_events_config: %w", err)
		}
		if inner == "" {
			return "", "", true, nil
		}
		obj = []byte(inner)
	}
	var c struct {
		Publisher string  `json:"publisher"`
		Endpoint  string  `json:"endpoint"`
		Replay    *string `json:"replay_endpoint"`
	}
	if err := json.Unmarshal(obj, &c); err != nil {
		return "", "", false, fmt.Errorf("sglang: kv_events_config: %w", err)
	}
	if c.Publisher == "null" {
		return "", "", true, nil
	}
	if c.Replay != nil {
		replay = *c.Replay
	}
	return c.Endpoint, replay, false, nil
}

// TokenizeBody: POST /v1/tokenize {"model","prompt","add_special_tokens":
// false}, the adapter's Tokenize shape (testdata/cases/tokenize.json).
func (a *Adapter) TokenizeBody(model, text string) []byte {
	sh := a.Tokenize()
	b, _ := json.Marshal(map[string]any{sh.ModelField: model, sh.TextField: text, sh.AddSpecialField: false})
	return b
}

// ParseTokens reads TokenizeResponse {"tokens":[...],"count","max_model_len"}.
func (a *Adapter) ParseTokens(body []byte) ([]uint32, error) {
	var t map[string]json.RawMessage
	if err := json.Unmarshal(body, &t); err != nil {
		return nil, fmt.Errorf("sglang: tokenize: %w", err)
	}
	raw, ok := t[a.Tokenize().TokensField]
	if !ok {
		return nil, fmt.Errorf("sglang: tokenize answer has no %q", a.Tokenize().TokensField)
	}
	var ids []uint32
	if err := json.Unmarshal(raw, &ids); err != nil {
		return nil, fmt.Errorf("sglang: tokenize tokens: %w", err)
	}
	return ids, nil
}

// EventsProbe: SGLang's events are a ZMQ PUB stream, not destructive.
func (*Adapter) EventsProbe() (string, string, int) { return "", "", 0 }

// Guide: SGLang starts as a single pool with CHWBL; kvExactMode 3 only after
// hash parity is verified; a role-split pool runs concurrent P/D joined by
// the prefill's bootstrap server.
func (*Adapter) Guide() engines.Guide {
	return engines.Guide{
		FirstSel:   8,
		FirstWhy:   "the guide starts SGLang as a single pool with CHWBL: its radix cache rewards prefix affinity from the first request",
		KVExactWhy: "SGLang publishes its radix-cache blocks over ZeroMQ: add kvExactMode 3 only after hash parity (page_size, tokenizer, sha256_sglang chain) is verified",
		PDWhy:      "SGLang prefill/decode is concurrent: both legs are sent at once, joined by the prefill's bootstrap triple (host, port, room); a sequential dispatch would deadlock",
	}
}

// BootstrapAddr joins a prefill's host with the port it reported.
func BootstrapAddr(httpAddr string, port int) string {
	host, _, err := net.SplitHostPort(httpAddr)
	if err != nil {
		return ""
	}
	return net.JoinHostPort(host, strconv.Itoa(port))
}

var (
	_ engines.Describer = (*Adapter)(nil)
	_ engines.Guided    = (*Adapter)(nil)
)
