package rule

import (
	"crypto/x509"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/llmgw/llmgw/engines"
	_ "github.com/llmgw/llmgw/engines/all" // the adapters engines.For reads
	"github.com/llmgw/llmgw/engines/kvhash"
	"github.com/llmgw/llmgw/engines/tokenizer"
)

// Limits enforced by Admit.
const (
	MaxNameLen       = 63
	MaxEndpoints     = 256
	MaxEndpointIDLen = 128
	MaxWeight        = 1000
	MaxDpRankCount   = 8
	MaxKVBlockSize   = 4096
	// ReplayPortOffset is added to kvZmqPort (plus the rank) to reach an
	// engine's replay socket.
	ReplayPortOffset = 1000
)

// AdmissionError is a rule refused by Admit. Code is a stable token for
// clients and tests; Field is the JSON path of the offending field ("" when
// the rule as a whole is at fault); Message says what is wrong and what to do.
// Conflict reports a clash with stored state (the admin API answers 409);
// otherwise the rule itself is invalid (400).
type AdmissionError struct {
	Code     string
	Field    string
	Message  string
	Conflict bool
}

func (e *AdmissionError) Error() string {
	if e.Field == "" {
		return "rule: " + e.Code + ": " + e.Message
	}
	return "rule: " + e.Code + ": " + e.Field + ": " + e.Message
}

// Status returns the HTTP status the admin API answers with: 409 for a
// conflict with stored state, 400 otherwise.
func (e *AdmissionError) Status() int {
	if e.Conflict {
		return 409
	}
	return 400
}

// Is makes errors.Is(err, &AdmissionError{Code: c}) match any admission
// error with code c.
func (e *AdmissionError) Is(target error) bool {
	t, ok := target.(*AdmissionError)
	return ok && t.Code == e.Code
}

// Admission codes, in the order Admit evaluates them. Codes are part of the
// admin API's contract: never renumber or reuse them.
const (
	CodeRuleMissing          = "rule_missing"
	CodeNameRequired         = "name_required"
	CodeNameInvalid          = "name_invalid"
	CodeSelRequiresFullproxy = "sel_requires_fullproxy"      // ref V1
	CodePDRequiresFullproxy  = "pd_requires_fullproxy"       // ref V2
	CodeKVExactFullproxy     = "kv_exact_requires_fullproxy" // ref V6
	CodeModeUnsupported      = "mode_unsupported"            // ref V17: there is no other mode to change to
	CodeSelUnsupported       = "sel_unsupported"
	CodeEndpointsRequired    = "endpoints_required"
	CodeEndpointsTooMany     = "endpoints_too_many"
	CodeEndpointIP           = "endpoint_ip"
	CodeEndpointPort         = "endpoint_port"
	CodeEndpointWeight       = "endpoint_weight" // ref V19
	CodeEndpointRole         = "endpoint_role"
	CodeEndpointNixlPort     = "endpoint_nixl_port"
	CodeEndpointP2PNcclPort  = "endpoint_p2p_nccl_port"
	CodeEndpointBootstrap    = "endpoint_bootstrap_port"
	CodeEndpointEvents       = "endpoint_events_endpoint"
	CodeEndpointID           = "endpoint_id"
	CodeEndpointIDDuplicate  = "endpoint_id_duplicate"
	CodeEndpointDuplicate    = "endpoint_duplicate"
	CodePDRoles              = "pd_roles" // ref V3
	CodeRoleRequiresPD       = "role_requires_pd"
	CodeKVExactSingleWithPD  = "kv_exact_single_role_with_pd" // ref V5
	CodeKVExactPDWithoutPD   = "kv_exact_pd_requires_pd"      // ref V7
	CodeKVExactMode          = "kv_exact_mode"                // ref V13 and §16 #33
	CodeKVExactSel           = "kv_exact_sel"
	CodeBackendTLS           = "backend_tls"
	CodeKVEngineType         = "kv_engine_type" // ref V8
	CodeLlamacppKVExact      = "llamacpp_kv_exact"
	CodeLlamacppPD           = "llamacpp_pd"
	CodeKVDpRankCount        = "kv_dp_rank_count"    // ref V9
	CodeKVHashAlgo           = "kv_hash_algo"        // ref V10
	CodeKVHashAlgoEngine     = "kv_hash_algo_engine" // ref V11
	CodeKVHashSeed           = "kv_hash_seed"
	CodePDBootstrapPort      = "pd_bootstrap_port"    // ref V12
	CodeTRTLLMZmqPort        = "trtllm_zmq_port"      // ref V14
	CodeTRTLLMDpRankCount    = "trtllm_dp_rank_count" // ref V15
	CodeKVBlockSize          = "kv_block_size"
	CodeKVZmqPort            = "kv_zmq_port"
	CodeKVWarmupSec          = "kv_warmup_sec"
	CodeKVHitMinShare        = "kv_hit_min_share"
	CodeKVTokenizer          = "kv_tokenizer"
	CodeKVChatTemplate       = "kv_chat_template"
	CodeSessionHeader        = "session_header"
	CodeSessionHeaderSel     = "session_header_sel"
	CodeSessionTTL           = "session_ttl"
	CodeCHWBLLoadFactor      = "chwbl_load_factor"
	CodeCHWBLReplicas        = "chwbl_replicas"
	CodeCHWBLPrefixBytes     = "chwbl_prefix_bytes"
	CodeProbePath            = "probe_path"
	CodeProbeInterval        = "probe_interval"
	CodeProbeTimeout         = "probe_timeout"
	CodeProbeFailures        = "probe_failures"
	CodeProbeSuccesses       = "probe_successes"
	CodeCBFailures           = "cb_failures"
	CodeCBOpenFor            = "cb_open_for"
	CodeCBHalfOpenTrials     = "cb_half_open_trials"
	CodeCBOrigin5xx          = "cb_origin_5xx"
	CodeTimeouts             = "timeouts"
	CodeListenInvalid        = "listen_invalid"
	CodeKVEngineImmutable    = "kv_engine_immutable"   // ref V16, 409
	CodeListenModelConflict  = "listen_model_conflict" // 409
	CodeEndpointsFrom        = "endpoints_from_invalid"
	CodeReadBackName         = "read_back_name" // sel_name, kvExactModeName, ep_role_name
)

