// Package harness runs the llmgw binary as child processes (gateway and
// simulators) on loopback for the fault suite and the soak tool: it builds
// the binary, starts `llmgw serve` and `llmgw sim` with kernel-chosen ports,
// reads their bound addresses, injects simulator faults, reads receipts and
// scrapes the gateway's Prometheus metrics.
//
// Every Proc is owned by the context it was started with: cancelling the
// context kills the process. Stop and Kill are idempotent and safe for
// concurrent use.
package harness

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"syscall"
	"time"
)

// ErrStart is returned (wrapped) when a child process exits or stays silent
// before announcing its addresses.
var ErrStart = errors.New("harness: process did not start")

// ModuleRoot returns the directory of the llmgw go.mod, found from the
// working directory upwards.
func ModuleRoot() (string, error) {
	dir, err := os.Getwd()
	if err != nil {
		return "", fmt.Errorf("harness: working directory: %w", err)
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			return dir, nil
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", fmt.Errorf("harness: no go.mod above the working directory")
		}
		dir = parent
	}
}

// Build compiles ./cmd/llmgw of the module at root into outDir and returns
// the binary's path. static builds with CGO_ENABLED=0 (for FROM scratch
// images).
func Build(ctx context.Context, root, outDir string, static bool) (string, error) {
	bin := filepath.Join(outDir, "llmgw")
	cmd := exec.CommandContext(ctx, "go", "build", "-o", bin, "./cmd/llmgw")
	cmd.Dir = root
	cmd.Env = os.Environ()
	if static {
		cmd.Env = append(cmd.Env, "CGO_ENABLED=0")
	}
	if out, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("harness: go build ./cmd/llmgw: %w\n%s", err, out)
	}
	return bin, nil
}

// Proc is a running child process. Its standard error goes to a log file
// (so that a chatty child never blocks on a full pipe).
type Proc struct {
	cmd     *exec.Cmd
	done    chan struct{}
	waitErr error
	LogPath string

	once sync.Once
}

func start(ctx context.Context, logPath string, stdout io.Writer, name string, args ...string) (*Proc, error) {
	logf, err := os.Create(logPath)
	if err != nil {
		return nil, fmt.Errorf("harness: log file: %w", err)
	}
	cmd := exec.CommandContext(ctx, name, args...)
	cmd.Stderr = logf
	cmd.Stdout = stdout
	cmd.Cancel = func() error { return cmd.Process.Kill() }
	if err := cmd.Start(); err != nil {
		logf.Close()
		return nil, fmt.Errorf("harness: start %s: %w", name, err)
	}
	p := &Proc{cmd: cmd, done: make(chan struct{}), LogPath: logPath}
	go func() {
		p.waitErr = cmd.Wait()
		logf.Close()
		close(p.done)
	}()
	return p, nil
}

// Pid is the child's process id.
func (p *Proc) Pid() int { return p.cmd.Process.Pid }

// Done is closed once the process has exited and been reaped.
func (p *Proc) Done() <-chan struct{} { return p.done }

// Kill sends SIGKILL and waits for the exit.
func (p *Proc) Kill() {
	_ = p.cmd.Process.Signal(syscall.SIGKILL)
	<-p.done
}

// Stop sends SIGTERM, waits up to 10 s for a clean exit, then kills.
func (p *Proc) Stop() {
	p.once.Do(func() {
		_ = p.cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-p.done:
		case <-time.After(10 * time.Second):
			p.Kill()
		}
	})
	<-p.done
}

// Log returns the child's standard error so far.
func (p *Proc) Log() string {
	b, _ := os.ReadFile(p.LogPath)
	return string(b)
}

// SimAddrs are the addresses a simulator announces on its first stdout line.
type SimAddrs struct {
	HTTP      string `json:"http"`
	Events    string `json:"events"`
	Replay    string `json:"replay"`
	Bootstrap string `json:"bootstrap"`
}

// Sim is a running `llmgw sim` child.
type Sim struct {
	*Proc
	Addrs SimAddrs
}

// StartSim runs `bin sim --listen 127.0.0.1:0 args...` and waits (up to 30 s)
// for its address line. logPath receives its standard error.
func StartSim(ctx context.Context, bin, logPath string, args ...string) (*Sim, error) {
	pr, pw := io.Pipe()
	p, err := start(ctx, logPath, pw, bin, append([]string{"sim", "--listen", "127.0.0.1:0"}, args...)...)
	if err != nil {
		return nil, err
	}
	// The reader goroutine ends when the child exits (the pipe is closed
	// after Wait returns below).
	lines := make(chan string, 1)
	go func() {
		br := bufio.NewReader(pr)
		line, _ := br.ReadString('\n')
		lines <- line
		_, _ = io.Copy(io.Discard, br)
	}()
	go func() {
		<-p.done
		pw.Close()
	}()
	select {
	case line := <-lines:
		var a SimAddrs
		if err := json.Unmarshal([]byte(line), &a); err != nil || a.HTTP == "" {
			p.Kill()
			return nil, fmt.Errorf("%w: sim address line %q: %v\n%s", ErrStart, line, err, p.Log())
		}
		return &Sim{Proc: p, Addrs: a}, nil
	case <-time.After(30 * time.Second):
		p.Kill()
		return nil, fmt.Errorf("%w: sim printed no address line in 30s\n%s", ErrStart, p.Log())
	}
}

// URL is the simulator's base URL.
func (s *Sim) URL() string { return "http://" + s.Addrs.HTTP }

