package sim

import (
	"encoding/json"
	"fmt"

	"github.com/valyala/fasthttp"

	"github.com/llmgw/llmgw/engines"
	"github.com/llmgw/llmgw/engines/tokenizer"
	"github.com/llmgw/llmgw/engines/trtllm"
)

// trtKnownFields are the top-level request fields trtllm-serve's pydantic
// models accept (extra="forbid"); any other field is a 400 naming it, so
// another engine's leaked hand-off field fails loudly. The hand-off field
// itself is added from engines/trtllm.
var trtKnownFields = map[string]bool{
	trtllm.Field: true,
	"model":      true, "messages": true, "prompt": true, "max_tokens": true, "max_completion_tokens": true,
	"stream": true, "stream_options": true, "user": true, "metadata": true, "temperature": true, "top_p": true,
	"top_k": true, "n": true, "stop": true, "seed": true, "frequency_penalty": true, "presence_penalty": true,
	"logprobs": true, "top_logprobs": true, "echo": true, "ignore_eos": true, "min_tokens": true,
	"prompt_token_ids": true, "tools": true, "tool_choice": true,
	"response_format": true, "add_generation_prompt": true, "chat_template_kwargs": true, "lora_request": true,
	"best_of": true, "logit_bias": true, "suffix": true, "repetition_penalty": true, "length_penalty": true,
	"skip_special_tokens": true, "spaces_between_special_tokens": true, "return_context_logits": true,
	"return_generation_logits": true, "parallel_tool_calls": true, "reasoning_effort": true,
}

// buildJob tokenizes the request and validates it the way the persona does.
func (s *Sim) buildJob(ctx *fasthttp.RequestCtx, api apiKind, req *genRequest, rec *Receipt) (*genJob, *reqError) {
	job := &genJob{api: api, req: req, requestID: rec.RequestID, max: req.maxTokens(), stream: req.stream()}
	if s.cfg.Engine == engines.TRTLLM {
		var fields map[string]json.RawMessage
		if err := json.Unmarshal(ctx.PostBody(), &fields); err != nil {
			return nil, badRequest(fmt.Errorf("%w: %v", errBadRequest, err))
		}
		for k := range fields {
			if !trtKnownFields[k] {
				return nil, badRequest(fmt.Errorf("%w: 1 validation error for request: %s: Extra inputs are not permitted", errBadRequest, k))
			}
		}
	}
	if (api == apiChat || api == apiCompletion) && s.cfg.Engine == engines.VLLM && req.Model != "" && req.Model != s.cfg.Model {
		msg := fmt.Sprintf("The model `%s` does not exist.", req.Model)
		return nil, &reqError{status: fasthttp.StatusNotFound, err: fmt.Errorf("%w: %s", errUnknownModel, req.Model), msg: msg}
	}
	explicit := req.MaxTokens != nil || req.MaxCompletionTokens != nil ||
		(req.SamplingParams != nil && req.SamplingParams.MaxNewTokens != nil)
	switch {
	case s.cfg.Engine == engines.LlamaCpp:
		// n_predict wins over max_tokens (case n_predict_wins). llama-server
		// samples one token before it checks the budget: 0 gives 1 token,
		// finish "length" (case max_tokens_0); a negative budget is
		// unlimited.
		if req.NPredict != nil {
			job.max, explicit = max(*req.NPredict, -1), true
		}
		if job.max < -1 {
			job.max = -1
		}
		if explicit && job.max == 0 {
			job.max = 1
		}
	case explicit && job.max < 1 && !(api == apiGenerate && job.max == 0):
		return nil, engineBadRequest("max_tokens must be at least 1, got %d.", job.max)
	}
	var err error
	switch {
	case len(req.PromptTokenIDs) > 0 && s.cfg.Engine == engines.TRTLLM:
		// A TensorRT-LLM generation_only request carries the context
		// server's prompt token ids.
		job.prompt = append([]uint32(nil), req.PromptTokenIDs...)
	case api == apiChat:
		var msgs []tokenizer.Message
		var perr error
		if s.cfg.Engine == engines.LlamaCpp {
			msgs = llamaMessages(req.Messages) // checked by llamaValidate
		} else {
			msgs, perr = parseMessages(req.Messages)
		}
		if perr != nil {
			return nil, badRequest(perr)
		}
		text, rerr := s.renderChat(msgs, true, req.Tools, req.ChatTemplateKwargs)
		if rerr != nil {
			return nil, badRequest(fmt.Errorf("%w: chat template: %v", errBadRequest, rerr))
		}
		// No BOS from the tokenizer: vLLM encodes a rendered chat prompt
		// with add_special_tokens=False (a BOS comes from the template).
		job.prompt = s.tok.Encode(nil, text)
	case api == apiGenerate:
		switch {
		case len(req.InputIDs) > 0:
			job.prompt = append([]uint32(nil), req.InputIDs...)
		case !isNull(req.Text):
			var p promptInput
			if p, err = parsePrompt(req.Text, "text"); err != nil {
				return nil, badRequest(err)
			}
			job.prompt = s.promptTokens(p)
		default:
			return nil, engineBadRequest("Either text, input_ids or input_embeds should be provided.")
		}
	default: // completions, llama.cpp /completion
		p, perr := parsePrompt(req.Prompt, "prompt")
		if perr != nil {
			return nil, badRequest(perr)
		}
		job.prompt = s.promptTokens(p)
	}
	// llama-server accepts an empty prompt (its BOS alone).
	if len(job.prompt) == 0 && s.cfg.Engine != engines.LlamaCpp {
		return nil, badRequest(fmt.Errorf("%w: the prompt is empty", errBadRequest))
	}
	if s.cfg.Engine == engines.LlamaCpp {
		s.llamaTruncate(job)
	} else if len(job.prompt) >= maxModelLen {
		return nil, engineBadRequest("This model's maximum context length is %d tokens. However, your request has %d input tokens. Please reduce the length of the input messages.", maxModelLen, len(job.prompt))
	}
	job.rec = *rec
	if rerr := s.parsePD(job, ctx.PostBody()); rerr != nil {
		*rec = job.rec
		return nil, rerr
	}
	return job, nil
}

// promptTokens tokenizes a completions prompt; text gets the model's BOS
// when its config asks for one, token ids are used as given.
func (s *Sim) promptTokens(p promptInput) []uint32 {
	if !p.isText {
		return append([]uint32(nil), p.ids...)
	}
	return s.tok.Encode(append([]uint32(nil), s.bos...), p.text)
}

// includeUsage reports whether a stream ends with a usage chunk. vLLM's
// StreamOptions defaults include_usage to true once stream_options is
// present at all, and TensorRT-LLM copied that model; SGLang and llama.cpp
// follow OpenAI (false unless set). See the chat_stream_options_empty
// fixtures under engines/<engine>/testdata/cases.
func (s *Sim) includeUsage(req *genRequest) bool {
	so := req.StreamOptions
	if so == nil {
		return false
	}
	if so.IncludeUsage == nil {
		return s.cfg.Engine == engines.VLLM || s.cfg.Engine == engines.TRTLLM
	}
	return *so.IncludeUsage
}