// SupportedSels lists the selection policies llmgw implements.
var SupportedSels = []int{0, 2, 3, 4, 8, 10}

// KnownHashAlgos lists the block-hash algorithm names kvHashAlgo accepts
// (engines/kvhash's algorithms).
var KnownHashAlgos = func() []string {
	var out []string
	for _, a := range kvhash.Algos() {
		out = append(out, string(a))
	}
	return out
}()

// KnownEngines lists the kvEngineType values accepted ("" means vllm): the
// engines with a registered adapter.
var KnownEngines = func() []string {
	var out []string
	for _, a := range engines.Registered() {
		out = append(out, string(a.Kind()))
	}
	return out
}()

// engineHashAlgos is the engine/hash coherence (reference V11): the
// algorithms the engine's adapter says it can be configured with.
func engineHashAlgos(engine string) []string {
	a := adapterFor(engine)
	if a == nil || a.KV() == nil {
		return nil
	}
	return a.KV().HashAlgos
}

// quoted joins names as "a", "b", "c".
func quoted(names []string) string {
	q := make([]string, len(names))
	for i, n := range names {
		q[i] = strconv.Quote(n)
	}
	return strings.Join(q, ", ")
}

// ValidName reports whether name can be a rule name: 1..63 characters from
// [A-Za-z0-9._-], so that it is a REST path segment and a file name as is.
// "." and ".." are refused because they are path components.
func ValidName(name string) error {
	if name == "" {
		return errors.New("rule: name is required")
	}
	if len(name) > MaxNameLen {
		return fmt.Errorf("rule: name %q is %d characters, limit %d", truncate(name, 80), len(name), MaxNameLen)
	}
	if name == "." || name == ".." {
		return fmt.Errorf("rule: name %q is a path component", name)
	}
	for i := 0; i < len(name); i++ {
		if !isNameByte(name[i]) {
			return fmt.Errorf("rule: name %q: character %q is not allowed (use A-Z a-z 0-9 . _ -)", truncate(name, 80), name[i])
		}
	}
	return nil
}

func isNameByte(c byte) bool {
	return c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '.' || c == '_' || c == '-'
}

// Admit runs the ordered admission checks on r as decoded (before defaults)
// and returns nil or the first failure as an *AdmissionError. existing is the
// stored rule with the same name (nil on create); others are the other stored
// rules (a rule named like r among them is ignored). Admit does not modify
// its arguments and is safe for concurrent use. It reads the file system
// only to check a kvTokenizer path.
func Admit(r *Rule, existing *Rule, others []*Rule) error {
	if r == nil {
		return bad(CodeRuleMissing, "", "no rule given")
	}
	for _, check := range []func(*Rule) *AdmissionError{
		checkName, checkMode, checkSel, checkReadBackNames, checkEndpoints, checkPD, checkKVExact,
		checkEngine, checkKVExactSel, checkKVFields, checkTokenizer, checkChatTemplate, checkSession, checkCHWBL,
		checkProbe, checkCB, checkTimeouts, checkListen, checkBackendTLS,
	} {
		if err := check(r); err != nil {
			return err
		}
	}
	if err := checkConflicts(r, existing, others); err != nil {
		return err
	}
	return nil
}

func bad(code, field, format string, args ...any) *AdmissionError {
	return &AdmissionError{Code: code, Field: field, Message: fmt.Sprintf(format, args...)}
}

func checkName(r *Rule) *AdmissionError {
	if r.Name == "" {
		return bad(CodeNameRequired, "name", "a rule needs a name; it is the rule's id in the admin API")
	}
	if err := ValidName(r.Name); err != nil {
		return bad(CodeNameInvalid, "name", "%s", strings.TrimPrefix(err.Error(), "rule: "))
	}
	return nil
}

func checkMode(r *Rule) *AdmissionError {
	if r.Mode == "" || r.Mode == ModeFullProxy {
		return nil
	}
	switch {
	case r.Sel == 8 || r.Sel == 10:
		return bad(CodeSelRequiresFullproxy, "mode", "sel %d (%s) requires mode \"fullproxy\" (or 4), got %q; llmgw has no other mode, so omit mode", r.Sel, selName(r.Sel), string(r.Mode))
	case r.PDDisaggMode:
		return bad(CodePDRequiresFullproxy, "mode", "pd_disagg_mode requires mode \"fullproxy\" (or 4), got %q; omit mode", string(r.Mode))
	case r.KVExactMode == 3:
		return bad(CodeKVExactFullproxy, "mode", "kvExactMode 3 (single-pool KV-exact) requires mode \"fullproxy\" (or 4), got %q; omit mode", string(r.Mode))
	}
	return bad(CodeModeUnsupported, "mode", "mode %q is not supported: the only mode is \"fullproxy\" (4 is accepted as a synonym); omit mode", string(r.Mode))
}

func selName(sel Sel) string {
	switch sel {
	case 0:
		return "round robin"
	case 2:
		return "weighted round robin"
	case 3:
		return "session affinity"
	case 4:
		return "least in-flight"
	case 8:
		return "CHWBL"
	case 10:
		return "weighted CHWBL"
	}
	return "unknown"
}

func checkSel(r *Rule) *AdmissionError {
	const supported = "supported: 0 round robin, 2 weighted round robin, 3 session affinity, 4 least in-flight, 8 CHWBL, 10 weighted CHWBL"
	var why string
	switch r.Sel {
	case 0, 2, 3, 4, 8, 10:
		return nil
	case 1:
		why = "sel 1 (5-tuple hash) is an L4 policy with no meaning for HTTP requests; use 8 (CHWBL) for prompt affinity or 3 for session affinity"
	case 5, 6:
		why = fmt.Sprintf("sel %d (telco N2/N3) is not an LLM policy", r.Sel)
	case 7:
		why = "sel 7 is reserved"
	case 9:
		why = "sel 9 (\"GPU-aware\") is not implemented: it never used GPU telemetry; use kvExactMode for KV-aware routing or 4 for least in-flight"
	default:
		why = fmt.Sprintf("sel %d is unknown", r.Sel)
	}
	return bad(CodeSelUnsupported, "sel", "%s; %s", why, supported)
}