// SetFaults posts a fault patch (e.g. {"health_fail": true}) to the sim.
func (s *Sim) SetFaults(ctx context.Context, patch map[string]any) error {
	b, _ := json.Marshal(patch)
	_, err := do(ctx, http.MethodPost, s.URL()+"/_sim/faults", "", b)
	if err != nil {
		return fmt.Errorf("harness: sim faults: %w", err)
	}
	return nil
}

// Receipt is the part of a simulator receipt the suite checks.
type Receipt struct {
	RequestID    string `json:"request_id"`
	Path         string `json:"path"`
	Stream       bool   `json:"stream"`
	PromptTokens int    `json:"prompt_tokens"`
	CachedTokens int    `json:"cached_tokens"`
	Status       int    `json:"status"`
	Crashed      bool   `json:"crashed"`
	// Cancelled: the sim stopped generating because its client (the
	// gateway) closed the connection, at CancelledAt; Time is the arrival.
	Cancelled   bool      `json:"cancelled"`
	CancelledAt time.Time `json:"cancelled_at"`
	Time        time.Time `json:"time"`
}

// Receipts reads the sim's per-request receipts.
func (s *Sim) Receipts(ctx context.Context) ([]Receipt, error) {
	b, err := do(ctx, http.MethodGet, s.URL()+"/_sim/receipts", "", nil)
	if err != nil {
		return nil, fmt.Errorf("harness: sim receipts: %w", err)
	}
	var rs []Receipt
	if err := json.Unmarshal(b, &rs); err != nil {
		return nil, fmt.Errorf("harness: sim receipts: %w", err)
	}
	return rs, nil
}

// Gateway is a running `llmgw serve` child.
type Gateway struct {
	*Proc
	// Data and Admin are the bound host:port addresses.
	Data, Admin string
	// Token is the admin bearer token ("" = none).
	Token string
}

var servingLine = regexp.MustCompile(`llmgw serving: data plane https?://(\S+), admin http://(\S+),`)

// StartGateway runs `bin serve --listen 127.0.0.1:0 --admin 127.0.0.1:0
// --state-dir stateDir --drain-window 0s args...` and waits (up to 30 s) for
// its serving line. No drain window: nothing balances load in front of a
// test's gateway, so Stop need not wait for one (args may set one).
func StartGateway(ctx context.Context, bin, stateDir, logPath string, args ...string) (*Gateway, error) {
	all := append([]string{"serve", "--listen", "127.0.0.1:0", "--admin", "127.0.0.1:0", "--state-dir", stateDir, "--drain-window", "0s"}, args...)
	p, err := start(ctx, logPath, io.Discard, bin, all...)
	if err != nil {
		return nil, err
	}
	return waitServing(p)
}

// waitServing waits up to 30 s for the gateway's serving line.
func waitServing(p *Proc) (*Gateway, error) {
	deadline := time.Now().Add(30 * time.Second)
	for {
		if m := servingLine.FindStringSubmatch(p.Log()); m != nil {
			return &Gateway{Proc: p, Data: m[1], Admin: m[2]}, nil
		}
		select {
		case <-p.done:
			return nil, fmt.Errorf("%w: gateway exited: %v\n%s", ErrStart, p.waitErr, p.Log())
		case <-time.After(20 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			p.Kill()
			return nil, fmt.Errorf("%w: gateway printed no serving line in 30s\n%s", ErrStart, p.Log())
		}
	}
}

// URL is the data-plane base URL.
func (g *Gateway) URL() string { return "http://" + g.Data }

// AdminURL is the management API base URL.
func (g *Gateway) AdminURL() string { return "http://" + g.Admin }

// PutRule creates or replaces a rule (YAML or JSON) through the admin API.
func (g *Gateway) PutRule(ctx context.Context, name, body string) error {
	if _, err := do(ctx, http.MethodPut, g.AdminURL()+"/v1/rules/"+name, g.Token, []byte(body)); err != nil {
		return fmt.Errorf("harness: put rule %s: %w", name, err)
	}
	return nil
}

// GetRule returns the JSON of a rule as the admin API reads it back.
func (g *Gateway) GetRule(ctx context.Context, name string) ([]byte, error) {
	b, err := do(ctx, http.MethodGet, g.AdminURL()+"/v1/rules/"+name, "", nil)
	if err != nil {
		return nil, fmt.Errorf("harness: get rule %s: %w", name, err)
	}
	return b, nil
}

// StatusError is an HTTP answer outside 2xx.
type StatusError struct {
	Status int
	Body   string
}

func (e *StatusError) Error() string {
	return fmt.Sprintf("harness: HTTP %d: %s", e.Status, strings.TrimSpace(e.Body))
}

var plainClient = &http.Client{Timeout: 20 * time.Second, Transport: &http.Transport{DisableKeepAlives: true}}

// do performs one request without keep-alive (no idle connection outlives
// the call) and returns the body of a 2xx answer.
func do(ctx context.Context, method, url, token string, body []byte) ([]byte, error) {
	var rd io.Reader
	if body != nil {
		rd = bytes.NewReader(body)
	}
	req, err := http.NewRequestWithContext(ctx, method, url, rd)
	if err != nil {
		return nil, err
	}
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := plainClient.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return nil, err
	}
	if resp.StatusCode/100 != 2 {
		return nil, &StatusError{Status: resp.StatusCode, Body: string(b)}
	}
	return b, nil
}

// StartGatewayArgs runs bin with exactly args (e.g. "serve" and its flags)
// and waits (up to 30 s) for the serving line; for tests of the flags'
// defaults.
func StartGatewayArgs(ctx context.Context, bin, logPath string, args ...string) (*Gateway, error) {
	p, err := start(ctx, logPath, io.Discard, bin, args...)
	if err != nil {
		return nil, err
	}
	return waitServing(p)
}
