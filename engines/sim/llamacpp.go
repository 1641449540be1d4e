package sim

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/valyala/fasthttp"

	"github.com/llmgw/llmgw/engines/tokenizer"
)

// The llama.cpp persona reproduces llama-server as captured in
// engines/llamacpp/testdata (build c392e50, see its PROVENANCE); the
// conformance test there replays every capture against it. Where a
// behaviour was not captured, the comment cites llama.cpp's
// examples/server/server.cpp at that commit or says it is not established.
//
// What still differs from that server, and why:
//   - the header order of non-streamed answers: fasthttp writes Server,
//     Content-Type and Content-Length first, cpp-httplib follows its header
//     map (streamed answers, written by hand, are exact);
//   - generated text, token ids and counts: the simulator's tokenizer and
//     word list, not the GGUF's vocabulary; a completion stops naturally
//     after 8..32 tokens where the model runs to EOS or the context;
//   - timings and /metrics figures come from the latency model; prompt
//     reuse is the simulator's block LRU, not a slot's common prefix;
//   - a slot counts as processing from decode, not prefill, and its
//     n_decoded is estimated from the decode cost; id_task counts only
//     completion tasks;
//   - a batch of prompts is refused (the server answers an array);
//   - nlohmann's parse-error tail ("last read: …") is approximate;
//   - GET / serves a stand-in for the 1.2 MB web UI;
//   - a killed process is the crash_after_chunks fault: its wire side only;
//   - the /_sim control endpoints use the same served-connection budget.

// llamaNCtx is llama-server's default total context (-c 4096, as in the
// captures); each slot gets llamaNCtx / slots (-c 4096 -np 2: 2048).
const llamaNCtx = 4096

// llamaSlotCtx is the per-slot context (props n_ctx, truncation bound).
func (s *Sim) llamaSlotCtx() int { return llamaNCtx / s.llamaSlots() }

// llamaSlots is the number of llama.cpp slots (-np): the concurrency limit,
// or 1, llama-server's default.
func (s *Sim) llamaSlots() int { return max(s.cfg.MaxConcurrency, 1) }

// routeLlama serves llama-server's routes. Its HTTP library answers a
// wrong method like an unknown path: 404 "File Not Found", never 405.
func (s *Sim) routeLlama(ctx *fasthttp.RequestCtx, path string) {
	// CORS preflight is answered before anything else, even while loading
	// (server.cpp's pre-routing handler).
	if ctx.IsOptions() {
		h := &ctx.Response.Header
		h.Set("Access-Control-Allow-Credentials", "true")
		h.Set("Access-Control-Allow-Headers", "*")
		h.Set("Access-Control-Allow-Methods", "GET, POST")
		ctx.SetContentType("text/html")
		return
	}
	if s.loading() {
		s.llamaLoading(ctx, path)
		return
	}
	get := ctx.IsGet() || ctx.IsHead()
	post := ctx.IsPost()
	switch {
	case get && path == "/":
		s.llamaIndex(ctx)
	case get && path == "/health":
		if s.faults.healthFail() {
			s.writeError(ctx, nil, fasthttp.StatusServiceUnavailable, "Loading model", false)
			return
		}
		ctx.SetContentType("application/json")
		ctx.SetBodyString(`{"status":"ok"}`)
	case post && (path == "/v1/chat/completions" || path == "/chat/completions"):
		s.llamaGen(ctx, apiChat)
	case post && path == "/v1/completions":
		s.llamaGen(ctx, apiCompletion)
	case post && (path == "/completion" || path == "/completions"):
		s.llamaGen(ctx, apiLlama)
	case get && (path == "/v1/models" || path == "/models"):
		s.llamaModels(ctx)
	case post && path == "/tokenize":
		s.serveTokenizeLlama(ctx)
	case post && path == "/detokenize":
		s.llamaDetokenize(ctx)
	case post && path == "/apply-template":
		s.llamaApplyTemplate(ctx)
	case get && path == "/props":
		s.llamaProps(ctx)
	case post && path == "/props":
		s.writeError(ctx, nil, fasthttp.StatusNotImplemented, "This server does not support changing global properties. Start it with `--props`", false)
	case post && strings.HasPrefix(path, "/slots/"):
		s.writeError(ctx, nil, fasthttp.StatusNotImplemented, "This server does not support slots action. Start it with `--slot-save-path`", false)
	case path == "/lora-adapters" && (get || post):
		// No adapters loaded: the list is empty and setting it succeeds.
		ctx.SetContentType("application/json")
		if post {
			ctx.SetBodyString(`{"success":true}`)
		} else {
			ctx.SetBodyString(`[]`)
		}
	case post && (path == "/rerank" || path == "/reranking" || path == "/v1/rerank" || path == "/v1/reranking"):
		s.writeError(ctx, nil, fasthttp.StatusNotImplemented, "This server does not support reranking. Start it with `--reranking` and without `--embedding`", false)
	case get && path == "/slots":
		if !s.cfg.EnableSlots {
			s.writeError(ctx, nil, fasthttp.StatusNotImplemented, "This server does not support slots endpoint. Start it with `--slots`", false)
			return
		}
		s.llamaServeSlots(ctx)
	case get && path == "/metrics":
		if !s.cfg.EnableMetrics {
			s.writeError(ctx, nil, fasthttp.StatusNotImplemented, "This server does not support metrics endpoint. Start it with `--metrics`", false)
			return
		}
		s.serveMetrics(ctx)
		ctx.SetContentType("text/plain; version=0.0.4")
		ctx.Response.Header.Set("Process-Start-Time-Unix", strconv.FormatInt(s.started.Unix(), 10))
	case post && path == "/v1/embeddings":
		s.llamaEmbeddings(ctx, true)
	case post && (path == "/embedding" || path == "/embeddings"):
		s.llamaEmbeddings(ctx, false)
	case post && path == "/infill":
		// The simulated model has no fill-in-the-middle tokens.
		s.writeError(ctx, nil, fasthttp.StatusNotImplemented, "Infill is not supported by this model: prefix token is missing. suffix token is missing. middle token is missing. ", false)
	default:
		s.notFound(ctx)
	}
}