func checkEndpoints(r *Rule) *AdmissionError {
	if r.EndpointsFrom != nil {
		return checkEndpointsFrom(r)
	}
	if len(r.Endpoints) == 0 {
		return bad(CodeEndpointsRequired, "endpoints", "a rule needs at least one endpoint")
	}
	if len(r.Endpoints) > MaxEndpoints {
		return bad(CodeEndpointsTooMany, "endpoints", "%d endpoints, limit %d; split the pool into several rules", len(r.Endpoints), MaxEndpoints)
	}
	ids := make(map[string]int, len(r.Endpoints))
	addrs := make(map[string]int, len(r.Endpoints))
	for i := range r.Endpoints {
		ep := &r.Endpoints[i]
		p := fmt.Sprintf("endpoints[%d]", i)
		if !validHost(ep.EndpointIP) {
			if ep.EndpointIP == "" {
				return bad(CodeEndpointIP, p+".endpointIP", "endpointIP is required (an IP address or DNS name)")
			}
			return bad(CodeEndpointIP, p+".endpointIP", "%q is neither an IP address nor a DNS name", truncate(ep.EndpointIP, 80))
		}
		if !validPort(ep.TargetPort) {
			return bad(CodeEndpointPort, p+".targetPort", "targetPort must be within 1..65535, got %d", ep.TargetPort)
		}
		if ep.Weight != nil {
			switch w := *ep.Weight; {
			case w == 0:
				return bad(CodeEndpointWeight, p+".weight", "weight 0 is refused: it would not reliably stop traffic; drain the endpoint instead (POST /v1/rules/{name}/endpoints/{id}/drain)")
			case w < 1 || w > MaxWeight:
				return bad(CodeEndpointWeight, p+".weight", "weight must be within 1..%d, got %d", MaxWeight, w)
			}
		}
		if ep.EPRole < 0 || ep.EPRole > 2 {
			return bad(CodeEndpointRole, p+".ep_role", "ep_role must be 0 (normal), 1 (prefill) or 2 (decode), got %d", ep.EPRole)
		}
		if ep.NixlPort != 0 {
			if !validPort(ep.NixlPort) {
				return bad(CodeEndpointNixlPort, p+".nixl_port", "nixl_port must be within 1..65535 (0 = none), got %d", ep.NixlPort)
			}
			// The port is only ever written into the legs' request id of a
			// P/D pair; anywhere else it would be silently ignored.
			if a := adapterOf(r); !r.PDDisaggMode || a == nil || a.PD() == nil || !a.PD().KVPorts() || ep.EPRole == 0 {
				return bad(CodeEndpointNixlPort, p+".nixl_port", "nixl_port (the NIXL side-channel port, carried in the legs' X-Request-Id) applies only to prefill and decode endpoints of a vLLM P/D rule; remove it")
			}
		}
		if ep.P2PNcclPort != 0 {
			if !validPort(ep.P2PNcclPort) {
				return bad(CodeEndpointP2PNcclPort, p+".p2p_nccl_port", "p2p_nccl_port must be within 1..65535 (0 = none), got %d", ep.P2PNcclPort)
			}
			if a := adapterOf(r); !r.PDDisaggMode || a == nil || a.PD() == nil || !a.PD().KVPorts() || ep.EPRole == 0 {
				return bad(CodeEndpointP2PNcclPort, p+".p2p_nccl_port", "p2p_nccl_port (the vLLM P2P-NCCL KV port) applies only to prefill and decode endpoints of a vLLM P/D rule; remove it")
			}
		}
		if ep.BootstrapPort != 0 {
			if !validPort(ep.BootstrapPort) {
				return bad(CodeEndpointBootstrap, p+".bootstrapPort", "bootstrapPort must be within 1..65535, got %d", ep.BootstrapPort)
			}
			if a := adapterOf(r); !r.PDDisaggMode || a == nil || a.PD() == nil || a.PD().BootstrapPort() == 0 || ep.EPRole != 1 {
				return bad(CodeEndpointBootstrap, p+".bootstrapPort", "bootstrapPort applies only to prefill endpoints (ep_role 1) of a P/D rule whose engine has a bootstrap port (SGLang); remove it")
			}
		}
		if ep.KVEventsEndpoint != "" {
			if err := checkZmqEndpoint(ep.KVEventsEndpoint); err != "" {
				return bad(CodeEndpointEvents, p+".kvEventsEndpoint", "%s", err)
			}
		}
		if ep.KVReplayEndpoint != "" {
			if err := checkZmqEndpoint(ep.KVReplayEndpoint); err != "" {
				return bad(CodeEndpointEvents, p+".kvReplayEndpoint", "%s", err)
			}
		}
		id := ep.ID
		if id == "" {
			id = EndpointID(ep.EndpointIP, ep.TargetPort)
		} else if msg := checkEndpointID(id); msg != "" {
			return bad(CodeEndpointID, p+".id", "%s", msg)
		}
		if j, dup := ids[id]; dup {
			return bad(CodeEndpointIDDuplicate, p+".id", "id %q is also used by endpoints[%d]; ids must be unique within a rule", id, j)
		}
		ids[id] = i
		addr := EndpointID(strings.ToLower(canonicalHost(ep.EndpointIP)), ep.TargetPort)
		if j, dup := addrs[addr]; dup {
			return bad(CodeEndpointDuplicate, p, "%s is also endpoints[%d]; list each worker once (use weight to favour one)", addr, j)
		}
		addrs[addr] = i
	}
	return nil
}

