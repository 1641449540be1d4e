package sim

import (
	"encoding/base64"
	"encoding/json"
	"fmt"
	"math"
	"strconv"

	"github.com/valyala/fasthttp"

	"github.com/llmgw/llmgw/engines"
)

// pdState carries one request's prefill/decode hand-off, per engine.
type pdState struct {
	// vLLM NIXL.
	kvIn        *vllmKVParams
	kvParamsOut []byte
	// SGLang bootstrap.
	boot *BootstrapTriple
	// TensorRT-LLM.
	trtIn        *trtDisaggParams
	trtParamsOut []byte
}

// vllmKVParams is the kv_transfer_params object of vLLM's NixlConnector.
type vllmKVParams struct {
	DoRemoteDecode  bool            `json:"do_remote_decode"`
	DoRemotePrefill bool            `json:"do_remote_prefill"`
	RemoteBlockIDs  json.RawMessage `json:"remote_block_ids"`
	RemoteEngineID  *string         `json:"remote_engine_id"`
	RemoteHost      *string         `json:"remote_host"`
	RemotePort      *int            `json:"remote_port"`
	RemoteRequestID *string         `json:"remote_request_id"`
	RemoteNumTokens *int            `json:"remote_num_tokens"`
}

// trtDisaggParams is TensorRT-LLM's DisaggregatedParams.
type trtDisaggParams struct {
	RequestType        string   `json:"request_type"`
	FirstGenTokens     []uint32 `json:"first_gen_tokens"`
	CtxRequestID       *int64   `json:"ctx_request_id"`
	EncodedOpaqueState *string  `json:"encoded_opaque_state"`
	DisaggRequestID    *int64   `json:"disagg_request_id"`
}

// trtOpaqueState is what this simulator puts in encoded_opaque_state
// (base64 of this JSON); a generation server checks it.
type trtOpaqueState struct {
	Engine          string `json:"engine"`
	CtxRequestID    int64  `json:"ctx_request_id"`
	DisaggRequestID *int64 `json:"disagg_request_id,omitempty"`
	PromptTokens    int    `json:"prompt_tokens"`
}