// llamaLoading answers every path with 503 while the model loads: "/" and
// any ".html" path with an HTML page, everything else with the JSON error
// (server.cpp middleware_server_state; cases *_loading).
func (s *Sim) llamaLoading(ctx *fasthttp.RequestCtx, path string) {
	if path == "/" || strings.HasSuffix(path, ".html") {
		ctx.SetStatusCode(fasthttp.StatusServiceUnavailable)
		ctx.SetContentType("text/html; charset=utf-8")
		ctx.SetBodyString(llamaLoadingPage)
		return
	}
	s.writeError(ctx, nil, fasthttp.StatusServiceUnavailable, "Loading model", false)
}

// llamaLoadingPage is the page llama-server shows on / while loading
// (captured byte for byte: cases/root_loading.http).
const llamaLoadingPage = `<!DOCTYPE html>
<html>
    <head>
        <meta http-equiv="refresh" content="5">
    </head>
    <body>
        <div id="loading">
            The model is loading. Please wait.<br/>
            The user interface will appear soon.
        </div>
    </body>
</html>
`

// llamaGen validates an inference request the way llama-server does and
// serves it. llama-server parses the body with nlohmann::json and reports
// every parse or validation failure of the OpenAI endpoints as 500
// server_error (its exception handler), before any streaming starts, so
// "n": 2 with "stream": true is a JSON error too.
func (s *Sim) llamaGen(ctx *fasthttp.RequestCtx, api apiKind) {
	if s.cfg.Embeddings {
		s.writeError(ctx, nil, fasthttp.StatusNotImplemented, "This server does not support completions. Start it without `--embeddings`", false)
		return
	}
	body, err := llamaParseBody(ctx.PostBody())
	if err != nil {
		s.writeError(ctx, nil, fasthttp.StatusInternalServerError, err.Error(), false)
		return
	}
	if status, msg := llamaValidate(api, body); status != 0 {
		s.writeError(ctx, nil, status, msg, false)
		return
	}
	if b, changed := llamaLenient(body); changed {
		ctx.Request.SetBody(b)
	}
	s.serveGen(ctx, api)
}

// llamaLenient drops the fields whose JSON type is not the one the server
// reads: llama-server reads each parameter with a default for a missing
// or mistyped value ("stream": "yes" streams nothing, "max_tokens": "2"
// is unlimited, "model": 5 answers with the alias).
func llamaLenient(body map[string]json.RawMessage) ([]byte, bool) {
	changed := false
	for range len(body) + 1 {
		b, err := json.Marshal(body)
		if err != nil {
			return nil, false
		}
		var te *json.UnmarshalTypeError
		if err := json.Unmarshal(b, new(genRequest)); !errors.As(err, &te) || te.Field == "" {
			return b, changed
		}
		top, _, _ := strings.Cut(te.Field, ".")
		if _, ok := body[top]; !ok {
			return b, changed
		}
		delete(body, top)
		changed = true
	}
	return nil, false
}

// llamaIndex is GET /: the built-in web UI, which is served gzip-encoded
// only. A client that does not accept gzip gets llama-server's plain-text
// refusal; one that does gets a small page standing in for the UI (the
// simulator does not ship llama.cpp's 1.2 MB bundle).
func (s *Sim) llamaIndex(ctx *fasthttp.RequestCtx) {
	if !bytes.Contains(ctx.Request.Header.Peek("Accept-Encoding"), []byte("gzip")) {
		ctx.SetContentType("text/plain")
		ctx.SetBodyString("Error: gzip is not supported by this browser")
		return
	}
	ctx.Response.Header.Set("Cross-Origin-Embedder-Policy", "require-corp")
	ctx.Response.Header.Set("Cross-Origin-Opener-Policy", "same-origin")
	ctx.Response.Header.Set("Content-Encoding", "gzip")
	ctx.SetContentType("text/html; charset=utf-8")
	ctx.SetBody(fasthttp.AppendGzipBytes(nil, []byte("<!DOCTYPE html><html><body>llama.cpp persona of llmgw sim</body></html>\n")))
}

// llamaValidate applies llama-server's checks, in its order (cases err_*
// and extra/err_*): chat refuses tools and tool_choice without --jinja,
// then needs well-formed messages; /v1/completions and native /completion
// need a prompt of a valid type; the OpenAI endpoints refuse n != 1, chat
// top_logprobs without logprobs, completions echo, best_of and suffix. It
// returns status 0 when the request passes.
func llamaValidate(api apiKind, body map[string]json.RawMessage) (int, string) {
	const e500 = fasthttp.StatusInternalServerError
	switch api {
	case apiChat:
		// Without --jinja: tools need it, tool_choice is refused; both are
		// checked before the messages.
		var tools []json.RawMessage
		if json.Unmarshal(body["tools"], &tools) == nil && len(tools) > 0 {
			return e500, "tools param requires --jinja flag"
		}
		if _, ok := body["tool_choice"]; ok {
			return e500, "Unsupported param: tool_choice"
		}
		msgs, ok := body["messages"]
		if !ok {
			return e500, "[json.exception.out_of_range.403] key 'messages' not found"
		}
		if msg := llamaCheckMessages(msgs); msg != "" {
			return e500, "Failed to parse messages: " + msg + "; messages = " + indentJSON(msgs)
		}
	case apiCompletion:
		if _, ok := body["prompt"]; !ok {
			return e500, `"prompt" is required`
		}
	case apiLlama:
		if _, ok := body["prompt"]; !ok {
			return fasthttp.StatusBadRequest, "[json.exception.out_of_range.403] key 'prompt' not found"
		}
	}
	if api != apiChat {
		if t := bytes.TrimSpace(body["prompt"]); len(t) == 0 || (t[0] != '"' && t[0] != '[') {
			return fasthttp.StatusBadRequest, `"prompt" must be a string, an list of tokens, a list of mixed strings & tokens, or a list of prompts`
		}
	}
	if api == apiLlama {
		return 0, ""
	}
	if n, ok := body["n"]; ok {
		var v float64
		if json.Unmarshal(n, &v) == nil && !isNull(n) && v != 1 {
			return e500, "Only one completion choice is allowed"
		}
	}
	if api == apiChat {
		if !isNull(body["top_logprobs"]) {
			var logprobs bool
			_ = json.Unmarshal(body["logprobs"], &logprobs) // mistyped: false
			if !logprobs {
				return e500, "top_logprobs requires logprobs to be set to true"
			}
		}
	}
	if api == apiCompletion {
		// Refused by presence, whatever the value.
		for _, p := range []string{"best_of", "echo", "suffix"} {
			if _, ok := body[p]; ok {
				return e500, "Unsupported param: " + p
			}
		}
	}
	return 0, ""
}