func checkEndpointID(id string) string {
	if len(id) > MaxEndpointIDLen {
		return fmt.Sprintf("id is %d characters, limit %d", len(id), MaxEndpointIDLen)
	}
	for i := 0; i < len(id); i++ {
		if c := id[i]; !isNameByte(c) && c != ':' && c != '[' && c != ']' {
			return fmt.Sprintf("id %q: character %q is not allowed (use A-Z a-z 0-9 . _ - : [ ])", truncate(id, 80), c)
		}
	}
	return ""
}

// checkZmqEndpoint returns "" when s is "tcp://host:port", or what is wrong.
func checkZmqEndpoint(s string) string {
	hp, ok := strings.CutPrefix(s, "tcp://")
	if !ok {
		return fmt.Sprintf("%q: want tcp://host:port", truncate(s, 80))
	}
	host, port, err := net.SplitHostPort(hp)
	if err != nil || !validHost(host) {
		return fmt.Sprintf("%q: want tcp://host:port with an IP address or DNS name", truncate(s, 80))
	}
	if n, err := strconv.Atoi(port); err != nil || !validPort(n) {
		return fmt.Sprintf("%q: port must be within 1..65535", truncate(s, 80))
	}
	return ""
}

// checkEndpointsFrom checks a discovered pool's source. The endpoints it
// finds are admitted later, one set at a time, as the endpoints of the same
// rule written statically (the gateway does that on every change).
func checkEndpointsFrom(r *Rule) *AdmissionError {
	f := r.EndpointsFrom
	if len(r.Endpoints) > 0 {
		return bad(CodeEndpointsFrom, "endpoints", "endpoints are discovered from endpoints_from; remove the endpoints list (%d given)", len(r.Endpoints))
	}
	if r.PDDisaggMode {
		return bad(CodeEndpointsFrom, "endpoints_from", "pd_disagg_mode needs each endpoint's ep_role, which discovery does not give; list the endpoints statically")
	}
	if !validK8sName(f.Namespace) {
		return bad(CodeEndpointsFrom, "endpoints_from.namespace", "namespace %q is not a Kubernetes namespace name (lower-case letters, digits, '-', 1..63)", truncate(f.Namespace, 80))
	}
	n := 0
	for _, set := range []bool{f.Service != "", len(f.Selector) > 0, f.InferencePool != ""} {
		if set {
			n++
		}
	}
	switch {
	case n > 1:
		return bad(CodeEndpointsFrom, "endpoints_from", "give one of service, selector and inference_pool")
	case f.InferencePool != "":
		if !validK8sSubdomain(f.InferencePool) {
			return bad(CodeEndpointsFrom, "endpoints_from.inference_pool", "inference_pool %q is not a Kubernetes object name (lower-case letters, digits, '-', '.', 1..253)", truncate(f.InferencePool, 80))
		}
		if len(f.TargetPorts) > 0 || f.PortName != "" {
			return bad(CodeEndpointsFrom, "endpoints_from.target_ports", "an InferencePool gives its selector and targetPorts; remove target_ports and port_name")
		}
	case f.Service != "":
		if !validK8sName(f.Service) {
			return bad(CodeEndpointsFrom, "endpoints_from.service", "service %q is not a Kubernetes Service name", truncate(f.Service, 80))
		}
		if len(f.TargetPorts) > 0 {
			return bad(CodeEndpointsFrom, "endpoints_from.target_ports", "target_ports go with selector; a Service's port comes from its EndpointSlices (use port_name to pick one)")
		}
	case len(f.Selector) > 0:
		if f.PortName != "" {
			return bad(CodeEndpointsFrom, "endpoints_from.port_name", "port_name goes with service; pods selected by labels are served on target_ports")
		}
		if len(f.TargetPorts) == 0 {
			return bad(CodeEndpointsFrom, "endpoints_from.target_ports", "selector needs target_ports (the pods' serving ports)")
		}
		seen := map[int]bool{}
		for i, p := range f.TargetPorts {
			if p < 1 || p > 65535 || seen[p] {
				return bad(CodeEndpointsFrom, fmt.Sprintf("endpoints_from.target_ports[%d]", i), "port %d: each target port is 1..65535 and listed once", p)
			}
			seen[p] = true
		}
		for k, v := range f.Selector {
			if k == "" || len(k) > 316 || len(v) > 63 || strings.ContainsAny(k+v, ",=!() ") {
				return bad(CodeEndpointsFrom, "endpoints_from.selector", "label %q=%q is not a valid label selector term", truncate(k, 80), truncate(v, 80))
			}
		}
	default:
		return bad(CodeEndpointsFrom, "endpoints_from", "give service (a Service's EndpointSlices), selector with target_ports (pods by label) or inference_pool (an InferencePool's pods)")
	}
	return nil
}

// validK8sSubdomain reports whether s is an RFC 1123 DNS subdomain, the
// form of most object names (an InferencePool's among them): DNS labels
// joined by dots, 253 characters at most.
func validK8sSubdomain(s string) bool {
	if len(s) == 0 || len(s) > 253 {
		return false
	}
	for _, l := range strings.Split(s, ".") {
		if !validK8sName(l) {
			return false
		}
	}
	return true
}

// validK8sName reports whether s is an RFC 1123 DNS label, the form of a
// Namespace or Service name.
func validK8sName(s string) bool {
	if s == "" || len(s) > 63 || s[0] == '-' || s[len(s)-1] == '-' {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if !(c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '-') {
			return false
		}
	}
	return true
}

