package labkit

import (
	"context"
	"encoding/json"
	"errors"
	"net"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/llmgw/llmgw/engines/sim"
	"github.com/llmgw/llmgw/runbook"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func TestParseCompletion(t *testing.T) {
	cases := []struct {
		name             string
		body             string
		wantErr          bool
		wantText         string
		wantCached, want int
	}{
		{name: "text and usage", body: `{"choices":[{"text":"hi"}],"usage":{"prompt_tokens":7,"prompt_tokens_details":{"cached_tokens":4}}}`, wantText: "hi", wantCached: 4, want: 7},
		{name: "chat message, no usage", body: `{"choices":[{"message":{"content":"yo"}}]}`, wantText: "yo", wantCached: -1},
		{name: "no choices", body: `{"choices":[]}`, wantErr: true, wantCached: -1},
		{name: "not JSON", body: `data: x`, wantErr: true, wantCached: -1},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			c, err := ParseCompletion(tc.body)
			if (err != nil) != tc.wantErr {
				t.Fatalf("err = %v, want error %v", err, tc.wantErr)
			}
			if err != nil && !errors.Is(err, ErrNotCompletion) {
				t.Errorf("err = %v, want it to wrap ErrNotCompletion", err)
			}
			if c.Text != tc.wantText || c.CachedTokens != tc.wantCached || c.PromptTokens != tc.want {
				t.Errorf("got %+v, want text %q cached %d prompt %d", c, tc.wantText, tc.wantCached, tc.want)
			}
		})
	}
}

func TestParseSSE(t *testing.T) {
	cases := []struct {
		name       string
		body       string
		wantErr    bool
		wantText   string
		wantChunks int
	}{
		{name: "two events", body: "data: {\"choices\":[{\"delta\":{\"content\":\"a\"}}]}\n\ndata: {\"choices\":[{\"delta\":{\"content\":\"b\"}}]}\r\n\ndata: [DONE]\n", wantText: "ab", wantChunks: 2},
		{name: "no DONE", body: "data: {\"choices\":[{\"text\":\"a\"}]}\n", wantErr: true, wantText: "a", wantChunks: 1},
		{name: "only DONE", body: "data: [DONE]\n", wantErr: true},
		{name: "event after DONE", body: "data: {}\n\ndata: [DONE]\n\ndata: {}\n", wantErr: true, wantChunks: 1},
		{name: "bad JSON event", body: "data: {\n", wantErr: true},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			c, err := ParseSSE(tc.body)
			if (err != nil) != tc.wantErr {
				t.Fatalf("err = %v, want error %v", err, tc.wantErr)
			}
			if c.Text != tc.wantText || c.Chunks != tc.wantChunks {
				t.Errorf("got text %q chunks %d, want %q %d", c.Text, c.Chunks, tc.wantText, tc.wantChunks)
			}
		})
	}
}

func TestCheckAnswer(t *testing.T) {
	sse := "data: {\"choices\":[{\"text\":\"a\"}]}\n\ndata: [DONE]\n"
	cases := []struct {
		name    string
		ex      Exchange
		stream  bool
		wantErr bool
	}{
		{name: "json", ex: Exchange{Body: `{"choices":[{"text":"a"}]}`}},
		{name: "sse", ex: Exchange{Body: sse, Header: map[string]string{"Content-Type": "text/event-stream; charset=utf-8"}}, stream: true},
		{name: "sse with JSON content type", ex: Exchange{Body: sse, Header: map[string]string{"Content-Type": "application/json"}}, stream: true, wantErr: true},
		{name: "json expected, stream given", ex: Exchange{Body: sse}, wantErr: true},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			if err := CheckAnswer(tc.ex, tc.stream); (err != nil) != tc.wantErr {
				t.Errorf("err = %v, want error %v", err, tc.wantErr)
			}
		})
	}
}

