package trtllm

import (
	"encoding/base64"
	"encoding/json"
	"strconv"

	"github.com/valyala/fastjson"

	"github.com/llmgw/llmgw/engines"
)

// pd is TensorRT-LLM's context→generation hand-off: a context-only
// request (disaggregated_params.request_type "context_only") answers with
// choices[0].disaggregated_params, which the generation request carries back
// with request_type "generation_only". Fields: DisaggregatedParams in
// tensorrt_llm/serve/openai_protocol.py and tensorrt_llm/disaggregated_params.py;
// the orchestration follows tensorrt_llm/serve/openai_disagg_server.py.
type pd struct{}

const (
	handOffField   = "disaggregated_params"
	contextOnly    = "context_only"
	generationOnly = "generation_only"
)

// Field is the request field of the hand-off; in an answer it sits in
// choices[i].
const Field = handOffField

func (pd) Shape() engines.PDShape { return engines.PDContextGeneration }
func (pd) BootstrapPort() int     { return 0 }
func (pd) KVPorts() bool          { return false }

func (pd) LegRequestID(p *engines.PDPair) string { return p.RequestID }

// PrefillBody: a non-streaming context-only request with a fresh
// disagg_request_id.
func (pd) PrefillBody(body []byte, p *engines.PDPair) ([]byte, error) {
	return engines.RewriteJSON(body, func(v *fastjson.Value, a *fastjson.Arena) {
		v.Set("stream", a.NewFalse())
		v.Del("stream_options")
		dp := a.NewObject()
		dp.Set("request_type", a.NewString(contextOnly))
		dp.Set("disagg_request_id", a.NewNumberString(strconv.FormatUint(p.Nonce&(1<<63-1), 10)))
		v.Set(handOffField, dp)
	})
}

// HandOff reads choices[0]: a finish_reason other than "length" or
// "not_finished" means the context phase produced the whole answer (the
// early exit of openai_disagg_server.py): it is Final, without the
// hand-off. Otherwise its disaggregated_params become the generation's,
// with request_type generation_only.
func (pd) HandOff(answer []byte, _ *engines.PDPair) engines.HandOff {
	// Strictly valid JSON only: fastjson's parser alone is lax about
	// numbers, and the params go on to the generation leg.
	if fastjson.ValidateBytes(answer) != nil {
		return engines.HandOff{Missing: "context-unparsable"}
	}
	var p fastjson.Parser
	v, err := p.ParseBytes(answer)
	if err != nil {
		return engines.HandOff{Missing: "context-unparsable"}
	}
	c0 := v.Get("choices", "0")
	if c0 == nil {
		return engines.HandOff{Missing: "context-no-choice"}
	}
	if fr := c0.Get("finish_reason"); fr != nil && fr.Type() == fastjson.TypeString {
		if s := string(fr.GetStringBytes()); s != "length" && s != "not_finished" {
			c0.Del(handOffField)
			return engines.HandOff{Final: v.MarshalTo(nil)}
		}
	}
	dp := c0.Get(handOffField)
	if dp == nil || dp.Type() != fastjson.TypeObject {
		return engines.HandOff{Missing: "params-missing"}
	}
	return engines.HandOff{Params: pd{}.CarryParams(dp.MarshalTo(nil))}
}

func (pd) DecodeBody(body []byte, _ *engines.PDPair, h engines.HandOff) ([]byte, error) {
	if h.Params == nil {
		return body, nil
	}
	var p fastjson.Parser
	dp, err := p.ParseBytes(h.Params)
	if err != nil {
		return nil, engines.PDErrorf("%s: %v", handOffField, err)
	}
	return engines.RewriteJSON(body, func(v *fastjson.Value, _ *fastjson.Arena) {
		v.Set(handOffField, dp)
	})
}

// disaggParams is DisaggregatedParams as far as the hand-off reads it.
type disaggParams struct {
	RequestType        string  `json:"request_type"`
	EncodedOpaqueState *string `json:"encoded_opaque_state"`
	DisaggRequestID    *int64  `json:"disagg_request_id"`
}

