package sim

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/valyala/fasthttp"
)

// ErrRendezvous classifies SGLang P/D rendezvous failures (a leg whose peer
// never joined the same bootstrap room in time).
var ErrRendezvous = errors.New("sim: bootstrap rendezvous failed")

// bootstrapServer is a SGLang prefill's bootstrap server. A prefill request
// carrying room R registers R and waits for a decode to join it;
// the decode's join (POST /bootstrap/join) waits until the prefill has
// computed the prompt and then learns how many tokens were transferred. A
// leg whose peer does not arrive within the timeout fails, so a pair sent
// with different rooms fails on both sides.
type bootstrapServer struct {
	addr    string
	timeout time.Duration
	ln      net.Listener
	srv     *fasthttp.Server
	done    chan struct{}
	quit    chan struct{} // closed by close: wakes every waiting leg

	mu    sync.Mutex
	rooms map[uint64]*room
}

type room struct {
	prefill chan struct{} // closed when the prefill registers
	joined  chan struct{} // closed when the decode joins
	ready   chan struct{} // closed when the prefill finished (tokens/err set)
	tokens  int
	err     error
	hasP    bool
	hasD    bool
}

func newRoom() *room {
	return &room{prefill: make(chan struct{}), joined: make(chan struct{}), ready: make(chan struct{})}
}

func startBootstrap(ctx context.Context, listen string, timeout time.Duration) (*bootstrapServer, error) {
	ln, err := net.Listen("tcp", listen)
	if err != nil {
		return nil, fmt.Errorf("sim: bootstrap listen %s: %w", listen, err)
	}
	b := &bootstrapServer{addr: ln.Addr().String(), timeout: timeout, ln: ln, rooms: map[uint64]*room{}, done: make(chan struct{}), quit: make(chan struct{})}
	b.srv = &fasthttp.Server{Handler: b.handle, Name: "sglang-bootstrap", CloseOnShutdown: true, MaxIdleWorkerDuration: idleWorkerCheck}
	go func() {
		defer close(b.done)
		_ = b.srv.Serve(ln)
	}()
	_ = ctx // the owning Sim closes the server; ctx only bounds waits
	return b, nil
}

func (b *bootstrapServer) close() {
	close(b.quit)
	_ = b.srv.Shutdown()
	_ = b.ln.Close() // Serve may not have started when Shutdown ran
	<-b.done
}

func (b *bootstrapServer) get(id uint64) *room {
	b.mu.Lock()
	defer b.mu.Unlock()
	r, ok := b.rooms[id]
	if !ok {
		r = newRoom()
		b.rooms[id] = r
	}
	return r
}

func (b *bootstrapServer) drop(id uint64, r *room) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.rooms[id] == r {
		delete(b.rooms, id)
	}
}

// awaitDecode registers the prefill of room id and waits for its decode.
func (b *bootstrapServer) awaitDecode(ctx context.Context, id uint64) error {
	r := b.get(id)
	b.mu.Lock()
	if r.hasP {
		b.mu.Unlock()
		return fmt.Errorf("%w: bootstrap room %d already has a prefill", ErrRendezvous, id)
	}
	r.hasP = true
	close(r.prefill)
	b.mu.Unlock()
	t := time.NewTimer(b.timeout)
	defer t.Stop()
	select {
	case <-r.joined:
		return nil
	case <-t.C:
	case <-ctx.Done():
	case <-b.quit:
	}
	b.finish(id, r, 0, fmt.Errorf("%w: no decode joined bootstrap room %d within %s", ErrRendezvous, id, b.timeout))
	return r.err
}

// transferDone marks room id's KV as computed (tokens prompt tokens).
func (b *bootstrapServer) transferDone(id uint64, tokens int) {
	b.mu.Lock()
	r := b.rooms[id]
	b.mu.Unlock()
	if r != nil {
		b.finish(id, r, tokens, nil)
	}
}

func (b *bootstrapServer) finish(id uint64, r *room, tokens int, err error) {
	b.mu.Lock()
	select {
	case <-r.ready:
	default:
		r.tokens, r.err = tokens, err
		close(r.ready)
	}
	b.mu.Unlock()
	b.drop(id, r)
}

