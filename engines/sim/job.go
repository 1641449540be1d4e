package sim

import (
	"encoding/json"
	"fmt"

	"github.com/valyala/fasthttp"

	"github.com/llmgw/llmgw/engines"
)

// trtKnownFields are the top-level request fields trtllm-serve's pydantic
// models accept (extra="forbid"); any other field is a 400 naming it, so a
// leaked kv_transfer_params or bootstrap field fails loudly.
var trtKnownFields = map[string]bool{
	"model": true, "messages": true, "prompt": true, "max_tokens": true, "max_completion_tokens": true,
	"stream": true, "stream_options": true, "user": true, "metadata": true, "temperature": true, "top_p": true,
	"top_k": true, "n": true, "stop": true, "seed": true, "frequency_penalty": true, "presence_penalty": true,
	"logprobs": true, "top_logprobs": true, "echo": true, "ignore_eos": true, "min_tokens": true,
	"disaggregated_params": true, "prompt_token_ids": true, "tools": true, "tool_choice": true,
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
	if explicit && job.max < 1 && !(api == apiGenerate && job.max == 0) {
		return nil, engineBadRequest("max_tokens must be at least 1, got %d.", job.max)
	}
	var err error
	switch {
	case len(req.PromptTokenIDs) > 0 && s.cfg.Engine == engines.TRTLLM:
		// A TensorRT-LLM generation_only request carries the context
		// server's prompt token ids.
		job.prompt = append([]uint32(nil), req.PromptTokenIDs...)
	case api == apiChat:
		msgs, perr := parseMessages(req.Messages)
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
	if len(job.prompt) == 0 {
		return nil, badRequest(fmt.Errorf("%w: the prompt is empty", errBadRequest))
	}
	if len(job.prompt) >= maxModelLen {
		if s.cfg.Engine == engines.LlamaCpp {
			return nil, badRequest(fmt.Errorf("%w: the request exceeds the available context size, try increasing it", errBadRequest))
		}
		return nil, engineBadRequest("This model's maximum context length is %d tokens. However, your request has %d input tokens. Please reduce the length of the input messages.", maxModelLen, len(job.prompt))
	}
	job.rec = *rec
	if rerr := s.parsePD(job); rerr != nil {
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
// present at all; the other engines follow OpenAI (false unless set).
func (s *Sim) includeUsage(req *genRequest) bool {
	so := req.StreamOptions
	if so == nil {
		return false
	}
	if so.IncludeUsage == nil {
		return s.cfg.Engine == engines.VLLM
	}
	return *so.IncludeUsage
}
