package sim

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"mime"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/llmgw/llmgw/engines"
	"github.com/llmgw/llmgw/profiles"
)

// This file replays the fixture sets built from the engines' public source
// (engines/<engine>/testdata/cases/*.json, see each set's PROVENANCE)
// against the simulator's personas. The fixtures are the reference: when a
// case fails, the persona is wrong, not the fixture.
//
// A case names one request and what the engine answers: status, media type,
// and the shape of the body. Shapes are key sets, not bytes: "required"
// keys must be present, "optional" keys may be (a field that depends on a
// flag, or whose presence at the catalog version could not be established
// from the source), any other key is a difference. "values" pins exact
// values; "fields" describes nested objects (for an array, every element).

// fixtureCase is one case file.
type fixtureCase struct {
	Name           string          `json:"name"`
	About          string          `json:"about"`
	Source         []fixtureSource `json:"source"`
	NotEstablished []string        `json:"not_established"`
	Request        fixtureRequest  `json:"request"`
	Response       fixtureResponse `json:"response"`
}

type fixtureSource struct {
	Repo   string `json:"repo"`
	Path   string `json:"path"`
	Commit string `json:"commit"`
	Shows  string `json:"shows"`
}

type fixtureRequest struct {
	Method string          `json:"method"`
	Path   string          `json:"path"`
	Body   json.RawMessage `json:"body"`
	// RawBody is sent verbatim (malformed JSON cases).
	RawBody *string `json:"raw_body"`
}

type fixtureResponse struct {
	Status int `json:"status"`
	// ContentType is the media type without parameters; "" means the
	// engine sends none (an empty body).
	ContentType string `json:"content_type"`
	// Body is "empty", "json", "sse", "text" or "prometheus".
	Body string `json:"body"`
	// Text is the exact body of a "text" answer.
	Text *string         `json:"text"`
	JSON *shape          `json:"json"`
	SSE  *sseSpec        `json:"sse"`
	Prom *prometheusSpec `json:"prometheus"`
	// CatalogVersion names the key (dotted path) that must hold the
	// catalog's engine version (profiles/catalog/catalog.yaml).
	CatalogVersion string `json:"catalog_version"`
}

// shape is the expected key set of a JSON object.
type shape struct {
	Required []string                   `json:"required"`
	Optional []string                   `json:"optional"`
	Values   map[string]json.RawMessage `json:"values"`
	Fields   map[string]*shape          `json:"fields"`
	// NullOrAbsent keys may be missing or null, never set (the pydantic
	// encoder writes null where the msgspec one omits the key).
	NullOrAbsent []string `json:"null_or_absent"`
	// Open: the object carries keys that cannot be listed (a dump of all
	// server arguments); only Required and Values are checked.
	Open bool `json:"open"`
}

// sseSpec describes an OpenAI-style event stream. Events are classified:
// the first event; "usage", an event whose choices array is empty;
// "finish", an event whose first choice has a non-null finish_reason;
// "token", every other event.
type sseSpec struct {
	// Done: the stream ends with "data: [DONE]\n\n".
	Done bool `json:"done"`
	// FirstTerminator is what follows the first event's JSON (default
	// "\n\n"); Terminator is that of every other event.
	FirstTerminator string `json:"first_terminator"`
	Terminator      string `json:"terminator"`
	First           *shape `json:"first"`
	Token           *shape `json:"token"`
	Finish          *shape `json:"finish"`
	Usage           *shape `json:"usage"`
	// NoUsage: no usage event may appear.
	NoUsage bool `json:"no_usage"`
	// Last applies to the last JSON event (native streams without the
	// OpenAI classification).
	Last *shape `json:"last"`
	// Native: the events are not OpenAI chunks; only First and Last apply.
	Native bool `json:"native"`
}

type prometheusSpec struct {
	Families []promFamily `json:"families"`
	// Absent names families the engine no longer exposes by default.
	Absent []string `json:"absent"`
	// Labels every sample of the listed families carries.
	Labels []string `json:"labels"`
}

type promFamily struct {
	Name string `json:"name"`
	Type string `json:"type"`
}

