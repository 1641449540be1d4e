package gateway

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"net"
	"os"
	"strconv"
	"strings"
	"syscall"

	"github.com/valyala/fasthttp"

	"github.com/llmgw/llmgw/gateway/openai"
	"github.com/llmgw/llmgw/gateway/policy"
)

// The gateway's own failures. Every error the data plane answers with is one
// of these (possibly wrapped with detail); statusFor maps them to an HTTP
// status and an OpenAI error body in one place.
var (
	// ErrBadRequest: the body is not a valid request (400).
	ErrBadRequest = errors.New("gateway: invalid request")
	// ErrUnknownModel: no rule serves the requested model and there is no
	// default rule (404).
	ErrUnknownModel = errors.New("gateway: model not served")
	// ErrNotFound: no route for the path (404).
	ErrNotFound = errors.New("gateway: no route")
	// ErrMethodNotAllowed: e.g. GET on a completion path (405).
	ErrMethodNotAllowed = errors.New("gateway: method not allowed")
	// ErrBodyTooLarge: the request body is over the configured limit (413).
	ErrBodyTooLarge = errors.New("gateway: request body too large")
	// ErrHeaderTooLarge: the request header block is over the read buffer
	// (431).
	ErrHeaderTooLarge = errors.New("gateway: request header too large")
	// ErrRequestTimeout: the client did not send a whole request within the
	// read timeout (408).
	ErrRequestTimeout = errors.New("gateway: request read timed out")
	// ErrNoEndpoint: the rule has no available endpoint (503).
	ErrNoEndpoint = policy.ErrNoEndpoint
	// ErrUpstreamUnreachable: the chosen worker (and the retry's) could not be
	// connected, or closed before answering (502).
	ErrUpstreamUnreachable = errors.New("gateway: backend unreachable")
	// ErrUpstreamTimeout: the worker did not answer in time (504).
	ErrUpstreamTimeout = errors.New("gateway: backend timed out")
	// ErrServerClosed: the gateway is shutting down (503).
	ErrServerClosed = errors.New("gateway: server closed")
	// ErrUpstreamFailed: the worker's answer could not be read (502).
	ErrUpstreamFailed = errors.New("gateway: backend response failed")
	// ErrBufferBudget: the answer has to be buffered (the client cannot take
	// a stream of unknown length) and the global buffer budget is spent (503).
	ErrBufferBudget = errors.New("gateway: response buffer budget spent")
	// ErrStreamNeedsHTTP11: a stream asked over HTTP/1.0 (400). HTTP/1.0 has
	// no chunked coding: a stream of unknown length could only end by
	// closing the connection, which a client cannot tell from a cut.
	ErrStreamNeedsHTTP11 = errors.New("gateway: streaming needs HTTP/1.1")
)

// DialError is a failure to connect to a worker. Nothing reached the
// worker, so the request may be retried on another one.
type DialError struct {
	Addr string
	Err  error
}

func (e *DialError) Error() string { return "gateway: dial " + e.Addr + ": " + e.Err.Error() }
func (e *DialError) Unwrap() error { return e.Err }

// apiError is the OpenAI error object: {"error":{"message","type","param","code"}}.
type apiError struct {
	Error struct {
		Message string  `json:"message"`
		Type    string  `json:"type"`
		Param   *string `json:"param"`
		Code    string  `json:"code"`
	} `json:"error"`
}

