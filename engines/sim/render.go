package sim

import (
	"strings"

	"github.com/llmgw/llmgw/engines"
)

// sseChunk is one SSE event of a stream; token chunks carry a generated
// token and are paced by the decode cost.
type sseChunk struct {
	data  []byte
	token bool
}

// responseID returns the completion id: vLLM and TensorRT-LLM prefix the
// request id ("chatcmpl-" / "cmpl-"), SGLang uses the bare id, llama.cpp
// "chatcmpl-" for both OpenAI families.
func (s *Sim) responseID(job *genJob) string {
	switch {
	case s.cfg.Engine == engines.SGLang:
		return job.requestID
	case job.api == apiChat || s.cfg.Engine == engines.LlamaCpp:
		return "chatcmpl-" + job.requestID
	default:
		return "cmpl-" + job.requestID
	}
}

func (s *Sim) created() int64 { return s.cfg.Clock().Unix() }

// usage writes the usage object.
func (s *Sim) usage(w *jw, out *genOutcome, completion int) {
	w.key("usage").obj()
	w.kint("prompt_tokens", int64(out.promptTokens)).kint("total_tokens", int64(out.promptTokens+completion)).kint("completion_tokens", int64(completion))
	w.key("prompt_tokens_details").obj().kint("cached_tokens", int64(out.cachedTokens)).end()
	w.end()
}

// renderFull renders a non-streaming response body.
func (s *Sim) renderFull(job *genJob, out *genOutcome) []byte {
	if s.cfg.Engine == engines.LlamaCpp {
		return s.renderLlamaFull(job, out)
	}
	text := strings.Join(out.pieces, "")
	w := &jw{b: make([]byte, 0, 512+len(text))}
	if job.api == apiGenerate {
		s.renderGenerate(w, job, out, text, out.ids, true)
		return w.b
	}
	// Field sets and order follow each engine's response models (cited in
	// engines/<engine>/testdata/cases/chat_json.json and completion_json.json):
	// vLLM and TensorRT-LLM dump every field (nulls included), SGLang drops
	// a few None fields in model serializers.
	w.obj().kstr("id", s.responseID(job))
	if job.api == apiChat {
		w.kstr("object", "chat.completion")
	} else {
		w.kstr("object", "text_completion")
	}
	w.kint("created", s.created()).kstr("model", s.cfg.Model)
	w.key("choices").arr().obj().kint("index", 0)
	if job.api == apiChat {
		w.key("message").obj().kstr("role", "assistant").kstr("content", text)
		switch s.cfg.Engine {
		case engines.VLLM:
			// ChatMessage: an empty tool_calls list is dropped by its
			// serializer; reasoning (formerly reasoning_content).
			w.knull("refusal").knull("annotations").knull("audio").knull("function_call").knull("reasoning")
		case engines.SGLang:
			w.knull("reasoning_content").knull("tool_calls")
		case engines.TRTLLM:
			// Without a reasoning parser the reasoning text is "".
			w.kstr("reasoning_content", "").key("tool_calls").arr().aend()
		}
		w.end()
		w.knull("logprobs").kstr("finish_reason", out.finish)
	} else {
		w.kstr("text", text)
		if s.cfg.Engine == engines.TRTLLM {
			w.knull("token_ids").knull("logprobs").knull("context_logits")
		} else {
			w.knull("logprobs")
		}
		w.kstr("finish_reason", out.finish)
	}
	switch s.cfg.Engine {
	case engines.VLLM:
		w.knull("stop_reason").knull("token_ids")
		if job.api == apiCompletion {
			w.knull("prompt_logprobs").knull("prompt_token_ids")
		}
	case engines.SGLang:
		w.knull("matched_stop")
	case engines.TRTLLM:
		w.knull("stop_reason")
		if p := job.pd.trtParamsOut; p != nil {
			w.key("disaggregated_params").raw(p)
		} else {
			w.knull("disaggregated_params")
		}
		w.knull("avg_decoded_tokens_per_iter")
	}
	w.end().aend()
	if s.cfg.Engine == engines.VLLM {
		w.knull("service_tier").knull("system_fingerprint")
	}
	s.usage(w, out, out.completionTokens)
	switch s.cfg.Engine {
	case engines.VLLM:
		if job.api == apiChat {
			w.knull("prompt_logprobs").knull("prompt_token_ids")
		}
		if p := job.pd.kvParamsOut; p != nil {
			w.key("kv_transfer_params").raw(p)
		} else {
			w.knull("kv_transfer_params")
		}
	case engines.SGLang:
		w.key("metadata").obj().kstr("weight_version", "default").end()
	case engines.TRTLLM:
		if job.pd.trtParamsOut != nil {
			w.key("prompt_token_ids").ints(job.prompt)
		} else {
			w.knull("prompt_token_ids")
		}
	}
	w.end()
	return w.b
}

