package sim

import (
	"encoding/json"
	"fmt"
	"strings"

	"github.com/valyala/fasthttp"

	"github.com/llmgw/llmgw/engines"
	"github.com/llmgw/llmgw/engines/sglang"
	"github.com/llmgw/llmgw/engines/trtllm"
)

func (s *Sim) routeVLLM(ctx *fasthttp.RequestCtx, path string) {
	switch path {
	case "/v1/chat/completions":
		s.onlyPost(ctx, func() { s.serveGen(ctx, apiChat) })
	case "/v1/completions":
		s.onlyPost(ctx, func() { s.serveGen(ctx, apiCompletion) })
	case "/v1/embeddings":
		s.onlyPost(ctx, func() { s.serveEmbeddingsVLLM(ctx) })
	case "/v1/responses":
		s.onlyPost(ctx, func() { s.serveResponsesVLLM(ctx) })
	case "/v1/models":
		s.onlyGet(ctx, func() { s.serveModels(ctx, "vllm") })
	case "/health":
		s.onlyGet(ctx, func() { s.healthEmpty(ctx) })
	case "/tokenize":
		s.onlyPost(ctx, func() { s.serveTokenizeVLLM(ctx) })
	case "/detokenize":
		s.onlyPost(ctx, func() { s.serveDetokenize(ctx, "prompt") })
	case "/metrics":
		s.onlyGet(ctx, func() { s.serveMetrics(ctx) })
	case "/reset_prefix_cache":
		s.onlyPost(ctx, func() { s.resetCache(); ctx.SetStatusCode(fasthttp.StatusOK) })
	case "/version":
		s.onlyGet(ctx, func() { s.serveVersion(ctx) })
	default:
		s.notFound(ctx)
	}
}

func (s *Sim) routeSGLang(ctx *fasthttp.RequestCtx, path string) {
	switch path {
	case "/v1/chat/completions":
		s.onlyPost(ctx, func() { s.serveGen(ctx, apiChat) })
	case "/v1/completions":
		s.onlyPost(ctx, func() { s.serveGen(ctx, apiCompletion) })
	case "/generate":
		s.onlyPost(ctx, func() { s.serveGen(ctx, apiGenerate) })
	case "/v1/models":
		s.onlyGet(ctx, func() { s.serveModels(ctx, "sglang") })
	case "/health", "/health_generate":
		s.onlyGet(ctx, func() { s.healthEmpty(ctx) })
	case "/get_model_info", "/model_info":
		s.onlyGet(ctx, func() {
			w := &jw{}
			w.obj().kstr("model_path", s.cfg.Model).kstr("tokenizer_path", s.cfg.Model).kbool("is_generation", true).
				knull("preferred_sampling_params").kstr("weight_version", "default").end()
			ctx.SetContentType("application/json")
			ctx.SetBody(w.b)
		})
	case "/get_server_info", "/server_info":
		s.onlyGet(ctx, func() {
			w := &jw{}
			w.obj().kstr("model_path", s.cfg.Model).kint("page_size", int64(s.cfg.BlockSize)).
				kstr("disaggregation_mode", sglangMode(s.cfg.Role))
			if s.boot != nil {
				port := portOf(s.boot.addr)
				w.key(sglang.ServerInfoBootstrapPort).raw([]byte(port))
			}
			if s.addrs.Events != "" {
				kv := mustJSON(map[string]string{"publisher": "zmq", "endpoint": s.addrs.Events, "replay_endpoint": s.addrs.Replay})
				w.kstr("kv_events_config", string(kv))
			} else {
				w.knull("kv_events_config")
			}
			w.kint("max_total_num_tokens", int64(s.cfg.CacheBlocks*s.cfg.BlockSize)).
				kint("context_length", maxModelLen).key("internal_states").arr().obj().
				kint("max_total_num_tokens", int64(s.cfg.CacheBlocks*s.cfg.BlockSize)).end().aend().
				kstr("version", s.version).end()
			ctx.SetContentType("application/json")
			ctx.SetBody(w.b)
		})
	case "/metrics":
		s.onlyGet(ctx, func() { s.serveMetrics(ctx) })
	case "/v1/tokenize", "/tokenize":
		s.onlyPost(ctx, func() { s.serveTokenizeSGLang(ctx) })
	case "/flush_cache":
		// SGLang routes GET and POST here and answers plain text without a
		// media type (http_server.py flush_cache).
		if !ctx.IsGet() && !ctx.IsPost() {
			s.methodNotAllowed(ctx)
			return
		}
		s.resetCache()
		ctx.SetBodyString("Cache flushed.\nPlease check backend logs for more details. (When there are running or waiting requests, the operation will not be performed.)\n")
	default:
		s.notFound(ctx)
	}
}