// statusFor maps an error to its HTTP status, OpenAI error type and stable
// code. It is the only place that does so.
func statusFor(err error) (status int, typ, code string) {
	var ne net.Error
	switch {
	case errors.Is(err, ErrPDPoolUnavailable):
		return fasthttp.StatusServiceUnavailable, "server_error", "pd_pool_unavailable"
	case errors.Is(err, ErrPDPrefillTimeout):
		return fasthttp.StatusGatewayTimeout, "server_error", "pd_prefill_timeout"
	case errors.Is(err, ErrPDDecodeTimeout):
		return fasthttp.StatusGatewayTimeout, "server_error", "pd_decode_timeout"
	case errors.Is(err, ErrPDDecodeStalled):
		return fasthttp.StatusBadGateway, "server_error", "pd_decode_stream_timeout"
	case errors.Is(err, ErrPDPrefillFailed):
		return fasthttp.StatusBadGateway, "server_error", "pd_prefill_failed"
	case errors.Is(err, ErrPDDecodeDied):
		return fasthttp.StatusBadGateway, "server_error", "pd_decode_backend_died"
	case errors.Is(err, ErrPDBodyTooLarge):
		return fasthttp.StatusRequestEntityTooLarge, "invalid_request_error", "pd_body_too_large"
	case errors.Is(err, errClientGone):
		// Never seen by the client (it left); the status is for logs and
		// metrics, as nginx's 499.
		return 499, "client_closed_request", "client_closed_request"
	case errors.Is(err, ErrBufferBudget):
		return fasthttp.StatusServiceUnavailable, "server_error", "buffer_budget_exhausted"
	case errors.Is(err, ErrStreamNeedsHTTP11):
		return fasthttp.StatusBadRequest, "invalid_request_error", "stream_requires_http11"
	case errors.Is(err, ErrBadRequest), errors.Is(err, openai.ErrInvalid):
		return fasthttp.StatusBadRequest, "invalid_request_error", "invalid_request"
	case errors.Is(err, ErrUnknownModel):
		return fasthttp.StatusNotFound, "invalid_request_error", "model_not_found"
	case errors.Is(err, ErrNotFound):
		return fasthttp.StatusNotFound, "invalid_request_error", "not_found"
	case errors.Is(err, ErrMethodNotAllowed):
		return fasthttp.StatusMethodNotAllowed, "invalid_request_error", "method_not_allowed"
	case errors.Is(err, ErrBodyTooLarge), errors.Is(err, fasthttp.ErrBodyTooLarge):
		return fasthttp.StatusRequestEntityTooLarge, "invalid_request_error", "request_too_large"
	case errors.Is(err, ErrHeaderTooLarge):
		return fasthttp.StatusRequestHeaderFieldsTooLarge, "invalid_request_error", "request_header_too_large"
	case errors.Is(err, ErrRequestTimeout):
		return fasthttp.StatusRequestTimeout, "invalid_request_error", "request_timeout"
	case errors.Is(err, ErrServerClosed):
		return fasthttp.StatusServiceUnavailable, "server_error", "server_shutting_down"
	case errors.Is(err, ErrNoEndpoint):
		return fasthttp.StatusServiceUnavailable, "server_error", "no_available_endpoint"
	// A dial error is tested before timeouts: a connect timeout is a
	// failure to reach the worker (nothing sent, retried elsewhere), not a
	// worker that took too long to answer.
	case errors.Is(err, ErrUpstreamUnreachable), isDialError(err):
		return fasthttp.StatusBadGateway, "server_error", "backend_unreachable"
	case errors.Is(err, ErrUpstreamTimeout), errors.Is(err, fasthttp.ErrTimeout),
		errors.Is(err, os.ErrDeadlineExceeded), errors.Is(err, context.DeadlineExceeded),
		errors.As(err, &ne) && ne.Timeout():
		return fasthttp.StatusGatewayTimeout, "server_error", "backend_timeout"
	default:
		return fasthttp.StatusBadGateway, "server_error", "backend_failed"
	}
}

func isDialError(err error) bool {
	var de *DialError
	return errors.As(err, &de)
}

// notSent reports whether a failed send provably reached no worker: the
// connection could not be made, a pooled connection was dead before the
// request was written, writing the request failed (upconn.go), or the
// gateway had no free connection to the endpoint.
func notSent(err error) bool {
	var se *sendError
	return isDialError(err) || errors.Is(err, errStaleConn) || errors.Is(err, errConnRetired) ||
		errors.Is(err, fasthttp.ErrNoFreeConns) || errors.As(err, &se)
}

