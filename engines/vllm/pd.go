package vllm

import (
	"encoding/json"
	"fmt"
	"math/rand/v2"

	"github.com/valyala/fastjson"

	"github.com/llmgw/llmgw/engines"
)

// pd is vLLM's sequential prefill/decode hand-off, in two connector
// flavours:
//
//   - NIXL (NixlConnector, the default): the prefill leg carries
//     kv_transfer_params {do_remote_decode: true, ...} and answers with the
//     kv_transfer_params the decode leg must send back (remote engine,
//     host, port, block ids). vllm/distributed/kv_transfer/kv_connector/v1/
//     nixl_connector.py; the toy proxy
//     tests/v1/kv_connector/nixl_integration/toy_proxy_server.py sends the
//     same prefill object.
//     With nixl_port (the NIXL side-channel port, as the reference gateway
//     means it) the hand-off is the same and both legs carry the id below
//     naming those ports, as the reference gateway sends them
//     (___prefill_addr_<P ip>:<P nixl_port|port>___decode_addr_..., its
//     §10.1); NixlConnector itself reads its peer from kv_transfer_params.
//   - P2P-NCCL (P2pNcclConnector), when the rule gives endpoints
//     p2p_nccl_port: no hand-off fields; both legs carry the X-Request-Id
//     "___prefill_addr_<host>:<port>___decode_addr_<host>:<port>_<32 hex>"
//     from which each side parses its peer. Format: vllm-project/vllm
//     examples/online_serving/disaggregated_serving_p2p_nccl_xpyd/
//     disagg_proxy_p2p_nccl_xpyd.py @ cd583cfb65ae316a1f7826f263ac5f477630f767
//     (request_id = f"___prefill_addr_{p}___decode_addr_{d}_{uuid4().hex}");
//     parsed by P2pNcclConnector.parse_request_id in
//     vllm/distributed/kv_transfer/kv_connector/v1/p2p/p2p_nccl_connector.py
//     @ ee0cdef382af1f489c17570cbddcbf8e8928be36 (regexes
//     "___decode_addr_(.*):(\\d+)" and "___prefill_addr_(.*):(\\d+)___").
type pd struct{}

// handOffField is the request and answer field of the NIXL hand-off.
const handOffField = "kv_transfer_params"

func (pd) Shape() engines.PDShape { return engines.PDSequential }
func (pd) BootstrapPort() int     { return 0 }
func (pd) KVPorts() bool          { return true }

// p2p reports whether the pair uses the P2P-NCCL connector.
func p2p(p *engines.PDPair) bool { return p.PrefillKVPort != 0 || p.DecodeKVPort != 0 }

// nixlPorts reports whether the pair names NIXL side-channel ports.
func nixlPorts(p *engines.PDPair) bool { return p.PrefillNixlPort != 0 || p.DecodeNixlPort != 0 }

// LegRequestID: the client's id for NIXL without ports; the id naming the
// pair's ports when it has P2P-NCCL ports (the rendezvous id) or NIXL ports
// (the reference gateway's id). An endpoint without one uses its HTTP port,
// as the reference gateway does. The tail is 32 hex digits like uuid4().hex and
// holds no colon, so the engine's greedy "(.*):(\d+)" still finds the
// address. IPv6 hosts are written unbracketed: the regexes split on the
// last colon; whether the connector then dials an IPv6 literal correctly
// is not established from the source.
func (pd) LegRequestID(p *engines.PDPair) string {
	var pp, dp int
	switch {
	case p2p(p):
		pp, dp = p.PrefillKVPort, p.DecodeKVPort
	case nixlPorts(p):
		pp, dp = p.PrefillNixlPort, p.DecodeNixlPort
	default:
		return p.RequestID
	}
	if pp == 0 {
		pp = p.PrefillPort
	}
	if dp == 0 {
		dp = p.DecodePort
	}
	return fmt.Sprintf("___prefill_addr_%s:%d___decode_addr_%s:%d_%016x%016x",
		p.PrefillHost, pp, p.DecodeHost, dp, p.Nonce, rand.Uint64())
}