func checkPD(r *Rule) *AdmissionError {
	prefill, decode := 0, 0
	for _, ep := range r.Endpoints {
		switch ep.EPRole {
		case 1:
			prefill++
		case 2:
			decode++
		}
	}
	if r.PDDisaggMode {
		if prefill == 0 || decode == 0 {
			return bad(CodePDRoles, "endpoints", "pd_disagg_mode requires at least 1 prefill (ep_role 1) and 1 decode (ep_role 2) endpoint; got %d prefill and %d decode", prefill, decode)
		}
		// One connector per deployment: with P2P-NCCL ports on some
		// endpoints only, some pairs would rendezvous by request id
		// (P2P-NCCL) and others by the NIXL hand-off.
		withP2P, withNixl := 0, 0
		for _, ep := range r.Endpoints {
			if ep.EPRole != 0 && ep.P2PNcclPort != 0 {
				withP2P++
			}
			if ep.EPRole != 0 && ep.NixlPort != 0 {
				withNixl++
			}
		}
		switch {
		case withP2P != 0 && withNixl != 0:
			return bad(CodeEndpointP2PNcclPort, "endpoints", "p2p_nccl_port (P2P-NCCL) and nixl_port (NIXL) are both set; a deployment uses one vLLM KV connector: keep one of them")
		case withP2P != 0 && withP2P != prefill+decode:
			return bad(CodeEndpointP2PNcclPort, "endpoints", "p2p_nccl_port is set on %d of %d prefill and decode endpoints; vLLM's P2P-NCCL connector needs it on all of them (or on none, for NIXL)", withP2P, prefill+decode)
		}
		return nil
	}
	if prefill+decode > 0 {
		return bad(CodeRoleRequiresPD, "endpoints", "%d endpoints have ep_role 1 or 2, which only mean something with pd_disagg_mode: true; set it, or drop ep_role", prefill+decode)
	}
	return nil
}

// checkKVExactSel: a single-pool KV-exact rule routes requests whose prefix
// no endpoint holds with CHWBL (the content affinity that keeps a new prefix
// on one worker so it becomes a KV hit next time), so its sel must be 8 or
// 10 (weighted). Anything else would be silently ignored.
func checkKVExactSel(r *Rule) *AdmissionError {
	if r.KVExactMode == 3 && r.Sel != 8 && r.Sel != 10 {
		return bad(CodeKVExactSel, "sel", "kvExactMode 3 falls back to CHWBL when no endpoint holds a request's prefix: set sel 8 (CHWBL) or 10 (weighted CHWBL), got %d (%s)", r.Sel, selName(r.Sel))
	}
	return nil
}

// checkBackendTLS: a CA file must be a readable PEM bundle, and skipping
// verification excludes naming a CA (one of the two is a mistake).
func checkBackendTLS(r *Rule) *AdmissionError {
	t := r.BackendTLS
	if t == nil {
		return nil
	}
	if t.InsecureSkipVerify && t.CAFile != "" {
		return bad(CodeBackendTLS, "backend_tls", "insecure_skip_verify disables the check that ca_file would configure; set one of them")
	}
	if t.CAFile != "" {
		data, err := os.ReadFile(t.CAFile)
		if err != nil {
			return bad(CodeBackendTLS, "backend_tls.ca_file", "cannot read %q: %v", truncate(t.CAFile, 200), err)
		}
		if !x509.NewCertPool().AppendCertsFromPEM(data) {
			return bad(CodeBackendTLS, "backend_tls.ca_file", "%q holds no PEM certificate", truncate(t.CAFile, 200))
		}
	}
	return nil
}

func checkKVExact(r *Rule) *AdmissionError {
	switch {
	case r.KVExactMode == 3 && r.PDDisaggMode:
		return bad(CodeKVExactSingleWithPD, "kvExactMode", "kvExactMode 3 (single-pool KV-exact) is incompatible with pd_disagg_mode; use kvExactMode 1 for P/D")
	case r.KVExactMode == 1 && !r.PDDisaggMode:
		return bad(CodeKVExactPDWithoutPD, "kvExactMode", "kvExactMode 1 (P/D prefill scoring) requires pd_disagg_mode: true; use kvExactMode 3 for a single pool")
	case r.KVExactMode == 2:
		return bad(CodeKVExactMode, "kvExactMode", "kvExactMode 2 (\"nats\") is reserved and has no event plane; use 0 (off), 1 (P/D) or 3 (single pool)")
	case r.KVExactMode != 0 && r.KVExactMode != 1 && r.KVExactMode != 3:
		return bad(CodeKVExactMode, "kvExactMode", "kvExactMode must be 0 (off), 1 (P/D) or 3 (single pool), got %d", r.KVExactMode)
	}
	return nil
}

func engineOf(r *Rule) string {
	if r.KVEngineType == "" {
		return DefaultKVEngineType
	}
	return r.KVEngineType
}

func checkEngine(r *Rule) *AdmissionError {
	if r.KVEngineType == "" {
		return nil
	}
	a := adapterOf(r)
	if a == nil {
		return bad(CodeKVEngineType, "kvEngineType", "kvEngineType must be one of %s (empty means %s), got %q", quoted(KnownEngines), DefaultKVEngineType, truncate(r.KVEngineType, 80))
	}
	if a.KV() == nil && r.KVExactMode != 0 {
		return bad(CodeLlamacppKVExact, "kvExactMode", "kv-engine-type %s has no KV event plane: kvExactMode must be 0, got %d", a.Kind(), r.KVExactMode)
	}
	if a.PD() == nil && r.PDDisaggMode {
		return bad(CodeLlamacppPD, "pd_disagg_mode", "kv-engine-type %s does not support prefill/decode disaggregation; remove pd_disagg_mode", a.Kind())
	}
	return nil
}