// handle serves POST /bootstrap/join {"room", "prompt_tokens"}: it answers
// 200 {"room","transferred_tokens"} once the prefill of
// that room has run, 504 when no prefill arrives in time, 409 on a second
// decode, 500 when the prefill failed.
func (b *bootstrapServer) handle(ctx *fasthttp.RequestCtx) {
	ctx.SetContentType("application/json")
	if string(ctx.Path()) != "/bootstrap/join" || !ctx.IsPost() {
		ctx.SetStatusCode(fasthttp.StatusNotFound)
		ctx.SetBodyString(`{"detail":"Not Found"}`)
		return
	}
	var req struct {
		Room         *uint64 `json:"room"`
		PromptTokens int     `json:"prompt_tokens"`
	}
	if err := json.Unmarshal(ctx.PostBody(), &req); err != nil || req.Room == nil {
		ctx.SetStatusCode(fasthttp.StatusBadRequest)
		ctx.SetBodyString(`{"error":"join needs room"}`)
		return
	}
	id := *req.Room
	r := b.get(id)
	b.mu.Lock()
	dup := r.hasD
	r.hasD = true
	if !dup {
		close(r.joined)
	}
	b.mu.Unlock()
	if dup {
		ctx.SetStatusCode(fasthttp.StatusConflict)
		ctx.SetBody(mustJSON(map[string]string{"error": fmt.Sprintf("bootstrap room %d already has a decode", id)}))
		return
	}
	t := time.NewTimer(b.timeout)
	defer t.Stop()
	select {
	case <-r.ready:
	case <-b.quit:
		ctx.SetStatusCode(fasthttp.StatusServiceUnavailable)
		ctx.SetBodyString(`{"error":"bootstrap server shutting down"}`)
		return
	case <-t.C:
		b.finish(id, r, 0, fmt.Errorf("no prefill for bootstrap room %d within %s", id, b.timeout))
		ctx.SetStatusCode(fasthttp.StatusGatewayTimeout)
		ctx.SetBody(mustJSON(map[string]string{"error": r.err.Error()}))
		return
	}
	if r.err != nil {
		ctx.SetStatusCode(fasthttp.StatusInternalServerError)
		ctx.SetBody(mustJSON(map[string]string{"error": r.err.Error()}))
		return
	}
	if req.PromptTokens != 0 && req.PromptTokens != r.tokens {
		ctx.SetStatusCode(fasthttp.StatusConflict)
		ctx.SetBody(mustJSON(map[string]string{"error": fmt.Sprintf("bootstrap room %d: prefill computed %d prompt tokens, decode has %d", id, r.tokens, req.PromptTokens)}))
		return
	}
	ctx.SetBody(mustJSON(map[string]any{"room": id, "transferred_tokens": r.tokens}))
}

// bootstrapClient is a SGLang decode's side of the rendezvous. The zero
// value is ready; close releases idle connections.
type bootstrapClient struct {
	once sync.Once
	tr   *http.Transport
}

func (c *bootstrapClient) transport() *http.Transport {
	c.once.Do(func() { c.tr = &http.Transport{MaxIdleConnsPerHost: 4, IdleConnTimeout: 30 * time.Second} })
	return c.tr
}

func (c *bootstrapClient) close() {
	c.once.Do(func() {})
	if c.tr != nil {
		c.tr.CloseIdleConnections()
	}
}

// join joins room t.Room at the prefill's bootstrap server and returns the
// number of prompt tokens whose KV was transferred.
func (c *bootstrapClient) join(ctx context.Context, t *BootstrapTriple, promptTokens int, timeout time.Duration) (int, error) {
	host := t.Host
	if strings.Contains(host, ":") && !strings.HasPrefix(host, "[") {
		host = "[" + host + "]"
	}
	url := "http://" + host + ":" + strconv.FormatInt(t.Port, 10) + "/bootstrap/join"
	body := mustJSON(map[string]any{"room": t.Room, "prompt_tokens": promptTokens})
	ctx, cancel := context.WithTimeout(ctx, timeout+5*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, strings.NewReader(string(body)))
	if err != nil {
		return 0, fmt.Errorf("%w: room %d: %w", ErrRendezvous, t.Room, err)
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := (&http.Client{Transport: c.transport()}).Do(req)
	if err != nil {
		return 0, fmt.Errorf("%w: room %d: join %s: %w", ErrRendezvous, t.Room, url, err)
	}
	defer resp.Body.Close()
	data, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<16))
	if resp.StatusCode != http.StatusOK {
		return 0, fmt.Errorf("%w: room %d: bootstrap answered %d: %s", ErrRendezvous, t.Room, resp.StatusCode, strings.TrimSpace(string(data)))
	}
	var ok struct {
		Transferred int `json:"transferred_tokens"`
	}
	if err := json.Unmarshal(data, &ok); err != nil {
		return 0, fmt.Errorf("%w: room %d: bad join answer: %w", ErrRendezvous, t.Room, err)
	}
	return ok.Transferred, nil
}
