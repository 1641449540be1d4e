package reliability

import (
	"bufio"
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"net"
	"net/http"
	"os"
	"strings"
	"sync"
	"testing"

	"github.com/llmgw/llmgw/gateway"
	"github.com/llmgw/llmgw/gateway/rule"
)

// relayEnv is an embedded gateway in front of a scripted worker that
// answers each request with the SSE bytes, chunking and ending the request
// itself carries. One per test process, shared by the fuzz workers'
// iterations (requests carry their whole script, so they are independent).
type relayEnv struct {
	gw     *gateway.Server
	ln     net.Listener
	wg     sync.WaitGroup
	client *http.Client
	dir    string
}

var (
	relayOnce sync.Once
	relay     *relayEnv
	relayErr  error
)

func getRelayEnv() (*relayEnv, error) {
	relayOnce.Do(func() {
		relay, relayErr = newRelayEnv()
		if relay != nil {
			cleanups = append(cleanups, relay.close)
		}
	})
	return relay, relayErr
}

func newRelayEnv() (*relayEnv, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, fmt.Errorf("reliability: worker listener: %w", err)
	}
	dir, err := os.MkdirTemp("", "llmgw-relay-fuzz-")
	if err != nil {
		ln.Close()
		return nil, err
	}
	e := &relayEnv{ln: ln, dir: dir, client: &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 16}}}
	e.wg.Add(1)
	go e.serve()
	gw, err := gateway.New(gateway.Config{Listen: "127.0.0.1:0", Admin: "127.0.0.1:0", StateDir: dir,
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err == nil {
		err = gw.Start(context.Background())
	}
	if err != nil {
		e.close()
		return nil, err
	}
	e.gw = gw
	_, port, _ := net.SplitHostPort(ln.Addr().String())
	r, err := rule.Decode([]byte("name: relay\nmodel_name: m\nprobe: {disabled: true}\ncb: {failures: 1000, origin_5xx: -1}\ntimeouts: {idle: 5s}\nendpoints:\n  - {id: w1, endpointIP: 127.0.0.1, targetPort: " + port + "}\n"))
	if err == nil {
		_, err = gw.Apply(r, false)
	}
	if err != nil {
		e.close()
		return nil, err
	}
	return e, nil
}

func (e *relayEnv) close() {
	if e.gw != nil {
		e.gw.Close()
	}
	e.ln.Close()
	e.wg.Wait()
	e.client.CloseIdleConnections()
	os.RemoveAll(e.dir)
}

// serve accepts worker connections until the listener closes; each
// connection answers one request and closes.
func (e *relayEnv) serve() {
	defer e.wg.Done()
	for {
		conn, err := e.ln.Accept()
		if err != nil {
			return
		}
		e.wg.Add(1)
		go func() {
			defer e.wg.Done()
			defer conn.Close()
			answerScripted(conn)
		}()
	}
}

// relayScript is what one request asks the worker to do.
type relayScript struct {
	Payload []byte `json:"p"`
	Seed    uint64 `json:"s"`
	Broken  bool   `json:"b"` // close without the terminating chunk
}

func answerScripted(conn net.Conn) {
	req, err := http.ReadRequest(bufio.NewReader(conn))
	if err != nil {
		return
	}
	var body struct {
		Messages []struct {
			Content string `json:"content"`
		} `json:"messages"`
	}
	raw, _ := io.ReadAll(req.Body)
	var sc relayScript
	if json.Unmarshal(raw, &body) != nil || len(body.Messages) == 0 {
		return
	}
	b, err := base64.StdEncoding.DecodeString(body.Messages[0].Content)
	if err != nil || json.Unmarshal(b, &sc) != nil {
		return
	}
	w := bufio.NewWriter(conn)
	w.WriteString("HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n")
	rng := rand.New(rand.NewPCG(sc.Seed, 0))
	p := sc.Payload
	for len(p) > 0 {
		n := min(len(p), 1+rng.IntN(64))
		fmt.Fprintf(w, "%x\r\n%s\r\n", n, p[:n])
		if w.Flush() != nil {
			return
		}
		p = p[n:]
	}
	if !sc.Broken {
		w.WriteString("0\r\n\r\n")
	}
	w.Flush()
}

// checkRelay sends one scripted stream through the gateway and checks the
// relay contract: the client gets the worker's bytes unchanged and in
// order; a stream that breaks before "data: [DONE]" ends with one OpenAI
// error event and [DONE]; one that ends cleanly gets nothing added.
func checkRelay(t *testing.T, e *relayEnv, sc relayScript) {
	t.Helper()
	script, _ := json.Marshal(sc)
	body := fmt.Sprintf(`{"model":"m","stream":true,"messages":[{"role":"user","content":%q}]}`, base64.StdEncoding.EncodeToString(script))
	resp, err := e.client.Post("http://"+e.gw.Addr()+"/v1/chat/completions", "application/json", strings.NewReader(body))
	if err != nil {
		t.Fatalf("request: %v", err)
	}
	got, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	if err != nil {
		t.Fatalf("reading the relayed stream: %v", err)
	}
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("status %d: %s", resp.StatusCode, got)
	}
	if !bytes.HasPrefix(got, sc.Payload) {
		t.Fatalf("relayed bytes differ from the worker's:\n got %q\nwant prefix %q", got, sc.Payload)
	}
	rest := got[len(sc.Payload):]
	switch {
	case !sc.Broken || bytes.Contains(sc.Payload, []byte("data: [DONE]")):
		if len(rest) != 0 {
			t.Fatalf("the gateway added %q to a stream that ended cleanly or had already sent [DONE]", rest)
		}
	default:
		if !bytes.HasPrefix(rest, []byte(`data: {"error":`)) || !bytes.HasSuffix(rest, []byte("\n\ndata: [DONE]\n\n")) || bytes.Count(rest, []byte("data: ")) != 2 {
			t.Fatalf("a broken stream ended with %q; want one error event and [DONE]", rest)
		}
	}
}