func checkKVFields(r *Rule) *AdmissionError {
	engine := engineOf(r)
	if r.KVDpRankCount < 0 || r.KVDpRankCount > MaxDpRankCount {
		return bad(CodeKVDpRankCount, "kvDpRankCount", "kvDpRankCount must be within 1..%d (0 = default 1), got %d", MaxDpRankCount, r.KVDpRankCount)
	}
	if r.KVHashAlgo != "" {
		known := false
		for _, a := range KnownHashAlgos {
			known = known || a == r.KVHashAlgo
		}
		if !known {
			return bad(CodeKVHashAlgo, "kvHashAlgo", "kvHashAlgo must be one of %s, got %q", quoted(KnownHashAlgos), truncate(r.KVHashAlgo, 80))
		}
		allowed := false
		for _, a := range engineHashAlgos(engine) {
			allowed = allowed || a == r.KVHashAlgo
		}
		if !allowed {
			if d := DefaultHashAlgo(engine); d != "" {
				return bad(CodeKVHashAlgoEngine, "kvHashAlgo", "kvHashAlgo %q is incompatible with kvEngineType %q; omit kvHashAlgo to take the engine default %q", r.KVHashAlgo, engine, d)
			}
			return bad(CodeKVHashAlgoEngine, "kvHashAlgo", "kvEngineType %q has no KV block hashes; remove kvHashAlgo", engine)
		}
	}
	if r.KVHashSeed != nil {
		if _, err := strconv.ParseUint(*r.KVHashSeed, 10, 32); err != nil {
			return bad(CodeKVHashSeed, "kvHashSeed", "kvHashSeed must be the engine's PYTHONHASHSEED, a decimal integer within 0..4294967295, got %q; an unpinned (random) seed makes block hashes unpredictable", truncate(*r.KVHashSeed, 80))
		}
	}
	if r.PDBootstrapPort != 0 {
		if a := adapterOf(r); !r.PDDisaggMode || a == nil || a.PD() == nil || a.PD().BootstrapPort() == 0 {
			return bad(CodePDBootstrapPort, "pdBootstrapPort", "pdBootstrapPort requires pd_disagg_mode: true and an engine with a bootstrap port (kvEngineType \"sglang\"); remove it")
		}
		if !validPort(r.PDBootstrapPort) {
			return bad(CodePDBootstrapPort, "pdBootstrapPort", "pdBootstrapPort must be within 1..65535, got %d", r.PDBootstrapPort)
		}
	}
	if a := adapterFor(engine); a != nil && a.KV() != nil && a.KV().Transport == engines.EventsHTTPPoll {
		if r.KVZmqPort != 0 && r.KVZmqPort != DefaultKVZmqPort {
			return bad(CodeTRTLLMZmqPort, "kvZmqPort", "kvZmqPort is meaningless for kvEngineType %q (events are polled over HTTP from targetPort); remove it", engine)
		}
		if r.KVDpRankCount > 1 {
			return bad(CodeTRTLLMDpRankCount, "kvDpRankCount", "kvDpRankCount is meaningless for kvEngineType %q (one HTTP event stream per endpoint); remove it", engine)
		}
	}
	if r.KVBlockSize < 0 || r.KVBlockSize > MaxKVBlockSize {
		return bad(CodeKVBlockSize, "kvBlockSize", "kvBlockSize must be within 1..%d (0 = default %d) and equal the engine's block size, got %d", MaxKVBlockSize, DefaultKVBlockSize, r.KVBlockSize)
	}
	ranks := max(r.KVDpRankCount, 1)
	if r.KVZmqPort < 0 || r.KVZmqPort > 65535 {
		return bad(CodeKVZmqPort, "kvZmqPort", "kvZmqPort must be within 1..65535 (0 = default %d), got %d", DefaultKVZmqPort, r.KVZmqPort)
	}
	port := r.KVZmqPort
	if port == 0 {
		port = DefaultKVZmqPort
	}
	if top := port + ReplayPortOffset + ranks - 1; top > 65535 {
		return bad(CodeKVZmqPort, "kvZmqPort", "kvZmqPort %d with %d rank(s) puts the replay port at %d, above 65535; use a base port of at most %d", port, ranks, top, 65535-ReplayPortOffset-ranks+1)
	}
	if r.KVWarmupSec < 0 {
		return bad(CodeKVWarmupSec, "kvWarmupSec", "kvWarmupSec must not be negative, got %d", r.KVWarmupSec)
	}
	if v := r.KVHitMinShare; v != nil {
		if r.KVExactMode != 1 && r.KVExactMode != 3 {
			return bad(CodeKVHitMinShare, "kvHitMinShare", "kvHitMinShare grades KV-exact decisions and needs kvExactMode 1 or 3; remove it")
		}
		if !(*v >= 0 && *v <= 1) { // also refuses NaN
			return bad(CodeKVHitMinShare, "kvHitMinShare", "kvHitMinShare must be a share within 0..1 of the prompt's blocks (default %v), got %v", DefaultKVHitMinShare, *v)
		}
	}
	return nil
}

// checkTokenizer: a KV-exact rule hashes the engine's token ids, so it needs
// the model's real tokenizer: a tokenizer.json or .gguf file, a models
// directory holding the model's snapshot, or "engine" (the workers'
// /tokenize). Without one every lookup would hash the wrong tokens and miss
// silently; such a rule is refused. The path is resolved here (file system
// only; the tokenizer is loaded when the rule is applied).
func checkTokenizer(r *Rule) *AdmissionError {
	const what = "give kvTokenizer: the path of the model's tokenizer.json or .gguf file on the gateway host, a models directory holding the model's snapshot (<org>__<name>/, <org>/<name>/ or the Hugging Face cache layout models--<org>--<name>/snapshots/), or \"engine\" to ask the workers' /tokenize"
	switch r.KVTokenizer {
	case "engine":
		// The engine's adapter says whether it has a tokenize endpoint
		// (SGLang and TensorRT-LLM have none).
		a, err := engines.For(engines.Kind(engineOf(r)))
		if err != nil {
			return bad(CodeKVTokenizer, "kvTokenizer", "kvTokenizer \"engine\": %v", err)
		}
		if a.Surfaces().Tokenize == "" {
			return bad(CodeKVTokenizer, "kvTokenizer", "kvTokenizer \"engine\": %s has no tokenize endpoint; give the path of the model's tokenizer.json or .gguf file, or a models directory holding its snapshot", a.Display())
		}
		return nil
	case "builtin":
		return bad(CodeKVTokenizer, "kvTokenizer", "kvTokenizer \"builtin\" (a made-up tokenizer) is gone: its ids match no engine; %s", what)
	case "":
		if r.KVExactMode != 0 {
			return bad(CodeKVTokenizer, "kvTokenizer", "KV-exact routing (kvExactMode %d) hashes the engine's token ids and needs the model's tokenizer: %s", r.KVExactMode, what)
		}
		return nil
	}
	path, err := tokenizer.Resolve(r.KVTokenizer, r.ModelName)
	if err != nil {
		return bad(CodeKVTokenizer, "kvTokenizer", "kvTokenizer %q: %v; %s", truncate(r.KVTokenizer, 200), err, what)
	}
	if r.KVExactMode == 0 || r.KVChatTemplate != "" {
		return nil
	}
	// A chat request is hashed as the engine renders it, with the model's
	// chat template; a tokenizer without one would miss on every chat
	// request while the rule looked ready.
	if err := tokenizer.CheckChatTemplate(path); err != nil {
		return bad(CodeKVTokenizer, "kvTokenizer", "kvTokenizer %q: %v: KV-exact routing could not render chat requests as the engine does, so every one would miss; put the model's tokenizer_config.json (with its chat_template) beside the tokenizer.json, or name the engine's template file with kvChatTemplate", truncate(r.KVTokenizer, 200), err)
	}
	return nil
}

