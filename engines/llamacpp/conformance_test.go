package llamacpp_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/llmgw/llmgw/engines/sim"
)

// The conformance test replays every exchange captured from a real
// llama-server (testdata/cases, see testdata/PROVENANCE) against the
// simulator's llama.cpp persona and compares what the gateway can observe:
// status, Content-Type, the connection headers, the header set, the JSON
// field set (recursively, with JSON kinds), the values that do not vary
// between runs, and the shape of an SSE stream's first and last events.
// Values that vary (ids, created, timings, generated text, token ids and
// counts from a different tokenizer) are not compared.

type captureIndex struct {
	Cases map[string]struct {
		Instance     string `json:"instance"`
		Method       string `json:"method"`
		Path         string `json:"path"`
		ResponseFile string `json:"response_file"`
		RequestFile  string `json:"request_file"`
	} `json:"cases"`
}

type capturedRequest struct {
	Method  string            `json:"method"`
	Path    string            `json:"path"`
	Headers map[string]string `json:"headers"`
	Body    string            `json:"body"`
}

// notApplicable lists the captured cases a simulator cannot replay, with
// the reason. Every other case is replayed; the test fails if this list
// names a case that is not captured.
var notApplicable = map[string]string{
	"sigterm_mid_stream":       "the process was sent SIGTERM mid-stream (transport.json sigterm_mid_stream); a simulator runs in-process, its crash_after_chunks fault is the analogue and is tested in engines/sim",
	"sigkill_mid_stream":       "the process was sent SIGKILL mid-stream; see sigterm_mid_stream",
	"sigterm_mid_json_request": "SIGTERM during a non-streamed request (0 bytes, then EOF); a signal to the engine process, not a wire exchange",
	"sigkill_mid_json_request": "SIGKILL during a non-streamed request; see sigterm_mid_json_request",
}

// instanceConfig is the simulator configuration standing in for each
// captured server instance (index.json instances): -np 2 is two slots.
func instanceConfig(instance string, clock *testClock) (sim.Config, bool) {
	base := sim.Config{MaxConcurrency: 2}
	switch instance {
	case "main":
		return base, true
	case "metrics_slots":
		base.EnableMetrics, base.EnableSlots = true, true
		// Generation is paced so that the "busy" cases can be captured
		// while a stream runs.
		base.DecodePerToken = 2 * time.Millisecond
		return base, true
	case "embeddings":
		base.Embeddings = true
		return base, true
	case "loading":
		base.EnableMetrics, base.EnableSlots = true, true
		base.LoadingFor = time.Hour
		base.Clock = clock.now
		return base, true
	}
	return sim.Config{}, false
}

// testClock is a clock the loading cases move past the load phase.
type testClock struct {
	mu  sync.Mutex
	off time.Duration
}

func (c *testClock) now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return time.Now().Add(c.off)
}

func (c *testClock) advance(d time.Duration) {
	c.mu.Lock()
	c.off += d
	c.mu.Unlock()
}

// captureSets are the capture directories: the shared capture session and
// the extra exchanges recorded later from the same build.
var captureSets = []string{"testdata", filepath.Join("testdata", "extra")}

func loadIndex(t *testing.T, dir string) captureIndex {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(dir, "index.json"))
	if err != nil {
		t.Fatal(err)
	}
	var idx captureIndex
	if err := json.Unmarshal(b, &idx); err != nil {
		t.Fatalf("index.json: %v", err)
	}
	return idx
}

// captureOrder is the cases in the order they were captured (index.json
// lists them so); state such as "after requests" or "after loading"
// follows from it.
func captureOrder(t *testing.T, dir string) []string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(dir, "index.json"))
	if err != nil {
		t.Fatal(err)
	}
	var raw struct {
		Cases json.RawMessage `json:"cases"`
	}
	if err := json.Unmarshal(b, &raw); err != nil {
		t.Fatal(err)
	}
	dec := json.NewDecoder(bytes.NewReader(raw.Cases))
	if _, err := dec.Token(); err != nil {
		t.Fatal(err)
	}
	var names []string
	for dec.More() {
		tok, err := dec.Token()
		if err != nil {
			t.Fatal(err)
		}
		names = append(names, tok.(string))
		var skip json.RawMessage
		if err := dec.Decode(&skip); err != nil {
			t.Fatal(err)
		}
	}
	return names
}

