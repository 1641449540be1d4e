package gateway

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/valyala/fasthttp"

	"github.com/llmgw/llmgw/gateway/rule"
	"github.com/llmgw/llmgw/internal/wait"
)

// pushSource is an EndpointSource the test drives: Watch returns the set
// it holds and push delivers a new one, as the k8s package's informers do.
// (The informers themselves are tested against a real API server in k8s.)
type pushSource struct {
	mu      sync.Mutex
	initial []rule.Endpoint
	updates []func([]rule.Endpoint)
	wg      sync.WaitGroup
}

func (p *pushSource) Watch(ctx context.Context, _ rule.EndpointsFrom, update func([]rule.Endpoint)) ([]rule.Endpoint, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	ch := make(chan []rule.Endpoint)
	p.updates = append(p.updates, func(eps []rule.Endpoint) {
		select {
		case ch <- eps:
		case <-ctx.Done():
		}
	})
	p.wg.Add(1)
	go func() {
		defer p.wg.Done()
		for {
			select {
			case <-ctx.Done():
				return
			case eps := <-ch:
				update(eps)
			}
		}
	}()
	return append([]rule.Endpoint(nil), p.initial...), nil
}

// push sends eps to the newest watch.
func (p *pushSource) push(eps []rule.Endpoint) {
	p.mu.Lock()
	u := p.updates[len(p.updates)-1]
	p.mu.Unlock()
	u(eps)
}

// lockedBuf is a log sink safe for the gateway's goroutines.
type lockedBuf struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuf) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuf) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// earlySource delivers next before Watch returns, before the rule is
// installed, as an informer event right after the first sync may.
type earlySource struct {
	initial, next []rule.Endpoint
}

func (e *earlySource) Watch(ctx context.Context, _ rule.EndpointsFrom, update func([]rule.Endpoint)) ([]rule.Endpoint, error) {
	done := make(chan struct{})
	go func() {
		defer close(done)
		update(e.next)
	}()
	<-done
	return e.initial, nil
}

func epsOf(bs ...*backend) []rule.Endpoint {
	var out []rule.Endpoint
	for i, b := range bs {
		out = append(out, rule.Endpoint{ID: "pod-" + string(rune('a'+i)), EndpointIP: "127.0.0.1", TargetPort: b.port()})
	}
	return out
}

func ids(t *testing.T, s *Server, name string) string {
	t.Helper()
	st, err := s.Rule(name)
	if err != nil {
		return err.Error()
	}
	var out []string
	for _, e := range st.Status.Endpoints {
		if e.Draining {
			out = append(out, e.ID+"(drained)")
		} else {
			out = append(out, e.ID)
		}
	}
	return strings.Join(out, ",")
}

const discoveredRule = "name: d\nmodel_name: m1\nprobe: {disabled: true}\nendpoints_from: {namespace: llm, selector: {app: vllm}, target_ports: [8000]}\n"