func sglangMode(role string) string {
	if role == RoleBoth {
		return "null"
	}
	return role
}

func (s *Sim) routeTRT(ctx *fasthttp.RequestCtx, path string) {
	switch path {
	case "/v1/chat/completions":
		s.onlyPost(ctx, func() { s.serveGen(ctx, apiChat) })
	case "/v1/completions":
		s.onlyPost(ctx, func() { s.serveGen(ctx, apiCompletion) })
	case "/v1/models":
		s.onlyGet(ctx, func() { s.serveModels(ctx, "tensorrt_llm") })
	case "/health":
		s.onlyGet(ctx, func() {
			if s.faults.healthFail() {
				ctx.SetStatusCode(fasthttp.StatusServiceUnavailable)
				ctx.SetBodyString("LLM is unavailable. Please check the server logs for more details.")
				return
			}
			ctx.SetStatusCode(fasthttp.StatusOK)
		})
	case "/health_generate":
		s.onlyGet(ctx, func() {
			if s.faults.healthFail() {
				ctx.SetStatusCode(fasthttp.StatusInternalServerError)
				ctx.SetBodyString("Generation health check failed.")
				return
			}
			ctx.SetBodyString("Generation health check OK")
		})
	case "/server_info":
		s.onlyGet(ctx, func() {
			w := &jw{}
			w.obj().kstr("model", s.cfg.Model).kint("tokens_per_block", int64(s.cfg.BlockSize)).
				kstr("kv_cache_hash_algo", trtllm.ReportedHashAlgo).kstr("disaggregated_role", trtRole(s.cfg.Role)).end()
			ctx.SetContentType("application/json")
			ctx.SetBody(w.b)
		})
	case "/prometheus/metrics":
		s.onlyGet(ctx, func() { s.serveMetrics(ctx) })
	case "/metrics":
		// trtllm-serve's /metrics is a drained JSON array of iteration stats.
		s.onlyGet(ctx, func() { ctx.SetContentType("application/json"); ctx.SetBodyString("[]") })
	case "/kv_cache_events":
		s.onlyPost(ctx, func() {
			ctx.SetContentType("application/json")
			ctx.SetBody(s.trt.drain())
		})
	case "/version":
		s.onlyGet(ctx, func() { s.serveVersion(ctx) })
	default:
		s.notFound(ctx)
	}
}

func trtRole(role string) string {
	switch role {
	case RolePrefill:
		return "context"
	case RoleDecode:
		return "generation"
	}
	return "converged"
}

func (s *Sim) onlyPost(ctx *fasthttp.RequestCtx, fn func()) {
	if !ctx.IsPost() {
		s.methodNotAllowed(ctx)
		return
	}
	fn()
}

func (s *Sim) onlyGet(ctx *fasthttp.RequestCtx, fn func()) {
	if !ctx.IsGet() && !ctx.IsHead() {
		s.methodNotAllowed(ctx)
		return
	}
	fn()
}

