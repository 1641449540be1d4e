package labkit

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
)

// ErrNotCompletion classifies an answer body that is not an OpenAI
// completion (JSON or SSE).
var ErrNotCompletion = errors.New("labkit: not an OpenAI completion")

// Completion is what the runbooks read from an OpenAI answer, JSON or an
// SSE stream folded.
type Completion struct {
	ID     string // the answer's "id" (the first event's, for a stream)
	Text   string // choices' text, message and delta contents, in order
	Chunks int    // SSE data events before [DONE]; 0 for a JSON answer
	Done   bool   // the SSE stream ended with data: [DONE]
	// CachedTokens is usage.prompt_tokens_details.cached_tokens; -1 when
	// the answer carries none.
	CachedTokens int
	PromptTokens int // usage.prompt_tokens; 0 when absent
}

type openaiBody struct {
	ID      string `json:"id"`
	Choices []struct {
		Text    string `json:"text"`
		Message *struct {
			Content string `json:"content"`
		} `json:"message"`
		Delta *struct {
			Content string `json:"content"`
		} `json:"delta"`
	} `json:"choices"`
	Usage *struct {
		PromptTokens int `json:"prompt_tokens"`
		Details      *struct {
			Cached int `json:"cached_tokens"`
		} `json:"prompt_tokens_details"`
	} `json:"usage"`
}

func (c *Completion) add(b openaiBody) {
	if c.ID == "" {
		c.ID = b.ID
	}
	for _, ch := range b.Choices {
		c.Text += ch.Text
		if ch.Message != nil {
			c.Text += ch.Message.Content
		}
		if ch.Delta != nil {
			c.Text += ch.Delta.Content
		}
	}
	if b.Usage != nil {
		c.PromptTokens = b.Usage.PromptTokens
		if b.Usage.Details != nil {
			c.CachedTokens = b.Usage.Details.Cached
		}
	}
}

// ParseCompletion reads a non-streaming completion body (untrusted bytes
// from a worker or the gateway). It needs a JSON object with at least one
// choice; the error wraps ErrNotCompletion, and then CachedTokens is -1.
func ParseCompletion(body string) (Completion, error) {
	c := Completion{CachedTokens: -1}
	var b openaiBody
	if err := json.Unmarshal([]byte(body), &b); err != nil {
		return c, fmt.Errorf("%w: %w", ErrNotCompletion, err)
	}
	if len(b.Choices) == 0 {
		return c, fmt.Errorf("%w: no choices", ErrNotCompletion)
	}
	c.add(b)
	return c, nil
}

// ParseSSE folds an SSE completion stream (untrusted bytes): every
// "data:" event is JSON until the final "data: [DONE]", and at least one
// precedes it. Other SSE lines are ignored. On error (wrapping
// ErrNotCompletion) the Completion holds what was folded so far.
func ParseSSE(body string) (Completion, error) {
	c := Completion{CachedTokens: -1}
	sc := bufio.NewScanner(strings.NewReader(body))
	sc.Buffer(make([]byte, 64<<10), MaxBody)
	for sc.Scan() {
		data, ok := strings.CutPrefix(strings.TrimRight(sc.Text(), "\r"), "data:")
		if !ok {
			continue
		}
		data = strings.TrimSpace(data)
		if c.Done {
			return c, fmt.Errorf("%w: event after [DONE]", ErrNotCompletion)
		}
		if data == "[DONE]" {
			c.Done = true
			continue
		}
		var b openaiBody
		if err := json.Unmarshal([]byte(data), &b); err != nil {
			return c, fmt.Errorf("%w: SSE event %d: %w", ErrNotCompletion, c.Chunks+1, err)
		}
		c.Chunks++
		c.add(b)
	}
	if err := sc.Err(); err != nil {
		return c, fmt.Errorf("%w: %w", ErrNotCompletion, err)
	}
	if c.Chunks == 0 || !c.Done {
		return c, fmt.Errorf("%w: %d events, [DONE] seen: %v", ErrNotCompletion, c.Chunks, c.Done)
	}
	return c, nil
}

// CheckAnswer checks a 200 answer's body: for a stream, a text/event-stream
// content type and a complete SSE stream; otherwise a JSON completion.
func CheckAnswer(ex Exchange, stream bool) error {
	if !stream {
		_, err := ParseCompletion(ex.Body)
		return err
	}
	if ct := ex.Get("Content-Type"); !strings.HasPrefix(ct, "text/event-stream") {
		return fmt.Errorf("content type %q, want text/event-stream", ct)
	}
	_, err := ParseSSE(ex.Body)
	return err
}