// TestDiscoveredEndpoints: a rule with endpoints_from runs the source's
// set, follows each new set without a restart (state kept by id), drains
// on an empty set and undrains when endpoints return, refuses a set that
// fails admission, persists the rule as written, and is refused on a
// server without a source.
func TestDiscoveredEndpoints(t *testing.T) {
	b1, b2, b3 := newBackend(t, "a", nil), newBackend(t, "b", nil), newBackend(t, "c", nil)
	src := &pushSource{initial: epsOf(b1, b2)}
	dir := t.TempDir()
	// Registered first, so it runs after the gateway's Close has ended the
	// watches' contexts.
	t.Cleanup(src.wg.Wait)
	logs := &lockedBuf{}
	gw := startGateway(t, dir, func(c *Config) {
		c.EndpointSource = src
		c.Logger = slog.New(slog.NewTextHandler(logs, nil))
	})
	eff := mustApply(t, gw, discoveredRule)
	if len(eff.Endpoints) != 2 || eff.EndpointsFrom == nil {
		t.Fatalf("effective rule: %d endpoints, endpoints_from %v", len(eff.Endpoints), eff.EndpointsFrom)
	}
	c := newClient(t)
	url := "http://" + gw.Addr() + "/v1/chat/completions"
	if resp, _ := post(t, c, url, chatBody); resp.StatusCode != 200 {
		t.Fatalf("status %d", resp.StatusCode)
	}
	// Operator state carries over a change by endpoint id.
	if err := gw.SetDraining("d", "pod-a", true); err != nil {
		t.Fatal(err)
	}
	steps := []struct {
		name string
		set  []rule.Endpoint
		want string
	}{
		{"scale up", epsOf(b1, b2, b3), "pod-a(drained),pod-b,pod-c"},
		{"scale down", epsOf(b1, b2), "pod-a(drained),pod-b"},
		{"empty set drains", nil, "pod-a(drained),pod-b(drained)"},
		{"endpoints return undrained", epsOf(b1, b2), "pod-a,pod-b"},
	}
	for _, st := range steps {
		t.Run(st.name, func(t *testing.T) {
			src.push(st.set)
			wait.For(t, 5*time.Second, st.want, func() bool { return ids(t, gw, "d") == st.want })
		})
	}
	t.Run("a set failing admission is refused", func(t *testing.T) {
		src.push(append(epsOf(b1), rule.Endpoint{ID: "pod-a", EndpointIP: "127.0.0.1", TargetPort: b2.port()}))
		wait.For(t, 5*time.Second, "the refusal logged", func() bool {
			return strings.Contains(logs.String(), "discovered endpoints refused") && strings.Contains(logs.String(), "endpoint_id_duplicate")
		})
		if got := ids(t, gw, "d"); got != "pod-a,pod-b" {
			t.Fatalf("set %s after a refused update, want the previous pod-a,pod-b", got)
		}
	})
	if resp, _ := post(t, c, url, chatBody); resp.StatusCode != 200 {
		t.Fatalf("after the changes: status %d", resp.StatusCode)
	}
	// Persisted as written: no endpoints on disk.
	saved, err := gw.store.Load()
	if err != nil {
		t.Fatal(err)
	}
	if len(saved) != 1 || len(saved[0].Endpoints) != 0 || saved[0].EndpointsFrom == nil {
		t.Fatalf("stored rule %+v, want endpoints_from and no endpoints", saved)
	}

	t.Run("restart resolves the stored rule through the source", func(t *testing.T) {
		gw.Close()
		again := startGateway(t, dir, func(c *Config) { c.EndpointSource = src })
		if got := ids(t, again, "d"); got != "pod-a,pod-b" {
			t.Fatalf("after restart: %s, want the source's set pod-a,pod-b", got)
		}
	})
	t.Run("a set delivered as the watch starts is not lost", func(t *testing.T) {
		src := &earlySource{initial: epsOf(b1), next: epsOf(b1, b2)}
		early := startGateway(t, "", func(c *Config) { c.EndpointSource = src })
		mustApply(t, early, discoveredRule)
		if got := ids(t, early, "d"); got != "pod-a,pod-b" {
			t.Fatalf("set %s when Apply returned, want the early set pod-a,pod-b", got)
		}
	})
	t.Run("no source", func(t *testing.T) {
		plain := startGateway(t, "", nil)
		r, err := rule.Decode([]byte(discoveredRule))
		if err != nil {
			t.Fatal(err)
		}
		_, err = plain.Apply(r, false)
		var adm *rule.AdmissionError
		if !errors.As(err, &adm) || adm.Code != rule.CodeEndpointsFrom {
			t.Fatalf("err %v, want %s", err, rule.CodeEndpointsFrom)
		}
	})
	t.Run("empty at apply", func(t *testing.T) {
		empty := startGateway(t, "", func(c *Config) { c.EndpointSource = &pushSource{} })
		r, err := rule.Decode([]byte(discoveredRule))
		if err != nil {
			t.Fatal(err)
		}
		_, err = empty.Apply(r, false)
		if !errors.Is(err, &rule.AdmissionError{Code: rule.CodeNoReadyEndpoint}) || !strings.Contains(err.Error(), "no ready endpoint") {
			t.Fatalf("err %v, want %s", err, rule.CodeNoReadyEndpoint)
		}
	})
}

// TestDiscoveredEndpointVanishesMidRequest: an endpoint that leaves the
// discovered set while it streams, and then dies, ends that stream as a
// static rule's dying worker does (the events so far, an error event,
// [DONE]: TestUpstreamDeathMidStreamEndsWithErrorEvent); the next request
// goes to the endpoint that replaced it.
func TestDiscoveredEndpointVanishesMidRequest(t *testing.T) {
	started, removed := make(chan struct{}), make(chan struct{})
	dying := newBackend(t, "dies", func(ctx *fasthttp.RequestCtx) {
		ctx.HijackSetNoResponse(true)
		ctx.Hijack(func(c net.Conn) {
			fmt.Fprintf(c, "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n")
			ev := "data: {\"n\":1}\n\n"
			fmt.Fprintf(c, "%x\r\n%s\r\n", len(ev), ev)
			close(started)
			<-removed
			c.Close() // dies without the terminating chunk
		})
	})
	healthy := newBackend(t, "b", nil)
	src := &pushSource{initial: epsOf(dying)}
	t.Cleanup(src.wg.Wait)
	gw := startGateway(t, "", func(c *Config) { c.EndpointSource = src })
	mustApply(t, gw, discoveredRule)
	c := newClient(t)
	url := "http://" + gw.Addr() + "/v1/chat/completions"
	type answer struct {
		status int
		body   string
	}
	got := make(chan answer, 1)
	go func() {
		req, _ := http.NewRequest(http.MethodPost, url, strings.NewReader(`{"model":"m1","stream":true,"messages":[{"role":"user","content":"x"}]}`))
		resp, err := c.Do(req)
		if err != nil {
			got <- answer{body: err.Error()}
			return
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		got <- answer{resp.StatusCode, string(b)}
	}()
	<-started
	// The pod goes away: a new set without it, then the worker dies.
	src.push([]rule.Endpoint{{ID: "pod-b", EndpointIP: "127.0.0.1", TargetPort: healthy.port()}})
	wait.For(t, 5*time.Second, "the set without the dying pod", func() bool { return ids(t, gw, "d") == "pod-b" })
	close(removed)
	a := <-got
	if a.status != 200 || !strings.HasPrefix(a.body, "data: {\"n\":1}\n\n") || !strings.Contains(a.body, `"error":{`) || !strings.HasSuffix(a.body, "data: [DONE]\n\n") {
		t.Errorf("status %d stream %q; want the first event, an error event and [DONE]", a.status, a.body)
	}
	resp, _ := post(t, c, url, chatBody)
	if resp.StatusCode != 200 || resp.Header.Get("X-Llmgw-Endpoint") != "pod-b" {
		t.Errorf("next request: status %d endpoint %q, want 200 from pod-b", resp.StatusCode, resp.Header.Get("X-Llmgw-Endpoint"))
	}
}