// ParseLeg reads disaggregated_params: context_only is a prefill leg,
// generation_only a decode leg, which must carry the context's
// encoded_opaque_state (base64).
func (p pd) ParseLeg(body []byte) (engines.PDLeg, error) {
	var req struct {
		DP json.RawMessage `json:"disaggregated_params"`
	}
	if err := json.Unmarshal(body, &req); err != nil {
		return engines.PDLeg{}, engines.PDErrorf("%v", err)
	}
	if engines.IsJSONNull(req.DP) {
		return engines.PDLeg{}, nil
	}
	return p.ParseHandOff(req.DP)
}

func (pd) ParseHandOff(raw []byte) (engines.PDLeg, error) {
	if engines.IsJSONNull(raw) {
		return engines.PDLeg{}, nil
	}
	leg := engines.PDLeg{Raw: append([]byte(nil), raw...), RemoteBlocks: -1, RemoteTokens: -1}
	var dp disaggParams
	if err := json.Unmarshal(raw, &dp); err != nil {
		return leg, engines.PDErrorf("%s: %v", handOffField, err)
	}
	leg.RequestRef = dp.DisaggRequestID
	switch dp.RequestType {
	case contextOnly:
		leg.Role = engines.PDLegPrefill
	case generationOnly:
		leg.Role = engines.PDLegDecode
		if dp.EncodedOpaqueState == nil {
			return leg, engines.PDErrorf("%s: %s requires encoded_opaque_state", handOffField, generationOnly)
		}
		st, err := base64.StdEncoding.DecodeString(*dp.EncodedOpaqueState)
		if err != nil {
			return leg, engines.PDErrorf("%s: encoded_opaque_state is not a context state: %v", handOffField, err)
		}
		leg.Opaque, leg.HasOpaque = st, true
	default:
		return leg, engines.PDErrorf("%s: unknown request_type %q", handOffField, dp.RequestType)
	}
	return leg, nil
}

// CarryParams: the generation request carries the context's params with
// request_type generation_only; nil when answered is not a JSON object.
func (pd) CarryParams(answered []byte) []byte {
	if fastjson.ValidateBytes(answered) != nil {
		return nil
	}
	var p fastjson.Parser
	dp, err := p.ParseBytes(answered)
	if err != nil || dp.Type() != fastjson.TypeObject {
		return nil
	}
	var a fastjson.Arena
	dp.Set("request_type", a.NewString(generationOnly))
	return dp.MarshalTo(nil)
}

// ParseLegAnswer returns choices[0].disaggregated_params of a context answer.
func (pd) ParseLegAnswer(answer []byte) []byte {
	if fastjson.ValidateBytes(answer) != nil {
		return nil
	}
	var p fastjson.Parser
	v, err := p.ParseBytes(answer)
	if err != nil {
		return nil
	}
	if dp := v.Get("choices", "0", handOffField); dp != nil && dp.Type() == fastjson.TypeObject {
		return dp.MarshalTo(nil)
	}
	return nil
}

// ContextAnswer is what a context-only request hands back.
type ContextAnswer struct {
	FirstGenTokens []uint32
	CtxRequestID   int64
	// Opaque is the engine's transfer state (sent base64-encoded).
	Opaque []byte
	// DisaggRequestID echoes the request's, when it had one.
	DisaggRequestID *int64
}

// AnswerParams renders a context answer's disaggregated_params (the
// simulator's TensorRT-LLM context persona answers with it):
// request_type, first_gen_tokens, ctx_request_id, encoded_opaque_state,
// draft_tokens (null), disagg_request_id when the request had one.
func AnswerParams(c ContextAnswer) []byte {
	toks := c.FirstGenTokens
	if toks == nil {
		toks = []uint32{}
	}
	b, _ := json.Marshal(struct {
		RequestType     string   `json:"request_type"`
		FirstGenTokens  []uint32 `json:"first_gen_tokens"`
		CtxRequestID    int64    `json:"ctx_request_id"`
		EncodedOpaque   string   `json:"encoded_opaque_state"`
		DraftTokens     []uint32 `json:"draft_tokens"`
		DisaggRequestID *int64   `json:"disagg_request_id,omitempty"`
	}{contextOnly, toks, c.CtxRequestID, base64.StdEncoding.EncodeToString(c.Opaque), nil, c.DisaggRequestID})
	return b
}

// Summary is the P/D runbook's evidence phrase.
func (pd) Summary() string {
	return "context_only then generation_only with the context state carried"
}