// healthEmpty is vLLM's and SGLang's health: 200 with an empty body, 503
// (empty) when unhealthy.
func (s *Sim) healthEmpty(ctx *fasthttp.RequestCtx) {
	if s.faults.healthFail() {
		ctx.SetStatusCode(fasthttp.StatusServiceUnavailable)
		return
	}
	ctx.SetStatusCode(fasthttp.StatusOK)
}

func (s *Sim) serveMetrics(ctx *fasthttp.RequestCtx) {
	body, err := s.renderMetrics()
	if err != nil {
		s.writeError(ctx, nil, fasthttp.StatusInternalServerError, err.Error(), false)
		return
	}
	ctx.SetContentType("text/plain; version=0.0.4; charset=utf-8")
	ctx.SetBody(body)
}

func (s *Sim) serveModels(ctx *fasthttp.RequestCtx, owner string) {
	w := &jw{}
	created := s.created()
	w.obj().kstr("object", "list").key("data").arr().obj().kstr("id", s.cfg.Model).kstr("object", "model").
		kint("created", created).kstr("owned_by", owner)
	switch s.cfg.Engine {
	case engines.VLLM:
		w.kstr("root", s.cfg.Model).knull("parent").kint("max_model_len", maxModelLen).key("permission").arr().obj().
			kstr("id", fmt.Sprintf("modelperm-%016x", splitmix64(uint64(s.cfg.Seed)))).kstr("object", "model_permission").kint("created", created).
			kbool("allow_create_engine", false).kbool("allow_sampling", true).kbool("allow_logprobs", true).
			kbool("allow_search_indices", false).kbool("allow_view", true).kbool("allow_fine_tuning", false).
			kstr("organization", "*").knull("group").kbool("is_blocking", false).end().aend()
	case engines.SGLang:
		w.kstr("root", s.cfg.Model).knull("parent").kint("max_model_len", maxModelLen)
	}
	w.end().aend().end()
	ctx.SetContentType("application/json")
	ctx.SetBody(w.b)
}

// serveTokenizeVLLM is vLLM's POST /tokenize, prompt or chat form.
func (s *Sim) serveTokenizeVLLM(ctx *fasthttp.RequestCtx) {
	var req struct {
		Model                *string         `json:"model"`
		Prompt               *string         `json:"prompt"`
		Messages             json.RawMessage `json:"messages"`
		Tools                json.RawMessage `json:"tools"`
		ChatTemplateKwargs   json.RawMessage `json:"chat_template_kwargs"`
		AddGenerationPrompt  *bool           `json:"add_generation_prompt"`
		ContinueFinalMessage bool            `json:"continue_final_message"`
		AddSpecialTokens     *bool           `json:"add_special_tokens"`
		ReturnTokenStrs      bool            `json:"return_token_strs"`
	}
	if err := json.Unmarshal(ctx.PostBody(), &req); err != nil {
		s.writeError(ctx, nil, fasthttp.StatusBadRequest, "JSON decode error: "+err.Error(), true)
		return
	}
	if req.Model != nil && *req.Model != s.cfg.Model {
		s.writeError(ctx, nil, fasthttp.StatusNotFound, "The model `"+*req.Model+"` does not exist.", false)
		return
	}
	var ids []uint32
	switch {
	case req.Prompt != nil:
		addSpecial := req.AddSpecialTokens == nil || *req.AddSpecialTokens
		if addSpecial {
			ids = append(ids, s.bos...)
		}
		ids = s.tok.Encode(ids, *req.Prompt)
	case !isNull(req.Messages):
		agp := req.AddGenerationPrompt == nil || *req.AddGenerationPrompt
		if agp && req.ContinueFinalMessage {
			s.writeError(ctx, nil, fasthttp.StatusBadRequest, "Cannot set both `continue_final_message` and `add_generation_prompt` to True.", true)
			return
		}
		msgs, err := parseMessages(req.Messages)
		if err != nil {
			s.writeError(ctx, nil, fasthttp.StatusBadRequest, s.messageFor(err), true)
			return
		}
		text, err := s.renderChat(msgs, agp, req.Tools, req.ChatTemplateKwargs)
		if err != nil {
			s.writeError(ctx, nil, fasthttp.StatusBadRequest, "chat template: "+err.Error(), true)
			return
		}
		if req.ContinueFinalMessage {
			text = strings.TrimSuffix(text, "<|im_end|>\n")
		}
		ids = s.tok.Encode(ids, text)
	default:
		s.writeError(ctx, nil, fasthttp.StatusBadRequest, "Either `prompt` or `messages` is required.", true)
		return
	}
	w := &jw{}
	w.obj().kint("count", int64(len(ids))).kint("max_model_len", maxModelLen).key("tokens").ints(ids)
	if req.ReturnTokenStrs {
		w.key("token_strs").arr()
		for _, id := range ids {
			w.str(s.tok.Decode([]uint32{id}))
		}
		w.aend()
	} else {
		w.knull("token_strs")
	}
	w.end()
	ctx.SetContentType("application/json")
	ctx.SetBody(w.b)
}

