package sim

import (
	"bufio"
	"encoding/base64"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"math"
	"strings"

	"github.com/valyala/fasthttp"
)

// The vLLM persona's /v1/embeddings and /v1/responses. Shapes follow
// vLLM's public source (vllm-project/vllm):
//   - vllm/entrypoints/pooling/embed/api_router.py @f2649902 (POST
//     /v1/embeddings) and embed/protocol.py @ff8d577a: EmbeddingResponse
//     {id "embd-<uuid>", object "list", created, model, data
//     [{index, object "embedding", embedding}], usage UsageInfo}; the
//     request is completion-style ("input") or chat-style ("messages"),
//     encoding_format float or base64.
//   - vllm/entrypoints/openai/responses/api_router.py @f6e93254 (POST
//     /v1/responses; a stream is text/event-stream with one
//     "event: <type>\ndata: <json>\n\n" per event) and responses/protocol.py
//     @c0bc5965 (ResponsesResponse.from_request: the fields written here).
//
// What the sim cannot know: the embedding vector (a real one is the
// model's hidden state; the sim's is a deterministic unit vector of
// simEmbeddingDims, or "dimensions", derived from the token ids), and the
// served model's task set (a real vLLM serves /v1/embeddings only for a
// pooling model and /v1/responses only for a generative one; the sim
// serves both).
const simEmbeddingDims = 16

func (s *Sim) serveEmbeddingsVLLM(ctx *fasthttp.RequestCtx) {
	var req struct {
		Model          *string         `json:"model"`
		Input          json.RawMessage `json:"input"`
		Messages       json.RawMessage `json:"messages"`
		EncodingFormat string          `json:"encoding_format"`
		Dimensions     *int            `json:"dimensions"`
	}
	if err := json.Unmarshal(ctx.PostBody(), &req); err != nil {
		s.writeError(ctx, nil, fasthttp.StatusBadRequest, "JSON decode error: "+err.Error(), true)
		return
	}
	if req.Model != nil && *req.Model != s.cfg.Model {
		s.writeError(ctx, nil, fasthttp.StatusNotFound, "The model `"+*req.Model+"` does not exist.", false)
		return
	}
	var inputs [][]uint32
	switch {
	case !isNull(req.Input):
		var err error
		if inputs, err = s.embeddingInputs(req.Input); err != nil {
			s.writeError(ctx, nil, fasthttp.StatusBadRequest, err.Error(), true)
			return
		}
	case !isNull(req.Messages):
		msgs, err := parseMessages(req.Messages)
		if err != nil {
			s.writeError(ctx, nil, fasthttp.StatusBadRequest, s.messageFor(err), true)
			return
		}
		text, err := s.render.Render(msgs, false)
		if err != nil {
			s.writeError(ctx, nil, fasthttp.StatusBadRequest, "chat template: "+err.Error(), true)
			return
		}
		inputs = [][]uint32{s.tok.Encode(nil, text)}
	default:
		s.writeError(ctx, nil, fasthttp.StatusBadRequest, "Field required: input", true)
		return
	}
	dims := simEmbeddingDims
	if req.Dimensions != nil {
		if *req.Dimensions < 1 {
			s.writeError(ctx, nil, fasthttp.StatusBadRequest, "dimensions must be at least 1", false)
			return
		}
		dims = *req.Dimensions
	}
	if f := req.EncodingFormat; f != "" && f != "float" && f != "base64" {
		s.writeError(ctx, nil, fasthttp.StatusBadRequest, fmt.Sprintf("Input should be 'float', 'base64' or 'bytes': %q", f), true)
		return
	}
	w := &jw{}
	w.obj().kstr("id", "embd-"+s.nextRequestID()).kstr("object", "list").kint("created", s.created()).kstr("model", s.cfg.Model)
	w.key("data").arr()
	tokens := 0
	for i, ids := range inputs {
		tokens += len(ids)
		vec := embedVector(ids, dims)
		w.obj().kint("index", int64(i)).kstr("object", "embedding").key("embedding")
		if req.EncodingFormat == "base64" {
			buf := make([]byte, 4*len(vec))
			for j, f := range vec {
				binary.LittleEndian.PutUint32(buf[4*j:], math.Float32bits(float32(f)))
			}
			w.str(base64.StdEncoding.EncodeToString(buf))
		} else {
			w.arr()
			for _, f := range vec {
				w.float(f)
			}
			w.aend()
		}
		w.end()
	}
	w.aend()
	w.key("usage").obj().kint("prompt_tokens", int64(tokens)).kint("total_tokens", int64(tokens)).
		kint("completion_tokens", 0).knull("prompt_tokens_details").end()
	w.end()
	ctx.SetContentType("application/json")
	ctx.SetBody(w.b)
}

