// Package loadgen holds the pieces both llmgw benchmarks share: latency
// summaries and a reader for OpenAI-style server-sent event streams. It
// sends no load itself; bench/overhead and bench/routing do.
package loadgen

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"slices"
	"time"
)

// Summary condenses a set of latencies. The zero value means "no samples".
type Summary struct {
	Count int           `json:"count"`
	Mean  time.Duration `json:"mean_ns"`
	P50   time.Duration `json:"p50_ns"`
	P90   time.Duration `json:"p90_ns"`
	P99   time.Duration `json:"p99_ns"`
	Max   time.Duration `json:"max_ns"`
}

// Summarize sorts samples in place and returns their summary; an empty
// slice gives the zero Summary.
func Summarize(samples []time.Duration) Summary {
	if len(samples) == 0 {
		return Summary{}
	}
	slices.Sort(samples)
	var sum time.Duration
	for _, d := range samples {
		sum += d
	}
	return Summary{
		Count: len(samples),
		Mean:  sum / time.Duration(len(samples)),
		P50:   Quantile(samples, 0.50),
		P90:   Quantile(samples, 0.90),
		P99:   Quantile(samples, 0.99),
		Max:   samples[len(samples)-1],
	}
}

// Quantile returns the q-quantile (0 ≤ q ≤ 1) of sorted samples by the
// nearest-rank method, so the result is always an observed value; it
// returns 0 for an empty slice.
func Quantile(sorted []time.Duration, q float64) time.Duration {
	if len(sorted) == 0 {
		return 0
	}
	rank := int(math.Ceil(q*float64(len(sorted)))) - 1
	return sorted[min(max(rank, 0), len(sorted)-1)]
}

// ErrStream classifies malformed event streams and chunks; test with
// errors.Is.
var ErrStream = errors.New("loadgen: malformed event stream")

// maxEventBytes bounds one SSE line; a longer line is an error rather than
// unbounded buffering of a misbehaving peer's output.
const maxEventBytes = 1 << 20

// SSEReader reads the data payloads of a server-sent event stream. It is
// not safe for concurrent use.
type SSEReader struct {
	sc *bufio.Scanner
}

// NewSSEReader reads events from r.
func NewSSEReader(r io.Reader) *SSEReader {
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 0, 4096), maxEventBytes)
	return &SSEReader{sc: sc}
}

// Next returns the payload of the next "data:" line (without the prefix
// and the optional single space). Comment lines, blank lines and other
// fields are skipped. It returns io.EOF at the end of the stream and an
// error wrapping ErrStream for an over-long line. The returned slice is
// valid only until the next call.
func (r *SSEReader) Next() ([]byte, error) {
	for r.sc.Scan() {
		line := r.sc.Bytes()
		rest, ok := bytes.CutPrefix(line, []byte("data:"))
		if !ok {
			continue
		}
		rest, _ = bytes.CutPrefix(rest, []byte(" "))
		return rest, nil
	}
	if err := r.sc.Err(); err != nil {
		if errors.Is(err, bufio.ErrTooLong) {
			return nil, fmt.Errorf("%w: line longer than %d bytes", ErrStream, maxEventBytes)
		}
		return nil, fmt.Errorf("loadgen: read stream: %w", err)
	}
	return nil, io.EOF
}

// Chunk is what the benchmarks read from one streamed completion chunk.
type Chunk struct {
	// Done reports the terminal "[DONE]" event; the other fields are zero.
	Done bool
	// Content is the concatenated text of the choices' deltas (chat) or
	// text fields (completions).
	Content string
	// HasUsage reports a usage object; PromptTokens and CachedTokens are
	// the engine's figures (cached = prompt_tokens_details.cached_tokens).
	HasUsage     bool
	PromptTokens int
	CachedTokens int
}

type wireChunk struct {
	Choices []struct {
		Delta struct {
			Content *string `json:"content"`
		} `json:"delta"`
		Text *string `json:"text"`
	} `json:"choices"`
	Usage *struct {
		PromptTokens int `json:"prompt_tokens"`
		Details      *struct {
			CachedTokens int `json:"cached_tokens"`
		} `json:"prompt_tokens_details"`
	} `json:"usage"`
}

// ParseChunk decodes one SSE data payload of an OpenAI-style stream. A
// payload that is not "[DONE]" and not a JSON object gives an error
// wrapping ErrStream.
func ParseChunk(data []byte) (Chunk, error) {
	data = bytes.TrimSpace(data)
	if string(data) == "[DONE]" {
		return Chunk{Done: true}, nil
	}
	var w wireChunk
	if err := json.Unmarshal(data, &w); err != nil {
		return Chunk{}, fmt.Errorf("%w: chunk: %w", ErrStream, err)
	}
	var c Chunk
	for _, ch := range w.Choices {
		if ch.Delta.Content != nil {
			c.Content += *ch.Delta.Content
		}
		if ch.Text != nil {
			c.Content += *ch.Text
		}
	}
	if w.Usage != nil {
		c.HasUsage, c.PromptTokens = true, w.Usage.PromptTokens
		if w.Usage.Details != nil {
			c.CachedTokens = w.Usage.Details.CachedTokens
		}
	}
	if c.PromptTokens < 0 || c.CachedTokens < 0 || c.CachedTokens > c.PromptTokens {
		return Chunk{}, fmt.Errorf("%w: usage: cached %d of %d prompt tokens", ErrStream, c.CachedTokens, c.PromptTokens)
	}
	return c, nil
}