// checkChatTemplate: kvChatTemplate names a readable template file, and
// only beside a kvTokenizer path (with "engine" the worker renders with its
// own template).
func checkChatTemplate(r *Rule) *AdmissionError {
	if r.KVChatTemplate == "" {
		return nil
	}
	switch {
	case r.KVExactMode == 0:
		return bad(CodeKVChatTemplate, "kvChatTemplate", "kvChatTemplate is the chat template of KV-exact routing and needs kvExactMode 1 or 3; remove it")
	case r.KVTokenizer == "engine":
		return bad(CodeKVChatTemplate, "kvChatTemplate", "kvChatTemplate does not apply to kvTokenizer \"engine\": the worker's /tokenize renders with the engine's own template; remove it")
	}
	st, err := os.Stat(r.KVChatTemplate)
	if err != nil {
		return bad(CodeKVChatTemplate, "kvChatTemplate", "kvChatTemplate %q: %v", truncate(r.KVChatTemplate, 200), err)
	}
	if !st.Mode().IsRegular() {
		return bad(CodeKVChatTemplate, "kvChatTemplate", "kvChatTemplate %q is not a regular file", truncate(r.KVChatTemplate, 200))
	}
	return nil
}

// ParseSessionKey splits a session_header_name into its source ("header",
// "cookie" or "query") and name. It returns an error when s is empty or
// malformed. Prefixes are case-insensitive; header names are HTTP tokens.
func ParseSessionKey(s string) (source, name string, err error) {
	source, name = "header", s
	if prefix, rest, ok := strings.Cut(s, ":"); ok {
		switch strings.ToLower(prefix) {
		case "cookie":
			source, name = "cookie", rest
		case "query":
			source, name = "query", rest
		default:
			return "", "", fmt.Errorf("rule: session key %q: unknown source %q (want a header name, cookie:NAME or query:NAME)", truncate(s, 80), truncate(prefix, 40))
		}
	}
	if name == "" {
		return "", "", fmt.Errorf("rule: session key %q: empty name", truncate(s, 80))
	}
	if strings.EqualFold(s, "basic-auth") {
		return "", "", errors.New("rule: session key \"basic-auth\" is not supported; name a header, cookie:NAME or query:NAME")
	}
	for i := 0; i < len(name); i++ {
		c := name[i]
		ok := isTokenByte(c)
		if source == "query" {
			ok = c > ' ' && c < 0x7f && c != '&' && c != '=' && c != '#' && c != '?'
		}
		if !ok {
			return "", "", fmt.Errorf("rule: session key %q: character %q is not allowed in a %s name", truncate(s, 80), c, source)
		}
	}
	return source, name, nil
}

// isTokenByte reports whether c may appear in an HTTP token (RFC 9110 tchar).
func isTokenByte(c byte) bool {
	if isNameByte(c) {
		return true
	}
	return strings.IndexByte("!#$%&'*+^`|~", c) >= 0
}

func checkSession(r *Rule) *AdmissionError {
	if r.SessionHeaderName != "" {
		if _, _, err := ParseSessionKey(r.SessionHeaderName); err != nil {
			return bad(CodeSessionHeader, "session_header_name", "%s", strings.TrimPrefix(err.Error(), "rule: "))
		}
		if r.Sel != 0 && r.Sel != 3 {
			return bad(CodeSessionHeaderSel, "session_header_name", "session_header_name applies to sel 3 (session affinity) and sel 0 (round robin with learned sessions), not sel %d (%s); remove it or change sel", r.Sel, selName(r.Sel))
		}
	}
	if r.SessionTTL < 0 {
		return bad(CodeSessionTTL, "session_ttl", "session_ttl must not be negative")
	}
	return nil
}

func checkCHWBL(r *Rule) *AdmissionError {
	c := r.CHWBL
	if c.LoadFactor != 0 && !(c.LoadFactor >= 1 && c.LoadFactor <= 10) {
		return bad(CodeCHWBLLoadFactor, "chwbl.load_factor", "load_factor must be within 1..10 (0 = default %g), got %g; it is a factor such as 1.25, not a percentage", DefaultCHWBLLoadFactor, c.LoadFactor)
	}
	if c.Replicas < 0 || c.Replicas > 4096 {
		return bad(CodeCHWBLReplicas, "chwbl.replicas", "replicas must be within 1..4096 (0 = default %d), got %d", DefaultCHWBLReplicas, c.Replicas)
	}
	if c.PrefixBytes < 0 || c.PrefixBytes > 1<<20 {
		return bad(CodeCHWBLPrefixBytes, "chwbl.prefix_bytes", "prefix_bytes must be within 1..1048576 (0 = default %d), got %d", DefaultCHWBLPrefixBytes, c.PrefixBytes)
	}
	return nil
}