// sourceEngines are the fixture sets this file replays; llama.cpp's
// captured set has its own test.
var sourceEngines = []engines.Kind{engines.VLLM, engines.SGLang, engines.TRTLLM}

func loadCases(t *testing.T, kind engines.Kind) []fixtureCase {
	t.Helper()
	dir := filepath.Join("..", string(kind), "testdata", "cases")
	files, err := filepath.Glob(filepath.Join(dir, "*.json"))
	if err != nil || len(files) == 0 {
		t.Fatalf("%s: no cases in %s (err %v)", kind, dir, err)
	}
	sort.Strings(files)
	out := make([]fixtureCase, 0, len(files))
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		var c fixtureCase
		dec := json.NewDecoder(bytes.NewReader(b))
		dec.DisallowUnknownFields()
		if err := dec.Decode(&c); err != nil {
			t.Fatalf("%s: %v", f, err)
		}
		if want := strings.TrimSuffix(filepath.Base(f), ".json"); c.Name != want {
			t.Fatalf("%s: name %q does not match the file name", f, c.Name)
		}
		if len(c.Source) == 0 {
			t.Fatalf("%s: a case must cite its source", f)
		}
		for _, s := range c.Source {
			// "spec" marks the shared reference note (cited with its
			// section and confidence tag), the only non-commit source.
			if s.Repo == "" || s.Path == "" || s.Shows == "" || (len(s.Commit) != 40 && s.Commit != "spec") {
				t.Fatalf("%s: source %+v must name repo, path, a 40-digit commit and what it shows", f, s)
			}
		}
		out = append(out, c)
	}
	return out
}

func TestSourceFixtures(t *testing.T) {
	cat, err := profiles.Load()
	if err != nil {
		t.Fatal(err)
	}
	for _, kind := range sourceEngines {
		t.Run(string(kind), func(t *testing.T) {
			ev, err := cat.Versions().For(string(kind))
			if err != nil {
				t.Fatal(err)
			}
			s := startSim(t, Config{Engine: kind, KVEvents: KVEventsOff, Seed: 7})
			c := client(t)
			for _, fc := range loadCases(t, kind) {
				t.Run(fc.Name, func(t *testing.T) {
					checkCase(t, c, "http://"+s.Addrs().HTTP, fc, ev.Version)
				})
			}
		})
	}
}

func checkCase(t *testing.T, c *http.Client, base string, fc fixtureCase, catalogVersion string) {
	t.Helper()
	body := ""
	switch {
	case fc.Request.RawBody != nil:
		body = *fc.Request.RawBody
	case len(fc.Request.Body) > 0:
		body = string(fc.Request.Body)
	}
	res := do(t, c, fc.Request.Method, base+fc.Request.Path, body)
	if res.err != nil {
		t.Fatalf("read body: %v", res.err)
	}
	want := fc.Response
	if res.status != want.Status {
		t.Errorf("status: got %d, want %d (body %.300s)", res.status, want.Status, res.body)
	}
	gotCT := ""
	if ct := res.header.Get("Content-Type"); ct != "" {
		mt, _, err := mime.ParseMediaType(ct)
		if err != nil {
			t.Errorf("Content-Type %q: %v", ct, err)
		}
		gotCT = mt
	}
	if gotCT != want.ContentType {
		t.Errorf("Content-Type: got %q, want %q", gotCT, want.ContentType)
	}
	switch want.Body {
	case "empty":
		if len(res.body) != 0 {
			t.Errorf("body: got %q, want empty", res.body)
		}
	case "text":
		if want.Text != nil && string(res.body) != *want.Text {
			t.Errorf("body: got %q, want %q", res.body, *want.Text)
		}
	case "json":
		var v any
		if err := json.Unmarshal(res.body, &v); err != nil {
			t.Fatalf("body is not JSON: %v: %.300s", err, res.body)
		}
		if want.JSON != nil {
			for _, e := range matchShape("$", v, want.JSON) {
				t.Error(e)
			}
		}
		if want.CatalogVersion != "" {
			got, _ := lookup(v, want.CatalogVersion).(string)
			if got != catalogVersion {
				t.Errorf("%s: got %q, want the catalog's %q", want.CatalogVersion, got, catalogVersion)
			}
		}
	case "sse":
		for _, e := range matchSSE(res.body, want.SSE) {
			t.Error(e)
		}
	case "prometheus":
		for _, e := range matchProm(res.body, want.Prom) {
			t.Error(e)
		}
	default:
		t.Fatalf("unknown body kind %q", want.Body)
	}
}