// llamaCheckMessages applies llama-server's message checks
// (common_chat_msgs_parse_oaicompat): an array of objects, each with a
// role and a string, null or text-parts content. It returns "" when the
// messages are acceptable.
func llamaCheckMessages(raw json.RawMessage) string {
	const ref = " (ref: https://github.com/ggml-org/llama.cpp/issues/8367)"
	var msgs []json.RawMessage
	if t := bytes.TrimSpace(raw); len(t) == 0 || t[0] != '[' || json.Unmarshal(raw, &msgs) != nil {
		return "Expected 'messages' to be an array, got " + compactJSON(raw)
	}
	for _, m := range msgs {
		var fields map[string]json.RawMessage
		if json.Unmarshal(m, &fields) != nil {
			return "Expected 'message' to be an object, got " + compactJSON(m)
		}
		if _, ok := fields["role"]; !ok {
			return "Missing 'role' in message: " + compactJSON(m)
		}
		content, ok := fields["content"]
		if !ok {
			if _, calls := fields["tool_calls"]; !calls {
				return "Expected 'content'" + ref
			}
			continue
		}
		t := bytes.TrimSpace(content)
		switch {
		case isNull(t), t[0] == '"':
		case t[0] == '[':
			var parts []json.RawMessage
			if json.Unmarshal(t, &parts) != nil {
				return "Invalid 'content' type: expected string or array, got " + compactJSON(t) + ref
			}
			for _, p := range parts {
				var part struct {
					Type json.RawMessage `json:"type"`
				}
				if json.Unmarshal(p, &part) != nil || part.Type == nil {
					return "Missing content part type: " + compactJSON(p)
				}
				if string(part.Type) != `"text"` {
					return "Unsupported content part type: " + compactJSON(part.Type)
				}
			}
		default:
			return "Invalid 'content' type: expected string or array, got " + compactJSON(t) + ref
		}
	}
	return ""
}

// indentJSON is nlohmann's dump(2): two-space indent, the request's key
// order.
func indentJSON(raw json.RawMessage) string {
	var b bytes.Buffer
	if err := json.Indent(&b, raw, "", "  "); err != nil {
		return string(raw)
	}
	return b.String()
}

func compactJSON(raw json.RawMessage) string {
	var b bytes.Buffer
	if err := json.Compact(&b, raw); err != nil {
		return string(raw)
	}
	return b.String()
}

// llamaParseBody parses a request body as an object; its errors carry
// nlohmann::json's wording ("[json.exception.parse_error.101] parse error
// at line L, column C: …"), the prefix the llama.cpp adapter classifies as
// the client's fault. The position is exact; the tail after it is
// nlohmann's only for an empty or truncated body.
func llamaParseBody(b []byte) (map[string]json.RawMessage, error) {
	if len(bytes.TrimSpace(b)) == 0 {
		return nil, errors.New("[json.exception.parse_error.101] parse error at line 1, column 1: attempting to parse an empty input; check that your input string or stream contains the expected JSON")
	}
	var v any
	if err := json.Unmarshal(b, &v); err != nil {
		off := len(b)
		what := "syntax error while parsing value - unexpected end of input; expected '[', '{', or a literal"
		var se *json.SyntaxError
		if errors.As(err, &se) && se.Offset < int64(len(b)) {
			off = max(int(se.Offset)-1, 0)
			what = "syntax error while parsing value - invalid literal; last read: '" + string(b[off:min(off+1, len(b))]) + "'"
		}
		line, col := 1, 1
		for _, c := range b[:off] {
			if c == '\n' {
				line, col = line+1, 1
			} else {
				col++
			}
		}
		return nil, fmt.Errorf("[json.exception.parse_error.101] parse error at line %d, column %d: %s", line, col, what)
	}
	obj, ok := v.(map[string]any)
	if !ok {
		return nil, fmt.Errorf("[json.exception.type_error.304] cannot use at() with %s", nlohmannType(v))
	}
	out := make(map[string]json.RawMessage, len(obj))
	if err := json.Unmarshal(b, &out); err != nil {
		return nil, fmt.Errorf("[json.exception.parse_error.101] %w", err)
	}
	return out, nil
}

// nlohmannTypeError is nlohmann::json's message for reading raw as the
// wanted type.
func nlohmannTypeError(want string, raw json.RawMessage) string {
	var v any
	_ = json.Unmarshal(raw, &v)
	return "[json.exception.type_error.302] type must be " + want + ", but is " + nlohmannType(v)
}

func nlohmannType(v any) string {
	switch v.(type) {
	case nil:
		return "null"
	case bool:
		return "boolean"
	case float64:
		return "number"
	case string:
		return "string"
	case []any:
		return "array"
	}
	return "object"
}