// renderChunks renders every SSE event of a streaming response, in order.
func (s *Sim) renderChunks(job *genJob, out *genOutcome) []sseChunk {
	if s.cfg.Engine == engines.LlamaCpp {
		return s.renderLlamaChunks(job, out)
	}
	chunks := make([]sseChunk, 0, len(out.pieces)+4)
	add := func(w *jw, token bool) {
		b := make([]byte, 0, len(w.b)+8)
		b = append(b, "data: "...)
		b = append(b, w.b...)
		b = append(b, "\n\n"...)
		chunks = append(chunks, sseChunk{data: b, token: token})
	}
	switch {
	case job.api == apiGenerate:
		// SGLang native streams cumulative text and output ids.
		var text strings.Builder
		for i, p := range out.pieces {
			text.WriteString(p)
			w := &jw{}
			last := i == len(out.pieces)-1
			s.renderGenerate(w, job, out, text.String(), out.ids[:min(i+1, len(out.ids))], last)
			add(w, true)
		}
		chunks = append(chunks, sseChunk{data: []byte("data: [DONE]\n\n")})
		return chunks
	}
	if s.cfg.Engine != engines.LlamaCpp {
		return s.renderOpenAIChunks(job, out, chunks)
	}
	id, created := s.responseID(job), s.created()
	head := func(w *jw) {
		w.kstr("id", id)
		if job.api == apiChat {
			w.kstr("object", "chat.completion.chunk")
		} else {
			w.kstr("object", "text_completion")
		}
		w.kint("created", created).kstr("model", s.cfg.Model)
	}
	usage := s.includeUsage(job.req)
	continuous := usage && job.req.StreamOptions != nil && job.req.StreamOptions.ContinuousUsageStats && s.cfg.Engine == engines.VLLM
	choice := func(w *jw, content string, role bool, finish string) {
		w.key("choices").arr().obj()
		w.kint("index", 0)
		if job.api == apiChat {
			w.key("delta").obj()
			if role {
				w.kstr("role", "assistant").kstr("content", "")
			} else {
				w.kstr("content", content)
			}
			w.end()
			w.knull("logprobs")
		} else {
			w.kstr("text", content).knull("logprobs")
		}
		if finish != "" {
			w.kstr("finish_reason", finish)
		} else {
			w.knull("finish_reason")
		}
		switch {
		case s.cfg.Engine == engines.VLLM && (finish != "" || job.api == apiCompletion):
			w.knull("stop_reason")
		case s.cfg.Engine == engines.SGLang && finish != "":
			w.knull("matched_stop")
		}
		w.end().aend()
	}
	if job.api == apiChat {
		w := &jw{}
		w.obj()
		head(w)
		choice(w, "", true, "")
		if continuous {
			s.usage(w, out, 0)
		}
		w.end()
		add(w, false)
	}
	for i, p := range out.pieces {
		finish := ""
		if i == len(out.pieces)-1 {
			finish = out.finish
		}
		w := &jw{}
		w.obj()
		head(w)
		choice(w, p, false, finish)
		if continuous {
			s.usage(w, out, i+1)
		}
		w.end()
		add(w, true)
	}
	if usage {
		w := &jw{}
		w.obj()
		head(w)
		w.key("choices").arr().aend()
		s.usage(w, out, out.completionTokens)
		w.end()
		add(w, false)
	}
	chunks = append(chunks, sseChunk{data: []byte("data: [DONE]\n\n")})
	return chunks
}

// renderGenerate writes a SGLang /generate response object.
func (s *Sim) renderGenerate(w *jw, job *genJob, out *genOutcome, text string, ids []uint32, final bool) {
	w.obj().kstr("text", text).key("output_ids").ints(ids)
	w.key("meta_info").obj().kstr("id", job.requestID)
	if final {
		w.key("finish_reason").obj().kstr("type", out.finish)
		if out.finish == "length" {
			w.kint("length", int64(out.completionTokens))
		} else {
			w.kint("matched", int64(sglangEOS))
		}
		w.end()
	} else {
		w.knull("finish_reason")
	}
	w.kint("prompt_tokens", int64(out.promptTokens)).kstr("weight_version", "default").
		kint("completion_tokens", int64(len(ids))).kint("cached_tokens", int64(out.cachedTokens)).
		key("e2e_latency").float(0)
	w.end().end()
}

// sglangEOS is the EOS id SGLang reports as the matched stop (Qwen's
// <|im_end|>).
const sglangEOS = 151645
