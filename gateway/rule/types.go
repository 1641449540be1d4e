// Package rule defines the gateway's rule schema (DESIGN §4), decodes rules
// strictly from JSON or YAML, resolves defaults, and runs the ordered
// admission checks. It imports nothing of the gateway's runtime, so the admin
// API, the CLI client and the tests share one definition.
package rule

// Rule is one routing rule: a pool of endpoints serving one model name on one
// listener. Field names and JSON tags are the wire contract operators know
// from the reference gateway; do not rename them.
//
// A Rule value as decoded holds what the operator wrote. Effective() returns
// a copy with every default resolved; that copy is what the gateway runs and
// what GET returns.
type Rule struct {
	Name      string `json:"name"`
	ModelName string `json:"model_name"`
	// Listen is a dedicated "host:port"; "" means the shared data-plane
	// listener. Rules with the same Listen form per-model pools.
	Listen string `json:"listen,omitempty"`
	// Mode is "fullproxy" (4 accepted as a synonym); the only mode.
	Mode Mode `json:"mode,omitempty"`
	// Sel: 0 rr, 2 weighted rr, 3 session affinity, 4 least in-flight,
	// 8 CHWBL, 10 weighted CHWBL; the names rr, wrr, session,
	// least_inflight, chwbl, weighted_chwbl are accepted beside the numbers
	// and it is read back as the number (see names.go).
	Sel Sel `json:"sel"`
	// SelName is sel's name, filled by Effective for read-back. A body may
	// carry it (a read-back applied again) only when it names sel.
	SelName string `json:"sel_name,omitempty"`
	// SessionHeaderName: "<Header-Name>", "cookie:<NAME>" or "query:<NAME>";
	// the body's "user" is the fallback key.
	SessionHeaderName string   `json:"session_header_name,omitempty"`
	SessionTTL        Duration `json:"session_ttl,omitempty"`

	// KVExactMode: 0 off, 1 P/D prefill, 3 single pool (names off,
	// pd_prefill, single_pool); KVExactModeName is its read-back name.
	KVExactMode     KVExactMode `json:"kvExactMode,omitempty"`
	KVExactModeName string      `json:"kvExactModeName,omitempty"`

	KVEngineType  string  `json:"kvEngineType,omitempty"`
	KVHashAlgo    string  `json:"kvHashAlgo,omitempty"`
	KVHashSeed    *string `json:"kvHashSeed,omitempty"`
	KVBlockSize   int     `json:"kvBlockSize,omitempty"`
	KVZmqPort     int     `json:"kvZmqPort,omitempty"`
	KVDpRankCount int     `json:"kvDpRankCount,omitempty"`
	// KVWarmupSec is accepted, stored and echoed for rules written for the
	// reference gateway, and inert there as here: nothing reads it.
	KVWarmupSec int `json:"kvWarmupSec,omitempty"`
	// KVHitMinShare is the share of the prompt's full blocks the chosen
	// endpoint must already hold for a KV-exact decision to count as a hit
	// (X-Llmgw-Route "kv-exact hit=", llmgw_kv_hits_total, the decision's
	// "hit"). Below it the decision is "partial". 0..1; nil = default 0.5
	// (kv-exact rules only); 0 counts any matched block, as before.
	KVHitMinShare *float64 `json:"kvHitMinShare,omitempty"`
	// KVTokenizer is the model's tokenizer for KV-exact routing (required
	// when kvExactMode is not 0): a tokenizer.json or .gguf path, a models
	// directory holding the model's snapshot (tokenizer.Resolve), or
	// "engine" (ask a worker's /tokenize).
	KVTokenizer string `json:"kvTokenizer,omitempty"`
	// KVChatTemplate is the path of a Jinja chat template file on the
	// gateway host (as vLLM's --chat-template), for a kvTokenizer path
	// that does not bring the model's template (a bare tokenizer.json, a
	// .gguf without tokenizer.chat_template). It overrides the tokenizer's
	// own template; it must be the one the engine renders with.
	KVChatTemplate string `json:"kvChatTemplate,omitempty"`

	PDDisaggMode    bool `json:"pd_disagg_mode,omitempty"`
	PDBootstrapPort int  `json:"pdBootstrapPort,omitempty"`

	CBEnable *bool    `json:"cb_enable,omitempty"`
	CB       CBConfig `json:"cb,omitempty"`

	CHWBL    CHWBLConfig    `json:"chwbl,omitempty"`
	Probe    ProbeConfig    `json:"probe,omitempty"`
	Timeouts TimeoutsConfig `json:"timeouts,omitempty"`
	// BackendTLS, when set, makes the gateway speak TLS to the workers
	// (requests, probes, P/D legs, TensorRT-LLM event polls). nil: plain HTTP.
	BackendTLS *BackendTLSConfig `json:"backend_tls,omitempty"`

	Endpoints []Endpoint `json:"endpoints"`
	// EndpointsFrom, when set, makes the gateway discover the endpoints
	// instead of reading them from Endpoints (which must then be empty in
	// what the operator writes; the read-back lists the current set). It
	// needs a server started with an endpoint source (llmgw serve
	// --endpoints-source kubernetes).
	EndpointsFrom *EndpointsFrom `json:"endpoints_from,omitempty"`
}

