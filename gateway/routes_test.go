package gateway

import (
	"bufio"
	"bytes"
	"fmt"
	"io"
	"mime/multipart"
	"net/http"
	"strings"
	"sync"
	"testing"

	"github.com/valyala/fasthttp"
)

// TestRoutedByModel: every model-routed path reaches the rule of its
// body's model (not the default rule), the path and body arrive unchanged,
// malformed and ambiguous bodies are refused before any worker sees them,
// and other paths still pass through to the default rule.
func TestRoutedByModel(t *testing.T) {
	echo := func(name string) func(ctx *fasthttp.RequestCtx) {
		return func(ctx *fasthttp.RequestCtx) {
			ctx.SetContentType("application/json")
			ctx.SetBodyString(`{"served_by":"` + name + `","path":"` + string(ctx.Path()) + `"}`)
		}
	}
	def := newBackend(t, "def", echo("def"))
	a := newBackend(t, "a", echo("a"))
	gw := startGateway(t, "", nil)
	mustApply(t, gw, ruleYAML("def", "", "", def))
	mustApply(t, gw, ruleYAML("a", "model-a", "", a))
	c := newClient(t)

	audio := func(fields ...string) (string, string) {
		var buf bytes.Buffer
		w := multipart.NewWriter(&buf)
		fw, _ := w.CreateFormFile("file", "a.wav")
		fw.Write(bytes.Repeat([]byte{0x52}, 64<<10))
		for i := 0; i+1 < len(fields); i += 2 {
			w.WriteField(fields[i], fields[i+1])
		}
		w.Close()
		return w.FormDataContentType(), buf.String()
	}
	formCT, formBody := audio("model", "model-a", "language", "en")
	noModelCT, noModel := audio("language", "en")
	dupCT, dupBody := audio("model", "model-a", "model", "other")

	cases := []struct {
		name, path, ct, body string
		status               int
		servedBy             string
		errCode              string
	}{
		{"embeddings", "/v1/embeddings", "", `{"model":"model-a","input":"x"}`, 200, "a", ""},
		{"embeddings unknown model falls to default", "/v1/embeddings", "", `{"model":"zzz","input":"x"}`, 200, "def", ""},
		{"embeddings without model go to default", "/v1/embeddings", "", `{"input":"x"}`, 200, "def", ""},
		{"tokenize with null model goes to default", "/tokenize", "", `{"model":null,"prompt":"x"}`, 200, "def", ""},
		{"embeddings with a numeric model", "/v1/embeddings", "", `{"model":1,"input":"x"}`, 400, "", "invalid_request"},
		{"responses", "/v1/responses", "", `{"model":"model-a","input":"hi"}`, 200, "a", ""},
		{"rerank v1", "/v1/rerank", "", `{"model":"model-a","query":"q","documents":["d"]}`, 200, "a", ""},
		{"rerank", "/rerank", "", `{"model":"model-a","query":"q","documents":["d"]}`, 200, "a", ""},
		{"rerank v2", "/v2/rerank", "", `{"model":"model-a","query":"q","documents":["d"]}`, 200, "a", ""},
		{"score v1", "/v1/score", "", `{"model":"model-a","text_1":"a","text_2":"b"}`, 200, "a", ""},
		{"score", "/score", "", `{"model":"model-a","text_1":"a","text_2":"b"}`, 200, "a", ""},
		{"tokenize", "/tokenize", "", `{"model":"model-a","prompt":"x"}`, 200, "a", ""},
		{"detokenize", "/detokenize", "", `{"model":"model-a","tokens":[1]}`, 200, "a", ""},
		{"tokenize v1", "/v1/tokenize", "", `{"model":"model-a","text":"x"}`, 200, "a", ""},
		{"detokenize v1", "/v1/detokenize", "", `{"model":"model-a","tokens":[1]}`, 200, "a", ""},
		{"transcriptions", "/v1/audio/transcriptions", formCT, formBody, 200, "a", ""},
		{"translations", "/v1/audio/translations", formCT, formBody, 200, "a", ""},
		{"transcriptions without model go to default", "/v1/audio/transcriptions", noModelCT, noModel, 200, "def", ""},
		{"transcriptions duplicate model", "/v1/audio/transcriptions", dupCT, dupBody, 400, "", "invalid_request"},
		{"transcriptions as JSON", "/v1/audio/transcriptions", "", `{"model":"model-a"}`, 400, "", "invalid_request"},
		{"embeddings duplicate model", "/v1/embeddings", "", `{"model":"model-a","model":"x","input":"x"}`, 400, "", "invalid_request"},
		{"embeddings missing input", "/v1/embeddings", "", `{"model":"model-a"}`, 400, "", "invalid_request"},
		{"responses bad input", "/v1/responses", "", `{"model":"model-a","input":5}`, 400, "", "invalid_request"},
		{"other path passes through", "/v1/files", "", `{"model":"model-a"}`, 200, "def", ""},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			hdr := []string{}
			if tc.ct != "" {
				hdr = append(hdr, "Content-Type", tc.ct)
			}
			before := def.hits.Load() + a.hits.Load()
			resp, body := post(t, c, "http://"+gw.Addr()+tc.path, tc.body, hdr...)
			if resp.StatusCode != tc.status {
				t.Fatalf("status %d; want %d: %s", resp.StatusCode, tc.status, body)
			}
			if tc.servedBy == "" {
				if n := def.hits.Load() + a.hits.Load(); n != before {
					t.Fatalf("a refused request reached a worker")
				}
				if !strings.Contains(body, `"code":"`+tc.errCode+`"`) {
					t.Fatalf("error body %s; want code %s", body, tc.errCode)
				}
				return
			}
			if want := `{"served_by":"` + tc.servedBy + `","path":"` + tc.path + `"}`; body != want {
				t.Fatalf("body %s; want %s", body, want)
			}
		})
	}

	t.Run("GET on a routed path is 405", func(t *testing.T) {
		req, _ := http.NewRequest(http.MethodGet, "http://"+gw.Addr()+"/v1/embeddings", nil)
		resp, err := c.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != 405 || resp.Header.Get("Allow") != "POST" {
			t.Fatalf("status %d Allow %q", resp.StatusCode, resp.Header.Get("Allow"))
		}
	})
}