// llamaTruncate shortens a prompt that does not fit the slot's context as
// llama-server does, silently (only native /completion reports
// "truncated": true): with n_keep 0 it keeps the tail after dropping whole
// blocks of n_ctx/2 tokens, so 5002 tokens become 1930 and 3002 become
// 1978 with n_ctx 2048 (cases prompt_longer_than_ctx,
// prompt_exceeds_slot_ctx; server.cpp update_slots).
func (s *Sim) llamaTruncate(job *genJob) {
	nctx := s.llamaSlotCtx()
	n := len(job.prompt)
	if n < nctx {
		return
	}
	block := nctx / 2
	erased := (n - block) / block
	job.prompt = job.prompt[erased*block:]
	job.truncated = true
}

// llamaModels is GET /v1/models (and /models): the alias, owned by
// "llamacpp", with the model's metadata. The simulator has no GGUF; meta
// carries the captured tiny model's figures, n_vocab the tokenizer's.
func (s *Sim) llamaModels(ctx *fasthttp.RequestCtx) {
	w := &jw{}
	w.obj().kstr("object", "list").key("data").arr().obj().kstr("id", s.cfg.Model).kstr("object", "model").
		kint("created", s.created()).kstr("owned_by", "llamacpp").
		key("meta").obj().kint("vocab_type", 1).kint("n_vocab", 32000).kint("n_ctx_train", llamaNCtx).
		kint("n_embd", llamaNEmbd).kint("n_params", 4178240).kint("size", 16712960).end().
		end().aend().end()
	ctx.SetContentType("application/json")
	ctx.SetBody(w.b)
}

// llamaNEmbd is the embedding width of the captured tiny model, llamaEOS
// its EOS token.
const (
	llamaNEmbd = 64
	llamaEOS   = 2
)

// llamaSampling is one slot's sampling parameters as llama-server reports
// them (props default_generation_settings.params, /slots params, native
// generation_settings): the request's n_predict, seed, temperature and
// stream, and the server defaults the captures show for the rest.
type llamaSampling struct {
	nPredict    int
	seed        int64
	temperature string // as llama-server prints the float
	stream      bool
	// ignoreEOS shows as a -inf (null) logit bias on EOS, ignore_eos
	// itself staying false (case slots_enabled_busy).
	ignoreEOS bool
}

func llamaDefaultSampling() llamaSampling {
	// seed 4294967295 is LLAMA_DEFAULT_SEED (random); temperature 0.8.
	return llamaSampling{nPredict: -1, seed: 4294967295, temperature: "0.800000011920929", stream: true}
}

// samplingFor reads the request's sampling parameters (native n_predict
// wins over max_tokens).
func (s *Sim) samplingFor(job *genJob) llamaSampling {
	p := llamaDefaultSampling()
	p.nPredict = job.max
	p.stream = job.stream
	if r := job.req; r != nil {
		p.ignoreEOS = r.IgnoreEOS != nil && *r.IgnoreEOS
		if r.Seed != nil {
			p.seed = *r.Seed
		}
		if r.Temperature != nil {
			// llama-server stores a float and prints its double value.
			p.temperature = strconv.FormatFloat(float64(float32(*r.Temperature)), 'g', -1, 64)
			if !strings.ContainsAny(p.temperature, ".e") {
				p.temperature += ".0"
			}
		}
	}
	return p
}

// write writes the params object in llama-server's key order.
func (p llamaSampling) write(w *jw) {
	w.obj().kint("n_predict", int64(p.nPredict)).kint("seed", p.seed).key("temperature").raw([]byte(p.temperature))
	for _, kv := range llamaStaticParams1 {
		w.key(kv[0]).raw([]byte(kv[1]))
	}
	w.kint("max_tokens", int64(p.nPredict))
	for _, kv := range llamaStaticParams2 {
		w.key(kv[0]).raw([]byte(kv[1]))
	}
	w.kbool("stream", p.stream)
	if p.ignoreEOS {
		w.key("logit_bias").raw([]byte(`[{"bias":null,"token":` + strconv.Itoa(llamaEOS) + `}]`))
	} else {
		w.key("logit_bias").raw([]byte("[]"))
	}
	for _, kv := range llamaStaticParams3 {
		w.key(kv[0]).raw([]byte(kv[1]))
	}
	w.end()
}

// The server defaults of the sampling parameters (cases props, slots_*).
var (
	llamaStaticParams1 = [][2]string{
		{"dynatemp_range", "0.0"}, {"dynatemp_exponent", "1.0"}, {"top_k", "40"}, {"top_p", "0.949999988079071"},
		{"min_p", "0.05000000074505806"}, {"xtc_probability", "0.0"}, {"xtc_threshold", "0.10000000149011612"},
		{"typical_p", "1.0"}, {"repeat_last_n", "64"}, {"repeat_penalty", "1.0"}, {"presence_penalty", "0.0"},
		{"frequency_penalty", "0.0"}, {"dry_multiplier", "0.0"}, {"dry_base", "1.75"}, {"dry_allowed_length", "2"},
		{"dry_penalty_last_n", "4096"}, {"dry_sequence_breakers", `["\n",":","\"","*"]`}, {"mirostat", "0"},
		{"mirostat_tau", "5.0"}, {"mirostat_eta", "0.10000000149011612"}, {"stop", "[]"},
	}
	llamaStaticParams2 = [][2]string{{"n_keep", "0"}, {"n_discard", "0"}, {"ignore_eos", "false"}}
	llamaStaticParams3 = [][2]string{
		{"n_probs", "0"}, {"min_keep", "0"}, {"grammar", `""`}, {"grammar_trigger_words", "[]"},
		{"grammar_trigger_tokens", "[]"}, {"preserved_tokens", "[]"}, {"chat_format", `"Content-only"`},
		{"samplers", `["penalties","dry","top_k","typ_p","top_p","min_p","xtc","temperature"]`},
		{"speculative.n_max", "16"}, {"speculative.n_min", "0"}, {"speculative.p_min", "0.75"},
		{"timings_per_token", "false"}, {"post_sampling_probs", "false"}, {"lora", "[]"},
	}
)

