package sim

import (
	"strings"

	"github.com/llmgw/llmgw/engines"
	"github.com/llmgw/llmgw/engines/trtllm"
	"github.com/llmgw/llmgw/engines/vllm"
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
	if s.cfg.Engine == engines.LlamaCpp {
		w.kint("completion_tokens", int64(completion)).kint("prompt_tokens", int64(out.promptTokens)).kint("total_tokens", int64(out.promptTokens+completion))
	} else {
		w.kint("prompt_tokens", int64(out.promptTokens)).kint("total_tokens", int64(out.promptTokens+completion)).kint("completion_tokens", int64(completion))
	}
	w.key("prompt_tokens_details").obj().kint("cached_tokens", int64(out.cachedTokens)).end()
	w.end()
}

// renderFull renders a non-streaming response body.
func (s *Sim) renderFull(job *genJob, out *genOutcome) []byte {
	text := strings.Join(out.pieces, "")
	w := &jw{b: make([]byte, 0, 512+len(text))}
	switch {
	case job.api == apiGenerate:
		s.renderGenerate(w, job, out, text, out.ids, true)
		return w.b
	case job.api == apiLlama:
		s.renderLlamaFinal(w, job, out, text, out.ids)
		return w.b
	case s.cfg.Engine == engines.LlamaCpp:
		s.renderLlamaOAI(w, job, out, text)
		return w.b
	}
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
			w.knull("refusal").knull("annotations").knull("audio").knull("function_call").key("tool_calls").arr().aend().knull("reasoning_content")
		case engines.SGLang:
			w.knull("reasoning_content").knull("tool_calls")
		case engines.TRTLLM:
			w.knull("reasoning_content").key("tool_calls").arr().aend()
		}
		w.end()
		w.knull("logprobs").kstr("finish_reason", out.finish)
	} else {
		w.kstr("text", text).knull("logprobs").kstr("finish_reason", out.finish)
	}
	switch s.cfg.Engine {
	case engines.VLLM:
		w.knull("stop_reason")
		if job.api == apiCompletion {
			w.knull("prompt_logprobs")
		}
	case engines.SGLang:
		w.knull("matched_stop")
	case engines.TRTLLM:
		w.knull("stop_reason")
		if p := job.pd.paramsOut; p != nil {
			w.key(trtllm.Field).raw(p)
		}
	}
	w.end().aend()
	if s.cfg.Engine == engines.VLLM {
		w.knull("service_tier").knull("system_fingerprint")
	}
	s.usage(w, out, out.completionTokens)
	switch s.cfg.Engine {
	case engines.VLLM:
		w.knull("prompt_logprobs")
		if p := job.pd.paramsOut; p != nil {
			w.key(vllm.AnswerField).raw(p)
		} else {
			w.knull(vllm.AnswerField)
		}
	case engines.TRTLLM:
		if job.pd.paramsOut != nil {
			w.key("prompt_token_ids").ints(job.prompt)
		}
	}
	w.end()
	return w.b
}

