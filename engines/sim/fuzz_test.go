package sim

import (
	"encoding/json"
	"errors"
	"testing"

	"github.com/valyala/fasthttp"

	"github.com/llmgw/llmgw/engines"
)

// FuzzParseGenRequest: arbitrary bodies either parse or fail with
// errBadRequest; they never panic.
func FuzzParseGenRequest(f *testing.F) {
	for _, s := range []string{
		chatBody + `}`, `{"prompt":[1,2,3]}`, `{"prompt":"x","stream":true,"stream_options":{}}`, ``, `{`, `[]`, `null`,
		`{"max_tokens":"x"}`, `{"bootstrap_room":18446744073709551615}`, `{"text":["a"],"sampling_params":{"max_new_tokens":1}}`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		r, err := parseGenRequest(body)
		if err != nil {
			if !errors.Is(err, errBadRequest) {
				t.Fatalf("error %v does not wrap errBadRequest", err)
			}
			return
		}
		_ = r.nonce()
		_ = r.maxTokens()
		if _, err := parseMessages(r.Messages); err != nil && !errors.Is(err, errBadRequest) {
			t.Fatalf("messages error %v does not wrap errBadRequest", err)
		}
		if _, err := parsePrompt(r.Prompt, "prompt"); err != nil && !errors.Is(err, errBadRequest) {
			t.Fatalf("prompt error %v does not wrap errBadRequest", err)
		}
		for _, a := range engines.Registered() {
			if pd := a.PD(); pd != nil {
				if _, err := pd.ParseLeg(body); err != nil && !errors.Is(err, engines.ErrPDBody) {
					t.Fatalf("%s P/D fields: error %v does not wrap engines.ErrPDBody", a.Kind(), err)
				}
			}
		}
	})
}

// FuzzHandler drives every persona's full request path (routing, parsing,
// tokenization, P/D fields, rendering) with arbitrary bodies: the answer is
// always a complete response with a JSON body for errors, never a panic or a
// hang. Latency is zero and P/D rendezvous is not reachable (no bootstrap
// triple can match a port-0 server), so every request finishes.
func FuzzHandler(f *testing.F) {
	sims := map[engines.Kind]*Sim{}
	for _, k := range engines.Kinds() {
		sims[k] = startSim(f, Config{Engine: k, KVEvents: KVEventsOff, RendezvousTimeout: 1})
	}
	paths := []string{"/v1/chat/completions", "/v1/completions", "/generate", "/completion", "/tokenize", "/detokenize", "/kv_cache_events", "/_sim/faults"}
	for i, s := range []string{
		chatBody + `}`, chatBody + `,"stream":true}`, `{"prompt":[1,2,3],"kv_transfer_params":{"do_remote_prefill":true,"remote_block_ids":[[1]]}}`,
		`{"prompt":"x","disaggregated_params":{"request_type":"context_only"}}`, `{"text":"x","bootstrap_host":"h","bootstrap_room":1}`,
		`{"messages":[{"role":"user","content":[{"type":"image_url"}]}]}`, `{"tokens":[1,2]}`, `{"content":"abc","with_pieces":true}`, `{`,
	} {
		f.Add(uint8(i), uint8(i), []byte(s))
	}
	f.Fuzz(func(t *testing.T, engine, path uint8, body []byte) {
		s := sims[engines.Kinds()[int(engine)%4]]
		p := paths[int(path)%len(paths)]
		if p == "/_sim/faults" {
			return // faults change the sim's behaviour for later inputs
		}
		var ctx fasthttp.RequestCtx
		ctx.Request.Header.SetMethod("POST")
		ctx.Request.SetRequestURI(p)
		ctx.Request.SetBody(body)
		s.handle(&ctx)
		if ctx.Hijacked() {
			t.Fatalf("unexpected hijack for %s %q", p, body)
		}
		status := ctx.Response.StatusCode()
		if status >= 400 {
			if !json.Valid(ctx.Response.Body()) {
				t.Fatalf("%s %s %q: status %d with non-JSON body %q", s.cfg.Engine, p, body, status, ctx.Response.Body())
			}
		}
		if status == 200 && ctx.Response.IsBodyStream() {
			// Streams are written by fasthttp after the handler; run the
			// writer here so its slot is released.
			if err := ctx.Response.BodyWriteTo(discard{}); err != nil {
				t.Fatalf("stream: %v", err)
			}
		}
	})
}

type discard struct{}

func (discard) Write(p []byte) (int, error) { return len(p), nil }