// embeddingInputs reads "input": a string, a list of strings, a list of
// token ids or a list of token-id lists. Text gets the tokenizer's BOS, as
// vLLM's completion-style pooling requests add special tokens by default.
func (s *Sim) embeddingInputs(raw json.RawMessage) ([][]uint32, error) {
	var one string
	if json.Unmarshal(raw, &one) == nil {
		return [][]uint32{s.tok.Encode(append([]uint32(nil), s.bos...), one)}, nil
	}
	var texts []string
	if json.Unmarshal(raw, &texts) == nil && len(texts) > 0 {
		out := make([][]uint32, len(texts))
		for i, t := range texts {
			out[i] = s.tok.Encode(append([]uint32(nil), s.bos...), t)
		}
		return out, nil
	}
	var ids []uint32
	if json.Unmarshal(raw, &ids) == nil && len(ids) > 0 {
		return [][]uint32{ids}, nil
	}
	var batch [][]uint32
	if json.Unmarshal(raw, &batch) == nil && len(batch) > 0 {
		return batch, nil
	}
	return nil, fmt.Errorf("input must be a string, a list of strings, or token ids")
}

// embedVector is a deterministic unit vector of the token ids.
func embedVector(ids []uint32, dims int) []float64 {
	h := uint64(len(ids))
	for _, id := range ids {
		h = splitmix64(h ^ uint64(id))
	}
	v := make([]float64, dims)
	var norm float64
	for i := range v {
		h = splitmix64(h)
		v[i] = float64(int64(h>>11))/float64(1<<52) - 1
		norm += v[i] * v[i]
	}
	norm = math.Sqrt(norm)
	for i := range v {
		if norm > 0 {
			v[i] /= norm
		}
	}
	return v
}

// responsesRequest holds the ResponsesRequest fields the sim reads.
type responsesRequest struct {
	Model           *string         `json:"model"`
	Input           json.RawMessage `json:"input"`
	Instructions    *string         `json:"instructions"`
	Stream          *bool           `json:"stream"`
	MaxOutputTokens *int            `json:"max_output_tokens"`
	User            *string         `json:"user"`
}

// chatMessages turns instructions and input into the chat messages vLLM
// renders them as (instructions first, as a system message).
func (r *responsesRequest) chatMessages() ([]chatMessage, error) {
	var msgs []chatMessage
	if r.Instructions != nil {
		msgs = append(msgs, chatMessage{Role: "system", Content: mustJSON(*r.Instructions)})
	}
	var one string
	if json.Unmarshal(r.Input, &one) == nil {
		return append(msgs, chatMessage{Role: "user", Content: mustJSON(one)}), nil
	}
	var items []struct {
		Role    string          `json:"role"`
		Content json.RawMessage `json:"content"`
	}
	if err := json.Unmarshal(r.Input, &items); err != nil {
		return nil, fmt.Errorf("%w: input must be a string or a list of items", errBadRequest)
	}
	for i, it := range items {
		if it.Role == "" {
			return nil, fmt.Errorf("%w: input[%d]: only message items are supported by the sim", errBadRequest, i)
		}
		text, err := responsesContentText(it.Content)
		if err != nil {
			return nil, fmt.Errorf("%w: input[%d].content: %v", errBadRequest, i, err)
		}
		msgs = append(msgs, chatMessage{Role: it.Role, Content: mustJSON(text)})
	}
	return msgs, nil
}

// responsesContentText flattens a message item's content: a string, or
// input_text / output_text parts.
func responsesContentText(raw json.RawMessage) (string, error) {
	var one string
	if json.Unmarshal(raw, &one) == nil {
		return one, nil
	}
	var parts []struct {
		Type string  `json:"type"`
		Text *string `json:"text"`
	}
	if err := json.Unmarshal(raw, &parts); err != nil {
		return "", fmt.Errorf("expected a string or a list of content parts")
	}
	var b strings.Builder
	for i, p := range parts {
		if (p.Type != "input_text" && p.Type != "output_text") || p.Text == nil {
			return "", fmt.Errorf("part %d: only input_text and output_text parts are supported by the sim", i)
		}
		b.WriteString(*p.Text)
	}
	return b.String(), nil
}