func TestDiffJSON(t *testing.T) {
	type inner struct {
		A int    `json:"a"`
		B string `json:"b,omitempty"`
	}
	type doc struct {
		X inner   `json:"x"`
		L []inner `json:"l"`
	}
	cases := []struct {
		name         string
		want, got    any
		wantDiffs    []string
		wantCompared int
	}{
		{name: "equal", want: doc{X: inner{A: 1}, L: []inner{{A: 2}}}, got: doc{X: inner{A: 1}, L: []inner{{A: 2}}}, wantCompared: 2},
		{name: "leaf differs", want: doc{X: inner{A: 1}}, got: doc{X: inner{A: 2}}, wantDiffs: []string{"x.a: applied 1, read back 2"}, wantCompared: 2},
		{name: "extra field read back", want: doc{X: inner{A: 1}}, got: doc{X: inner{A: 1, B: "z"}}, wantDiffs: []string{"x.b: applied <nil>, read back z"}, wantCompared: 3},
		{name: "list length", want: doc{L: []inner{{}}}, got: doc{}, wantDiffs: []string{"l: applied 1 items, read back <nil>"}, wantCompared: 1},
		// Nothing on both sides proves nothing: never a match.
		{name: "null equals null is a difference", want: nil, got: (*doc)(nil), wantDiffs: []string{"(root): applied and read back are both null: nothing to compare"}},
		{name: "unencodable side", want: doc{}, got: map[string]any{"f": func() {}},
			wantDiffs: []string{"(root): the read back value does not encode: json: unsupported type: func()"}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			diffs, compared := DiffJSON(tc.want, tc.got)
			if !slices.Equal(diffs, tc.wantDiffs) || compared != tc.wantCompared {
				t.Errorf("got %q (%d compared), want %q (%d)", diffs, compared, tc.wantDiffs, tc.wantCompared)
			}
		})
	}
}

func TestAddressesAndNames(t *testing.T) {
	cases := []struct {
		name, got, want string
	}{
		{"data address keeps a host", DataAddress("10.0.0.1:9000", "http://127.0.0.1:8081"), "10.0.0.1:9000"},
		{"data address fills unspecified", DataAddress("0.0.0.0:9000", "http://gw.local:8081"), "gw.local:9000"},
		{"data address fills empty host", DataAddress(":9000", "http://127.0.0.1:8081"), "127.0.0.1:9000"},
		{"data address not host:port", DataAddress("nonsense", "http://x"), "nonsense"},
		{"short id", ShortID("20261130-010203-AbC9"), "abc9"},
		{"short id without tail", ShortID("plain"), "run"},
		{"short id trailing dash", ShortID("x-"), "run"},
		{"path chat", CompletionPath(true), "/v1/chat/completions"},
		{"path text", CompletionPath(false), "/v1/completions"},
		{"kind", Kind(true) + "," + Kind(false), "sse,json"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			if tc.got != tc.want {
				t.Errorf("got %q, want %q", tc.got, tc.want)
			}
		})
	}
}

func TestRequestBody(t *testing.T) {
	cases := []struct {
		name   string
		chat   bool
		stream bool
		keys   []string
	}{
		{"completion", false, false, []string{"max_tokens", "model", "prompt", "temperature", "user"}},
		{"chat stream", true, true, []string{"max_tokens", "messages", "model", "stream", "stream_options", "temperature", "user"}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			var m map[string]any
			if err := json.Unmarshal(RequestBody(tc.chat, "m", "p", "n1", tc.stream), &m); err != nil {
				t.Fatal(err)
			}
			var keys []string
			for k := range m {
				keys = append(keys, k)
			}
			slices.Sort(keys)
			if !slices.Equal(keys, tc.keys) || m["user"] != "n1" {
				t.Errorf("got %v, want keys %v and user n1", m, tc.keys)
			}
		})
	}
}

func TestEndpoint(t *testing.T) {
	ep := Endpoint("w1", "127.0.0.1:8123")
	if ep.ID != "w1" || ep.EndpointIP != "127.0.0.1" || ep.TargetPort != 8123 {
		t.Errorf("got %+v, want w1 at 127.0.0.1:8123", ep)
	}
}

// worker is a real loopback HTTP server answering like a simulator.
func worker(t *testing.T, receipts string) runbook.Worker {
	t.Helper()
	mux := http.NewServeMux()
	mux.HandleFunc("GET /health", func(w http.ResponseWriter, _ *http.Request) {})
	mux.HandleFunc("GET /v1/models", func(w http.ResponseWriter, _ *http.Request) {
		w.Write([]byte(`{"data":[{"id":"m1"},{"id":"m2"}]}`))
	})
	mux.HandleFunc("GET /_sim/receipts", func(w http.ResponseWriter, _ *http.Request) {
		if receipts == "" {
			http.NotFound(w, nil)
			return
		}
		w.Write([]byte(receipts))
	})
	mux.HandleFunc("POST /echo", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("X-Request-Id", r.Header.Get("X-Request-Id"))
		w.Header().Set("X-Got-Type", r.Header.Get("Content-Type"))
		w.WriteHeader(http.StatusTeapot)
		w.Write([]byte("short and stout"))
	})
	srv := httptest.NewServer(mux)
	t.Cleanup(srv.Close)
	return runbook.Worker{ID: "w1", HTTP: strings.TrimPrefix(srv.URL, "http://"), HealthPath: "/health"}
}