// PrefillBody caps the prefill at one token, always, even when the client
// set no limit (an uncapped prefill would generate the whole answer on the
// prefill worker), makes it non-streaming and, for NIXL, asks it to hand its
// blocks off.
func (pd) PrefillBody(body []byte, p *engines.PDPair) ([]byte, error) {
	return engines.RewriteJSON(body, func(v *fastjson.Value, a *fastjson.Arena) {
		v.Set("max_tokens", a.NewNumberInt(1))
		if v.Exists("max_completion_tokens") {
			v.Set("max_completion_tokens", a.NewNumberInt(1))
		}
		if mt := v.Get("min_tokens"); mt != nil && mt.GetInt() > 1 {
			v.Set("min_tokens", a.NewNumberInt(1))
		}
		v.Set("stream", a.NewFalse())
		v.Del("stream_options")
		if p2p(p) {
			return
		}
		kv := a.NewObject()
		kv.Set("do_remote_decode", a.NewTrue())
		kv.Set("do_remote_prefill", a.NewFalse())
		kv.Set("remote_engine_id", a.NewNull())
		kv.Set("remote_block_ids", a.NewNull())
		kv.Set("remote_host", a.NewNull())
		kv.Set("remote_port", a.NewNull())
		v.Set(handOffField, kv)
	})
}

// HandOff takes the answer's top-level kv_transfer_params object as is.
func (pd) HandOff(answer []byte, p *engines.PDPair) engines.HandOff {
	if p2p(p) {
		return engines.HandOff{OutOfBand: true}
	}
	if kv := answerParams(answer); kv != nil {
		return engines.HandOff{Params: kv}
	}
	return engines.HandOff{Missing: "kv-params-missing"}
}

// answerParams returns the answer's kv_transfer_params object, re-encoded;
// nil for an answer that is not strictly valid JSON (fastjson's parser alone
// is lax about numbers, and the object goes on to the decode).
func answerParams(answer []byte) []byte {
	if fastjson.ValidateBytes(answer) != nil {
		return nil
	}
	var p fastjson.Parser
	v, err := p.ParseBytes(answer)
	if err != nil {
		return nil
	}
	if kv := v.Get(handOffField); kv != nil && kv.Type() == fastjson.TypeObject {
		return kv.MarshalTo(nil)
	}
	return nil
}

// DecodeBody is the client's body, with the prefill's kv_transfer_params
// when there are any (without them the decode recomputes the prompt).
func (pd) DecodeBody(body []byte, _ *engines.PDPair, h engines.HandOff) ([]byte, error) {
	if h.Params == nil {
		return body, nil
	}
	var p fastjson.Parser
	kv, err := p.ParseBytes(h.Params)
	if err != nil {
		return nil, engines.PDErrorf("%s: %v", handOffField, err)
	}
	return engines.RewriteJSON(body, func(v *fastjson.Value, _ *fastjson.Arena) {
		v.Set(handOffField, kv)
	})
}

// kvParams is NixlConnector's kv_transfer_params object.
type kvParams struct {
	DoRemoteDecode  bool            `json:"do_remote_decode"`
	DoRemotePrefill bool            `json:"do_remote_prefill"`
	RemoteBlockIDs  json.RawMessage `json:"remote_block_ids"`
	RemoteNumTokens *int            `json:"remote_num_tokens"`
}

// ParseLeg reads kv_transfer_params: do_remote_decode marks a prefill leg,
// do_remote_prefill with blocks a decode leg.
func (p pd) ParseLeg(body []byte) (engines.PDLeg, error) {
	var req struct {
		KV json.RawMessage `json:"kv_transfer_params"`
	}
	if err := json.Unmarshal(body, &req); err != nil {
		return engines.PDLeg{}, engines.PDErrorf("%v", err)
	}
	if engines.IsJSONNull(req.KV) {
		return engines.PDLeg{}, nil
	}
	return p.ParseHandOff(req.KV)
}