// countBlockIDs counts remote_block_ids: a flat list, or one list per KV
// cache group (hybrid models), in which case the first group counts.
func countBlockIDs(raw json.RawMessage) (int, error) {
	if isNull(raw) {
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

// parsePD reads the request's P/D fields for the persona and validates them.
func (s *Sim) parsePD(job *genJob) *reqError {
	req := job.req
	switch s.cfg.Engine {
	case engines.VLLM:
		if isNull(req.KVTransferParams) {
			return nil
		}
		job.rec.KVTransferParams = append(json.RawMessage(nil), req.KVTransferParams...)
		var p vllmKVParams
		if err := json.Unmarshal(req.KVTransferParams, &p); err != nil {
			return badRequest(fmt.Errorf("%w: kv_transfer_params: %v", errBadRequest, err))
		}
		n, err := countBlockIDs(p.RemoteBlockIDs)
		if err != nil {
			return badRequest(fmt.Errorf("%w: kv_transfer_params: %v", errBadRequest, err))
		}
		job.pd.kvIn = &p
		if p.DoRemotePrefill && n > 0 {
			// NIXL pulls every prompt token but the last from the prefiller.
			job.remoteTokens = len(job.prompt) - 1
			if p.RemoteNumTokens != nil {
				job.remoteTokens = min(*p.RemoteNumTokens, len(job.prompt)-1)
			}
			job.rec.RemotePrefillTokens = job.remoteTokens
		}
	case engines.SGLang:
		present := !isNull(req.BootstrapHost) || !isNull(req.BootstrapRoom) || !isNull(req.BootstrapPort)
		if !present {
			return nil
		}
		t, err := parseTriple(req)
		if err != nil {
			return badRequest(err)
		}
		job.pd.boot = t
		job.rec.Bootstrap = t
		if s.cfg.Role == RolePrefill && s.boot != nil {
			if strconv.Itoa(int(t.Port)) != portOf(s.boot.addr) {
				return badRequest(fmt.Errorf("%w: bootstrap_port %d does not match this prefill server's bootstrap port %s", errBadRequest, t.Port, portOf(s.boot.addr)))
			}
			if h := hostOf(s.boot.addr); t.Host != h && !(t.Host == "localhost" && h == "127.0.0.1") {
				return badRequest(fmt.Errorf("%w: bootstrap_host %q does not match this prefill server's bootstrap host %q", errBadRequest, t.Host, h))
			}
		}
	case engines.TRTLLM:
		if isNull(req.DisaggregatedParams) {
			return nil
		}
		job.rec.DisaggregatedParams = append(json.RawMessage(nil), req.DisaggregatedParams...)
		var p trtDisaggParams
		if err := json.Unmarshal(req.DisaggregatedParams, &p); err != nil {
			return badRequest(fmt.Errorf("%w: disaggregated_params: %v", errBadRequest, err))
		}
		switch p.RequestType {
		case "context_only":
			// The context phase produces exactly the first token.
			job.max = 1
			job.stream = false
		case "generation_only":
			if p.EncodedOpaqueState == nil {
				return badRequest(fmt.Errorf("%w: disaggregated_params: generation_only requires encoded_opaque_state", errBadRequest))
			}
			raw, err := base64.StdEncoding.DecodeString(*p.EncodedOpaqueState)
			var st trtOpaqueState
			if err == nil {
				err = json.Unmarshal(raw, &st)
			}
			if err != nil {
				return badRequest(fmt.Errorf("%w: disaggregated_params: encoded_opaque_state is not a context state: %v", errBadRequest, err))
			}
			if st.PromptTokens != len(job.prompt) {
				return badRequest(fmt.Errorf("%w: disaggregated_params: context state covers %d prompt tokens, request has %d", errBadRequest, st.PromptTokens, len(job.prompt)))
			}
			job.remoteTokens = len(job.prompt) - 1
			job.rec.RemotePrefillTokens = job.remoteTokens
		default:
			return badRequest(fmt.Errorf("%w: disaggregated_params: unknown request_type %q", errBadRequest, p.RequestType))
		}
		job.pd.trtIn = &p
	}
	return nil
}

// parseTriple reads SGLang's bootstrap fields; all three must be present
// (bootstrap_port may be null: SGLang then uses its default 8998).
func parseTriple(req *genRequest) (*BootstrapTriple, error) {
	var t BootstrapTriple
	if isNull(req.BootstrapHost) || isNull(req.BootstrapRoom) {
		return nil, fmt.Errorf("%w: bootstrap_host and bootstrap_room must be given together", errBadRequest)
	}
	if err := json.Unmarshal(req.BootstrapHost, &t.Host); err != nil {
		return nil, fmt.Errorf("%w: bootstrap_host: expected a string", errBadRequest)
	}
	t.Port = 8998
	if !isNull(req.BootstrapPort) {
		if err := json.Unmarshal(req.BootstrapPort, &t.Port); err != nil {
			return nil, fmt.Errorf("%w: bootstrap_port: expected an integer", errBadRequest)
		}
	}
	var room json.Number
	if err := json.Unmarshal(req.BootstrapRoom, &room); err != nil {
		return nil, fmt.Errorf("%w: bootstrap_room: expected an integer", errBadRequest)
	}
	r, err := strconv.ParseUint(room.String(), 10, 64)
	if err != nil || r > math.MaxInt64 {
		return nil, fmt.Errorf("%w: bootstrap_room %s out of range [0, 2^63)", errBadRequest, room)
	}
	t.Room = r
	return &t, nil
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
	switch {
	case job.pd.boot != nil && s.cfg.Role == RolePrefill && s.boot != nil:
		s.boot.transferDone(job.pd.boot.Room, out.promptTokens)
	case job.pd.kvIn != nil && job.pd.kvIn.DoRemoteDecode:
		// NixlConnector hands the blocks over only when the prefill stopped
		// on its length cap (max_tokens=1), not on EOS.
		if out.finish != "length" {
			return nil
		}
		ids := out.blockIDs
		if ids == nil {
			ids = []int64{}
		}
		host := hostOf(s.addrs.HTTP)
		port, _ := strconv.Atoi(portOf(s.addrs.HTTP))
		w := &jw{}
		w.obj().kbool("do_remote_prefill", true).kbool("do_remote_decode", false).key("remote_block_ids").arr()
		for _, id := range ids {
			w.int(id)
		}
		w.aend().kstr("remote_engine_id", s.engineID).kstr("remote_host", host).kint("remote_port", int64(port)).
			kstr("remote_request_id", job.requestID).kint("remote_num_tokens", int64(out.promptTokens)).kint("tp_size", 1).end()
		job.pd.kvParamsOut = w.b
		job.rec.KVTransferParamsOut = append(json.RawMessage(nil), w.b...)
	case job.pd.trtIn != nil && job.pd.trtIn.RequestType == "context_only":
		ctxID := int64(s.trtCtxSeq.Add(1))
		st := trtOpaqueState{Engine: s.engineID, CtxRequestID: ctxID, DisaggRequestID: job.pd.trtIn.DisaggRequestID, PromptTokens: out.promptTokens}
		opaque := base64.StdEncoding.EncodeToString(mustJSON(st))
		w := &jw{}
		w.obj().kstr("request_type", "context_only").key("first_gen_tokens").ints(out.ids[:min(1, len(out.ids))]).
			kint("ctx_request_id", ctxID).kstr("encoded_opaque_state", opaque).knull("draft_tokens")
		if d := job.pd.trtIn.DisaggRequestID; d != nil {
			w.kint("disagg_request_id", *d)
		}
		w.end()
		job.pd.trtParamsOut = w.b
	}
	return nil
}