// llamaSlotTable is what /slots reports of each slot: the last task it
// ran (its id, sampling parameters, prompt and progress) and whether it
// runs one now. A slot keeps its last task's state when it goes idle
// (cases slots_enabled_*). A task takes an idle slot whose cached prompt
// matches more than half of the new one, else the idle slot used least
// recently (server.cpp get_available_slot, slot_prompt_similarity 0.5;
// checked against the same build: a new prompt goes to the never-used
// slot). llama.cpp's similarity measure changed across versions (common
// substring or prefix, over the cached or the new tokens); the simulator
// uses the common prefix over the new prompt.
type llamaSlotTable struct {
	mu       sync.Mutex
	slots    []llamaSlot
	nextTask int64
}

// pick returns the idle slot for prompt, or -1.
func (t *llamaSlotTable) pick(prompt []uint32) int {
	best, bestLCP := -1, 0
	for i, sl := range t.slots {
		if sl.busy || !sl.used || len(prompt) == 0 {
			continue
		}
		n := 0
		for n < len(prompt) && n < len(sl.tokens) && prompt[n] == sl.tokens[n] {
			n++
		}
		if 2*n > len(prompt) && n > bestLCP {
			best, bestLCP = i, n
		}
	}
	if best >= 0 {
		return best
	}
	for i, sl := range t.slots {
		if !sl.busy && (best < 0 || sl.idTask < t.slots[best].idTask) {
			best = i // never used (idTask 0) first, then the oldest task
		}
	}
	return best
}

type llamaSlot struct {
	used   bool // has run a task
	busy   bool
	idTask int64
	params llamaSampling
	prompt string
	tokens []uint32
	start  time.Time // decoding started
	total  int       // tokens the task produces
	done   int       // tokens produced, once finished
}

// llamaOccupy puts job on an idle slot as its decoding starts and returns
// a release that frees the slot too. With every slot busy (a persona
// without a concurrency limit runs more tasks than slots) the task runs
// on no slot.
func (s *Sim) llamaOccupy(job *genJob, out *genOutcome, release func()) func() {
	t := &s.lslots
	t.mu.Lock()
	defer t.mu.Unlock()
	if len(t.slots) == 0 {
		t.slots = make([]llamaSlot, s.llamaSlots())
	}
	job.slot = t.pick(job.prompt)
	if job.slot < 0 {
		return release
	}
	t.nextTask++
	t.slots[job.slot] = llamaSlot{used: true, busy: true, idTask: t.nextTask, params: s.samplingFor(job),
		prompt: s.tok.Decode(job.prompt), tokens: job.prompt, start: time.Now(), total: out.completionTokens}
	id := job.slot
	var once sync.Once
	return func() {
		once.Do(func() {
			t.mu.Lock()
			t.slots[id].busy = false
			t.slots[id].done = t.slots[id].total
			t.mu.Unlock()
			release()
		})
	}
}

// snapshot copies the slots, with the running tasks' progress estimated
// from the decode cost.
func (t *llamaSlotTable) snapshot(n int, perToken time.Duration) []llamaSlot {
	t.mu.Lock()
	defer t.mu.Unlock()
	out := make([]llamaSlot, n)
	copy(out, t.slots)
	for i := range out {
		if out[i].busy {
			out[i].done = out[i].total
			if perToken > 0 {
				out[i].done = min(int(time.Since(out[i].start)/perToken), out[i].total)
			}
		}
	}
	return out
}

// writeSlot writes one slot object (/slots element, props
// default_generation_settings).
func (s *Sim) writeSlot(w *jw, id int, sl llamaSlot) {
	idTask, params := int64(-1), llamaDefaultSampling()
	if sl.used {
		idTask, params = sl.idTask, sl.params
	}
	w.obj().kint("id", int64(id)).kint("id_task", idTask).kint("n_ctx", int64(s.llamaSlotCtx())).kbool("speculative", false).
		kbool("is_processing", sl.busy).kbool("non_causal", false).key("params")
	params.write(w)
	remain := -1
	if sl.used && params.nPredict >= 0 {
		remain = params.nPredict - sl.done
	}
	w.kstr("prompt", sl.prompt).key("next_token").obj().kbool("has_next_token", !sl.used || sl.busy).kbool("has_new_line", false).
		kint("n_remain", int64(remain)).kint("n_decoded", int64(sl.done)).kstr("stopping_word", "").end().end()
}

// llamaServeSlots is GET /slots; with ?fail_on_no_slot it answers 503 "no
// slot available" when every slot is busy (checked against the same build).
func (s *Sim) llamaServeSlots(ctx *fasthttp.RequestCtx) {
	slots := s.lslots.snapshot(s.llamaSlots(), s.cfg.DecodePerToken)
	busy := 0
	for _, sl := range slots {
		if sl.busy {
			busy++
		}
	}
	if ctx.QueryArgs().Has("fail_on_no_slot") && busy == len(slots) {
		s.writeError(ctx, nil, fasthttp.StatusServiceUnavailable, "no slot available", false)
		return
	}
	w := &jw{}
	w.arr()
	for i, sl := range slots {
		s.writeSlot(w, i, sl)
	}
	w.aend()
	ctx.SetContentType("application/json")
	ctx.SetBody(w.b)
}

// llamaProps is GET /props. build_info is the catalog's llama.cpp version,
// which is the captured build's own ("b0-unknown": built without git
// metadata), the build whose wire the persona speaks.
func (s *Sim) llamaProps(ctx *fasthttp.RequestCtx) {
	w := &jw{}
	w.obj().key("default_generation_settings")
	s.writeSlot(w, 0, llamaSlot{})
	w.kint("total_slots", int64(s.llamaSlots())).kstr("model_path", s.cfg.Model).
		kstr("chat_template", llamaChatMLTemplate).kstr("bos_token", "<s>").kstr("eos_token", "</s>").
		kstr("build_info", s.version).end()
	ctx.SetContentType("application/json")
	ctx.SetBody(w.b)
}

