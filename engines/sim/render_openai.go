package sim

import "github.com/llmgw/llmgw/engines"

// renderOpenAIChunks renders the OpenAI-compatible stream of the Python
// servers (vLLM, SGLang, TensorRT-LLM). Each engine serializes its chunk
// models differently, and the key sets below follow those serializers as
// recorded in engines/<engine>/testdata/cases/*stream*.json:
//
//   - vLLM dumps chunks with exclude_unset: the fields the server passes
//     explicitly are present even when null (logprobs, finish_reason,
//     token_ids, the first chunk's prompt_token_ids); the usage chunk also
//     drops nulls.
//   - SGLang always writes index, delta, logprobs, finish_reason and
//     matched_stop on a choice, omits null delta keys, and sends the finish
//     reason in a chunk of its own after the last content chunk.
//   - TensorRT-LLM dumps chat chunks with exclude_none (no null keys) and
//     frames the first one "data: {...} \n\n"; completion chunks and every
//     usage chunk are dumped in full.
func (s *Sim) renderOpenAIChunks(job *genJob, out *genOutcome, chunks []sseChunk) []sseChunk {
	eng := s.cfg.Engine
	chat := job.api == apiChat
	id, created := s.responseID(job), s.created()
	add := func(w *jw, token bool, terminator string) {
		b := make([]byte, 0, len(w.b)+8)
		b = append(b, "data: "...)
		b = append(b, w.b...)
		b = append(b, terminator...)
		chunks = append(chunks, sseChunk{data: b, token: token})
	}
	head := func(w *jw) {
		w.obj().kstr("id", id)
		if chat {
			w.kstr("object", "chat.completion.chunk")
		} else {
			w.kstr("object", "text_completion")
		}
		w.kint("created", created).kstr("model", s.cfg.Model)
	}
	usage := s.includeUsage(job.req)
	continuous := usage && job.req.StreamOptions != nil && job.req.StreamOptions.ContinuousUsageStats && eng == engines.VLLM

	// choice writes one chunk's choices array. first: the role chunk;
	// finish: the finish reason ("" while generating).
	choice := func(w *jw, content string, first bool, finish string) {
		w.key("choices").arr().obj().kint("index", 0)
		switch {
		case chat && eng == engines.TRTLLM:
			w.key("delta").obj()
			if first {
				w.kstr("role", "assistant")
			} else {
				// Without a reasoning parser the reasoning delta is "",
				// which exclude_none keeps.
				w.kstr("content", content).kstr("reasoning_content", "")
			}
			w.end()
			if finish != "" {
				w.kstr("finish_reason", finish)
			}
		case chat:
			w.key("delta").obj()
			switch {
			case first:
				w.kstr("role", "assistant").kstr("content", "")
			case eng == engines.SGLang && finish != "":
				// SGLang's finish chunk carries no content.
			default:
				w.kstr("content", content)
			}
			w.end().knull("logprobs")
			writeFinish(w, finish)
		case eng == engines.TRTLLM:
			w.kstr("text", content).knull("token_ids").knull("logprobs")
			writeFinish(w, finish)
			w.knull("stop_reason").knull("avg_decoded_tokens_per_iter")
		default:
			w.kstr("text", content).knull("logprobs")
			writeFinish(w, finish)
		}
		switch {
		case eng == engines.VLLM && chat && first:
		case eng == engines.VLLM && chat && finish == "":
			w.knull("token_ids")
		case eng == engines.VLLM && chat:
			w.knull("stop_reason").knull("token_ids")
		case eng == engines.VLLM:
			w.knull("stop_reason").knull("prompt_token_ids").knull("token_ids")
		case eng == engines.SGLang:
			if finish != "" && out.finish != "length" {
				w.kint("matched_stop", sglangEOS)
			} else {
				w.knull("matched_stop")
			}
		}
		w.end().aend()
	}
	tail := func(w *jw, completion int, first bool) {
		if continuous {
			// vLLM's per-chunk UsageInfo sets only the three counts, and
			// the chunk is dumped exclude_unset (no prompt_tokens_details).
			w.key("usage").obj().kint("prompt_tokens", int64(out.promptTokens)).
				kint("total_tokens", int64(out.promptTokens+completion)).kint("completion_tokens", int64(completion)).end()
		}
		switch {
		case eng == engines.VLLM && chat && first:
			w.knull("prompt_token_ids")
		case eng == engines.TRTLLM && !chat:
			w.knull("usage")
		}
		w.end()
	}

	if chat {
		w := &jw{}
		head(w)
		choice(w, "", true, "")
		tail(w, 0, true)
		term := "\n\n"
		if eng == engines.TRTLLM {
			term = " \n\n"
		}
		add(w, false, term)
	}
	separateFinish := chat && eng == engines.SGLang
	for i, p := range out.pieces {
		finish := ""
		if i == len(out.pieces)-1 && !separateFinish {
			finish = out.finish
		}
		w := &jw{}
		head(w)
		choice(w, p, false, finish)
		tail(w, i+1, false)
		add(w, true, "\n\n")
	}
	if separateFinish {
		w := &jw{}
		head(w)
		choice(w, "", false, out.finish)
		tail(w, len(out.pieces), false)
		add(w, false, "\n\n")
	}
	if usage {
		w := &jw{}
		head(w)
		w.key("choices").arr().aend()
		s.usage(w, out, out.completionTokens)
		w.end()
		add(w, false, "\n\n")
	}
	return append(chunks, sseChunk{data: []byte("data: [DONE]\n\n")})
}

func writeFinish(w *jw, finish string) {
	if finish != "" {
		w.kstr("finish_reason", finish)
	} else {
		w.knull("finish_reason")
	}
}