// renderChunks renders every SSE event of a streaming response, in order.
func (s *Sim) renderChunks(job *genJob, out *genOutcome) []sseChunk {
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
	case job.api == apiLlama:
		// llama.cpp native: one object per token, a final object with the
		// whole result, and no [DONE].
		for i, p := range out.pieces {
			w := &jw{}
			w.obj().kint("index", 0).kstr("content", p).key("tokens").ints(out.ids[min(i, len(out.ids)):min(i+1, len(out.ids))]).
				kbool("stop", false).kint("id_slot", 0).kint("tokens_predicted", int64(i+1)).kint("tokens_evaluated", int64(out.promptTokens)).end()
			add(w, true)
		}
		w := &jw{}
		s.renderLlamaFinal(w, job, out, "", nil)
		add(w, false)
		return chunks
	}
	id, created := s.responseID(job), s.created()
	head := func(w *jw) {
		if s.cfg.Engine == engines.LlamaCpp {
			return
		}
		w.kstr("id", id)
		if job.api == apiChat {
			w.kstr("object", "chat.completion.chunk")
		} else {
			w.kstr("object", "text_completion")
		}
		w.kint("created", created).kstr("model", s.cfg.Model)
	}
	tail := func(w *jw) {
		if s.cfg.Engine != engines.LlamaCpp {
			return
		}
		w.kint("created", created).kstr("id", id).kstr("model", s.cfg.Model).kstr("system_fingerprint", llamaFingerprint)
		if job.api == apiChat {
			w.kstr("object", "chat.completion.chunk")
		} else {
			w.kstr("object", "text_completion")
		}
	}
	usage := s.includeUsage(job.req)
	continuous := usage && job.req.StreamOptions != nil && job.req.StreamOptions.ContinuousUsageStats && s.cfg.Engine == engines.VLLM
	choice := func(w *jw, content string, role bool, finish string) {
		w.key("choices").arr().obj()
		if s.cfg.Engine == engines.LlamaCpp {
			if finish != "" {
				w.kstr("finish_reason", finish)
			} else {
				w.knull("finish_reason")
			}
			w.kint("index", 0)
			if job.api == apiChat {
				w.key("delta").obj()
				if role {
					w.kstr("role", "assistant").knull("content")
				} else if finish == "" {
					w.kstr("content", content)
				}
				w.end()
			} else {
				w.kstr("text", content)
			}
			w.end().aend()
			return
		}
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
		tail(w)
		w.end()
		add(w, false)
	}
	for i, p := range out.pieces {
		finish := ""
		if i == len(out.pieces)-1 && s.cfg.Engine != engines.LlamaCpp {
			finish = out.finish
		}
		w := &jw{}
		w.obj()
		head(w)
		choice(w, p, false, finish)
		if continuous {
			s.usage(w, out, i+1)
		}
		tail(w)
		w.end()
		add(w, true)
	}
	if s.cfg.Engine == engines.LlamaCpp {
		// llama.cpp sends the finish reason (and timings) in a final chunk
		// with an empty delta.
		w := &jw{}
		w.obj()
		choice(w, "", false, out.finish)
		tail(w)
		s.timings(w, out)
		w.end()
		add(w, false)
	}
	if usage {
		w := &jw{}
		w.obj()
		if s.cfg.Engine == engines.LlamaCpp {
			w.key("choices").arr().aend()
			tail(w)
		} else {
			head(w)
			w.key("choices").arr().aend()
		}
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

const llamaFingerprint = "b1-sim"

func (s *Sim) timings(w *jw, out *genOutcome) {
	w.key("timings").obj().
		kint("cache_n", int64(out.cachedTokens)).
		kint("prompt_n", int64(out.promptTokens-out.cachedTokens)).
		key("prompt_ms").float(float64(out.prefillCost.Microseconds())/1000).
		kint("predicted_n", int64(out.completionTokens)).
		key("predicted_ms").float(float64((s.cfg.DecodePerToken * timeDuration(out.completionTokens)).Microseconds()) / 1000).
		end()
}

// renderLlamaOAI writes llama-server's non-streaming OpenAI response (its
// ordered_json key order).
func (s *Sim) renderLlamaOAI(w *jw, job *genJob, out *genOutcome, text string) {
	w.obj().key("choices").arr().obj().kstr("finish_reason", out.finish).kint("index", 0)
	if job.api == apiChat {
		w.key("message").obj().kstr("role", "assistant").kstr("content", text).end()
	} else {
		w.kstr("text", text)
	}
	w.end().aend()
	w.kint("created", s.created()).kstr("model", s.cfg.Model).kstr("system_fingerprint", llamaFingerprint)
	if job.api == apiChat {
		w.kstr("object", "chat.completion")
	} else {
		w.kstr("object", "text_completion")
	}
	s.usage(w, out, out.completionTokens)
	w.kstr("id", s.responseID(job))
	s.timings(w, out)
	w.end()
}

// renderLlamaFinal writes llama.cpp's native /completion result (the whole
// response, or the final stream object when text is "").
func (s *Sim) renderLlamaFinal(w *jw, job *genJob, out *genOutcome, text string, ids []uint32) {
	stopType := "eos"
	if out.finish == "length" {
		stopType = "limit"
	}
	w.obj().kint("index", 0).kstr("content", text).key("tokens").ints(ids).kint("id_slot", 0).kbool("stop", true).
		kstr("model", s.cfg.Model).kint("tokens_predicted", int64(out.completionTokens)).kint("tokens_evaluated", int64(out.promptTokens))
	w.key("generation_settings").obj().kint("n_predict", int64(job.max)).kint("seed", s.cfg.Seed).end()
	w.kstr("prompt", s.tok.Decode(job.prompt)).kbool("has_new_line", strings.Contains(text, "\n")).kbool("truncated", false).
		kstr("stop_type", stopType).kstr("stopping_word", "").kint("tokens_cached", int64(out.cachedTokens))
	s.timings(w, out)
	w.end()
}