// llamaChatMLTemplate is the template llama-server falls back to for a
// model without one (cases props), which the builtin renderer implements.
const llamaChatMLTemplate = "{%- for message in messages -%}\n  {{- '<|im_start|>' + message.role + '\n' + message.content + '<|im_end|>\n' -}}\n{%- endfor -%}\n{%- if add_generation_prompt -%}\n  {{- '<|im_start|>assistant\n' -}}\n{%- endif -%}"

// llamaApplyTemplate is POST /apply-template: the rendered chat prompt.
func (s *Sim) llamaApplyTemplate(ctx *fasthttp.RequestCtx) {
	body, err := llamaParseBody(ctx.PostBody())
	if err != nil {
		s.writeError(ctx, nil, fasthttp.StatusInternalServerError, err.Error(), false)
		return
	}
	if status, msg := llamaValidate(apiChat, body); status != 0 {
		s.writeError(ctx, nil, status, msg, false)
		return
	}
	text, err := s.render.Render(llamaMessages(body["messages"]), true)
	if err != nil {
		s.writeError(ctx, nil, fasthttp.StatusInternalServerError, err.Error(), false)
		return
	}
	w := &jw{}
	w.obj().kstr("prompt", text).end()
	ctx.SetContentType("application/json")
	ctx.SetBody(w.b)
}

// llamaDetokenize is POST /detokenize; a body without "tokens" gives an
// empty content, as server.cpp handle_detokenize does.
func (s *Sim) llamaDetokenize(ctx *fasthttp.RequestCtx) {
	body, err := llamaParseBody(ctx.PostBody())
	if err != nil {
		s.writeError(ctx, nil, fasthttp.StatusInternalServerError, err.Error(), false)
		return
	}
	var ids []uint32
	if raw, ok := body["tokens"]; ok {
		if err := json.Unmarshal(raw, &ids); err != nil {
			s.writeError(ctx, nil, fasthttp.StatusInternalServerError, nlohmannTypeError("array", raw), false)
			return
		}
	}
	w := &jw{}
	w.obj().kstr("content", s.tok.Decode(ids)).end()
	ctx.SetContentType("application/json")
	ctx.SetBody(w.b)
}

// llamaEmbeddings serves /v1/embeddings (oai) and the native /embedding.
// Without --embeddings the server's pooling is "none": the OpenAI endpoint
// refuses (400) and the native one returns one vector per token. With
// --embeddings --pooling mean both return one vector per input. The
// vectors are deterministic noise of the model's width; that the native
// endpoint nests a pooled vector in a one-element array is not captured.
func (s *Sim) llamaEmbeddings(ctx *fasthttp.RequestCtx, oai bool) {
	body, err := llamaParseBody(ctx.PostBody())
	if err != nil {
		s.writeError(ctx, nil, fasthttp.StatusInternalServerError, err.Error(), false)
		return
	}
	if oai && !s.cfg.Embeddings {
		s.writeError(ctx, nil, fasthttp.StatusBadRequest, "Pooling type 'none' is not OAI compatible. Please use a different pooling type", false)
		return
	}
	raw, ok := body["input"]
	if !ok {
		raw, ok = body["content"]
	}
	if !ok {
		s.writeError(ctx, nil, fasthttp.StatusBadRequest, `"input" or "content" must be provided`, false)
		return
	}
	var inputs []string
	var one string
	if json.Unmarshal(raw, &one) == nil {
		inputs = []string{one}
	} else if err := json.Unmarshal(raw, &inputs); err != nil {
		// Token-id inputs are not simulated; other types are refused as
		// the tokenizer refuses them (case: "content": 5).
		s.writeError(ctx, nil, fasthttp.StatusInternalServerError, `"prompt" must be a string, an list of tokens, a list of mixed strings & tokens, or a list of prompts`, false)
		return
	}
	w := &jw{}
	if oai {
		model := s.cfg.Model
		var m string
		if json.Unmarshal(body["model"], &m) == nil && m != "" {
			model = m
		}
		total := 0
		w.obj().kstr("model", model).kstr("object", "list")
		data := &jw{}
		data.arr()
		for i, in := range inputs {
			ids := s.tok.Encode(append([]uint32(nil), s.bos...), in)
			total += len(ids)
			data.obj().key("embedding")
			writeVector(data, pooled(ids))
			data.kint("index", int64(i)).kstr("object", "embedding").end()
		}
		data.aend()
		w.key("usage").obj().kint("prompt_tokens", int64(total)).kint("total_tokens", int64(total)).end()
		w.key("data").raw(data.b).end()
	} else {
		w.arr()
		for i, in := range inputs {
			ids := s.tok.Encode(append([]uint32(nil), s.bos...), in)
			w.obj().kint("index", int64(i)).key("embedding").arr()
			if s.cfg.Embeddings {
				writeVector(w, pooled(ids))
			} else {
				for _, id := range ids {
					writeVector(w, tokenVector(id))
				}
			}
			w.aend().end()
		}
		w.aend()
	}
	ctx.SetContentType("application/json")
	ctx.SetBody(w.b)
}

func tokenVector(id uint32) []float64 {
	v := make([]float64, llamaNEmbd)
	h := uint64(id)
	for i := range v {
		h = splitmix64(h + uint64(i))
		v[i] = float64(int64(h>>11)%2000-1000) / 500
	}
	return v
}

// pooled is the L2-normalised mean of the tokens' vectors.
func pooled(ids []uint32) []float64 {
	sum := make([]float64, llamaNEmbd)
	for _, id := range ids {
		for i, x := range tokenVector(id) {
			sum[i] += x
		}
	}
	var norm float64
	for _, x := range sum {
		norm += x * x
	}
	if norm > 0 {
		n := math.Sqrt(norm)
		for i := range sum {
			sum[i] /= n
		}
	}
	return sum
}

func writeVector(w *jw, v []float64) {
	w.arr()
	for _, x := range v {
		w.float(x)
	}
	w.aend()
}

