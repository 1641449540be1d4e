package cli

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/llmgw/llmgw/engines"
	"github.com/llmgw/llmgw/engines/sim"
)

// freeAddr is a loopback address with a kernel-chosen port, free when
// returned (for a serve whose admin port a test must know before serve
// prints it).
func freeAddr(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().String()
}

// readyz asks GET /readyz on admin: the status, the body, or -1 when the
// admin listener does not answer.
func readyz(admin string) (int, map[string]any) {
	c := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{DisableKeepAlives: true}}
	resp, err := c.Get("http://" + admin + "/readyz")
	if err != nil {
		return -1, nil
	}
	defer resp.Body.Close()
	var m map[string]any
	_ = json.NewDecoder(resp.Body).Decode(&m)
	return resp.StatusCode, m
}

// TestServeNotReadyUntilInitialRules (issue 42): serve said ready for a
// while at start-up before the rules given at start were installed. Here
// the API server of --rules-from kubernetes never answers, so the initial
// list never arrives: /readyz must say 503 "starting" all along, and
// serve must stop when its context ends.
func TestServeNotReadyUntilInitialRules(t *testing.T) {
	hold := make(chan struct{})
	api := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		select {
		case <-hold:
		case <-r.Context().Done():
		}
	}))
	t.Cleanup(api.Close)
	t.Cleanup(func() { close(hold) })
	kubeconfig := filepath.Join(t.TempDir(), "kubeconfig")
	kc := fmt.Sprintf("apiVersion: v1\nkind: Config\nclusters: [{name: c, cluster: {server: %q}}]\nusers: [{name: u, user: {}}]\ncontexts: [{name: x, context: {cluster: c, user: u}}]\ncurrent-context: x\n", api.URL)
	if err := os.WriteFile(kubeconfig, []byte(kc), 0o600); err != nil {
		t.Fatal(err)
	}
	admin := freeAddr(t)
	ios, _, _ := TestIO()
	ios.ErrOut = io.Discard
	root := NewRootCmd(ios)
	root.SetArgs([]string{"serve", "--listen", "127.0.0.1:0", "--admin", admin, "--state-dir", t.TempDir(), "--log-level", "error",
		"--rules-from", "kubernetes", "--kubeconfig", kubeconfig, "--drain-window", "0s"})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- root.ExecuteContext(ctx) }()
	var code int
	var body map[string]any
	waitCond(t, 30*time.Second, "the admin listener answering", func() bool {
		code, body = readyz(admin)
		return code != -1
	})
	// The initial list is being waited for: a few more answers, all 503.
	for i := range 5 {
		if code, body = readyz(admin); code != http.StatusServiceUnavailable || body["starting"] == nil {
			t.Fatalf("/readyz answer %d before the initial rules = %d %v; want 503 starting", i, code, body)
		}
	}
	cancel()
	select {
	case <-done:
	case <-time.After(30 * time.Second):
		t.Fatal("serve did not stop after its context ended")
	}
}

// TestServeDrainsOnStop (issue 42): serve used to refuse connections the
// moment SIGTERM arrived. Now /readyz turns 503 at once, a connection
// opened during the drain window is served, and a second SIGTERM ends the
// window: serve then returns.
func TestServeDrainsOnStop(t *testing.T) {
	w, err := sim.Start(context.Background(), sim.Config{Engine: engines.VLLM, Model: "m", Listen: "127.0.0.1:0", KVEvents: sim.KVEventsOff})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { w.Close() })
	host, port, _ := net.SplitHostPort(w.Addrs().HTTP)
	rules := filepath.Join(t.TempDir(), "rules.yaml")
	if err := os.WriteFile(rules, []byte(fmt.Sprintf("name: r\nmodel_name: m\nprobe: {disabled: true}\nendpoints:\n  - {id: w1, endpointIP: %s, targetPort: %s}\n", host, port)), 0o600); err != nil {
		t.Fatal(err)
	}
	admin, data := freeAddr(t), freeAddr(t)
	ios, _, _ := TestIO()
	ios.ErrOut = io.Discard
	root := NewRootCmd(ios)
	// A window far longer than the test: only the second signal ends it.
	root.SetArgs([]string{"serve", "--listen", data, "--admin", admin, "--state-dir", t.TempDir(), "--log-level", "error",
		"--rules", rules, "--drain-window", "10m", "--shutdown-timeout", "20s"})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- root.ExecuteContext(ctx) }()
	waitCond(t, 30*time.Second, "serve ready", func() bool {
		code, _ := readyz(admin)
		return code == http.StatusOK
	})
	chat := func() (int, bool, error) {
		c := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{}}
		defer c.CloseIdleConnections()
		resp, err := c.Post("http://"+data+"/v1/chat/completions", "application/json",
			strings.NewReader(`{"model":"m","max_tokens":4,"messages":[{"role":"user","content":"hi"}]}`))
		if err != nil {
			return 0, false, err
		}
		defer resp.Body.Close()
		_, err = io.ReadAll(resp.Body)
		return resp.StatusCode, resp.Close, err
	}
	if code, _, err := chat(); err != nil || code != 200 {
		t.Fatalf("chat before the stop: %d %v", code, err)
	}
	cancel() // what the first SIGTERM does (main's signal.NotifyContext)
	waitCond(t, 10*time.Second, "/readyz 503 draining", func() bool {
		code, body := readyz(admin)
		return code == http.StatusServiceUnavailable && body["draining"] == true
	})
	for i := range 3 {
		code, closed, err := chat()
		if err != nil || code != 200 || !closed {
			t.Errorf("chat %d on a new connection while draining: %d, Connection: close %v, %v; want 200, closed", i, code, closed, err)
		}
	}
	select {
	case err := <-done:
		t.Fatalf("serve returned during its drain window: %v", err)
	default:
	}
	// The second signal: serve's handler, registered before /readyz
	// turned 503, takes it (the process is not killed).
	if err := syscall.Kill(os.Getpid(), syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-done:
		if err != nil {
			t.Errorf("serve: %v", err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("serve did not stop after the second signal")
	}
	if c, err := net.Dial("tcp", data); err == nil {
		c.Close()
		t.Errorf("%s still accepts after serve returned", data)
	}
}