// serveVersion answers GET /version (vLLM, TensorRT-LLM): {"version": ...}.
func (s *Sim) serveVersion(ctx *fasthttp.RequestCtx) {
	w := &jw{}
	w.obj().kstr("version", s.version).end()
	ctx.SetContentType("application/json")
	ctx.SetBody(w.b)
}

// serveTokenizeSGLang is SGLang's POST /v1/tokenize (and /tokenize):
// exactly one of prompt (a string) or messages; the answer is
// {"tokens","count","max_model_len"} (openai/protocol.py TokenizeResponse).
// A list of prompts (batched form) is not simulated.
func (s *Sim) serveTokenizeSGLang(ctx *fasthttp.RequestCtx) {
	var req struct {
		Prompt           *string         `json:"prompt"`
		Messages         json.RawMessage `json:"messages"`
		AddSpecialTokens *bool           `json:"add_special_tokens"`
	}
	if err := json.Unmarshal(ctx.PostBody(), &req); err != nil {
		s.writeError(ctx, nil, fasthttp.StatusBadRequest, "JSON decode error: "+err.Error(), true)
		return
	}
	if (req.Prompt == nil) == isNull(req.Messages) {
		s.writeError(ctx, nil, fasthttp.StatusBadRequest, "Exactly one of 'prompt' or 'messages' must be provided.", true)
		return
	}
	var ids []uint32
	if req.Prompt != nil {
		if req.AddSpecialTokens == nil || *req.AddSpecialTokens {
			ids = append(ids, s.bos...)
		}
		ids = s.tok.Encode(ids, *req.Prompt)
	} else {
		msgs, err := parseMessages(req.Messages)
		if err != nil {
			s.writeError(ctx, nil, fasthttp.StatusBadRequest, s.messageFor(err), true)
			return
		}
		text, err := s.render.Render(msgs, true)
		if err != nil {
			s.writeError(ctx, nil, fasthttp.StatusBadRequest, "chat template: "+err.Error(), false)
			return
		}
		ids = s.tok.Encode(ids, text)
	}
	w := &jw{}
	w.obj().key("tokens").ints(ids).kint("count", int64(len(ids))).kint("max_model_len", maxModelLen).end()
	ctx.SetContentType("application/json")
	ctx.SetBody(w.b)
}

// serveDetokenize answers {"tokens":[...]} with {key: text}.
func (s *Sim) serveDetokenize(ctx *fasthttp.RequestCtx, key string) {
	var req struct {
		Tokens []uint32 `json:"tokens"`
	}
	if err := json.Unmarshal(ctx.PostBody(), &req); err != nil {
		s.writeError(ctx, nil, fasthttp.StatusBadRequest, "JSON decode error: "+err.Error(), true)
		return
	}
	w := &jw{}
	w.obj().kstr(key, s.tok.Decode(req.Tokens)).end()
	ctx.SetContentType("application/json")
	ctx.SetBody(w.b)
}
