package sim

import (
	"encoding/json"
	"fmt"
	"strconv"

	"github.com/valyala/fasthttp"

	"github.com/llmgw/llmgw/engines"
	"github.com/llmgw/llmgw/engines/sglang"
	"github.com/llmgw/llmgw/engines/trtllm"
	"github.com/llmgw/llmgw/engines/vllm"
)

// pdState carries one request's prefill/decode hand-off, as the engine's
// adapter parsed it (engines.PDProtocol.ParseLeg): the field names and
// shapes live in engines/vllm, engines/sglang and engines/trtllm.
type pdState struct {
	leg engines.PDLeg
	// boot is the rendezvous triple (concurrent shape), nil otherwise.
	boot *BootstrapTriple
	// paramsOut is the hand-off this prefill (context) answers with.
	paramsOut []byte
}

// trtOpaqueState is what this simulator puts in a TensorRT-LLM context
// answer's opaque state (base64 of this JSON; the real engine's content is
// its own); a generation server checks it.
type trtOpaqueState struct {
	Engine          string `json:"engine"`
	CtxRequestID    int64  `json:"ctx_request_id"`
	DisaggRequestID *int64 `json:"disagg_request_id,omitempty"`
	PromptTokens    int    `json:"prompt_tokens"`
}

// parsePD reads the request's P/D fields through the engine's adapter and
// validates them as the persona does.
func (s *Sim) parsePD(job *genJob, body []byte) *reqError {
	proto := s.adapter.PD()
	if proto == nil {
		return nil
	}
	leg, err := proto.ParseLeg(body)
	if leg.Raw != nil {
		job.rec.HandOff = append(json.RawMessage(nil), leg.Raw...)
	}
	if err != nil {
		return badRequest(fmt.Errorf("%w: %v", errBadRequest, err))
	}
	job.pd.leg = leg
	switch proto.Shape() {
	case engines.PDSequential:
		if leg.Role == engines.PDLegDecode && leg.RemoteBlocks > 0 {
			// NIXL pulls every prompt token but the last from the prefiller.
			job.remoteTokens = len(job.prompt) - 1
			if leg.RemoteTokens >= 0 {
				job.remoteTokens = min(leg.RemoteTokens, len(job.prompt)-1)
			}
			job.rec.RemotePrefillTokens = job.remoteTokens
		}
	case engines.PDConcurrent:
		t := leg.Rendezvous
		if t == nil {
			return nil
		}
		job.pd.boot = t
		job.rec.Bootstrap = t
		if s.cfg.Role == RolePrefill && s.boot != nil {
			if strconv.Itoa(int(t.Port)) != portOf(s.boot.addr) {
				return badRequest(fmt.Errorf("%w: %s %d does not match this prefill server's bootstrap port %s", errBadRequest, sglang.FieldPort, t.Port, portOf(s.boot.addr)))
			}
			if h := hostOf(s.boot.addr); t.Host != h && !(t.Host == "localhost" && h == "127.0.0.1") {
				return badRequest(fmt.Errorf("%w: %s %q does not match this prefill server's bootstrap host %q", errBadRequest, sglang.FieldHost, t.Host, h))
			}
		}
	case engines.PDContextGeneration:
		switch leg.Role {
		case engines.PDLegPrefill:
			// The context phase produces exactly the first token.
			job.max = 1
			job.stream = false
		case engines.PDLegDecode:
			var st trtOpaqueState
			if err := json.Unmarshal(leg.Opaque, &st); err != nil {
				return badRequest(fmt.Errorf("%w: %s: encoded_opaque_state is not a context state: %v", errBadRequest, trtllm.Field, err))
			}
			if st.PromptTokens != len(job.prompt) {
				return badRequest(fmt.Errorf("%w: %s: context state covers %d prompt tokens, request has %d", errBadRequest, trtllm.Field, st.PromptTokens, len(job.prompt)))
			}
			job.remoteTokens = len(job.prompt) - 1
			job.rec.RemotePrefillTokens = job.remoteTokens
		}
	}
	return nil
}

// beforePrefill runs the hand-off steps that precede the prefill: a SGLang
// prefill waits for its decode to join the room; a SGLang decode joins and
// waits for the transferred KV.
func (s *Sim) beforePrefill(job *genJob) *reqError {
	t := job.pd.boot
	if t == nil {
		return nil
	}
	switch s.cfg.Role {
	case RolePrefill:
		if s.boot == nil {
			return nil
		}
		if err := s.boot.awaitDecode(s.ctx, t.Room); err != nil {
			return &reqError{status: fasthttp.StatusInternalServerError, err: err}
		}
	case RoleDecode:
		n, err := s.bootClient.join(s.ctx, t, len(job.prompt), s.cfg.RendezvousTimeout)
		if err != nil {
			return &reqError{status: fasthttp.StatusInternalServerError, err: err}
		}
		job.remoteTokens = min(n, len(job.prompt)-1)
		job.rec.RemotePrefillTokens = job.remoteTokens
	}
	return nil
}

// afterPrefill completes the hand-off once the prompt is computed.
func (s *Sim) afterPrefill(job *genJob, out *genOutcome) *reqError {
	leg := job.pd.leg
	switch {
	case job.pd.boot != nil && s.cfg.Role == RolePrefill && s.boot != nil:
		s.boot.transferDone(job.pd.boot.Room, out.promptTokens)
	case leg.Role == engines.PDLegPrefill && s.adapter.PD().Shape() == engines.PDSequential:
		// NixlConnector hands the blocks over only when the prefill stopped
		// on its length cap (max_tokens=1), not on EOS.
		if out.finish != "length" {
			return nil
		}
		port, _ := strconv.Atoi(portOf(s.addrs.HTTP))
		job.pd.paramsOut = vllm.AnswerParams(vllm.PrefillAnswer{
			BlockIDs: out.blockIDs, EngineID: s.engineID, Host: hostOf(s.addrs.HTTP), Port: port,
			RequestID: job.requestID, PromptTokens: out.promptTokens,
		})
		job.rec.HandOffOut = append(json.RawMessage(nil), job.pd.paramsOut...)
	case leg.Role == engines.PDLegPrefill && s.adapter.PD().Shape() == engines.PDContextGeneration:
		ctxID := int64(s.trtCtxSeq.Add(1))
		st := trtOpaqueState{Engine: s.engineID, CtxRequestID: ctxID, DisaggRequestID: leg.RequestRef, PromptTokens: out.promptTokens}
		job.pd.paramsOut = trtllm.AnswerParams(trtllm.ContextAnswer{
			FirstGenTokens: out.ids[:min(1, len(out.ids))], CtxRequestID: ctxID, Opaque: mustJSON(st), DisaggRequestID: leg.RequestRef,
		})
		job.rec.HandOffOut = append(json.RawMessage(nil), job.pd.paramsOut...)
	}
	return nil
}