// FuzzSSERelay drives arbitrary SSE bytes, cut into arbitrary chunks, with a
// clean or broken end, through the gateway's stream relay.
func FuzzSSERelay(f *testing.F) {
	f.Add([]byte("data: {\"choices\":[{\"delta\":{\"content\":\"hi\"}}]}\n\ndata: [DONE]\n\n"), uint64(1), false)
	f.Add([]byte("data: {\"choices\":[{\"delta\":{\"content\":\"hi\"}}]}\n\n"), uint64(2), true)
	f.Add([]byte("data: [DONE]\n\n"), uint64(3), true)
	f.Add([]byte("data: [DO"), uint64(4), true)
	f.Add([]byte(": keep-alive\r\n\r\nevent: x\ndata: a\ndata: b\n\n"), uint64(5), false)
	f.Add([]byte{}, uint64(6), true)
	f.Add([]byte("\x00\xff\xfe data: [DONE]"), uint64(7), false)
	f.Fuzz(func(t *testing.T, payload []byte, seed uint64, broken bool) {
		e, err := getRelayEnv()
		if err != nil {
			t.Fatal(err)
		}
		checkRelay(t, e, relayScript{Payload: payload, Seed: seed, Broken: broken})
	})
}

// TestSSERelayContract pins the relay contract on named cases (the fuzz
// target's seeds, readable).
func TestSSERelayContract(t *testing.T) {
	e, err := getRelayEnv()
	if err != nil {
		t.Fatal(err)
	}
	long := strings.Repeat("data: {\"choices\":[{\"delta\":{\"content\":\"token\"}}]}\n\n", 200)
	cases := []struct {
		name string
		sc   relayScript
	}{
		{"clean stream with [DONE]", relayScript{Payload: []byte(long + "data: [DONE]\n\n"), Seed: 1}},
		{"broken before [DONE]", relayScript{Payload: []byte(long), Seed: 2, Broken: true}},
		{"broken after [DONE]", relayScript{Payload: []byte(long + "data: [DONE]\n\n"), Seed: 3, Broken: true}},
		{"[DONE] split across chunks then broken", relayScript{Payload: []byte("data: [DONE]\n\n"), Seed: 4, Broken: true}},
		{"broken before any byte", relayScript{Seed: 5, Broken: true}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) { checkRelay(t, e, tc.sc) })
	}
}