func TestConformance(t *testing.T) {
	parent := t
	known := map[string]bool{}
	clock := &testClock{}
	sims := map[string]*sim.Sim{}
	for _, dir := range captureSets {
		idx := loadIndex(t, dir)
		for _, name := range captureOrder(t, dir) {
			if known[name] {
				t.Fatalf("case %q is captured twice", name)
			}
			known[name] = true
			c := idx.Cases[name]
			t.Run(name, func(t *testing.T) {
				if reason, ok := notApplicable[name]; ok {
					t.Skipf("not applicable to a simulator: %s", reason)
				}
				cfg, ok := instanceConfig(c.Instance, clock)
				if !ok {
					t.Fatalf("no simulator configuration for instance %q", c.Instance)
				}
				s := sims[c.Instance]
				if s == nil {
					var err error
					if s, err = startShared(parent, cfg); err != nil {
						t.Fatal(err)
					}
					sims[c.Instance] = s
				}
				if name == "health_ready_after_loading" {
					clock.advance(2 * time.Hour)
				}
				want := readCapture(t, filepath.Join(dir, c.ResponseFile))
				req := readRequest(t, filepath.Join(dir, c.RequestFile))
				if strings.HasSuffix(name, "_busy") {
					stop := startBusy(t, s)
					defer stop()
				}
				conn := dial(t, s.Addrs().HTTP)
				got := conn.roundTrip(req.Method, req.Path, requestHeaders(req), req.Body)
				compareResponse(t, want, got)
			})
		}
	}
	for name := range notApplicable {
		if !known[name] {
			t.Errorf("notApplicable names %q, which is not a captured case", name)
		}
	}
}

// startShared starts a sim that serves every case of one instance: it is
// closed when the parent test ends.
func startShared(parent *testing.T, cfg sim.Config) (*sim.Sim, error) {
	cfg.Engine = "llamacpp"
	s, err := sim.Start(context.Background(), cfg)
	if err != nil {
		return nil, fmt.Errorf("sim.Start: %w", err)
	}
	parent.Cleanup(func() {
		if err := s.Close(); err != nil {
			parent.Errorf("sim.Close: %v", err)
		}
	})
	return s, nil
}

// startBusy runs a long stream on one slot, as the capture did for the
// "busy" cases, and returns once its first token arrived.
func startBusy(t *testing.T, s *sim.Sim) (stop func()) {
	t.Helper()
	c := dial(t, s.Addrs().HTTP)
	c.send("POST", "/v1/chat/completions", map[string]string{"Content-Type": "application/json"},
		`{"messages":[{"role":"user","content":"busy"}],"max_tokens":1500,"stream":true}`)
	if _, err := c.br.ReadString('\n'); err != nil {
		t.Fatalf("busy stream: %v", err)
	}
	for {
		l, err := c.br.ReadString('\n')
		if err != nil {
			t.Fatalf("busy stream: %v", err)
		}
		if strings.HasPrefix(l, "data: ") {
			break
		}
	}
	return func() { _ = c.c.Close() }
}

func readCapture(t *testing.T, file string) *rawResponse {
	t.Helper()
	b, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	r, err := parseRaw(b)
	if err != nil {
		t.Fatalf("%s: %v", file, err)
	}
	return r
}

func readRequest(t *testing.T, file string) capturedRequest {
	t.Helper()
	b, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	var r capturedRequest
	if err := json.Unmarshal(b, &r); err != nil {
		t.Fatalf("%s: %v", file, err)
	}
	return r
}

// requestHeaders are the captured request's headers without Host (the
// sim's port differs) and Content-Length (send writes it).
func requestHeaders(r capturedRequest) map[string]string {
	h := map[string]string{}
	for k, v := range r.Headers {
		switch strings.ToLower(k) {
		case "host", "content-length":
			continue
		}
		h[k] = v
	}
	return h
}

// connHeaders must be equal, value and presence; of the other headers
// only the name set is compared (Process-Start-Time-Unix, for one, varies).
var connHeaders = []string{"Connection", "Keep-Alive", "Transfer-Encoding"}

func compareResponse(t *testing.T, want, got *rawResponse) {
	t.Helper()
	if got.status != want.status {
		t.Errorf("status %d, want %d (body %s)", got.status, want.status, trim(got.body))
	}
	wct, _ := want.get("Content-Type")
	gct, _ := got.get("Content-Type")
	if gct != wct {
		t.Errorf("Content-Type %q, want %q", gct, wct)
	}
	for _, h := range connHeaders {
		wv, wok := want.get(h)
		gv, gok := got.get(h)
		if wv != gv || wok != gok {
			t.Errorf("%s: %q (present %v), want %q (present %v)", h, gv, gok, wv, wok)
		}
	}
	if w, g := headerNames(want), headerNames(got); !slices.Equal(w, g) {
		t.Errorf("header set %v, want %v", g, w)
	}
	switch {
	case strings.HasPrefix(wct, "application/json"):
		compareJSON(t, want.body, got.body)
	case strings.HasPrefix(wct, "text/event-stream"):
		compareSSE(t, want.body, got.body)
		// llama-server writes each event as one HTTP chunk.
		for i, c := range got.chunks {
			if ev, err := sseEvents(c); err != nil || len(ev) != 1 {
				t.Errorf("chunk %d is not exactly one event: %q", i, trim(c))
				break
			}
		}
		// A streamed answer's head is written by the persona itself, so
		// its header order is llama-server's; fasthttp orders the head of
		// other answers (Server first, Keep-Alive after Content-Length),
		// a difference no HTTP client depends on.
		if w, g := headerOrder(want), headerOrder(got); !slices.Equal(w, g) {
			t.Errorf("header order %v, want %v", g, w)
		}
	case strings.HasPrefix(wct, "text/plain"):
		if w, g := metricFamilies(want.body), metricFamilies(got.body); !slices.Equal(w, g) {
			t.Errorf("metric families %v, want %v", g, w)
		}
	default:
		if (len(want.body) == 0) != (len(got.body) == 0) {
			t.Errorf("body %q, want %q", trim(got.body), trim(want.body))
		}
	}
}

