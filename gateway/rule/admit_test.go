package rule

import (
	"errors"
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func intp(v int) *int       { return &v }
func strp(s string) *string { return &s }

// plainRule is a valid round-robin rule with two workers.
func share(v float64) *float64 { return &v }

func plainRule() *Rule {
	return &Rule{
		Name:      "pool",
		ModelName: "m",
		Endpoints: []Endpoint{
			{EndpointIP: "127.0.0.1", TargetPort: 8001},
			{EndpointIP: "127.0.0.1", TargetPort: 8002},
		},
	}
}

// podsRule is a valid rule whose endpoints are pods selected by labels.
func podsRule() *Rule {
	return &Rule{Name: "pods", ModelName: "m", EndpointsFrom: &EndpointsFrom{Namespace: "llm", Selector: map[string]string{"app": "vllm"}, TargetPorts: []int{8000}}}
}

// svcRule is a valid rule whose endpoints are a Service's EndpointSlices.
func svcRule() *Rule {
	return &Rule{Name: "svc", ModelName: "m", EndpointsFrom: &EndpointsFrom{Namespace: "llm", Service: "vllm", PortName: "http"}}
}

func poolRule() *Rule {
	return &Rule{Name: "pool", ModelName: "m", EndpointsFrom: &EndpointsFrom{Namespace: "llm", InferencePool: "vllm-llama3-8b.v1"}}
}

// pdRule is a valid SGLang P/D rule.
func pdRule() *Rule {
	return &Rule{
		Name:         "pd",
		ModelName:    "m",
		KVEngineType: "sglang",
		PDDisaggMode: true,
		Endpoints: []Endpoint{
			{EndpointIP: "10.0.0.1", TargetPort: 8001, EPRole: 1},
			{EndpointIP: "10.0.0.2", TargetPort: 8001, EPRole: 2},
		},
	}
}

func trtRule() *Rule {
	r := pdRule()
	r.KVEngineType = "trtllm"
	return r
}

func TestAdmitRules(t *testing.T) {
	tokFile := writeTokenizer(t, t.TempDir(), `{"chat_template": "{{ messages }}"}`)
	// A tokenizer.json alone (no tokenizer_config.json), and one whose
	// config has no chat_template: chat requests could not be rendered.
	bareTok := writeTokenizer(t, t.TempDir(), "")
	noTplTok := writeTokenizer(t, t.TempDir(), `{"add_bos_token": false}`)
	tplFile := filepath.Join(t.TempDir(), "chat.jinja")
	if err := os.WriteFile(tplFile, []byte("{{ messages }}"), 0o600); err != nil {
		t.Fatal(err)
	}
	// A models directory with the snapshot of "org/m" in each layout
	// Resolve knows; admission only resolves, it does not load.
	models := t.TempDir()
	for _, dir := range []string{"slug/org__m", "nested/org/m", "hub/models--org--m/snapshots/abc123"} {
		if err := os.MkdirAll(filepath.Join(models, dir), 0o755); err != nil {
			t.Fatal(err)
		}
		writeTokenizer(t, filepath.Join(models, dir), `{"chat_template": "{{ messages }}"}`)
	}
	kvExact := func(r *Rule) { r.Sel = 8; r.KVEngineType = "vllm"; r.KVExactMode = 3; r.ModelName = "org/m" }
	tests := []struct {
		name     string
		base     func() *Rule
		mutate   func(r *Rule)
		existing *Rule
		others   []*Rule
		// wantCode "" means the rule must be admitted.
		wantCode     string
		wantField    string
		wantConflict bool
		// wantMsg, when set, must appear in the refusal's message.
		wantMsg string
	}{
		{name: "nil rule", base: func() *Rule { return nil }, wantCode: CodeRuleMissing},
		{name: "valid plain", base: plainRule},
		{name: "valid pd", base: pdRule},
		{name: "valid trtllm pd", base: trtRule},
		{name: "valid endpoints_from pods", base: podsRule},
		{name: "valid endpoints_from service", base: svcRule},
		{name: "valid endpoints_from inference_pool", base: poolRule},
		{name: "endpoints_from inference_pool and selector", base: poolRule, mutate: func(r *Rule) { r.EndpointsFrom.Selector = map[string]string{"app": "x"} }, wantCode: CodeEndpointsFrom, wantField: "endpoints_from"},
		{name: "endpoints_from inference_pool bad name", base: poolRule, mutate: func(r *Rule) { r.EndpointsFrom.InferencePool = "Pool_1" }, wantCode: CodeEndpointsFrom, wantField: "endpoints_from.inference_pool"},
		{name: "endpoints_from inference_pool with target_ports", base: poolRule, mutate: func(r *Rule) { r.EndpointsFrom.TargetPorts = []int{8000} }, wantCode: CodeEndpointsFrom, wantField: "endpoints_from.target_ports"},
		{name: "endpoints_from with endpoints", base: podsRule, mutate: func(r *Rule) { r.Endpoints = plainRule().Endpoints }, wantCode: CodeEndpointsFrom, wantField: "endpoints"},
		{name: "endpoints_from with pd", base: podsRule, mutate: func(r *Rule) { r.PDDisaggMode = true }, wantCode: CodeEndpointsFrom, wantField: "endpoints_from"},
		{name: "endpoints_from bad namespace", base: podsRule, mutate: func(r *Rule) { r.EndpointsFrom.Namespace = "Upper" }, wantCode: CodeEndpointsFrom, wantField: "endpoints_from.namespace"},
		{name: "endpoints_from no namespace", base: svcRule, mutate: func(r *Rule) { r.EndpointsFrom.Namespace = "" }, wantCode: CodeEndpointsFrom, wantField: "endpoints_from.namespace"},
		{name: "endpoints_from neither", base: podsRule, mutate: func(r *Rule) { r.EndpointsFrom.Selector = nil }, wantCode: CodeEndpointsFrom, wantField: "endpoints_from"},
		{name: "endpoints_from both", base: podsRule, mutate: func(r *Rule) { r.EndpointsFrom.Service = "vllm" }, wantCode: CodeEndpointsFrom, wantField: "endpoints_from"},
		{name: "endpoints_from bad service", base: svcRule, mutate: func(r *Rule) { r.EndpointsFrom.Service = "a_b" }, wantCode: CodeEndpointsFrom, wantField: "endpoints_from.service"},
		{name: "endpoints_from service with target_ports", base: svcRule, mutate: func(r *Rule) { r.EndpointsFrom.TargetPorts = []int{8000} }, wantCode: CodeEndpointsFrom, wantField: "endpoints_from.target_ports"},
		{name: "endpoints_from selector with port_name", base: podsRule, mutate: func(r *Rule) { r.EndpointsFrom.PortName = "http" }, wantCode: CodeEndpointsFrom, wantField: "endpoints_from.port_name"},
		{name: "endpoints_from selector without ports", base: podsRule, mutate: func(r *Rule) { r.EndpointsFrom.TargetPorts = nil }, wantCode: CodeEndpointsFrom, wantField: "endpoints_from.target_ports"},
		{name: "endpoints_from port out of range", base: podsRule, mutate: func(r *Rule) { r.EndpointsFrom.TargetPorts = []int{8000, 70000} }, wantCode: CodeEndpointsFrom, wantField: "endpoints_from.target_ports[1]"},
		{name: "endpoints_from port twice", base: podsRule, mutate: func(r *Rule) { r.EndpointsFrom.TargetPorts = []int{8000, 8000} }, wantCode: CodeEndpointsFrom, wantField: "endpoints_from.target_ports[1]"},
		{name: "endpoints_from bad selector term", base: podsRule, mutate: func(r *Rule) { r.EndpointsFrom.Selector = map[string]string{"app": "a,b"} }, wantCode: CodeEndpointsFrom, wantField: "endpoints_from.selector"},
		{name: "endpoints_from two ports", base: podsRule, mutate: func(r *Rule) { r.EndpointsFrom.TargetPorts = []int{8000, 8001} }},
		{name: "name required", base: plainRule, mutate: func(r *Rule) { r.Name = "" }, wantCode: CodeNameRequired, wantField: "name"},
		{name: "name with slash", base: plainRule, mutate: func(r *Rule) { r.Name = "a/b" }, wantCode: CodeNameInvalid, wantField: "name"},
		{name: "name dot dot", base: plainRule, mutate: func(r *Rule) { r.Name = ".." }, wantCode: CodeNameInvalid},
		{name: "name too long", base: plainRule, mutate: func(r *Rule) { r.Name = strings.Repeat("a", 64) }, wantCode: CodeNameInvalid},
		{name: "name max length", base: plainRule, mutate: func(r *Rule) { r.Name = strings.Repeat("a", 63) }},
		{name: "V1 chwbl needs fullproxy", base: plainRule, mutate: func(r *Rule) { r.Mode = "2"; r.Sel = 8 }, wantCode: CodeSelRequiresFullproxy, wantField: "mode"},
		{name: "V1 weighted chwbl needs fullproxy", base: plainRule, mutate: func(r *Rule) { r.Mode = "dnat"; r.Sel = 10 }, wantCode: CodeSelRequiresFullproxy},
		{name: "V2 pd needs fullproxy", base: pdRule, mutate: func(r *Rule) { r.Mode = "0" }, wantCode: CodePDRequiresFullproxy},
		{name: "V6 kv exact single role needs fullproxy", base: plainRule, mutate: func(r *Rule) { r.Mode = "3"; r.KVExactMode = 3 }, wantCode: CodeKVExactFullproxy},
		{name: "V17 other mode", base: plainRule, mutate: func(r *Rule) { r.Mode = "dsr" }, wantCode: CodeModeUnsupported, wantField: "mode"},
		{name: "mode fullproxy explicit", base: plainRule, mutate: func(r *Rule) { r.Mode = ModeFullProxy }},
		{name: "sel_name disagrees", base: plainRule, mutate: func(r *Rule) { r.Sel, r.SelName = 8, "rr" }, wantCode: CodeReadBackName, wantField: "sel_name"},
		{name: "kvExactModeName disagrees", base: plainRule, mutate: func(r *Rule) { r.KVExactModeName = "single_pool" }, wantCode: CodeReadBackName, wantField: "kvExactModeName"},
		{name: "ep_role_name disagrees", base: plainRule, mutate: func(r *Rule) { r.Endpoints[0].EPRoleName = "decode" }, wantCode: CodeReadBackName, wantField: "endpoints[0].ep_role_name"},
		{name: "sel 1 hash", base: plainRule, mutate: func(r *Rule) { r.Sel = 1 }, wantCode: CodeSelUnsupported, wantField: "sel"},
		{name: "sel 5 n2", base: plainRule, mutate: func(r *Rule) { r.Sel = 5 }, wantCode: CodeSelUnsupported},
		{name: "sel 6 n3", base: plainRule, mutate: func(r *Rule) { r.Sel = 6 }, wantCode: CodeSelUnsupported},
		{name: "sel 7 reserved", base: plainRule, mutate: func(r *Rule) { r.Sel = 7 }, wantCode: CodeSelUnsupported},
		{name: "sel 9 gpu aware", base: plainRule, mutate: func(r *Rule) { r.Sel = 9 }, wantCode: CodeSelUnsupported},
		{name: "sel 11 unknown", base: plainRule, mutate: func(r *Rule) { r.Sel = 11 }, wantCode: CodeSelUnsupported},
		{name: "sel negative", base: plainRule, mutate: func(r *Rule) { r.Sel = -1 }, wantCode: CodeSelUnsupported},
		{name: "sel 2 weighted", base: plainRule, mutate: func(r *Rule) { r.Sel = 2 }},
		{name: "sel 10 weighted chwbl", base: plainRule, mutate: func(r *Rule) { r.Sel = 10 }},
		{name: "no endpoints", base: plainRule, mutate: func(r *Rule) { r.Endpoints = nil }, wantCode: CodeEndpointsRequired, wantField: "endpoints"},
		{name: "too many endpoints", base: plainRule, mutate: func(r *Rule) {
			r.Endpoints = make([]Endpoint, MaxEndpoints+1)
			for i := range r.Endpoints {
				r.Endpoints[i] = Endpoint{EndpointIP: "10.0.0.1", TargetPort: 1000 + i}
			}
		}, wantCode: CodeEndpointsTooMany},
		{name: "endpoint ip missing", base: plainRule, mutate: func(r *Rule) { r.Endpoints[1].EndpointIP = "" }, wantCode: CodeEndpointIP, wantField: "endpoints[1].endpointIP"},
		{name: "endpoint ip bad octet", base: plainRule, mutate: func(r *Rule) { r.Endpoints[0].EndpointIP = "10.0.0.256" }, wantCode: CodeEndpointIP},
		{name: "endpoint ip underscore", base: plainRule, mutate: func(r *Rule) { r.Endpoints[0].EndpointIP = "bad_host" }, wantCode: CodeEndpointIP},
		{name: "endpoint dns name", base: plainRule, mutate: func(r *Rule) { r.Endpoints[0].EndpointIP = "worker-0.example.internal" }},
		{name: "endpoint ipv6", base: plainRule, mutate: func(r *Rule) { r.Endpoints[0].EndpointIP = "fd00::1" }},
		{name: "endpoint port zero", base: plainRule, mutate: func(r *Rule) { r.Endpoints[0].TargetPort = 0 }, wantCode: CodeEndpointPort, wantField: "endpoints[0].targetPort"},
		{name: "endpoint port too big", base: plainRule, mutate: func(r *Rule) { r.Endpoints[0].TargetPort = 65536 }, wantCode: CodeEndpointPort},
		{name: "V19 weight zero", base: plainRule, mutate: func(r *Rule) { r.Endpoints[0].Weight = intp(0) }, wantCode: CodeEndpointWeight, wantField: "endpoints[0].weight"},
		{name: "weight too big", base: plainRule, mutate: func(r *Rule) { r.Endpoints[0].Weight = intp(1001) }, wantCode: CodeEndpointWeight},
		{name: "weight negative", base: plainRule, mutate: func(r *Rule) { r.Endpoints[0].Weight = intp(-1) }, wantCode: CodeEndpointWeight},
		{name: "weight max", base: plainRule, mutate: func(r *Rule) { r.Endpoints[0].Weight = intp(1000) }},
		{name: "ep role 3", base: plainRule, mutate: func(r *Rule) { r.Endpoints[0].EPRole = 3 }, wantCode: CodeEndpointRole, wantField: "endpoints[0].ep_role"},
		{name: "nixl port out of range", base: plainRule, mutate: func(r *Rule) { r.Endpoints[0].NixlPort = 70000 }, wantCode: CodeEndpointNixlPort},
		{name: "nixl port on a vLLM P/D rule", base: pdRule, mutate: func(r *Rule) {
			r.KVEngineType = "vllm"
			r.Endpoints[0].NixlPort, r.Endpoints[1].NixlPort = 9001, 9002
		}},
		{name: "nixl port on some P/D endpoints only (the others named by targetPort)", base: pdRule, mutate: func(r *Rule) {
			r.KVEngineType = "vllm"
			r.Endpoints[0].NixlPort = 9001
		}},
		{name: "p2p nccl port out of range", base: pdRule, mutate: func(r *Rule) { r.KVEngineType = "vllm"; r.Endpoints[0].P2PNcclPort = 0x10000 }, wantCode: CodeEndpointP2PNcclPort},
		{name: "p2p nccl port on a vLLM P/D rule", base: pdRule, mutate: func(r *Rule) {
			r.KVEngineType = "vllm"
			r.Endpoints[0].P2PNcclPort, r.Endpoints[1].P2PNcclPort = 9001, 9002
		}},
		{name: "p2p nccl port on some P/D endpoints only is refused", base: pdRule, mutate: func(r *Rule) {
			r.KVEngineType = "vllm"
			r.Endpoints[0].P2PNcclPort = 9001
		}, wantCode: CodeEndpointP2PNcclPort},
		{name: "p2p nccl port with nixl port is refused", base: pdRule, mutate: func(r *Rule) {
			r.KVEngineType = "vllm"
			r.Endpoints[0].P2PNcclPort, r.Endpoints[1].P2PNcclPort = 9001, 9002
			r.Endpoints[0].NixlPort = 9003
		}, wantCode: CodeEndpointP2PNcclPort},
		{name: "p2p nccl port on a plain rule is refused", base: plainRule, mutate: func(r *Rule) { r.Endpoints[0].P2PNcclPort = 9001 }, wantCode: CodeEndpointP2PNcclPort},
		{name: "p2p nccl port on an SGLang P/D rule is refused", base: pdRule, mutate: func(r *Rule) { r.Endpoints[0].P2PNcclPort = 9001 }, wantCode: CodeEndpointP2PNcclPort},
		{name: "nixl port on a plain rule is refused", base: plainRule, mutate: func(r *Rule) { r.Endpoints[0].NixlPort = 9001 }, wantCode: CodeEndpointNixlPort},
		{name: "nixl port on an SGLang P/D rule is refused", base: pdRule, mutate: func(r *Rule) { r.Endpoints[0].NixlPort = 9001 }, wantCode: CodeEndpointNixlPort},
		{name: "endpoint bootstrap port on vllm", base: plainRule, mutate: func(r *Rule) { r.Endpoints[0].BootstrapPort = 9000 }, wantCode: CodeEndpointBootstrap},
		{name: "endpoint bootstrap port on decode", base: pdRule, mutate: func(r *Rule) { r.Endpoints[1].BootstrapPort = 9000 }, wantCode: CodeEndpointBootstrap, wantField: "endpoints[1].bootstrapPort"},
		{name: "endpoint bootstrap port on sglang prefill", base: pdRule, mutate: func(r *Rule) { r.Endpoints[0].BootstrapPort = 9000 }},
		{name: "events endpoint not tcp", base: plainRule, mutate: func(r *Rule) { r.Endpoints[0].KVEventsEndpoint = "http://127.0.0.1:5557" }, wantCode: CodeEndpointEvents, wantField: "endpoints[0].kvEventsEndpoint"},
		{name: "replay endpoint without port", base: plainRule, mutate: func(r *Rule) { r.Endpoints[0].KVReplayEndpoint = "tcp://127.0.0.1" }, wantCode: CodeEndpointEvents, wantField: "endpoints[0].kvReplayEndpoint"},
		{name: "endpoint id with slash", base: plainRule, mutate: func(r *Rule) { r.Endpoints[0].ID = "w/1" }, wantCode: CodeEndpointID},
		{name: "duplicate endpoint id", base: plainRule, mutate: func(r *Rule) { r.Endpoints[0].ID = "w"; r.Endpoints[1].ID = "w" }, wantCode: CodeEndpointIDDuplicate, wantField: "endpoints[1].id"},
		{name: "explicit id equal to a default id", base: plainRule, mutate: func(r *Rule) { r.Endpoints[1].ID = "127.0.0.1:8001" }, wantCode: CodeEndpointIDDuplicate},
		{name: "duplicate ip port", base: plainRule, mutate: func(r *Rule) {
			r.Endpoints[0].ID, r.Endpoints[1].ID = "a", "b"
			r.Endpoints[1].TargetPort = 8001
		}, wantCode: CodeEndpointDuplicate, wantField: "endpoints[1]"},
		{name: "duplicate ipv6 spelled differently", base: plainRule, mutate: func(r *Rule) {
			r.Endpoints[0] = Endpoint{ID: "a", EndpointIP: "fd00::1", TargetPort: 1}
			r.Endpoints[1] = Endpoint{ID: "b", EndpointIP: "fd00:0::0:1", TargetPort: 1}
		}, wantCode: CodeEndpointDuplicate},
		{name: "V3 pd without decode", base: pdRule, mutate: func(r *Rule) { r.Endpoints[1].EPRole = 1 }, wantCode: CodePDRoles, wantField: "endpoints"},
		{name: "V3 pd without prefill", base: pdRule, mutate: func(r *Rule) { r.Endpoints[0].EPRole = 0 }, wantCode: CodePDRoles},
		{name: "roles without pd", base: plainRule, mutate: func(r *Rule) { r.Endpoints[0].EPRole = 1 }, wantCode: CodeRoleRequiresPD},
		{name: "V5 kv exact 3 with pd", base: pdRule, mutate: func(r *Rule) { r.KVExactMode = 3 }, wantCode: CodeKVExactSingleWithPD, wantField: "kvExactMode"},
		{name: "V7 kv exact 1 without pd", base: plainRule, mutate: func(r *Rule) { r.KVExactMode = 1 }, wantCode: CodeKVExactPDWithoutPD},
		{name: "kv exact 2 nats reserved", base: plainRule, mutate: func(r *Rule) { r.KVExactMode = 2 }, wantCode: CodeKVExactMode},
		{name: "V13 trtllm kv exact 2", base: trtRule, mutate: func(r *Rule) { r.KVExactMode = 2 }, wantCode: CodeKVExactMode},
		{name: "kv exact 4", base: plainRule, mutate: func(r *Rule) { r.KVExactMode = 4 }, wantCode: CodeKVExactMode},
		{name: "V8 unknown engine", base: plainRule, mutate: func(r *Rule) { r.KVEngineType = "tgi" }, wantCode: CodeKVEngineType, wantField: "kvEngineType"},
		{name: "V8 engine case matters", base: plainRule, mutate: func(r *Rule) { r.KVEngineType = "VLLM" }, wantCode: CodeKVEngineType},
		{name: "backend tls with an unreadable ca file", base: plainRule, mutate: func(r *Rule) { r.BackendTLS = &BackendTLSConfig{CAFile: "/nonexistent/ca.pem"} }, wantCode: CodeBackendTLS, wantField: "backend_tls.ca_file"},
		{name: "backend tls skip verify with a ca file", base: plainRule, mutate: func(r *Rule) { r.BackendTLS = &BackendTLSConfig{CAFile: "x", InsecureSkipVerify: true} }, wantCode: CodeBackendTLS},
		{name: "kv exact 3 needs a chwbl fallback", base: plainRule, mutate: func(r *Rule) { r.KVExactMode = 3; r.Sel = 0 }, wantCode: CodeKVExactSel, wantField: "sel"},
		{name: "llamacpp kv exact", base: plainRule, mutate: func(r *Rule) { r.KVEngineType = "llamacpp"; r.KVExactMode = 3 }, wantCode: CodeLlamacppKVExact},
		{name: "llamacpp pd", base: pdRule, mutate: func(r *Rule) { r.KVEngineType = "llamacpp" }, wantCode: CodeLlamacppPD, wantField: "pd_disagg_mode"},
		{name: "V9 dp ranks 9", base: plainRule, mutate: func(r *Rule) { r.KVDpRankCount = 9 }, wantCode: CodeKVDpRankCount},
		{name: "dp ranks negative", base: plainRule, mutate: func(r *Rule) { r.KVDpRankCount = -1 }, wantCode: CodeKVDpRankCount},
		{name: "V10 unknown hash algo", base: plainRule, mutate: func(r *Rule) { r.KVHashAlgo = "md5" }, wantCode: CodeKVHashAlgo},
		{name: "V11 sglang with vllm hash", base: pdRule, mutate: func(r *Rule) { r.KVHashAlgo = "sha256_cbor" }, wantCode: CodeKVHashAlgoEngine},
		{name: "V11 default engine with trtllm hash", base: plainRule, mutate: func(r *Rule) { r.KVHashAlgo = "blockhash_trtllm" }, wantCode: CodeKVHashAlgoEngine},
		{name: "V11 llamacpp with hash", base: plainRule, mutate: func(r *Rule) { r.KVEngineType = "llamacpp"; r.KVHashAlgo = "sha256_cbor" }, wantCode: CodeKVHashAlgoEngine},
		{name: "vllm xxhash", base: plainRule, mutate: func(r *Rule) { r.KVHashAlgo = "xxhash_cbor" }},
		{name: "hash seed random", base: plainRule, mutate: func(r *Rule) { r.KVHashSeed = strp("random") }, wantCode: CodeKVHashSeed},
		{name: "hash seed 42", base: plainRule, mutate: func(r *Rule) { r.KVHashSeed = strp("42") }},
		{name: "V12 bootstrap port on vllm pd", base: pdRule, mutate: func(r *Rule) { r.KVEngineType = "vllm"; r.PDBootstrapPort = 8998 }, wantCode: CodePDBootstrapPort},
		{name: "V12 bootstrap port without pd", base: plainRule, mutate: func(r *Rule) { r.KVEngineType = "sglang"; r.PDBootstrapPort = 8998 }, wantCode: CodePDBootstrapPort},
		{name: "bootstrap port out of range", base: pdRule, mutate: func(r *Rule) { r.PDBootstrapPort = 70000 }, wantCode: CodePDBootstrapPort},
		{name: "V14 trtllm zmq port", base: trtRule, mutate: func(r *Rule) { r.KVZmqPort = 6000 }, wantCode: CodeTRTLLMZmqPort},
		{name: "trtllm zmq port default", base: trtRule, mutate: func(r *Rule) { r.KVZmqPort = 5557 }},
		{name: "V15 trtllm dp ranks", base: trtRule, mutate: func(r *Rule) { r.KVDpRankCount = 2 }, wantCode: CodeTRTLLMDpRankCount},
		{name: "block size too big", base: plainRule, mutate: func(r *Rule) { r.KVBlockSize = 4097 }, wantCode: CodeKVBlockSize},
		{name: "block size negative", base: plainRule, mutate: func(r *Rule) { r.KVBlockSize = -16 }, wantCode: CodeKVBlockSize},
		{name: "zmq port too big", base: plainRule, mutate: func(r *Rule) { r.KVZmqPort = 65536 }, wantCode: CodeKVZmqPort},
		{name: "zmq replay port overflows", base: plainRule, mutate: func(r *Rule) { r.KVZmqPort = 64536 }, wantCode: CodeKVZmqPort},
		{name: "zmq replay port fits", base: plainRule, mutate: func(r *Rule) { r.KVZmqPort = 64535 }},
		{name: "zmq replay port overflows with ranks", base: plainRule, mutate: func(r *Rule) { r.KVZmqPort = 64535; r.KVDpRankCount = 2 }, wantCode: CodeKVZmqPort},
		{name: "warmup negative", base: plainRule, mutate: func(r *Rule) { r.KVWarmupSec = -1 }, wantCode: CodeKVWarmupSec},
		{name: "hit share quarter", base: plainRule, mutate: func(r *Rule) { r.KVExactMode, r.Sel, r.KVHitMinShare, r.KVTokenizer = 3, 8, share(0.25), "engine" }},
		{name: "hit share zero counts any block", base: plainRule, mutate: func(r *Rule) { r.KVExactMode, r.Sel, r.KVHitMinShare, r.KVTokenizer = 3, 8, share(0), "engine" }},
		{name: "hit share whole prompt", base: plainRule, mutate: func(r *Rule) { r.KVExactMode, r.Sel, r.KVHitMinShare, r.KVTokenizer = 3, 8, share(1), "engine" }},
		{name: "hit share over one", base: plainRule, mutate: func(r *Rule) { r.KVExactMode, r.Sel, r.KVHitMinShare = 3, 8, share(1.5) }, wantCode: CodeKVHitMinShare, wantField: "kvHitMinShare"},
		{name: "hit share negative", base: plainRule, mutate: func(r *Rule) { r.KVExactMode, r.Sel, r.KVHitMinShare = 3, 8, share(-0.1) }, wantCode: CodeKVHitMinShare},
		{name: "hit share without kv-exact", base: plainRule, mutate: func(r *Rule) { r.KVHitMinShare = share(0.5) }, wantCode: CodeKVHitMinShare},
		{name: "tokenizer missing file", base: plainRule, mutate: func(r *Rule) { r.KVTokenizer = filepath.Join(t.TempDir(), "nope.json") }, wantCode: CodeKVTokenizer},
		{name: "tokenizer directory", base: plainRule, mutate: func(r *Rule) { r.KVTokenizer = t.TempDir() }, wantCode: CodeKVTokenizer},
		{name: "tokenizer file", base: plainRule, mutate: func(r *Rule) { r.KVTokenizer = tokFile }},
		{name: "tokenizer engine", base: plainRule, mutate: func(r *Rule) { r.KVTokenizer = "engine" }},
		{name: "kv-exact without tokenizer", base: plainRule, mutate: kvExact, wantCode: CodeKVTokenizer},
		{name: "kv-exact engine tokenizer vllm", base: plainRule, mutate: func(r *Rule) { kvExact(r); r.KVTokenizer = "engine" }},
		// SGLang serves POST /v1/tokenize (engines/sglang Tokenize).
		{name: "engine tokenizer sglang", base: pdRule, mutate: func(r *Rule) { r.KVExactMode = 1; r.KVTokenizer = "engine" }},
		{name: "engine tokenizer trtllm has none", base: trtRule, mutate: func(r *Rule) { r.KVExactMode = 1; r.KVTokenizer = "engine" }, wantCode: CodeKVTokenizer},
		{name: "kv-exact builtin tokenizer", base: plainRule, mutate: func(r *Rule) { kvExact(r); r.KVTokenizer = "builtin" }, wantCode: CodeKVTokenizer},
		{name: "kv-exact tokenizer file", base: plainRule, mutate: func(r *Rule) { kvExact(r); r.KVTokenizer = tokFile }},
		{name: "kv-exact bare tokenizer.json has no chat template", base: plainRule, mutate: func(r *Rule) { kvExact(r); r.KVTokenizer = bareTok }, wantCode: CodeKVTokenizer, wantMsg: "tokenizer_config.json"},
		{name: "kv-exact tokenizer config without chat_template", base: plainRule, mutate: func(r *Rule) { kvExact(r); r.KVTokenizer = noTplTok }, wantCode: CodeKVTokenizer, wantMsg: "chat_template"},
		{name: "kv-exact bare tokenizer.json with kvChatTemplate", base: plainRule, mutate: func(r *Rule) { kvExact(r); r.KVTokenizer = bareTok; r.KVChatTemplate = tplFile }},
		{name: "bare tokenizer.json without kv-exact needs no template", base: plainRule, mutate: func(r *Rule) { r.KVTokenizer = bareTok }},
		{name: "kvChatTemplate missing file", base: plainRule, mutate: func(r *Rule) {
			kvExact(r)
			r.KVTokenizer, r.KVChatTemplate = bareTok, filepath.Join(t.TempDir(), "nope.jinja")
		}, wantCode: CodeKVChatTemplate},
		{name: "kvChatTemplate with the engine tokenizer", base: plainRule, mutate: func(r *Rule) { kvExact(r); r.KVTokenizer = "engine"; r.KVChatTemplate = tplFile }, wantCode: CodeKVChatTemplate},
		{name: "kvChatTemplate without kv-exact", base: plainRule, mutate: func(r *Rule) { r.KVTokenizer = tokFile; r.KVChatTemplate = tplFile }, wantCode: CodeKVChatTemplate},
		{name: "kv-exact models dir slug", base: plainRule, mutate: func(r *Rule) { kvExact(r); r.KVTokenizer = filepath.Join(models, "slug") }},
		{name: "kv-exact models dir nested", base: plainRule, mutate: func(r *Rule) { kvExact(r); r.KVTokenizer = filepath.Join(models, "nested") }},
		{name: "kv-exact models dir hf cache", base: plainRule, mutate: func(r *Rule) { kvExact(r); r.KVTokenizer = filepath.Join(models, "hub") }},
		{name: "kv-exact models dir without the model", base: plainRule, mutate: func(r *Rule) { kvExact(r); r.ModelName = "org/other"; r.KVTokenizer = filepath.Join(models, "slug") }, wantCode: CodeKVTokenizer},
		{name: "session header with space", base: plainRule, mutate: func(r *Rule) { r.SessionHeaderName = "X Session" }, wantCode: CodeSessionHeader},
		{name: "session cookie empty", base: plainRule, mutate: func(r *Rule) { r.SessionHeaderName = "cookie:" }, wantCode: CodeSessionHeader},
		{name: "session unknown source", base: plainRule, mutate: func(r *Rule) { r.SessionHeaderName = "path:x" }, wantCode: CodeSessionHeader},
		{name: "session basic auth", base: plainRule, mutate: func(r *Rule) { r.SessionHeaderName = "basic-auth" }, wantCode: CodeSessionHeader},
		{name: "session query ok", base: plainRule, mutate: func(r *Rule) { r.Sel = 3; r.SessionHeaderName = "query:session" }},
		{name: "session header with chwbl", base: plainRule, mutate: func(r *Rule) { r.Sel = 8; r.SessionHeaderName = "X-Session-ID" }, wantCode: CodeSessionHeaderSel},
		{name: "session ttl negative", base: plainRule, mutate: func(r *Rule) { r.SessionTTL = -1 }, wantCode: CodeSessionTTL},
		{name: "chwbl load factor percent", base: plainRule, mutate: func(r *Rule) { r.CHWBL.LoadFactor = 125 }, wantCode: CodeCHWBLLoadFactor, wantField: "chwbl.load_factor"},
		{name: "chwbl load factor below one", base: plainRule, mutate: func(r *Rule) { r.CHWBL.LoadFactor = 0.5 }, wantCode: CodeCHWBLLoadFactor},
		{name: "chwbl replicas", base: plainRule, mutate: func(r *Rule) { r.CHWBL.Replicas = 4097 }, wantCode: CodeCHWBLReplicas},
		{name: "chwbl prefix bytes", base: plainRule, mutate: func(r *Rule) { r.CHWBL.PrefixBytes = 1<<20 + 1 }, wantCode: CodeCHWBLPrefixBytes},
		{name: "probe path relative", base: plainRule, mutate: func(r *Rule) { r.Probe.Path = "health" }, wantCode: CodeProbePath},
		{name: "probe interval negative", base: plainRule, mutate: func(r *Rule) { r.Probe.Interval = -1 }, wantCode: CodeProbeInterval},
		{name: "probe timeout over default interval", base: plainRule, mutate: func(r *Rule) { r.Probe.Timeout = Duration(6e9) }, wantCode: CodeProbeTimeout},
		{name: "probe timeout over interval", base: plainRule, mutate: func(r *Rule) { r.Probe.Interval = Duration(1e9); r.Probe.Timeout = Duration(2e9) }, wantCode: CodeProbeTimeout},
		{name: "probe failures", base: plainRule, mutate: func(r *Rule) { r.Probe.Failures = 101 }, wantCode: CodeProbeFailures},
		{name: "probe successes", base: plainRule, mutate: func(r *Rule) { r.Probe.Successes = -1 }, wantCode: CodeProbeSuccesses},
		{name: "cb failures", base: plainRule, mutate: func(r *Rule) { r.CB.Failures = -1 }, wantCode: CodeCBFailures},
		{name: "cb open for", base: plainRule, mutate: func(r *Rule) { r.CB.OpenFor = Duration(2 * 3600e9) }, wantCode: CodeCBOpenFor},
		{name: "cb half open trials", base: plainRule, mutate: func(r *Rule) { r.CB.HalfOpenTrials = 1001 }, wantCode: CodeCBHalfOpenTrials},
		{name: "cb origin 5xx", base: plainRule, mutate: func(r *Rule) { r.CB.Origin5xx = -2 }, wantCode: CodeCBOrigin5xx},
		{name: "cb origin 5xx disabled", base: plainRule, mutate: func(r *Rule) { r.CB.Origin5xx = -1 }},
		{name: "timeouts negative", base: plainRule, mutate: func(r *Rule) { r.Timeouts.Idle = -1 }, wantCode: CodeTimeouts, wantField: "timeouts.idle"},
		{name: "listen without port", base: plainRule, mutate: func(r *Rule) { r.Listen = "127.0.0.1" }, wantCode: CodeListenInvalid},
		{name: "listen port zero", base: plainRule, mutate: func(r *Rule) { r.Listen = "127.0.0.1:0" }, wantCode: CodeListenInvalid},
		{name: "listen bad host", base: plainRule, mutate: func(r *Rule) { r.Listen = "bad host:80" }, wantCode: CodeListenInvalid},
		{name: "listen any host", base: plainRule, mutate: func(r *Rule) { r.Listen = ":8081" }},
		{
			name: "V16 engine change is conflict", base: pdRule,
			mutate:   func(r *Rule) { r.KVEngineType = "trtllm" },
			existing: pdRule(), wantCode: CodeKVEngineImmutable, wantConflict: true,
		},
		{
			name: "V16 empty engine equals vllm", base: plainRule,
			mutate:   func(r *Rule) { r.KVEngineType = "vllm" },
			existing: plainRule(),
		},
		{
			name: "V16 vllm to default sglang", base: plainRule,
			existing: func() *Rule { r := plainRule(); r.KVEngineType = "sglang"; return r }(),
			wantCode: CodeKVEngineImmutable, wantConflict: true,
		},
		{
			name: "same model on shared listener", base: plainRule,
			others:   []*Rule{func() *Rule { r := plainRule(); r.Name = "other"; return r }()},
			wantCode: CodeListenModelConflict, wantConflict: true, wantField: "model_name",
		},
		{
			name: "same model on equivalent listen", base: plainRule,
			mutate: func(r *Rule) { r.Listen = "[::1]:9000" },
			others: []*Rule{func() *Rule {
				r := plainRule()
				r.Name, r.Listen = "other", "[0:0::1]:9000"
				return r
			}()},
			wantCode: CodeListenModelConflict, wantConflict: true,
		},
		{
			name: "same model on another listener", base: plainRule,
			mutate: func(r *Rule) { r.Listen = "127.0.0.1:9000" },
			others: []*Rule{func() *Rule { r := plainRule(); r.Name = "other"; return r }()},
		},
		{
			name: "other model on shared listener", base: plainRule,
			others: []*Rule{func() *Rule { r := plainRule(); r.Name, r.ModelName = "other", "n"; return r }()},
		},
		{
			name: "update of itself is no conflict", base: plainRule,
			existing: plainRule(), others: []*Rule{plainRule(), nil},
		},
		{name: "order: name before sel", base: plainRule, mutate: func(r *Rule) { r.Name = ""; r.Sel = 9 }, wantCode: CodeNameRequired},
		{name: "order: endpoints before kv exact", base: plainRule, mutate: func(r *Rule) { r.Endpoints = nil; r.KVExactMode = 2 }, wantCode: CodeEndpointsRequired},
		{name: "order: invalid rule before conflict", base: plainRule, mutate: func(r *Rule) { r.KVBlockSize = -1 },
			existing: func() *Rule { r := plainRule(); r.KVEngineType = "sglang"; return r }(), wantCode: CodeKVBlockSize},
	}
	covered := map[string]bool{}
	for _, tc := range tests {
		covered[tc.wantCode] = true
		t.Run(tc.name, func(t *testing.T) {
			r := tc.base()
			if tc.mutate != nil {
				tc.mutate(r)
			}
			before := r.Clone()
			err := Admit(r, tc.existing, tc.others)
			if !equalRules(r, before) {
				t.Errorf("Admit modified its argument")
			}
			if tc.wantCode == "" {
				if err != nil {
					t.Fatalf("Admit: got %v, want nil", err)
				}
				if err := Admit(r.Effective(), tc.existing, tc.others); err != nil {
					t.Errorf("Admit(Effective()): got %v, want nil (read-back must be re-appliable)", err)
				}
				return
			}
			var ae *AdmissionError
			if !errors.As(err, &ae) {
				t.Fatalf("Admit: got %v, want *AdmissionError %s", err, tc.wantCode)
			}
			if ae.Code != tc.wantCode {
				t.Errorf("code: got %q, want %q (%v)", ae.Code, tc.wantCode, err)
			}
			if ae.Conflict != tc.wantConflict {
				t.Errorf("conflict: got %v, want %v", ae.Conflict, tc.wantConflict)
			}
			if tc.wantField != "" && ae.Field != tc.wantField {
				t.Errorf("field: got %q, want %q", ae.Field, tc.wantField)
			}
			if wantStatus := map[bool]int{true: 409, false: 400}[tc.wantConflict]; ae.Status() != wantStatus {
				t.Errorf("status: got %d, want %d", ae.Status(), wantStatus)
			}
			if ae.Message == "" {
				t.Errorf("empty message")
			}
			if !strings.Contains(ae.Message, tc.wantMsg) {
				t.Errorf("message %q does not name %q", ae.Message, tc.wantMsg)
			}
			if !errors.Is(err, &AdmissionError{Code: tc.wantCode}) {
				t.Errorf("errors.Is by code: got false, want true")
			}
			if !strings.HasPrefix(err.Error(), "rule: "+tc.wantCode) {
				t.Errorf("Error(): got %q, want prefix %q", err.Error(), "rule: "+tc.wantCode)
			}
		})
	}

	// Every admission code declared in admit.go has a case above.
	for _, code := range declaredCodes(t) {
		if !covered[code] {
			t.Errorf("admission code %q has no test case", code)
		}
	}
}

// declaredCodes returns the values of the Code* constants in admit.go.
func declaredCodes(t *testing.T) []string {
	t.Helper()
	f, err := parser.ParseFile(token.NewFileSet(), "admit.go", nil, 0)
	if err != nil {
		t.Fatal(err)
	}
	var codes []string
	ast.Inspect(f, func(n ast.Node) bool {
		vs, ok := n.(*ast.ValueSpec)
		if !ok || len(vs.Names) != 1 || !strings.HasPrefix(vs.Names[0].Name, "Code") || len(vs.Values) != 1 {
			return true
		}
		if lit, ok := vs.Values[0].(*ast.BasicLit); ok && lit.Kind == token.STRING {
			codes = append(codes, strings.Trim(lit.Value, `"`))
		}
		return true
	})
	if len(codes) < 40 {
		t.Fatalf("found %d Code constants in admit.go, want the full list", len(codes))
	}
	return codes
}

// exampleModels points an example's kvTokenizer under /models (the
// examples' stand-in for a host's models directory) at a temporary one
// holding what the path names, so admission can resolve it. Admission only
// resolves; the files are not loaded.
func exampleModels(t *testing.T, r *Rule) {
	t.Helper()
	rest, ok := strings.CutPrefix(r.KVTokenizer, "/models")
	if !ok {
		return
	}
	root := t.TempDir()
	file := filepath.Join(root, rest)
	if !strings.HasSuffix(rest, "tokenizer.json") {
		file = filepath.Join(root, rest, strings.Replace(r.ModelName, "/", "__", 1), "tokenizer.json")
	}
	if err := os.MkdirAll(filepath.Dir(file), 0o755); err != nil {
		t.Fatal(err)
	}
	writeTokenizer(t, filepath.Dir(file), `{"chat_template": "{{ messages }}"}`)
	r.KVTokenizer = filepath.Join(root, rest)
}

func TestAdmitNil(t *testing.T) {
	var ae *AdmissionError
	if err := Admit(nil, nil, nil); !errors.As(err, &ae) || ae.Code != CodeRuleMissing {
		t.Fatalf("Admit(nil): got %v, want %s", err, CodeRuleMissing)
	}
}

// TestAdmitReferenceExamples admits the valid examples under testdata (a
// converged vLLM KV-exact pool, SGLang P/D, TensorRT-LLM P/D, plain
// llama.cpp), both as written and as read back through Effective.
func TestAdmitReferenceExamples(t *testing.T) {
	for _, file := range exampleFiles(t) {
		t.Run(filepath.Base(file), func(t *testing.T) {
			r := mustDecodeFile(t, file)
			exampleModels(t, r)
			if err := Admit(r, nil, nil); err != nil {
				t.Fatalf("Admit: got %v, want nil", err)
			}
			if err := Admit(r.Effective(), r, nil); err != nil {
				t.Fatalf("Admit(Effective()) as an update: got %v, want nil", err)
			}
		})
	}
}

func TestParseSessionKey(t *testing.T) {
	tests := []struct {
		name, in, wantSource, wantName string
		wantErr                        bool
	}{
		{name: "header", in: "X-Session-ID", wantSource: "header", wantName: "X-Session-ID"},
		{name: "cookie", in: "cookie:sid", wantSource: "cookie", wantName: "sid"},
		{name: "cookie upper prefix", in: "Cookie:sid", wantSource: "cookie", wantName: "sid"},
		{name: "query", in: "query:s.id", wantSource: "query", wantName: "s.id"},
		{name: "query with ampersand", in: "query:a&b", wantErr: true},
		{name: "empty", in: "", wantErr: true},
		{name: "header with colon source", in: "x:y", wantErr: true},
		{name: "header non ascii", in: "Sessión", wantErr: true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			src, name, err := ParseSessionKey(tc.in)
			if (err != nil) != tc.wantErr {
				t.Fatalf("ParseSessionKey(%q): got err %v, want error %v", tc.in, err, tc.wantErr)
			}
			if src != tc.wantSource || name != tc.wantName {
				t.Errorf("ParseSessionKey(%q): got (%q, %q), want (%q, %q)", tc.in, src, name, tc.wantSource, tc.wantName)
			}
		})
	}
}

// writeTokenizer writes a tokenizer.json into dir (admission resolves it, it
// does not load it) with config as the tokenizer_config.json beside it (""
// for none), and returns the tokenizer.json's path.
func writeTokenizer(t *testing.T, dir, config string) string {
	t.Helper()
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	p := filepath.Join(dir, "tokenizer.json")
	if err := os.WriteFile(p, []byte(`{}`), 0o600); err != nil {
		t.Fatal(err)
	}
	if config != "" {
		if err := os.WriteFile(filepath.Join(dir, "tokenizer_config.json"), []byte(config), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	return p
}