func checkProbe(r *Rule) *AdmissionError {
	p := r.Probe
	if p.Path != "" && (!strings.HasPrefix(p.Path, "/") || strings.ContainsAny(p.Path, " \t\r\n#")) {
		return bad(CodeProbePath, "probe.path", "probe path must start with \"/\" and hold no spaces or fragment, got %q", truncate(p.Path, 80))
	}
	if p.Interval < 0 {
		return bad(CodeProbeInterval, "probe.interval", "probe interval must be positive (0 = default %s)", Duration(DefaultProbeInterval))
	}
	interval := p.Interval
	if interval == 0 {
		interval = Duration(DefaultProbeInterval)
	}
	if p.Timeout < 0 || p.Timeout > interval {
		return bad(CodeProbeTimeout, "probe.timeout", "probe timeout must be positive and at most the interval (%s), got %s", interval, p.Timeout)
	}
	if p.Failures < 0 || p.Failures > 100 {
		return bad(CodeProbeFailures, "probe.failures", "probe failures must be within 1..100 (0 = default %d), got %d", DefaultProbeFailures, p.Failures)
	}
	if p.Successes < 0 || p.Successes > 100 {
		return bad(CodeProbeSuccesses, "probe.successes", "probe successes must be within 1..100 (0 = default %d), got %d", DefaultProbeSuccesses, p.Successes)
	}
	return nil
}

func checkCB(r *Rule) *AdmissionError {
	c := r.CB
	if c.Failures < 0 || c.Failures > 1000 {
		return bad(CodeCBFailures, "cb.failures", "cb failures must be within 1..1000 (0 = default), got %d", c.Failures)
	}
	if c.OpenFor < 0 || c.OpenFor.Std() > time.Hour {
		return bad(CodeCBOpenFor, "cb.open_for", "cb open_for must be within 0s..1h (0 = default %s), got %s", Duration(DefaultCBOpenFor), c.OpenFor)
	}
	if c.HalfOpenTrials < 0 || c.HalfOpenTrials > 1000 {
		return bad(CodeCBHalfOpenTrials, "cb.half_open_trials", "cb half_open_trials must be within 1..1000 (0 = default %d), got %d", DefaultCBHalfOpenTrials, c.HalfOpenTrials)
	}
	if c.Origin5xx < -1 || c.Origin5xx > 1000 {
		return bad(CodeCBOrigin5xx, "cb.origin_5xx", "cb origin_5xx must be within 1..1000, or -1 to disable demotion (0 = default %d), got %d", DefaultCBOrigin5xx, c.Origin5xx)
	}
	return nil
}

func checkTimeouts(r *Rule) *AdmissionError {
	t := r.Timeouts
	for _, f := range []struct {
		name string
		d    Duration
	}{{"connect", t.Connect}, {"first_byte", t.FirstByte}, {"idle", t.Idle}, {"prefill", t.Prefill}} {
		if f.d < 0 {
			return bad(CodeTimeouts, "timeouts."+f.name, "timeout must not be negative (0 = default)")
		}
	}
	return nil
}

func checkListen(r *Rule) *AdmissionError {
	if r.Listen == "" {
		return nil
	}
	host, port, err := net.SplitHostPort(r.Listen)
	if err != nil {
		return bad(CodeListenInvalid, "listen", "listen must be \"host:port\" (for example \"127.0.0.1:8081\" or \":8081\"), got %q", truncate(r.Listen, 80))
	}
	if host != "" && !validHost(host) {
		return bad(CodeListenInvalid, "listen", "listen host %q is neither an IP address nor a DNS name", truncate(host, 80))
	}
	if n, err := strconv.Atoi(port); err != nil || !validPort(n) {
		return bad(CodeListenInvalid, "listen", "listen port must be within 1..65535, got %q; a fixed port is needed so clients can find the rule", truncate(port, 20))
	}
	return nil
}

func checkConflicts(r, existing *Rule, others []*Rule) *AdmissionError {
	if existing != nil && engineOf(existing) != engineOf(r) {
		return &AdmissionError{
			Code: CodeKVEngineImmutable, Field: "kvEngineType", Conflict: true,
			Message: fmt.Sprintf("kvEngineType cannot change from %q to %q on an existing rule; delete and recreate the rule", engineOf(existing), engineOf(r)),
		}
	}
	listen := ListenKey(r.Listen)
	for _, o := range others {
		if o == nil || o.Name == r.Name {
			continue
		}
		if o.ModelName == r.ModelName && ListenKey(o.Listen) == listen {
			where := "the shared listener"
			if r.Listen != "" {
				where = "listen " + strconv.Quote(r.Listen)
			}
			return &AdmissionError{
				Code: CodeListenModelConflict, Field: "model_name", Conflict: true,
				Message: fmt.Sprintf("rule %q already serves model_name %q on %s; change model_name or listen, or update that rule", o.Name, r.ModelName, where),
			}
		}
	}
	return nil
}

// ListenKey canonicalises a listen address so that equivalent spellings
// ("[::1]:80" and "[0:0:0:0:0:0:0:1]:80", "LOCALHOST:80" and "localhost:80")
// compare equal. "" (the shared listener) maps to "".
func ListenKey(listen string) string {
	if listen == "" {
		return ""
	}
	host, port, err := net.SplitHostPort(listen)
	if err != nil {
		return listen
	}
	return net.JoinHostPort(strings.ToLower(canonicalHost(host)), port)
}

func canonicalHost(h string) string {
	if a, err := netip.ParseAddr(h); err == nil {
		return a.Unmap().String()
	}
	return h
}

func validPort(p int) bool { return p >= 1 && p <= 65535 }

// validHost reports whether h is an IP address or a DNS host name (labels of
// letters, digits and '-', not starting or ending with '-', with a
// non-numeric last label so that a mistyped address is not taken for a name).
func validHost(h string) bool {
	if h == "" {
		return false
	}
	if _, err := netip.ParseAddr(h); err == nil {
		return true
	}
	h = strings.TrimSuffix(h, ".")
	if len(h) == 0 || len(h) > 253 {
		return false
	}
	labels := strings.Split(h, ".")
	for _, l := range labels {
		if len(l) == 0 || len(l) > 63 || l[0] == '-' || l[len(l)-1] == '-' {
			return false
		}
		for i := 0; i < len(l); i++ {
			c := l[i]
			if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '-') {
				return false
			}
		}
	}
	last := labels[len(labels)-1]
	allDigits := true
	for i := 0; i < len(last); i++ {
		allDigits = allDigits && last[i] >= '0' && last[i] <= '9'
	}
	return !allDigits
}