// TestResponsesStreamRelayedEventByEvent: a Responses stream (named SSE
// events, no [DONE]) reaches the client one event at a time: the worker
// writes its second event only after the client has read the first through
// the gateway, so a gateway that buffered the stream would never deliver.
func TestResponsesStreamRelayedEventByEvent(t *testing.T) {
	firstRead := make(chan struct{})
	be := newBackend(t, "sse", func(ctx *fasthttp.RequestCtx) {
		ctx.SetContentType("text/event-stream")
		ctx.SetBodyStreamWriter(func(w *bufio.Writer) {
			fmt.Fprint(w, "event: response.created\ndata: {\"type\":\"response.created\",\"sequence_number\":0}\n\n")
			w.Flush()
			<-firstRead
			fmt.Fprint(w, "event: response.completed\ndata: {\"type\":\"response.completed\",\"sequence_number\":1}\n\n")
			w.Flush()
		})
	})
	gw := startGateway(t, "", nil)
	mustApply(t, gw, ruleYAML("r", "m", "", be))
	// Registered last, so it runs first: a failed test unblocks the worker
	// before the gateway and the worker are closed.
	var once sync.Once
	release := func() { once.Do(func() { close(firstRead) }) }
	t.Cleanup(release)
	c := newClient(t)
	req, _ := http.NewRequest(http.MethodPost, "http://"+gw.Addr()+"/v1/responses", strings.NewReader(`{"model":"m","input":"hi","stream":true}`))
	req.Header.Set("Content-Type", "application/json")
	resp, err := c.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != 200 || resp.Header.Get("X-Llmgw-Endpoint") != "w1" {
		t.Fatalf("status %d endpoint %q", resp.StatusCode, resp.Header.Get("X-Llmgw-Endpoint"))
	}
	br := bufio.NewReader(resp.Body)
	readEvent := func() string {
		t.Helper()
		var ev strings.Builder
		for {
			line, err := br.ReadString('\n')
			if err != nil {
				t.Fatalf("reading the stream: %v (so far %q)", err, ev.String())
			}
			if line == "\n" {
				return ev.String()
			}
			ev.WriteString(line)
		}
	}
	if ev := readEvent(); !strings.HasPrefix(ev, "event: response.created\n") {
		t.Fatalf("first event %q", ev)
	}
	release()
	if ev := readEvent(); !strings.HasPrefix(ev, "event: response.completed\n") {
		t.Fatalf("second event %q", ev)
	}
	if rest, err := io.ReadAll(br); err != nil || len(rest) != 0 {
		t.Fatalf("after the last event: %q, %v (a whole stream gets nothing appended)", rest, err)
	}
}
