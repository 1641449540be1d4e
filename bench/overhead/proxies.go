package overhead

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/llmgw/llmgw/engines"
	"github.com/llmgw/llmgw/internal/procgroup"
)

// ErrNotInstalled reports that a reference proxy's binary is not on PATH
// (`make bench-deps` installs nginx and HAProxy); test with errors.Is.
var ErrNotInstalled = errors.New("overhead: proxy not installed")

// proxy is a running reference proxy process.
type proxy struct {
	addr string
	cmd  *exec.Cmd
	dir  string
	// exited receives the process's Wait result; one goroutine owns Wait.
	exited chan error
}

// stop kills the process group this package started (by its own handle,
// never by name: nginx's and HAProxy's forked workers included), waits for
// it and removes its files.
func (p *proxy) stop() {
	killGroup(p.cmd, p.exited)
	os.RemoveAll(p.dir)
}

// killGroup kills cmd's whole process group and reaps cmd (whose Wait result
// arrives on exited). A group member that survives is reported on stderr:
// the caller cannot do more, and a silent leftover would hold its port.
func killGroup(cmd *exec.Cmd, exited <-chan error) {
	done := make(chan error, 1)
	go func() { done <- procgroup.Kill(cmd, 5*time.Second) }()
	<-exited
	if err := <-done; err != nil {
		fmt.Fprintln(os.Stderr, "overhead:", err)
	}
}

// freeLoopbackAddr asks the kernel for a free loopback port. The proxies
// bind it themselves a moment later; the race with another process taking
// it is accepted (startProxy then fails with a clear error).
func freeLoopbackAddr() (string, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", fmt.Errorf("overhead: pick a port: %w", err)
	}
	addr := ln.Addr().String()
	return addr, ln.Close()
}

// ProxyWorkers is how many workers every proxy under test runs: nginx's
// worker_processes, HAProxy's nbthread and llmgw's --procs (GOMAXPROCS).
// One number for all, so that no proxy gets a larger share of a CPU it
// shares with the backend: on one pinned core a single worker loses the
// fair-share race against the backend it wakes and is preempted at almost
// every write (measured for nginx and llmgw alike, BENCHMARKS.md).
const ProxyWorkers = 2

// nginxConf is a keep-alive reverse proxy to upstream with buffering off,
// so SSE chunks are forwarded as they arrive.
func nginxConf(dir, upstream, listen string) string {
	return nginxConfPool(dir, upstream, listen, true)
}

// nginxConfPool is nginxConf with (keepAlive) or without an upstream
// keep-alive pool; without one nginx sends HTTP/1.0 with Connection: close,
// a new upstream connection per request (its default).
func nginxConfPool(dir, upstream, listen string, keepAlive bool) string {
	pool, loc := " keepalive 256;", `proxy_http_version 1.1; proxy_set_header Connection ""; `
	if !keepAlive {
		pool, loc = "", ""
	}
	return fmt.Sprintf(`daemon off;
worker_processes %[6]d;
pid %[1]s/nginx.pid;
error_log %[1]s/error.log;
events { worker_connections 4096; }
http {
  access_log off;
  client_body_temp_path %[1]s;
  proxy_temp_path %[1]s;
  upstream w { server %[2]s;%[4]s }
  server {
    listen %[3]s;
    location / { proxy_pass http://w; %[5]sproxy_buffering off; }
  }
}
`, dir, upstream, listen, pool, loc, ProxyWorkers)
}

// haproxyConf is HAProxy's equivalent: HTTP mode, keep-alive on both sides
// with server connection reuse, ProxyWorkers threads.
func haproxyConf(upstream, listen string) string {
	return fmt.Sprintf(`global
  maxconn 8192
  nbthread %d
defaults
  mode http
  option http-keep-alive
  http-reuse always
  timeout connect 5s
  timeout client 60s
  timeout server 60s
frontend bench
  bind %s
  default_backend w
backend w
  server w1 %s
`, ProxyWorkers, listen, upstream)
}

