package trtllm

import (
	"encoding/base64"
	"encoding/json"
	"fmt"
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
	var a fastjson.Arena
	dp.Set("request_type", a.NewString(generationOnly))
	return engines.HandOff{Params: dp.MarshalTo(nil)}
}

func (pd) DecodeBody(body []byte, _ *engines.PDPair, h engines.HandOff) ([]byte, error) {
	if h.Params == nil {
		return body, nil
	}
	var p fastjson.Parser
	dp, err := p.ParseBytes(h.Params)
	if err != nil {
		return nil, fmt.Errorf("%w: %s: %v", engines.ErrPDBody, handOffField, err)
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
func (pd) ParseLeg(body []byte) (engines.PDLeg, error) {
	var req struct {
		DP json.RawMessage `json:"disaggregated_params"`
	}
	if err := json.Unmarshal(body, &req); err != nil {
		return engines.PDLeg{}, fmt.Errorf("%w: %v", engines.ErrPDBody, err)
	}
	if engines.IsJSONNull(req.DP) {
		return engines.PDLeg{}, nil
	}
	leg := engines.PDLeg{Raw: append([]byte(nil), req.DP...), RemoteBlocks: -1, RemoteTokens: -1}
	var dp disaggParams
	if err := json.Unmarshal(req.DP, &dp); err != nil {
		return leg, fmt.Errorf("%w: %s: %v", engines.ErrPDBody, handOffField, err)
	}
	leg.RequestRef = dp.DisaggRequestID
	switch dp.RequestType {
	case contextOnly:
		leg.Role = engines.PDLegPrefill
	case generationOnly:
		leg.Role = engines.PDLegDecode
		if dp.EncodedOpaqueState == nil {
			return leg, fmt.Errorf("%w: %s: %s requires encoded_opaque_state", engines.ErrPDBody, handOffField, generationOnly)
		}
		raw, err := base64.StdEncoding.DecodeString(*dp.EncodedOpaqueState)
		if err != nil {
			return leg, fmt.Errorf("%w: %s: encoded_opaque_state is not base64: %v", engines.ErrPDBody, handOffField, err)
		}
		leg.Opaque, leg.HasOpaque = raw, true
	default:
		return leg, fmt.Errorf("%w: %s: unknown request_type %q", engines.ErrPDBody, handOffField, dp.RequestType)
	}
	return leg, nil
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