func headerOrder(r *rawResponse) []string {
	var n []string
	for _, h := range r.headers {
		n = append(n, h.name)
	}
	return n
}

func headerNames(r *rawResponse) []string {
	var n []string
	for _, h := range r.headers {
		n = append(n, strings.ToLower(h.name))
	}
	sort.Strings(n)
	return n
}

func trim(b []byte) string {
	if len(b) > 300 {
		return string(b[:300]) + "…"
	}
	return string(b)
}

func compareJSON(t *testing.T, want, got []byte) {
	t.Helper()
	var w, g any
	if err := json.Unmarshal(want, &w); err != nil {
		t.Fatalf("captured body is not JSON: %v", err)
	}
	if err := json.Unmarshal(got, &g); err != nil {
		t.Errorf("body is not JSON: %v: %s", err, trim(got))
		return
	}
	wantBusy, gotBusy := busySlots(w), busySlots(g)
	if wantBusy > 0 || gotBusy > 0 {
		// Which slot serves which task is the server's choice: the slots
		// are compared as one merged shape, and by how many are busy.
		wa, ga := w.([]any), g.([]any)
		w, g = []any{union(wa)}, []any{union(ga)}
	}
	for _, d := range diffShape("$", w, g) {
		t.Error(d)
	}
	// Which slot serves a request is the server's choice; how many are
	// busy is compared.
	if wb, gb := wantBusy, gotBusy; wb != gb {
		t.Errorf("%d slots processing, want %d", gb, wb)
	}
}

func busySlots(v any) int {
	arr, _ := v.([]any)
	n := 0
	for _, e := range arr {
		if m, ok := e.(map[string]any); ok && m["is_processing"] == true {
			n++
		}
	}
	return n
}

// stableValues are the keys whose values do not vary between runs and
// must be equal wherever they occur. "message" is compared whole, except
// that of a JSON parse error, whose tail names the parser's state.
var stableValues = map[string]bool{
	"object": true, "owned_by": true, "type": true, "code": true, "message": true,
	"finish_reason": true, "role": true, "status": true, "stop_type": true, "stop": true,
	"truncated": true,
}

// diffShape compares two decoded JSON values: the same JSON kinds, the
// same object key sets (recursively; the elements of an array are compared
// as the union of their shapes) and equal stable values.
func diffShape(path string, want, got any) []string {
	if kind(want) != kind(got) {
		return []string{fmt.Sprintf("%s: %s, want %s", path, kind(got), kind(want))}
	}
	var out []string
	switch w := want.(type) {
	case map[string]any:
		g := got.(map[string]any)
		var missing, extra []string
		for k := range w {
			if _, ok := g[k]; !ok {
				missing = append(missing, k)
			}
		}
		for k := range g {
			if _, ok := w[k]; !ok {
				extra = append(extra, k)
			}
		}
		sort.Strings(missing)
		sort.Strings(extra)
		if len(missing) > 0 {
			out = append(out, fmt.Sprintf("%s: missing keys %v", path, missing))
		}
		if len(extra) > 0 {
			out = append(out, fmt.Sprintf("%s: extra keys %v", path, extra))
		}
		keys := make([]string, 0, len(w))
		for k := range w {
			keys = append(keys, k)
		}
		sort.Strings(keys)
		for _, k := range keys {
			gv, ok := g[k]
			if !ok {
				continue
			}
			p := path + "." + k
			if stableValues[k] && !isContainer(w[k]) {
				if d := diffValue(p, k, w[k], gv); d != "" {
					out = append(out, d)
				}
				continue
			}
			out = append(out, diffShape(p, w[k], gv)...)
		}
	case []any:
		g := got.([]any)
		if (len(w) == 0) != (len(g) == 0) {
			return []string{fmt.Sprintf("%s: %d elements, want %d", path, len(g), len(w))}
		}
		if len(w) == len(g) {
			for i := range w {
				out = append(out, diffShape(fmt.Sprintf("%s[%d]", path, i), w[i], g[i])...)
			}
		} else if len(w) > 0 {
			out = append(out, diffShape(path+"[]", union(w), union(g))...)
		}
	}
	return out
}