// startLLMGWProcess runs `bin serve` as a child process with one
// round-robin rule (probes off) over upstream and --procs ProxyWorkers, so
// llmgw is measured as nginx and HAProxy are: its own process, as many
// workers, its own CPU share.
func startLLMGWProcess(ctx context.Context, bin, upstream string, engine engines.Kind, pin Placement) (*proxy, error) {
	host, port, err := net.SplitHostPort(upstream)
	if err != nil {
		return nil, fmt.Errorf("overhead: upstream %q: %w", upstream, err)
	}
	if host == "localhost" {
		host = "127.0.0.1"
	}
	listen, err := freeLoopbackAddr()
	if err != nil {
		return nil, err
	}
	admin, err := freeLoopbackAddr()
	if err != nil {
		return nil, err
	}
	dir, err := os.MkdirTemp("", "llmgw-bench-proc-")
	if err != nil {
		return nil, fmt.Errorf("overhead: llmgw dir: %w", err)
	}
	rules := filepath.Join(dir, "rules.yaml")
	ruleText := benchRule(host, port, engine)
	if err := os.WriteFile(rules, []byte(ruleText), 0o600); err != nil {
		os.RemoveAll(dir)
		return nil, fmt.Errorf("overhead: llmgw rules: %w", err)
	}
	args := []string{"serve", "--listen", listen, "--admin", admin, "--state-dir", filepath.Join(dir, "state"), "--rules", rules, "--log-level", "warn", "--procs", strconv.Itoa(ProxyWorkers)}
	// The data plane listens before serve applies --rules; serve prints
	// its banner after, so the banner is the readiness signal.
	return startProcess(ctx, "llmgw", bin, args, listen, dir, "llmgw serving:", pin)
}

// startProxy writes kind's ("nginx" or "haproxy") configuration for
// upstream, starts it in the foreground and waits until it accepts
// connections. It returns ErrNotInstalled when the binary is missing.
func startProxy(ctx context.Context, kind, upstream string, pin Placement) (*proxy, error) {
	exe := kind
	if kind == NginxNoKeepAlive {
		exe = Nginx
	}
	bin, err := exec.LookPath(exe)
	if err != nil {
		return nil, fmt.Errorf("%w: %s", ErrNotInstalled, exe)
	}
	listen, err := freeLoopbackAddr()
	if err != nil {
		return nil, err
	}
	dir, err := os.MkdirTemp("", "llmgw-bench-"+kind+"-")
	if err != nil {
		return nil, fmt.Errorf("overhead: %s dir: %w", kind, err)
	}
	var args []string
	switch kind {
	case Nginx, NginxNoKeepAlive:
		path := filepath.Join(dir, "nginx.conf")
		if err := os.WriteFile(path, []byte(nginxConfPool(dir, upstream, listen, kind == Nginx)), 0o600); err != nil {
			os.RemoveAll(dir)
			return nil, fmt.Errorf("overhead: nginx config: %w", err)
		}
		args = []string{"-c", path, "-p", dir}
	case "haproxy":
		path := filepath.Join(dir, "haproxy.cfg")
		if err := os.WriteFile(path, []byte(haproxyConf(upstream, listen)), 0o600); err != nil {
			os.RemoveAll(dir)
			return nil, fmt.Errorf("overhead: haproxy config: %w", err)
		}
		// -db: stay in the foreground, so Kill stops it.
		args = []string{"-f", path, "-db"}
	default:
		os.RemoveAll(dir)
		return nil, fmt.Errorf("%w: unknown proxy %q", ErrParams, kind)
	}
	return startProcess(ctx, kind, bin, args, listen, dir, "", pin)
}

// fixedAnswer is the fixed backend's chat completion, padded with content
// to exactly FixedAnswerBytes bytes. It holds no quote, backslash or
// dollar sign, so it stands verbatim inside nginx's return '...'.
func fixedAnswer() string {
	head := `{"id":"chatcmpl-fixed","object":"chat.completion","created":1,"model":"m","choices":[{"index":0,"message":{"role":"assistant","content":"`
	tail := `"},"finish_reason":"stop"}],"usage":{"prompt_tokens":10,"completion_tokens":10,"total_tokens":20}}`
	return head + strings.Repeat("x", FixedAnswerBytes-len(head)-len(tail)) + tail
}