// reusedNotSent reports whether the send failed on a reused pooled
// connection before the worker could have read the request: the endpoint
// is not to blame, and a new connection to it may carry the request.
func reusedNotSent(err error) bool {
	if err == nil {
		return false
	}
	var se *sendError
	return errors.Is(err, errStaleConn) || errors.Is(err, errConnRetired) || (errors.As(err, &se) && se.reused)
}

// notSentText describes a failure that reached no worker, in the gateway's
// own words (never the worker's bytes).
func notSentText(err error) string {
	var de *DialError
	var dns *net.DNSError
	var ne net.Error
	switch {
	case errors.As(err, &dns):
		return "DNS lookup failed"
	case errors.As(err, &de) && strings.HasPrefix(de.Err.Error(), "TLS handshake"):
		return "TLS handshake failed"
	case errors.As(err, &de) && errors.As(err, &ne) && ne.Timeout():
		return "connect timed out"
	case errors.Is(err, syscall.ECONNREFUSED):
		return "connection refused"
	case isDialError(err):
		return "connect failed"
	default:
		return "sending the request failed"
	}
}

// afterSendText describes a failure after the whole request was written, in
// the gateway's own words: fasthttp's own error texts quote the worker's
// header bytes, which must not reach the client. An answer's body has no
// size limit (it is streamed to the client: roundTrip reads it with
// ReadLimitBody's 0, no limit), so there is no "too large" case.
func afterSendText(err error) string {
	var small *fasthttp.ErrSmallBuffer
	switch {
	case errors.Is(err, fasthttp.ErrConnectionClosed), errors.Is(err, io.EOF), errors.Is(err, io.ErrUnexpectedEOF),
		errors.Is(err, syscall.ECONNRESET), errors.Is(err, syscall.EPIPE), errors.Is(err, net.ErrClosed):
		return "closed the connection before the answer was complete"
	case errors.As(err, &small), errors.Is(err, errAnswerHeadTooLarge):
		return "sent a response header block over the read buffer"
	default:
		return "sent a response that could not be parsed"
	}
}

// logErrText is err's text for the gateway's own log, bounded: a parse
// error may quote kilobytes of the worker's bytes.
func logErrText(err error) string {
	t := err.Error()
	if len(t) > 256 {
		t = t[:256] + "…"
	}
	return t
}

// writeError answers ctx with err as an OpenAI error body.
func writeError(ctx *fasthttp.RequestCtx, err error) {
	status, b := errorJSON(err)
	ctx.Response.Reset()
	ctx.SetStatusCode(status)
	ctx.SetContentType("application/json")
	// Every answer carries a request id, the gateway's own errors too: the
	// one forward sent the worker (set on the request), the client's, or a
	// fresh one.
	if v := ctx.Request.Header.PeekBytes(hdrRequestID); len(v) > 0 && len(v) <= 256 && printable(v) {
		ctx.Response.Header.SetBytesKV(hdrRequestID, v)
	} else {
		var id [32]byte
		newRequestID(&id)
		ctx.Response.Header.SetBytesKV(hdrRequestID, id[:])
	}
	ctx.SetBody(b)
}

// errorJSON is err's status and OpenAI error body.
func errorJSON(err error) (status int, body []byte) {
	status, typ, code := statusFor(err)
	var e apiError
	e.Error.Message = err.Error()
	e.Error.Type = typ
	e.Error.Code = code
	// A struct of strings always marshals.
	body, _ = json.Marshal(&e)
	return status, body
}

// sseErrorEvent is the event a stream ends with when its worker fails after
// the response began: clients see an error, never a silent truncation.
func sseErrorEvent(err error) []byte {
	_, b := errorJSON(err)
	out := make([]byte, 0, len(b)+32)
	out = append(out, "data: "...)
	out = append(out, b...)
	out = append(out, "\n\ndata: [DONE]\n\n"...)
	return out
}

var statusText [600]string

func init() {
	for i := range statusText {
		statusText[i] = strconv.Itoa(i)
	}
}

// statusLabel returns the decimal status for metric labels without allocating.
func statusLabel(code int) string {
	if code >= 0 && code < len(statusText) {
		return statusText[code]
	}
	return "other"
}