func (pd) ParseHandOff(raw []byte) (engines.PDLeg, error) {
	if engines.IsJSONNull(raw) {
		return engines.PDLeg{}, nil
	}
	leg := engines.PDLeg{Raw: append([]byte(nil), raw...), RemoteBlocks: -1, RemoteTokens: -1}
	var kv kvParams
	if err := json.Unmarshal(raw, &kv); err != nil {
		return leg, engines.PDErrorf("%s: %v", handOffField, err)
	}
	n, err := countBlockIDs(kv.RemoteBlockIDs)
	if err != nil {
		return leg, engines.PDErrorf("%s: %v", handOffField, err)
	}
	leg.RemoteBlocks = n
	if kv.RemoteNumTokens != nil {
		leg.RemoteTokens = *kv.RemoteNumTokens
	}
	switch {
	case kv.DoRemoteDecode:
		leg.Role = engines.PDLegPrefill
	case kv.DoRemotePrefill:
		leg.Role = engines.PDLegDecode
	}
	return leg, nil
}

// CarryParams: the decode sends the prefill's kv_transfer_params back
// unchanged.
func (pd) CarryParams(answered []byte) []byte { return answered }

// countBlockIDs counts remote_block_ids: a flat list, or one list per KV
// cache group (hybrid models), in which case the first group counts.
func countBlockIDs(raw json.RawMessage) (int, error) {
	if engines.IsJSONNull(raw) {
		return 0, nil
	}
	var flat []int64
	if err := json.Unmarshal(raw, &flat); err == nil {
		return len(flat), nil
	}
	var groups [][]int64
	if err := json.Unmarshal(raw, &groups); err != nil {
		return 0, fmt.Errorf("remote_block_ids: expected a list of ints or of lists of ints: %w", err)
	}
	if len(groups) == 0 {
		return 0, nil
	}
	return len(groups[0]), nil
}

func (pd) ParseLegAnswer(answer []byte) []byte { return answerParams(answer) }

// PrefillAnswer is what a NIXL prefill hands back once its prompt is
// computed (NixlConnector.request_finished).
type PrefillAnswer struct {
	BlockIDs     []int64
	EngineID     string
	Host         string
	Port         int
	RequestID    string
	PromptTokens int
}

// AnswerParams renders a NIXL prefill's kv_transfer_params (the simulator's
// vLLM prefill persona answers with it): do_remote_prefill,
// do_remote_decode, remote_block_ids, remote_engine_id, remote_host,
// remote_port, remote_request_id, remote_num_tokens, tp_size, the set
// NixlConnector.request_finished returns (vllm/distributed/kv_transfer/
// kv_connector/v1/nixl_connector.py; the exact set at the catalog version is
// pinned by testdata/ when the fixture set cites it).
func AnswerParams(a PrefillAnswer) []byte {
	ids := a.BlockIDs
	if ids == nil {
		ids = []int64{}
	}
	b, _ := json.Marshal(struct {
		DoRemotePrefill bool    `json:"do_remote_prefill"`
		DoRemoteDecode  bool    `json:"do_remote_decode"`
		RemoteBlockIDs  []int64 `json:"remote_block_ids"`
		RemoteEngineID  string  `json:"remote_engine_id"`
		RemoteHost      string  `json:"remote_host"`
		RemotePort      int     `json:"remote_port"`
		RemoteRequestID string  `json:"remote_request_id"`
		RemoteNumTokens int     `json:"remote_num_tokens"`
		TPSize          int     `json:"tp_size"`
	}{true, false, ids, a.EngineID, a.Host, a.Port, a.RequestID, a.PromptTokens, 1})
	return b
}

// AnswerField is the answer field the prefill's hand-off goes in (top
// level, next to "choices").
const AnswerField = handOffField

// Summary is the P/D runbook's evidence phrase.
func (pd) Summary() string {
	return "prefill leg max_tokens 1, kv_transfer_params handed to the decode, KV pulled not recomputed"
}