func lookup(v any, path string) any {
	for _, k := range strings.Split(path, ".") {
		m, ok := v.(map[string]any)
		if !ok {
			return nil
		}
		v = m[k]
	}
	return v
}

// matchShape reports every difference between v and sh.
func matchShape(at string, v any, sh *shape) []string {
	m, ok := v.(map[string]any)
	if !ok {
		return []string{fmt.Sprintf("%s: got %T, want an object", at, v)}
	}
	var errs []string
	allowed := map[string]bool{}
	for _, k := range sh.Required {
		allowed[k] = true
		if _, ok := m[k]; !ok {
			errs = append(errs, fmt.Sprintf("%s: missing key %q", at, k))
		}
	}
	for _, k := range sh.Optional {
		allowed[k] = true
	}
	for k := range sh.Fields {
		allowed[k] = true
	}
	for k := range sh.Values {
		allowed[k] = true
	}
	for _, k := range sh.NullOrAbsent {
		allowed[k] = true
		if v, ok := m[k]; ok && v != nil {
			gb, _ := json.Marshal(v)
			errs = append(errs, fmt.Sprintf("%s.%s: got %s, want null or absent", at, k, gb))
		}
	}
	if !sh.Open {
		var extra []string
		for k := range m {
			if !allowed[k] {
				extra = append(extra, k)
			}
		}
		sort.Strings(extra)
		for _, k := range extra {
			errs = append(errs, fmt.Sprintf("%s: key %q is not in the engine's shape", at, k))
		}
	}
	for k, raw := range sh.Values {
		got, ok := m[k]
		if !ok {
			if !slices.Contains(sh.Required, k) {
				errs = append(errs, fmt.Sprintf("%s: missing key %q (want %s)", at, k, raw))
			}
			continue
		}
		var want any
		if err := json.Unmarshal(raw, &want); err != nil {
			errs = append(errs, fmt.Sprintf("%s.%s: bad fixture value: %v", at, k, err))
			continue
		}
		if !jsonEqual(got, want) {
			gb, _ := json.Marshal(got)
			errs = append(errs, fmt.Sprintf("%s.%s: got %s, want %s", at, k, gb, raw))
		}
	}
	keys := make([]string, 0, len(sh.Fields))
	for k := range sh.Fields {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		sub := sh.Fields[k]
		got, ok := m[k]
		if !ok || got == nil {
			if slices.Contains(sh.Required, k) && ok {
				errs = append(errs, fmt.Sprintf("%s.%s: got null, want an object", at, k))
			}
			continue
		}
		if arr, isArr := got.([]any); isArr {
			for i, el := range arr {
				errs = append(errs, matchShape(fmt.Sprintf("%s.%s[%d]", at, k, i), el, sub)...)
			}
			continue
		}
		errs = append(errs, matchShape(at+"."+k, got, sub)...)
	}
	return errs
}

func jsonEqual(a, b any) bool {
	ab, err1 := json.Marshal(a)
	bb, err2 := json.Marshal(b)
	return err1 == nil && err2 == nil && bytes.Equal(ab, bb)
}