// EndpointsFrom names where a rule's endpoints come from in a cluster: a
// Service's EndpointSlices, pods selected by labels (the shape of a
// Gateway API Inference Extension InferencePool: selector, targetPorts), or
// an InferencePool object itself. Exactly one of Service, Selector and
// InferencePool is set. Only ready addresses count:
// an endpoint whose pod is not ready is not in the set.
type EndpointsFrom struct {
	// Namespace of the Service or pods; required.
	Namespace string `json:"namespace"`
	// Service is a Service name: its EndpointSlices give the addresses.
	Service string `json:"service,omitempty"`
	// PortName picks the EndpointSlice port by name when the Service has
	// several; "" takes the only port.
	PortName string `json:"port_name,omitempty"`
	// Selector is a label selector (matchLabels) over pods.
	Selector map[string]string `json:"selector,omitempty"`
	// TargetPorts are the pods' serving ports (InferencePool targetPorts);
	// required with Selector, each 1..65535. A pod with several ports gives
	// one endpoint per port.
	TargetPorts []int `json:"target_ports,omitempty"`
	// InferencePool names an InferencePool (inference.networking.k8s.io/v1,
	// the Gateway API Inference Extension's API) in Namespace: its
	// spec.selector.matchLabels select the pods and its
	// spec.targetPorts[].number are their ports, followed as the object
	// changes.
	InferencePool string `json:"inference_pool,omitempty"`
}

// CodeNoReadyEndpoint is the admission code of a rule whose endpoints_from
// is valid but found no ready endpoint when the rule was applied: a state
// of the cluster, not a fault of the rule (the gateway gives it, not Admit;
// the Kubernetes rule sync applies the rule again once one is ready).
const CodeNoReadyEndpoint = "no_ready_endpoint"

// Endpoint is one worker of a rule.
type Endpoint struct {
	// ID is unique within the rule and names the endpoint in the REST API,
	// headers and metrics. Default: "<endpointIP>:<targetPort>".
	ID         string `json:"id,omitempty"`
	EndpointIP string `json:"endpointIP"`
	TargetPort int    `json:"targetPort"`
	// Weight is used by sel 2 and 10; default 1; range 1..1000. Weight 0 is
	// refused: drain an endpoint with the drain API instead.
	Weight *int `json:"weight,omitempty"`
	// EPRole: 0 normal, 1 prefill (TRT-LLM: context), 2 decode (generation);
	// names normal, prefill, decode. EPRoleName is its read-back name.
	EPRole     EPRole `json:"ep_role,omitempty"`
	EPRoleName string `json:"ep_role_name,omitempty"`
	// KVEventsEndpoint overrides the rule-level tcp://<endpointIP>:<kvZmqPort>.
	KVEventsEndpoint string `json:"kvEventsEndpoint,omitempty"`
	// KVReplayEndpoint overrides the rule-level replay address (kvZmqPort+1000).
	KVReplayEndpoint string `json:"kvReplayEndpoint,omitempty"`
	// BootstrapPort overrides pdBootstrapPort for this prefill endpoint.
	BootstrapPort int `json:"bootstrapPort,omitempty"`
	// NixlPort is the endpoint's NIXL side-channel port, as the reference
	// gateway means it (prefill and decode endpoints of a vLLM P/D rule
	// only; no default): the pair keeps the NIXL hand-off
	// (kv_transfer_params from the prefill's answer to the decode), and
	// both legs carry the reference's X-Request-Id
	// "___prefill_addr_<ip>:<port>___decode_addr_<ip>:<port>_<32 hex>"
	// naming these ports (an endpoint without one by its targetPort).
	NixlPort int `json:"nixl_port,omitempty"`
	// P2PNcclPort is the endpoint's KV port for vLLM's P2P-NCCL connector
	// (prefill and decode endpoints of a vLLM P/D rule, all of them or
	// none, never with nixl_port): the KV moves between the engines out of
	// band, no hand-off fields are sent, and both legs carry the P2P-NCCL
	// request id naming the pair's KV addresses.
	P2PNcclPort int `json:"p2p_nccl_port,omitempty"`
}