// fixedBackendConf is nginx answering every request with fixedAnswer, one
// worker, keep-alive connections never closed by request count.
func fixedBackendConf(dir, listen string) string {
	return fmt.Sprintf(`daemon off;
worker_processes 1;
pid %[1]s/nginx.pid;
error_log %[1]s/error.log;
events { worker_connections 4096; }
http {
  access_log off;
  client_body_temp_path %[1]s;
  keepalive_requests 100000000;
  server {
    listen %[2]s;
    location / { default_type application/json; return 200 '%[3]s'; }
  }
}
`, dir, listen, fixedAnswer())
}

// startFixedBackend runs nginx as the fixed backend (ErrNotInstalled when
// nginx is missing).
func startFixedBackend(ctx context.Context, pin Placement) (*proxy, error) {
	bin, err := exec.LookPath(Nginx)
	if err != nil {
		return nil, fmt.Errorf("%w: the fixed backend is nginx", ErrNotInstalled)
	}
	listen, err := freeLoopbackAddr()
	if err != nil {
		return nil, err
	}
	dir, err := os.MkdirTemp("", "llmgw-bench-fixed-")
	if err != nil {
		return nil, fmt.Errorf("overhead: fixed backend dir: %w", err)
	}
	path := filepath.Join(dir, "nginx.conf")
	if err := os.WriteFile(path, []byte(fixedBackendConf(dir, listen)), 0o600); err != nil {
		os.RemoveAll(dir)
		return nil, fmt.Errorf("overhead: fixed backend config: %w", err)
	}
	return startProcess(ctx, "fixed backend", bin, []string{"-c", path, "-p", dir}, listen, dir, "", pin)
}

// startProcess starts bin with args, logging to dir/output.log, and waits
// until listen accepts connections (and, when banner is not "", the log
// holds banner); on failure it kills the process it started and removes
// dir.
func startProcess(ctx context.Context, kind, bin string, args []string, listen, dir, banner string, pin Placement) (*proxy, error) {
	bin, args, err := pin.wrap(bin, args)
	if err != nil {
		os.RemoveAll(dir)
		return nil, err
	}
	cmd := exec.Command(bin, args...)
	procgroup.Prepare(cmd)
	out, err := os.Create(filepath.Join(dir, "output.log"))
	if err != nil {
		os.RemoveAll(dir)
		return nil, fmt.Errorf("overhead: %s log: %w", kind, err)
	}
	defer out.Close()
	cmd.Stdout, cmd.Stderr = out, out
	if err := cmd.Start(); err != nil {
		os.RemoveAll(dir)
		return nil, fmt.Errorf("overhead: start %s: %w", kind, err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	tick := time.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
	deadline := time.After(5 * time.Second)
	for {
		if c, err := net.Dial("tcp", listen); err == nil {
			c.Close()
			if banner == "" || logHas(filepath.Join(dir, "output.log"), banner) {
				return &proxy{addr: listen, cmd: cmd, dir: dir, exited: exited}, nil
			}
		}
		select {
		case err := <-exited:
			log, _ := os.ReadFile(filepath.Join(dir, "output.log"))
			os.RemoveAll(dir)
			return nil, fmt.Errorf("overhead: %s exited before listening (%v): %s", kind, err, log)
		case <-deadline:
			killGroup(cmd, exited)
			os.RemoveAll(dir)
			return nil, fmt.Errorf("overhead: %s not listening on %s after 5s", kind, listen)
		case <-ctx.Done():
			killGroup(cmd, exited)
			os.RemoveAll(dir)
			return nil, fmt.Errorf("overhead: starting %s: %w", kind, ctx.Err())
		case <-tick.C:
		}
	}
}

func logHas(path, s string) bool {
	b, err := os.ReadFile(path)
	return err == nil && strings.Contains(string(b), s)
}