// matchSSE checks the framing and the event shapes of a stream.
func matchSSE(body []byte, spec *sseSpec) []string {
	if spec == nil {
		return []string{"fixture: sse body without an sse spec"}
	}
	term := spec.Terminator
	if term == "" {
		term = "\n\n"
	}
	firstTerm := spec.FirstTerminator
	if firstTerm == "" {
		firstTerm = term
	}
	var errs []string
	rest := string(body)
	var events []any
	done := false
	for i := 0; rest != ""; i++ {
		line, ok := strings.CutPrefix(rest, "data: ")
		if !ok {
			return append(errs, fmt.Sprintf("event %d: does not start with %q: %.80q", i, "data: ", rest))
		}
		if strings.HasPrefix(line, "[DONE]\n\n") {
			done = true
			rest = line[len("[DONE]\n\n"):]
			if rest != "" {
				errs = append(errs, fmt.Sprintf("bytes after [DONE]: %.80q", rest))
			}
			break
		}
		t := term
		if i == 0 {
			t = firstTerm
		}
		end := strings.Index(line, "\n")
		if end < 0 {
			return append(errs, fmt.Sprintf("event %d: unterminated: %.80q", i, line))
		}
		payload := line[:end]
		// The terminator may start with bytes before the newline (a space).
		lead := strings.TrimSuffix(t, "\n\n")
		if !strings.HasSuffix(payload, lead) || !strings.HasPrefix(line[end:], "\n\n") {
			errs = append(errs, fmt.Sprintf("event %d: terminator: got %q, want %q", i, line[len(strings.TrimRight(payload, " ")):end+2], t))
		} else if lead == "" && strings.HasSuffix(payload, " ") {
			errs = append(errs, fmt.Sprintf("event %d: trailing space before the terminator", i))
		}
		payload = strings.TrimSuffix(payload, lead)
		var v any
		if err := json.Unmarshal([]byte(payload), &v); err != nil {
			return append(errs, fmt.Sprintf("event %d: not JSON: %v: %.120q", i, err, payload))
		}
		events = append(events, v)
		rest = line[end+2:]
	}
	if spec.Done != done {
		errs = append(errs, fmt.Sprintf("[DONE] terminator: got %v, want %v", done, spec.Done))
	}
	if len(events) == 0 {
		return append(errs, "no events")
	}
	if spec.First != nil {
		errs = append(errs, matchShape("first", events[0], spec.First)...)
	}
	if spec.Last != nil {
		errs = append(errs, matchShape("last", events[len(events)-1], spec.Last)...)
	}
	if spec.Native {
		return errs
	}
	var sawFinish, sawUsage bool
	for i, ev := range events {
		if i == 0 && spec.First != nil {
			continue
		}
		m, _ := ev.(map[string]any)
		choices, _ := m["choices"].([]any)
		at := fmt.Sprintf("event %d", i)
		switch {
		case len(choices) == 0:
			sawUsage = true
			if spec.NoUsage {
				errs = append(errs, at+": usage event where the engine sends none")
			} else if spec.Usage != nil {
				errs = append(errs, matchShape(at+" (usage)", ev, spec.Usage)...)
			}
		case finishOf(choices[0]) != nil:
			sawFinish = true
			if spec.Finish != nil {
				errs = append(errs, matchShape(at+" (finish)", ev, spec.Finish)...)
			}
		default:
			if spec.Token != nil {
				errs = append(errs, matchShape(at+" (token)", ev, spec.Token)...)
			}
		}
	}
	if spec.Finish != nil && !sawFinish {
		errs = append(errs, "no event carries a finish_reason")
	}
	if spec.Usage != nil && !sawUsage {
		errs = append(errs, "no usage event")
	}
	return errs
}

func finishOf(choice any) any {
	m, _ := choice.(map[string]any)
	return m["finish_reason"]
}