// llamaModel is the "model" of an OpenAI-style answer: the request's, or
// the alias when it named none (llama-server accepts any name).
func (s *Sim) llamaModel(job *genJob) string {
	if job.req != nil && job.req.Model != "" {
		return job.req.Model
	}
	return s.cfg.Model
}

// llamaTimings writes the timings object every OpenAI answer and final
// chunk carries, from the latency model (floored at 1 µs so that the
// rates stay finite).
func (s *Sim) llamaTimings(w *jw, out *genOutcome) {
	promptN := max(out.promptTokens-out.cachedTokens, 1)
	promptMS := max(float64(out.prefillCost.Microseconds())/1000, 0.001)
	predN := max(out.completionTokens, 1)
	predMS := max(float64((s.cfg.DecodePerToken*time.Duration(out.completionTokens)).Microseconds())/1000, 0.001)
	w.key("timings").obj().
		kint("prompt_n", int64(promptN)).
		key("prompt_ms").float(promptMS).
		key("prompt_per_token_ms").float(promptMS/float64(promptN)).
		key("prompt_per_second").float(1000*float64(promptN)/promptMS).
		kint("predicted_n", int64(out.completionTokens)).
		key("predicted_ms").float(predMS).
		key("predicted_per_token_ms").float(predMS / float64(predN)).
		key("predicted_per_second").float(1000 * float64(predN) / predMS).
		end()
}

func (s *Sim) llamaUsage(w *jw, out *genOutcome) {
	w.key("usage").obj().kint("completion_tokens", int64(out.completionTokens)).
		kint("prompt_tokens", int64(out.promptTokens)).
		kint("total_tokens", int64(out.promptTokens+out.completionTokens)).end()
}

func llamaObject(api apiKind, chunk bool) string {
	switch {
	case api == apiChat && chunk:
		return "chat.completion.chunk"
	case api == apiChat:
		return "chat.completion"
	}
	return "text_completion"
}

// renderLlamaFull renders a non-streamed answer in llama-server's key
// order (nlohmann ordered_json).
func (s *Sim) renderLlamaFull(job *genJob, out *genOutcome) []byte {
	text := strings.Join(out.pieces, "")
	w := &jw{b: make([]byte, 0, 768+len(text))}
	if job.api == apiLlama {
		s.renderLlamaFinal(w, job, out, text)
		return w.b
	}
	w.obj().key("choices").arr().obj()
	if job.api == apiChat {
		w.kstr("finish_reason", out.finish).kint("index", 0).key("message").obj().kstr("role", "assistant").kstr("content", text).end()
	} else {
		w.kstr("text", text).kint("index", 0).knull("logprobs").kstr("finish_reason", out.finish)
	}
	w.end().aend()
	w.kint("created", s.created()).kstr("model", s.llamaModel(job)).kstr("system_fingerprint", s.version).
		kstr("object", llamaObject(job.api, false))
	s.llamaUsage(w, out)
	w.kstr("id", s.responseID(job))
	s.llamaTimings(w, out)
	w.end()
	return w.b
}

// renderLlamaFinal writes native /completion's result: the whole answer,
// or the final stream event (content "" then). tokens is empty unless
// the request asked for them.
func (s *Sim) renderLlamaFinal(w *jw, job *genJob, out *genOutcome, text string) {
	stopType := "eos"
	if out.finish == "length" {
		stopType = "limit"
	}
	w.obj().kint("index", 0).kstr("content", text).key("tokens").arr().aend().kint("id_slot", int64(job.slot)).kbool("stop", true).
		kstr("model", s.cfg.Model).kint("tokens_predicted", int64(out.completionTokens)).kint("tokens_evaluated", int64(out.promptTokens)).
		key("generation_settings")
	s.samplingFor(job).write(w)
	w.kstr("prompt", s.tok.Decode(job.prompt)).kbool("has_new_line", strings.Contains(strings.Join(out.pieces, ""), "\n")).
		kbool("truncated", job.truncated).kstr("stop_type", stopType).kstr("stopping_word", "").
		kint("tokens_cached", int64(max(out.promptTokens+out.completionTokens-1, 0)))
	s.llamaTimings(w, out)
	w.end()
}

// renderLlamaChunks renders a streamed answer. The OpenAI endpoints send
// no role chunk: the first event already carries the first token; the
// final event has an empty delta (chat) or text (completions), the finish
// reason, usage and timings — whatever stream_options says — and [DONE]
// follows. The native endpoint sends one object per token and then the
// full result, with no [DONE].
func (s *Sim) renderLlamaChunks(job *genJob, out *genOutcome) []sseChunk {
	chunks := make([]sseChunk, 0, len(out.pieces)+2)
	add := func(w *jw, token bool) {
		b := make([]byte, 0, len(w.b)+8)
		b = append(append(append(b, "data: "...), w.b...), "\n\n"...)
		chunks = append(chunks, sseChunk{data: b, token: token})
	}
	if job.api == apiLlama {
		for i, p := range out.pieces {
			w := &jw{}
			w.obj().kint("index", 0).kstr("content", p).key("tokens").ints(out.ids[min(i, len(out.ids)):min(i+1, len(out.ids))]).
				kbool("stop", false).kint("id_slot", -1).kint("tokens_predicted", int64(i+1)).kint("tokens_evaluated", int64(out.promptTokens)).end()
			add(w, true)
		}
		w := &jw{}
		s.renderLlamaFinal(w, job, out, "")
		add(w, false)
		return chunks
	}
	id, created, model := s.responseID(job), s.created(), s.llamaModel(job)
	for _, p := range out.pieces {
		w := &jw{}
		w.obj().key("choices").arr().obj()
		if job.api == apiChat {
			w.knull("finish_reason").kint("index", 0).key("delta").obj().kstr("content", p).end().end().aend()
			w.kint("created", created).kstr("id", id).kstr("model", model).kstr("system_fingerprint", s.version).
				kstr("object", llamaObject(job.api, true))
		} else {
			w.kstr("text", p).kint("index", 0).knull("logprobs").knull("finish_reason").end().aend()
			w.kint("created", created).kstr("model", model).kstr("system_fingerprint", s.version).
				kstr("object", llamaObject(job.api, true)).kstr("id", id)
		}
		w.end()
		add(w, true)
	}
	w := &jw{}
	w.obj().key("choices").arr().obj()
	if job.api == apiChat {
		w.kstr("finish_reason", out.finish).kint("index", 0).key("delta").obj().end().end().aend()
		w.kint("created", created).kstr("id", id).kstr("model", model).kstr("system_fingerprint", s.version).
			kstr("object", llamaObject(job.api, true))
		s.llamaUsage(w, out)
	} else {
		w.kstr("text", "").kint("index", 0).knull("logprobs").kstr("finish_reason", out.finish).end().aend()
		w.kint("created", created).kstr("model", model).kstr("system_fingerprint", s.version).
			kstr("object", llamaObject(job.api, true))
		s.llamaUsage(w, out)
		w.kstr("id", id)
	}
	s.llamaTimings(w, out)
	w.end()
	add(w, false)
	return append(chunks, sseChunk{data: []byte("data: [DONE]\n\n")})
}

