package loadgen

import (
	"errors"
	"io"
	"strings"
	"testing"
	"time"
)

func TestQuantile(t *testing.T) {
	ms := func(v ...int) []time.Duration {
		out := make([]time.Duration, len(v))
		for i, x := range v {
			out[i] = time.Duration(x) * time.Millisecond
		}
		return out
	}
	cases := []struct {
		name    string
		samples []time.Duration
		q       float64
		want    time.Duration
	}{
		{"empty", nil, 0.5, 0},
		{"single", ms(7), 0.99, 7 * time.Millisecond},
		{"median of odd", ms(1, 2, 3, 4, 5), 0.5, 3 * time.Millisecond},
		{"median of even takes the lower rank", ms(1, 2, 3, 4), 0.5, 2 * time.Millisecond},
		{"p99 of 100 is the 99th", ms(seq(100)...), 0.99, 99 * time.Millisecond},
		{"q 0 is the minimum", ms(4, 5, 6), 0, 4 * time.Millisecond},
		{"q 1 is the maximum", ms(4, 5, 6), 1, 6 * time.Millisecond},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			if got := Quantile(tc.samples, tc.q); got != tc.want {
				t.Errorf("Quantile(%v, %v) = %v; want %v", tc.samples, tc.q, got, tc.want)
			}
		})
	}
}

func seq(n int) []int {
	out := make([]int, n)
	for i := range out {
		out[i] = i + 1
	}
	return out
}

func TestSummarizeSortsAndAverages(t *testing.T) {
	s := Summarize([]time.Duration{3, 1, 2})
	want := Summary{Count: 3, Mean: 2, P50: 2, P90: 3, P99: 3, Max: 3}
	if s != want {
		t.Errorf("Summarize = %+v; want %+v", s, want)
	}
	if got := Summarize(nil); got != (Summary{}) {
		t.Errorf("Summarize(nil) = %+v; want zero", got)
	}
}

func TestSSEReader(t *testing.T) {
	cases := []struct {
		name    string
		stream  string
		want    []string
		wantErr error
	}{
		{"two events and done", "data: {\"a\":1}\n\ndata: {\"b\":2}\n\ndata: [DONE]\n\n", []string{`{"a":1}`, `{"b":2}`, "[DONE]"}, io.EOF},
		{"no space after colon", "data:x\n\n", []string{"x"}, io.EOF},
		{"comments and other fields skipped", ": ping\nevent: message\nid: 4\ndata: y\n\n", []string{"y"}, io.EOF},
		{"crlf line ends", "data: z\r\n\r\n", []string{"z"}, io.EOF},
		{"empty stream", "", nil, io.EOF},
		{"over-long line", "data: " + strings.Repeat("x", maxEventBytes+1) + "\n", nil, ErrStream},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			r := NewSSEReader(strings.NewReader(tc.stream))
			var got []string
			var err error
			for {
				var b []byte
				if b, err = r.Next(); err != nil {
					break
				}
				got = append(got, string(b))
			}
			if !errors.Is(err, tc.wantErr) {
				t.Errorf("final error %v; want %v", err, tc.wantErr)
			}
			if strings.Join(got, "|") != strings.Join(tc.want, "|") {
				t.Errorf("events %q; want %q", got, tc.want)
			}
		})
	}
}

func TestParseChunk(t *testing.T) {
	cases := []struct {
		name    string
		data    string
		want    Chunk
		wantErr bool
	}{
		{"done", "[DONE]", Chunk{Done: true}, false},
		{"chat delta", `{"choices":[{"index":0,"delta":{"content":" a"}}]}`, Chunk{Content: " a"}, false},
		{"role only", `{"choices":[{"index":0,"delta":{"role":"assistant","content":""}}]}`, Chunk{}, false},
		{"completion text", `{"choices":[{"text":" be"}]}`, Chunk{Content: " be"}, false},
		{"usage with cached", `{"choices":[],"usage":{"prompt_tokens":40,"completion_tokens":3,"prompt_tokens_details":{"cached_tokens":32}}}`,
			Chunk{HasUsage: true, PromptTokens: 40, CachedTokens: 32}, false},
		{"usage without details", `{"usage":{"prompt_tokens":5}}`, Chunk{HasUsage: true, PromptTokens: 5}, false},
		{"cached above prompt", `{"usage":{"prompt_tokens":5,"prompt_tokens_details":{"cached_tokens":6}}}`, Chunk{}, true},
		{"not json", `{"choices":`, Chunk{}, true},
		{"array", `[1,2]`, Chunk{}, true},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			got, err := ParseChunk([]byte(tc.data))
			if (err != nil) != tc.wantErr {
				t.Fatalf("ParseChunk error %v; want error %v", err, tc.wantErr)
			}
			if err != nil && !errors.Is(err, ErrStream) {
				t.Errorf("error %v does not wrap ErrStream", err)
			}
			if got != tc.want {
				t.Errorf("ParseChunk = %+v; want %+v", got, tc.want)
			}
		})
	}
}

func FuzzSSEAndChunk(f *testing.F) {
	f.Add([]byte("data: {\"choices\":[{\"delta\":{\"content\":\"x\"}}]}\n\ndata: [DONE]\n\n"))
	f.Add([]byte("data: {\"usage\":{\"prompt_tokens\":3,\"prompt_tokens_details\":{\"cached_tokens\":1}}}\n"))
	f.Add([]byte(": comment\r\nevent: x\r\ndata:\r\n"))
	f.Add([]byte("data: [1,2,3]\n"))
	f.Fuzz(func(t *testing.T, stream []byte) {
		r := NewSSEReader(strings.NewReader(string(stream)))
		for i := 0; ; i++ {
			b, err := r.Next()
			if err != nil {
				if !errors.Is(err, io.EOF) && !errors.Is(err, ErrStream) {
					t.Fatalf("unclassified error %v", err)
				}
				return
			}
			if i > len(stream) {
				t.Fatalf("more events than bytes")
			}
			c, err := ParseChunk(b)
			if err != nil {
				if !errors.Is(err, ErrStream) {
					t.Fatalf("unclassified chunk error %v", err)
				}
				continue
			}
			if c.CachedTokens > c.PromptTokens || c.PromptTokens < 0 {
				t.Fatalf("accepted inconsistent usage %+v", c)
			}
		}
	})
}