// matchProm checks metric families and their types in Prometheus text.
func matchProm(body []byte, spec *prometheusSpec) []string {
	if spec == nil {
		return []string{"fixture: prometheus body without a prometheus spec"}
	}
	types := map[string]string{}
	samples := map[string][]string{} // family -> label strings
	sc := bufio.NewScanner(bytes.NewReader(body))
	for sc.Scan() {
		line := sc.Text()
		if rest, ok := strings.CutPrefix(line, "# TYPE "); ok {
			name, typ, _ := strings.Cut(rest, " ")
			types[name] = typ
			continue
		}
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		name, labels := line, ""
		if i := strings.IndexAny(line, "{ "); i >= 0 {
			name = line[:i]
			if line[i] == '{' {
				if j := strings.Index(line, "}"); j > i {
					labels = line[i+1 : j]
				}
			}
		}
		samples[familyOf(name, types)] = append(samples[familyOf(name, types)], labels)
	}
	var errs []string
	for _, f := range spec.Families {
		got, ok := types[f.Name]
		if !ok {
			errs = append(errs, fmt.Sprintf("family %q: missing", f.Name))
			continue
		}
		if got != f.Type {
			errs = append(errs, fmt.Sprintf("family %q: type %q, want %q", f.Name, got, f.Type))
		}
		for _, ls := range samples[f.Name] {
			for _, l := range spec.Labels {
				if !strings.Contains(ls, l+"=") {
					errs = append(errs, fmt.Sprintf("family %q: sample {%s} lacks label %q", f.Name, ls, l))
				}
			}
		}
	}
	for _, name := range spec.Absent {
		if _, ok := types[name]; ok {
			errs = append(errs, fmt.Sprintf("family %q: exposed, but the engine hides it by default", name))
		}
	}
	return errs
}

// familyOf maps a sample name to its family (counters expose name_total,
// histograms name_bucket/_sum/_count).
func familyOf(sample string, types map[string]string) string {
	if _, ok := types[sample]; ok {
		return sample
	}
	for _, suf := range []string{"_total", "_bucket", "_sum", "_count", "_created"} {
		if base, ok := strings.CutSuffix(sample, suf); ok {
			if _, ok := types[base]; ok {
				return base
			}
		}
	}
	return sample
}

// TestSourceFixturesIdleClose checks the connection fact each fixture set
// records (uvicorn's timeout_keep_alive): a kept-alive connection is
// reusable at once after an answer, and the engine closes it once idle for
// the adapter's IdleTimeout.
func TestSourceFixturesIdleClose(t *testing.T) {
	for _, kind := range sourceEngines {
		t.Run(string(kind), func(t *testing.T) {
			t.Parallel()
			idle := engines.MustFor(kind).Conn().IdleTimeout
			if idle <= 0 {
				t.Fatalf("%s adapter states no idle timeout", kind)
			}
			s := startSim(t, Config{Engine: kind, KVEvents: KVEventsOff})
			conn, err := net.Dial("tcp", s.Addrs().HTTP)
			if err != nil {
				t.Fatal(err)
			}
			defer conn.Close()
			br := bufio.NewReader(conn)
			for i := 0; i < 2; i++ {
				if _, err := fmt.Fprintf(conn, "GET /health HTTP/1.1\r\nHost: x\r\n\r\n"); err != nil {
					t.Fatalf("request %d: %v", i, err)
				}
				if err := readResponse(br); err != nil {
					t.Fatalf("response %d on a kept-alive connection: %v", i, err)
				}
			}
			// The engine must close the idle connection: the read ends in
			// EOF, well before this generous deadline.
			if err := conn.SetReadDeadline(time.Now().Add(idle + 10*time.Second)); err != nil {
				t.Fatal(err)
			}
			_, err = br.ReadByte()
			if !errors.Is(err, io.EOF) {
				t.Fatalf("idle connection: got %v, want EOF (closed by the engine)", err)
			}
		})
	}
}

// readResponse reads one HTTP/1.1 response with a Content-Length or empty
// body (health answers).
func readResponse(br *bufio.Reader) error {
	status, err := br.ReadString('\n')
	if err != nil {
		return err
	}
	if !strings.HasPrefix(status, "HTTP/1.1 200") {
		return fmt.Errorf("status line %q", status)
	}
	n := 0
	for {
		line, err := br.ReadString('\n')
		if err != nil {
			return err
		}
		line = strings.TrimRight(line, "\r\n")
		if line == "" {
			break
		}
		if k, v, ok := strings.Cut(line, ":"); ok && strings.EqualFold(k, "Content-Length") {
			if _, err := fmt.Sscan(strings.TrimSpace(v), &n); err != nil {
				return err
			}
		}
	}
	_, err = io.CopyN(io.Discard, br, int64(n))
	return err
}