// collectLlamaMetrics sends llama-server's 12 Prometheus series (cases
// metrics_enabled_*: counters are named with their _total suffix in HELP
// and TYPE too). The time and decode figures come from the latency model.
func (s *Sim) collectLlamaMetrics(p emitter) {
	m := &s.metrics
	prompt, predicted := m.promptTokens.Load(), m.generationTokens.Load()
	promptSec := float64(prompt-m.prefixHits.Load()) * s.cfg.PrefillPerToken.Seconds()
	predSec := float64(predicted) * s.cfg.DecodePerToken.Seconds()
	rate := func(n int64, sec float64) float64 {
		if sec <= 0 {
			return 0
		}
		return float64(n) / sec
	}
	kvTokens := float64(s.cacheLen() * s.cfg.BlockSize)
	usage := float64(s.cacheLen()) / float64(s.cfg.CacheBlocks*len(s.ranks))
	counter := p.counter
	counter("llamacpp:prompt_tokens_total", "Number of prompt tokens processed.", float64(prompt))
	counter("llamacpp:prompt_seconds_total", "Prompt process time", promptSec)
	counter("llamacpp:tokens_predicted_total", "Number of generation tokens processed.", float64(predicted))
	counter("llamacpp:tokens_predicted_seconds_total", "Predict process time", predSec)
	counter("llamacpp:n_decode_total", "Total number of llama_decode() calls", float64(predicted))
	busy := 0.0
	if predicted > 0 {
		busy = 1
	}
	counter("llamacpp:n_busy_slots_per_decode", "Average number of busy slots per llama_decode() call", busy)
	p.gauge("llamacpp:prompt_tokens_seconds", "Average prompt throughput in tokens/s.", rate(prompt, promptSec))
	p.gauge("llamacpp:predicted_tokens_seconds", "Average generation throughput in tokens/s.", rate(predicted, predSec))
	p.gauge("llamacpp:kv_cache_usage_ratio", "KV-cache usage. 1 means 100 percent usage.", usage)
	p.gauge("llamacpp:kv_cache_tokens", "KV-cache tokens.", kvTokens)
	p.gauge("llamacpp:requests_processing", "Number of requests processing.", float64(s.running.Load()))
	p.gauge("llamacpp:requests_deferred", "Number of requests deferred.", float64(s.waiting.Load()))
}

// serveTokenizeLlama is POST /tokenize: {"tokens":[…]}, or [{id,piece}]
// with with_pieces; BOS only with add_special. A body without "content"
// gives no tokens (server.cpp handle_tokenize).
func (s *Sim) serveTokenizeLlama(ctx *fasthttp.RequestCtx) {
	body, err := llamaParseBody(ctx.PostBody())
	if err != nil {
		s.writeError(ctx, nil, fasthttp.StatusInternalServerError, err.Error(), false)
		return
	}
	var req struct {
		AddSpecial bool `json:"add_special"`
		WithPieces bool `json:"with_pieces"`
	}
	// Mistyped flags fall back to false, as json_value does.
	_ = json.Unmarshal(body["add_special"], &req.AddSpecial)
	_ = json.Unmarshal(body["with_pieces"], &req.WithPieces)
	var ids []uint32
	if raw, ok := body["content"]; ok {
		var content string
		if err := json.Unmarshal(raw, &content); err != nil {
			s.writeError(ctx, nil, fasthttp.StatusInternalServerError, nlohmannTypeError("string", raw), false)
			return
		}
		if req.AddSpecial {
			ids = append(ids, s.bos...)
		}
		ids = s.tok.Encode(ids, content)
	}
	w := &jw{}
	w.obj().key("tokens")
	if req.WithPieces {
		w.arr()
		for _, id := range ids {
			w.obj().kint("id", int64(id)).kstr("piece", s.tok.Decode([]uint32{id})).end()
		}
		w.aend()
	} else {
		w.ints(ids)
	}
	w.end()
	ctx.SetContentType("application/json")
	ctx.SetBody(w.b)
}

// llamaMessages reads messages llamaValidate accepted: an empty list is
// allowed, null content is empty, text parts are joined.
func llamaMessages(raw json.RawMessage) []tokenizer.Message {
	var msgs []struct {
		Role    string          `json:"role"`
		Content json.RawMessage `json:"content"`
	}
	_ = json.Unmarshal(raw, &msgs)
	out := make([]tokenizer.Message, 0, len(msgs))
	for _, m := range msgs {
		var text string
		if json.Unmarshal(m.Content, &text) != nil {
			var parts []struct {
				Text string `json:"text"`
			}
			_ = json.Unmarshal(m.Content, &parts)
			var b strings.Builder
			for _, p := range parts {
				b.WriteString(p.Text)
			}
			text = b.String()
		}
		out = append(out, tokenizer.Message{Role: m.Role, Content: text})
	}
	return out
}