func (s *Sim) serveResponsesVLLM(ctx *fasthttp.RequestCtx) {
	rec := s.newReceipt(ctx)
	var rr responsesRequest
	if err := json.Unmarshal(ctx.PostBody(), &rr); err != nil {
		s.writeError(ctx, &rec, fasthttp.StatusBadRequest, "JSON decode error: "+err.Error(), true)
		return
	}
	if rr.Model != nil && *rr.Model != s.cfg.Model {
		s.writeError(ctx, &rec, fasthttp.StatusNotFound, "The model `"+*rr.Model+"` does not exist.", false)
		return
	}
	if isNull(rr.Input) {
		s.writeError(ctx, &rec, fasthttp.StatusBadRequest, "Field required: input", true)
		return
	}
	msgs, err := rr.chatMessages()
	if err != nil {
		s.writeError(ctx, &rec, fasthttp.StatusBadRequest, s.messageFor(err), true)
		return
	}
	req := &genRequest{Messages: mustJSON(msgs), MaxTokens: rr.MaxOutputTokens, Stream: rr.Stream}
	if rr.Model != nil {
		req.Model = *rr.Model
	}
	rec.Model, rec.Stream, rec.MaxTokens = req.Model, req.stream(), req.maxTokens()
	job, rerr := s.buildJob(ctx, apiChat, req, &rec)
	if rerr != nil {
		s.writeError(ctx, &rec, rerr.status, rerr.text(s), rerr.validation)
		return
	}
	release, _, err := s.admit()
	if err != nil {
		s.writeError(ctx, &job.rec, fasthttp.StatusServiceUnavailable, err.Error(), false)
		return
	}
	out := s.prefill(job)
	s.generate(job, out)
	release()
	s.metrics.finished(out.finish)
	job.rec.PromptTokens, job.rec.CachedTokens, job.rec.CompletionTokens = out.promptTokens, out.cachedTokens, out.completionTokens
	job.rec.FinishReason, job.rec.Status = out.finish, fasthttp.StatusOK
	s.receipts.add(job.rec)

	r := responsesRender{s: s, rr: &rr, out: out, id: "resp_" + job.requestID, msgID: "msg_" + job.requestID, created: s.created()}
	if !job.stream {
		ctx.SetContentType("application/json")
		ctx.SetBody(r.response(r.status(), true))
		return
	}
	ctx.SetContentType("text/event-stream; charset=utf-8")
	ctx.Response.Header.Set("Cache-Control", "no-cache")
	s.wg.Add(1)
	ctx.SetBodyStreamWriter(func(bw *bufio.Writer) {
		defer s.wg.Done()
		r.stream(bw)
	})
}

// responsesRender writes one Responses answer, whole or as events.
type responsesRender struct {
	s       *Sim
	rr      *responsesRequest
	out     *genOutcome
	id      string
	msgID   string
	created int64
	seq     int64
}

// status is "incomplete" when generation stopped at max_output_tokens
// (from_request's incomplete_details reason), else "completed".
func (r *responsesRender) status() string {
	if r.out.finish == "length" {
		return "incomplete"
	}
	return "completed"
}

func (r *responsesRender) text() string { return strings.Join(r.out.pieces, "") }

// message writes the assistant message item.
func (r *responsesRender) message(w *jw, status string, text string, withContent bool) {
	w.obj().kstr("id", r.msgID).kstr("type", "message").kstr("role", "assistant").kstr("status", status)
	w.key("content").arr()
	if withContent {
		r.textPart(w, text)
	}
	w.aend().end()
}

func (r *responsesRender) textPart(w *jw, text string) {
	w.obj().kstr("type", "output_text").kstr("text", text).key("annotations").arr().aend().key("logprobs").arr().aend().end()
}