func TestDo(t *testing.T) {
	w := worker(t, "")
	c := &http.Client{}
	defer c.CloseIdleConnections()
	cases := []struct {
		name       string
		url        string
		body       []byte
		wantErr    bool
		wantStatus int
		check      func(t *testing.T, ex Exchange)
	}{
		{name: "json body kept as JSON", url: "http://" + w.HTTP + "/echo", body: []byte(`{"a":1}`), wantStatus: http.StatusTeapot, check: func(t *testing.T, ex Exchange) {
			if string(ex.ReqBody) != `{"a":1}` || ex.ReqRaw != "" || ex.Get("x-got-type") != "application/json" || ex.Get("X-Request-Id") != "r1" || ex.Body != "short and stout" {
				t.Errorf("exchange %+v", ex)
			}
		}},
		{name: "raw body kept raw", url: "http://" + w.HTTP + "/echo", body: []byte(`{"a":`), wantStatus: http.StatusTeapot, check: func(t *testing.T, ex Exchange) {
			if ex.ReqBody != nil || ex.ReqRaw != `{"a":` {
				t.Errorf("exchange %+v", ex)
			}
		}},
		{name: "transport error recorded", url: "http://" + closedAddr(t) + "/x", wantErr: true, check: func(t *testing.T, ex Exchange) {
			if ex.Error == "" || ex.Status != 0 {
				t.Errorf("exchange %+v, want an error and no status", ex)
			}
		}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			ex, err := Do(t.Context(), c, http.MethodPost, tc.url, tc.body, map[string]string{"X-Request-Id": "r1"})
			if (err != nil) != tc.wantErr {
				t.Fatalf("err = %v, want error %v", err, tc.wantErr)
			}
			if ex.Status != tc.wantStatus {
				t.Errorf("status %d, want %d", ex.Status, tc.wantStatus)
			}
			tc.check(t, ex)
			var back Exchange
			if err := json.Unmarshal(ex.JSON(), &back); err != nil || back.URL != tc.url {
				t.Errorf("evidence JSON does not round-trip: %v %+v", err, back)
			}
		})
	}
}

// closedAddr is a loopback address nothing listens on any more.
func closedAddr(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close()
	return addr
}

func TestProbeServing(t *testing.T) {
	up := worker(t, "")
	c := &http.Client{}
	defer c.CloseIdleConnections()
	cases := []struct {
		name     string
		w        runbook.Worker
		wantLast string
		wantIDs  []string
	}{
		{name: "serving", w: up, wantIDs: []string{"m1", "m2"}},
		{name: "health 404", w: runbook.Worker{ID: "w", HTTP: up.HTTP, HealthPath: "/nope"}, wantLast: "health answered 404"},
		{name: "down", w: runbook.Worker{ID: "w", HTTP: closedAddr(t), HealthPath: "/health"}, wantLast: "health: "},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			p := ProbeServing(t.Context(), c, tc.w)
			if !strings.HasPrefix(p.Last, tc.wantLast) || (tc.wantLast == "") != (p.Last == "") {
				t.Errorf("last %q, want prefix %q", p.Last, tc.wantLast)
			}
			if got := ModelIDs(p.Models.Body); !slices.Equal(got, tc.wantIDs) {
				t.Errorf("models %v, want %v", got, tc.wantIDs)
			}
		})
	}
}

func TestReceipts(t *testing.T) {
	c := &http.Client{}
	defer c.CloseIdleConnections()
	cases := []struct {
		name    string
		log     string
		wantErr error
		wantN   int
	}{
		{name: "two receipts", log: `[{"request_id":"a"},{"request_id":"b"}]`, wantN: 2},
		{name: "empty list", log: `[]`},
		{name: "no receipt log", log: "", wantErr: ErrNoReceipts},
		{name: "null", log: `null`, wantErr: ErrNoReceipts},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			w := worker(t, tc.log)
			all, err := AllReceipts(t.Context(), c, []runbook.Worker{w})
			if !errors.Is(err, tc.wantErr) {
				t.Fatalf("err = %v, want %v", err, tc.wantErr)
			}
			if len(all[w.ID]) != tc.wantN {
				t.Errorf("%d receipts, want %d", len(all[w.ID]), tc.wantN)
			}
		})
	}
}

