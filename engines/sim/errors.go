package sim

import (
	"github.com/valyala/fasthttp"

	"github.com/llmgw/llmgw/engines"
)

// errorBody renders an error in the persona's exact shape:
//
//	vLLM      {"error":{"message","type","param":null,"code"}}
//	SGLang    {"object":"error","message","type","param":null,"code"}
//	TRT-LLM   the SGLang-like flat object; request validation errors are
//	          {"error":"<message>"} (validation=true)
//	llama.cpp {"error":{"code","message","type"}}
//
// validation marks a request the framework's request validation rejected
// (FastAPI's RequestValidationError: a body that is not JSON, a missing or
// mistyped field) as opposed to one the engine's serving code refused.
// vLLM and SGLang type the former with the HTTP status phrase ("Bad
// Request") and the latter "BadRequestError"; see the err_malformed_json
// fixtures under engines/<engine>/testdata/cases.
func (s *Sim) errorBody(status int, msg string, validation bool) []byte {
	w := jw{b: make([]byte, 0, 96+len(msg))}
	typ := pythonErrorType(status)
	if validation && status == fasthttp.StatusBadRequest {
		typ = "Bad Request"
	}
	switch s.cfg.Engine {
	case engines.VLLM:
		w.obj().key("error").obj().kstr("message", msg).kstr("type", typ).knull("param").kint("code", int64(status)).end().end()
	case engines.TRTLLM:
		if validation {
			w.obj().kstr("error", msg).end()
			break
		}
		w.obj().kstr("object", "error").kstr("message", msg).kstr("type", pythonErrorType(status)).knull("param").kint("code", int64(status)).end()
	case engines.SGLang:
		w.obj().kstr("object", "error").kstr("message", msg).kstr("type", typ).knull("param").kint("code", int64(status)).end()
	case engines.LlamaCpp:
		w.obj().key("error").obj().kint("code", int64(status)).kstr("message", msg).kstr("type", llamaErrorType(status)).end().end()
	}
	return w.b
}

// pythonErrorType is the OpenAI-style error type the Python servers use.
func pythonErrorType(status int) string {
	switch status {
	case fasthttp.StatusBadRequest:
		return "BadRequestError"
	case fasthttp.StatusNotFound:
		return "NotFoundError"
	case fasthttp.StatusNotImplemented:
		return "NotImplementedError"
	case fasthttp.StatusServiceUnavailable:
		return "ServiceUnavailableError"
	case fasthttp.StatusGatewayTimeout, fasthttp.StatusRequestTimeout:
		return "TimeoutError"
	default:
		return "InternalServerError"
	}
}

// llamaErrorType maps a status to llama-server's error type.
func llamaErrorType(status int) string {
	switch status {
	case 400:
		return "invalid_request_error"
	case 401:
		return "authentication_error"
	case 403:
		return "permission_error"
	case 404:
		return "not_found_error"
	case 501:
		return "not_supported_error"
	case 503:
		return "unavailable_error"
	default:
		return "server_error"
	}
}

// midStreamErrorMessage is the text of an injected mid-stream error.
const midStreamErrorMessage = "sim: injected fault (error_after_chunks)"

// midStreamError appends the persona's mid-stream error event to chunks:
// vLLM, TensorRT-LLM and llama.cpp send {"error":{...}} in their error
// shape, SGLang wraps its flat error object; OpenAI streams then end with
// [DONE], llama.cpp native streams do not.
func (s *Sim) midStreamError(job *genJob, chunks []sseChunk) []sseChunk {
	const status = fasthttp.StatusInternalServerError
	var body []byte
	switch s.cfg.Engine {
	case engines.SGLang:
		body = append([]byte(`{"error":`), s.errorBody(status, midStreamErrorMessage, false)...)
		body = append(body, '}')
	case engines.TRTLLM:
		w := jw{}
		w.obj().key("error").obj().kstr("message", midStreamErrorMessage).kstr("type", pythonErrorType(status)).knull("param").kint("code", status).end().end()
		body = w.b
	default:
		body = s.errorBody(status, midStreamErrorMessage, false)
	}
	ev := append(append([]byte("data: "), body...), "\n\n"...)
	chunks = append(chunks, sseChunk{data: ev})
	if job.api != apiLlama {
		chunks = append(chunks, sseChunk{data: []byte("data: [DONE]\n\n")})
	}
	return chunks
}

// writeError sends an error response and records it on rec (when non-nil).
func (s *Sim) writeError(ctx *fasthttp.RequestCtx, rec *Receipt, status int, msg string, validation bool) {
	ctx.SetStatusCode(status)
	ctx.SetContentType("application/json")
	ctx.SetBody(s.errorBody(status, msg, validation))
	if rec != nil {
		rec.Status = status
		rec.Error = msg
		s.receipts.add(*rec)
	}
}

// notFound answers an unknown route the way the engine's HTTP framework
// does (FastAPI for the Python engines, llama-server's own handler).
func (s *Sim) notFound(ctx *fasthttp.RequestCtx) {
	ctx.SetStatusCode(fasthttp.StatusNotFound)
	ctx.SetContentType("application/json")
	if s.cfg.Engine == engines.LlamaCpp {
		ctx.SetBodyString(`{"error":{"code":404,"message":"File Not Found","type":"not_found_error"}}`)
		return
	}
	ctx.SetBodyString(`{"detail":"Not Found"}`)
}

func (s *Sim) methodNotAllowed(ctx *fasthttp.RequestCtx) {
	ctx.SetStatusCode(fasthttp.StatusMethodNotAllowed)
	ctx.SetContentType("application/json")
	ctx.SetBodyString(`{"detail":"Method Not Allowed"}`)
}