// CBConfig tunes the per-endpoint circuit breaker and origin-5xx demotion.
type CBConfig struct {
	// Failures: consecutive connection failures or timeouts that open the
	// breaker. Default 5 (3 on P/D rules).
	Failures int `json:"failures,omitempty"`
	// OpenFor: how long the breaker stays open before half-open trials.
	// Default 30s.
	OpenFor Duration `json:"open_for,omitempty"`
	// HalfOpenTrials: requests admitted while half-open. Default 3.
	HalfOpenTrials int `json:"half_open_trials,omitempty"`
	// Origin5xx: consecutive origin 5xx answers that open the breaker.
	// Default 3; -1 disables demotion.
	Origin5xx int `json:"origin_5xx,omitempty"`
}

// CHWBLConfig tunes consistent hashing with bounded loads (sel 8 and 10).
type CHWBLConfig struct {
	// LoadFactor c: an endpoint is over the bound when its in-flight count
	// would exceed ceil(c * mean in-flight). Default 1.25; range 1..10.
	LoadFactor float64 `json:"load_factor,omitempty"`
	// Replicas: virtual nodes per endpoint (sel 8) or in total per unit of
	// weight (sel 10). Default 160; range 1..4096.
	Replicas int `json:"replicas,omitempty"`
	// PrefixBytes: bytes of the conversation or prompt that enter the key.
	// Default 2048; range 1..1048576.
	PrefixBytes int `json:"prefix_bytes,omitempty"`
}

// ProbeConfig tunes the active health probe.
type ProbeConfig struct {
	Path      string   `json:"path,omitempty"`      // default "/health"
	Interval  Duration `json:"interval,omitempty"`  // default 5s
	Timeout   Duration `json:"timeout,omitempty"`   // default 2s; must not exceed interval
	Failures  int      `json:"failures,omitempty"`  // consecutive failures to mark down; default 2
	Successes int      `json:"successes,omitempty"` // consecutive successes to mark up; default 1
	// Disabled turns active probing off; endpoints are then healthy unless the
	// breaker says otherwise.
	Disabled bool `json:"disabled,omitempty"`
}

// TimeoutsConfig bounds each phase of a proxied request.
type TimeoutsConfig struct {
	Connect   Duration `json:"connect,omitempty"`    // default 2s
	FirstByte Duration `json:"first_byte,omitempty"` // response headers; default 60s
	Idle      Duration `json:"idle,omitempty"`       // between body reads/SSE events; default 120s
	// Prefill bounds a P/D prefill leg; default 30s.
	Prefill Duration `json:"prefill,omitempty"`
}

// BackendTLSConfig configures TLS from the gateway to the workers.
type BackendTLSConfig struct {
	// CAFile is a PEM bundle of the CAs that sign the workers' certificates;
	// "" uses the system roots.
	CAFile string `json:"ca_file,omitempty"`
	// ServerName overrides the name checked in the workers' certificates;
	// "" checks each endpoint's endpointIP.
	ServerName string `json:"server_name,omitempty"`
	// InsecureSkipVerify disables certificate checks (lab use only).
	InsecureSkipVerify bool `json:"insecure_skip_verify,omitempty"`
}