// response renders the ResponsesResponse object; done adds the output and
// usage (the created/in_progress events carry neither yet).
func (r *responsesRender) response(status string, done bool) []byte {
	w := &jw{}
	w.obj().kstr("id", r.id).kstr("object", "response").kint("created_at", r.created)
	if status == "incomplete" {
		w.key("incomplete_details").obj().kstr("reason", "max_output_tokens").end()
	} else {
		w.knull("incomplete_details")
	}
	if r.rr.Instructions != nil {
		w.kstr("instructions", *r.rr.Instructions)
	} else {
		w.knull("instructions")
	}
	w.knull("metadata").kstr("model", r.s.cfg.Model)
	w.key("output").arr()
	if done {
		r.message(w, "completed", r.text(), true)
	}
	w.aend()
	w.kbool("parallel_tool_calls", true).key("temperature").float(1).kstr("tool_choice", "auto").key("tools").arr().aend().key("top_p").float(1)
	w.kbool("background", false)
	if r.rr.MaxOutputTokens != nil {
		w.kint("max_output_tokens", int64(*r.rr.MaxOutputTokens))
	} else {
		w.knull("max_output_tokens")
	}
	w.knull("max_tool_calls").knull("previous_response_id").knull("prompt").knull("reasoning").kstr("service_tier", "auto").kstr("status", status)
	w.knull("text").kint("top_logprobs", 0).kstr("truncation", "disabled")
	if r.rr.User != nil {
		w.kstr("user", *r.rr.User)
	} else {
		w.knull("user")
	}
	if done {
		w.key("usage").obj().kint("input_tokens", int64(r.out.promptTokens)).
			key("input_tokens_details").obj().kint("cached_tokens", int64(r.out.cachedTokens)).end().
			kint("output_tokens", int64(r.out.completionTokens)).
			key("output_tokens_details").obj().kint("reasoning_tokens", 0).end().
			kint("total_tokens", int64(r.out.promptTokens+r.out.completionTokens)).end()
	} else {
		w.knull("usage")
	}
	w.end()
	return w.b
}

// event writes one SSE event: "event: <type>" and its JSON data, whose
// fields are type, sequence_number and those fill adds.
func (r *responsesRender) event(bw *bufio.Writer, typ string, fill func(w *jw)) error {
	w := &jw{}
	w.obj().kstr("type", typ).kint("sequence_number", r.seq)
	r.seq++
	fill(w)
	w.end()
	if _, err := fmt.Fprintf(bw, "event: %s\ndata: %s\n\n", typ, w.b); err != nil {
		return err
	}
	return bw.Flush()
}

// stream writes the events of a text answer in the order vLLM's simple
// (non-harmony) streaming emits them: created, in_progress,
// output_item.added, content_part.added, one output_text.delta per token,
// output_text.done, content_part.done, output_item.done, completed.
func (r *responsesRender) stream(bw *bufio.Writer) {
	resp := func(status string, done bool) func(w *jw) {
		return func(w *jw) { w.key("response").raw(r.response(status, done)) }
	}
	item := func(idx string) func(w *jw) {
		return func(w *jw) { w.kstr("item_id", r.msgID).kint("output_index", 0).kint(idx, 0) }
	}
	steps := []struct {
		typ  string
		fill func(w *jw)
	}{
		{"response.created", resp("in_progress", false)},
		{"response.in_progress", resp("in_progress", false)},
		{"response.output_item.added", func(w *jw) {
			w.kint("output_index", 0).key("item")
			r.message(w, "in_progress", "", false)
		}},
		{"response.content_part.added", func(w *jw) {
			item("content_index")(w)
			w.key("part")
			r.textPart(w, "")
		}},
	}
	for _, p := range r.out.pieces {
		steps = append(steps, struct {
			typ  string
			fill func(w *jw)
		}{"response.output_text.delta", func(w *jw) {
			item("content_index")(w)
			w.kstr("delta", p).key("logprobs").arr().aend()
		}})
	}
	text := r.text()
	steps = append(steps, []struct {
		typ  string
		fill func(w *jw)
	}{
		{"response.output_text.done", func(w *jw) {
			item("content_index")(w)
			w.kstr("text", text).key("logprobs").arr().aend()
		}},
		{"response.content_part.done", func(w *jw) {
			item("content_index")(w)
			w.key("part")
			r.textPart(w, text)
		}},
		{"response.output_item.done", func(w *jw) {
			w.kint("output_index", 0).key("item")
			r.message(w, "completed", text, true)
		}},
		{"response.completed", resp(r.status(), true)},
	}...)
	for _, st := range steps {
		if r.s.ctx.Err() != nil {
			return
		}
		if err := r.event(bw, st.typ, st.fill); err != nil {
			return // the client left
		}
	}
}