func isContainer(v any) bool {
	switch v.(type) {
	case map[string]any, []any:
		return true
	}
	return false
}

func diffValue(path, key string, want, got any) string {
	if key == "message" {
		ws, _ := want.(string)
		gs, _ := got.(string)
		if strings.HasPrefix(ws, "[json.exception.parse_error.") {
			// nlohmann's tail names what the parser expected at that
			// point; the position and exception id are compared.
			ws, _, _ = strings.Cut(ws, ": ")
			gs, _, _ = strings.Cut(gs, ": ")
		}
		if ws != gs {
			return fmt.Sprintf("%s: %q, want %q", path, gs, ws)
		}
		return ""
	}
	if fmt.Sprint(want) != fmt.Sprint(got) {
		return fmt.Sprintf("%s: %v, want %v", path, got, want)
	}
	return ""
}

// union merges the elements of an array into one shape: objects' keys
// united (first value kept), scalars by kind.
func union(elems []any) any {
	var objs []map[string]any
	for _, e := range elems {
		if m, ok := e.(map[string]any); ok {
			objs = append(objs, m)
		}
	}
	if len(objs) == 0 {
		return elems[0]
	}
	u := map[string]any{}
	for _, m := range objs {
		for k, v := range m {
			if _, ok := u[k]; !ok {
				u[k] = v
			}
		}
	}
	return u
}

func kind(v any) string {
	switch v.(type) {
	case nil:
		return "null"
	case bool:
		return "bool"
	case float64:
		return "number"
	case string:
		return "string"
	case []any:
		return "array"
	case map[string]any:
		return "object"
	}
	return fmt.Sprintf("%T", v)
}

// sseEvents splits an SSE body into its data payloads; it reports a
// framing error (an event line other than "data: ", CRLF line ends).
func sseEvents(body []byte) ([]string, error) {
	var out []string
	for _, ev := range strings.Split(string(body), "\n\n") {
		if ev == "" {
			continue
		}
		if strings.Contains(ev, "\r") {
			return nil, fmt.Errorf("event %q has CR", ev)
		}
		data, ok := strings.CutPrefix(ev, "data: ")
		if !ok || strings.Contains(data, "\n") {
			return nil, fmt.Errorf("event %q is not one data line", trim([]byte(ev)))
		}
		out = append(out, data)
	}
	if !strings.HasSuffix(string(body), "\n\n") {
		return nil, fmt.Errorf("stream does not end with a blank line")
	}
	return out, nil
}

// compareSSE compares the first and the last JSON event shapes, whether
// the stream ends with [DONE], and that no delta carries a role (llama.cpp
// sends no role chunk).
func compareSSE(t *testing.T, want, got []byte) {
	t.Helper()
	we, err := sseEvents(want)
	if err != nil {
		t.Fatalf("captured stream: %v", err)
	}
	ge, err := sseEvents(got)
	if err != nil {
		t.Errorf("stream: %v", err)
		return
	}
	wDone := len(we) > 0 && we[len(we)-1] == "[DONE]"
	gDone := len(ge) > 0 && ge[len(ge)-1] == "[DONE]"
	if wDone != gDone {
		t.Errorf("ends with [DONE]: %v, want %v", gDone, wDone)
	}
	if wDone {
		we = we[:len(we)-1]
	}
	if gDone {
		ge = ge[:len(ge)-1]
	}
	if len(ge) < 2 {
		t.Errorf("%d JSON events, want at least a token and a final one", len(ge))
		return
	}
	for i, pair := range [][2]string{{we[0], ge[0]}, {we[len(we)-1], ge[len(ge)-1]}} {
		which := [...]string{"first", "last"}[i]
		var w, g any
		if err := json.Unmarshal([]byte(pair[0]), &w); err != nil {
			t.Fatalf("captured %s event: %v", which, err)
		}
		if err := json.Unmarshal([]byte(pair[1]), &g); err != nil {
			t.Errorf("%s event is not JSON: %v", which, err)
			continue
		}
		for _, d := range diffShape(which, w, g) {
			t.Error(d)
		}
	}
	for i, ev := range ge {
		if strings.Contains(ev, `"role"`) {
			t.Errorf("event %d carries a role: %s", i, trim([]byte(ev)))
		}
	}
}

// metricFamilies lists the "# TYPE" lines of a Prometheus text body.
func metricFamilies(body []byte) []string {
	var out []string
	for _, l := range strings.Split(string(body), "\n") {
		if rest, ok := strings.CutPrefix(l, "# TYPE "); ok {
			out = append(out, rest)
		}
	}
	sort.Strings(out)
	return out
}
