// Package llamacpp is llama.cpp's llama-server contract.
//
// Source of every fact: the wire captures of a real llama-server (build
// c392e50, 2025-02) in testdata/ (see testdata/PROVENANCE), unless a comment
// names another.
package llamacpp

import (
	"bytes"
	"encoding/json"
	"fmt"
	"time"

	"github.com/llmgw/llmgw/engines"
)

func init() { engines.Register(Adapter{}) }

// Adapter is llama.cpp's engines.Adapter.
type Adapter struct{}

func (Adapter) Kind() engines.Kind { return engines.LlamaCpp }
func (Adapter) Display() string    { return "llama.cpp" }

// IdleTimeout is how long llama-server keeps an idle keep-alive connection
// (and a connection that never sent a request): 5.0 s measured
// (transport.json), advertised as "Keep-Alive: timeout=5, max=100".
const IdleTimeout = 5 * time.Second

// MaxRequestsPerConn: the 100th answer on one connection carries
// "Connection: close".
const MaxRequestsPerConn = 100

// Conn: llama-server closes after every SSE answer (after the final
// 0-length chunk, though it advertised keep-alive), after 5 s idle and after
// 100 requests; it serves one connection per HTTP thread (4 with -np 2) and
// a reused connection's answer stalls ~40 ms (head and body written
// separately, Nagle against delayed ACK).
func (Adapter) Conn() engines.ConnPolicy {
	return engines.ConnPolicy{
		CloseAfterStream:   true,
		IdleTimeout:        IdleTimeout,
		MaxRequestsPerConn: MaxRequestsPerConn,
		ServingConns:       HTTPThreads(2, 2), // the captured -np 2 on 2 vCPUs: 4
		ReusedConnStall:    true,
	}
}

// clientFault500 are the messages of 500 answers that are the client's
// fault: llama-server reports request validation failures as 500
// server_error (cases err_malformed_json, err_empty_body_*,
// err_missing_messages, err_messages_not_array, err_missing_prompt_v1,
// err_n2, err_n2_stream).
var clientFault500 = [][]byte{
	[]byte("[json.exception."),
	[]byte("Only one completion choice is allowed"),
	[]byte(`\"prompt\" is required`),
	[]byte("\"prompt\" is required"),
}

// Classify: 4xx and 501 not_supported_error are the client's (a feature the
// server was not started with); 503 "Loading model" is overload; a 500 whose
// message is one of the validation failures above is the client's; other
// 5xx are the engine's.
func (Adapter) Classify(status int, body []byte) engines.Fault {
	switch {
	case status < 400:
		return engines.FaultNone
	case status < 500, status == 501:
		return engines.FaultClient
	case status == 503:
		return engines.FaultOverloaded
	case status == 500:
		for _, m := range clientFault500 {
			if bytes.Contains(body, m) {
				return engines.FaultClient
			}
		}
	}
	return engines.FaultEngine
}

// Surfaces: /health, /props (build_info is the only version it reports),
// /tokenize, and /metrics only with --metrics (501 otherwise).
func (Adapter) Surfaces() engines.Surfaces {
	return engines.Surfaces{
		Health:       "/health",
		Version:      "/props",
		Tokenize:     "/tokenize",
		Metrics:      "/metrics",
		MetricsOptIn: "--metrics",
		Models:       "/v1/models",
	}
}

// ParseVersion reads /props' build_info ("b4747-c392e50", or "b0-unknown"
// for a build without git metadata, as in the captures).
func (Adapter) ParseVersion(body []byte) (string, error) {
	var p struct {
		BuildInfo string `json:"build_info"`
	}
	if err := json.Unmarshal(body, &p); err != nil {
		return "", fmt.Errorf("llamacpp: /props: %w", err)
	}
	if p.BuildInfo == "" {
		return "", fmt.Errorf("%w: /props has no build_info", engines.ErrNoVersion)
	}
	return p.BuildInfo, nil
}

// Metrics: llama-server exports no request or prefix-cache counters; cache
// reuse shows in each answer: timings.prompt_n counts only the prompt
// tokens evaluated, usage.prompt_tokens all of them (34 and 34 on a first
// chat_json, 1 and 34 on its repeat). The captured build's timings have no
// cache_n.
func (Adapter) Metrics() engines.MetricNames {
	return engines.MetricNames{
		PromptTokens:    "llamacpp:prompt_tokens_total",
		RunningRequests: "llamacpp:requests_processing",
		WaitingRequests: "llamacpp:requests_deferred",
	}
}

// Tokenize: POST /tokenize {"content", "add_special" (default false),
// "with_pieces"} answers {"tokens":[...]} (cases tokenize,
// tokenize_add_special, tokenize_with_pieces: without add_special no BOS).
func (Adapter) Tokenize() *engines.TokenizeShape {
	return &engines.TokenizeShape{TextField: "content", AddSpecialField: "add_special", TokensField: "tokens"}
}

// KV: llama.cpp publishes no KV-cache events.
func (Adapter) KV() *engines.KVContract { return nil }

// PD: llama.cpp has no prefill/decode disaggregation.
func (Adapter) PD() engines.PDProtocol { return nil }

// HTTPThreads is the size of llama-server's HTTP thread pool when
// --threads-http is not given: max(n_parallel+2, hardware threads-1)
// (examples/server/server.cpp at c392e50). Each thread serves one
// connection for its whole keep-alive life, so this many connections are
// served at once; the captures' "-np 2" on 2 vCPUs logged "http threads:
// 4".
func HTTPThreads(nParallel, hwThreads int) int { return max(nParallel+2, hwThreads-1) }

// ReusedConnStall is the delay between the response head and the body of
// a non-streamed answer on a reused keep-alive connection: 43.8 ms median
// for GET /health (head at 0.16 ms, body at 43.8 ms) and 41.7 ms for a chat
// answer, 20 samples each (transport.json,
// latency_reused_vs_new_connection). A streamed answer on a reused
// connection is not delayed (checked against the same build: head at
// 0.4 ms, first chunks at 2.2 ms). It is Linux's delayed-ACK timer
// (40 ms minimum) meeting Nagle's algorithm on the server's socket
// (cpp-httplib's CPPHTTPLIB_TCP_NODELAY defaults to false) and two writes
// per answer (head, then body: write_response_core), so a client that
// acknowledges at once does not see it; the simulator's persona
// reproduces the mechanism, not this figure.
const ReusedConnStall = 44 * time.Millisecond