func TestHolders(t *testing.T) {
	all := map[string][]sim.Receipt{
		"w2": {{RequestID: "a"}}, "w1": {{RequestID: "b"}, {RequestID: "a"}}, "w3": nil,
	}
	cases := []struct {
		name, rid string
		want      []string
	}{
		{"two holders sorted", "a", []string{"w1", "w2"}},
		{"one holder", "b", []string{"w1"}},
		{"none", "c", nil},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			if got := Holders(all, tc.rid); !slices.Equal(got, tc.want) {
				t.Errorf("got %v, want %v", got, tc.want)
			}
		})
	}
}

func TestWaitFor(t *testing.T) {
	boom := errors.New("boom")
	cancelled, cancel := context.WithCancel(context.Background())
	cancel()
	cases := []struct {
		name     string
		ctx      context.Context
		timeout  time.Duration
		cond     func(n int) (bool, string, error)
		wantErr  error
		wantLast string
	}{
		{name: "holds on the third poll", ctx: context.Background(), timeout: time.Minute, cond: func(n int) (bool, string, error) { return n == 3, "n", nil }, wantLast: "n"},
		{name: "condition error", ctx: context.Background(), timeout: time.Minute, cond: func(int) (bool, string, error) { return false, "x", boom }, wantErr: boom, wantLast: "x"},
		{name: "context ended", ctx: cancelled, timeout: time.Minute, cond: func(int) (bool, string, error) { return false, "never", nil }, wantErr: context.Canceled, wantLast: "never"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			n := 0
			last, err := WaitFor(tc.ctx, tc.timeout, func() (bool, string, error) { n++; return tc.cond(n) })
			if !errors.Is(err, tc.wantErr) || last != tc.wantLast {
				t.Errorf("got %q, %v; want %q, %v", last, err, tc.wantLast, tc.wantErr)
			}
		})
	}
	t.Run("timeout", func(t *testing.T) {
		_, err := WaitFor(context.Background(), time.Millisecond, func() (bool, string, error) { return false, "", nil })
		if err == nil || !strings.Contains(err.Error(), "not reached within") {
			t.Errorf("err = %v, want a timeout", err)
		}
	})
}

func TestWaitClosed(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close()
	if err := WaitClosed(t.Context(), addr, time.Minute); err != nil {
		t.Errorf("closed listener: %v", err)
	}
	l2, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l2.Close()
	ctx, cancel := context.WithCancel(t.Context())
	cancel()
	if err := WaitClosed(ctx, l2.Addr().String(), time.Minute); !errors.Is(err, context.Canceled) {
		t.Errorf("open listener: err = %v, want it to keep waiting until the context ends", err)
	}
}

func FuzzParseSSE(f *testing.F) {
	f.Add("data: {\"choices\":[{\"text\":\"hi\"}]}\n\ndata: [DONE]\n\n")
	f.Add("data: [DONE]\n")
	f.Add("data: {\"choices\":")
	f.Add(": comment\r\ndata: {\"usage\":{\"prompt_tokens\":1}}\r\n\r\ndata: [DONE]\r\n")
	f.Fuzz(func(t *testing.T, body string) {
		c, err := ParseSSE(body)
		if err != nil {
			if !errors.Is(err, ErrNotCompletion) {
				t.Fatalf("error %v does not wrap ErrNotCompletion", err)
			}
			return
		}
		if !c.Done || c.Chunks == 0 || !strings.Contains(body, "[DONE]") {
			t.Fatalf("success without a complete stream: %+v", c)
		}
	})
}

func FuzzParseCompletion(f *testing.F) {
	f.Add(`{"choices":[{"text":"x"}],"usage":{"prompt_tokens":4,"prompt_tokens_details":{"cached_tokens":0}}}`)
	f.Add(`{"choices":[]}`)
	f.Add(`[]`)
	f.Fuzz(func(t *testing.T, body string) {
		c, err := ParseCompletion(body)
		if err != nil {
			if c.CachedTokens != -1 || !errors.Is(err, ErrNotCompletion) {
				t.Fatalf("error %v with %+v", err, c)
			}
			return
		}
		if !json.Valid([]byte(body)) {
			t.Fatalf("accepted invalid JSON %q", body)
		}
	})
}

func FuzzParseReceipts(f *testing.F) {
	f.Add([]byte(`[{"seq":1,"request_id":"r","role":"prefill"}]`))
	f.Add([]byte(`[]`))
	f.Add([]byte(`null`))
	f.Add([]byte(`{"request_id":"r"}`))
	f.Fuzz(func(t *testing.T, b []byte) {
		recs, err := ParseReceipts(b)
		if err == nil && recs == nil {
			t.Fatal("nil receipts without an error")
		}
		if err != nil && !errors.Is(err, ErrNoReceipts) {
			t.Fatalf("error %v does not wrap ErrNoReceipts", err)
		}
	})
}
