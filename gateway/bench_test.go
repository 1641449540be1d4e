package gateway

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httputil"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/valyala/fasthttp"

	"github.com/llmgw/llmgw/internal/procgroup"
	"github.com/llmgw/llmgw/internal/wait"
)

// BenchmarkOverhead compares, in one run, a fixed-response worker reached
// directly, through llmgw, through Go's httputil.ReverseProxy, and through
// nginx when it is installed. "throughput" runs parallel clients (ns/op is
// the inverse of requests/s); "latency" sends one request at a time and
// reports p50/p99 in µs. Run with `make bench-gateway`; results go to
// BENCHMARKS.md.
//
// The worker, llmgw, ReverseProxy and the clients share this process (and
// its CPUs), while nginx is a process of its own: the llmgw / nginx ratio
// here is not the gateway-as-a-process comparison. That one is `llmgw bench
// overhead --backend fixed --pin-targets 0 --pin-load 1`.
func BenchmarkOverhead(b *testing.B) {
	body := `{"id":"cmpl-bench","object":"chat.completion","choices":[{"index":0,"message":{"role":"assistant","content":"` + strings.Repeat("x", 880) + `"},"finish_reason":"stop"}]}`
	worker := benchServe(b, &fasthttp.Server{Handler: func(ctx *fasthttp.RequestCtx) {
		ctx.SetContentType("application/json")
		ctx.SetBodyString(body)
	}})
	gw, err := New(Config{Listen: "127.0.0.1:0", Admin: "127.0.0.1:0", StateDir: b.TempDir(), Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		b.Fatal(err)
	}
	if err := gw.Start(context.Background()); err != nil {
		b.Fatal(err)
	}
	defer gw.Close()
	_, port, _ := net.SplitHostPort(worker)
	if _, err := gw.Apply(mustDecode(b, fmt.Sprintf("name: bench\nmodel_name: m\nsel: 0\nprobe: {disabled: true}\nendpoints:\n  - {endpointIP: 127.0.0.1, targetPort: %s}\n", port)), false); err != nil {
		b.Fatal(err)
	}
	u, _ := url.Parse("http://" + worker)
	rp := httputil.NewSingleHostReverseProxy(u)
	rp.Transport = &http.Transport{MaxIdleConnsPerHost: 1024, MaxIdleConns: 1024}
	rpLn, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	rpSrv := &http.Server{Handler: rp}
	go rpSrv.Serve(rpLn)
	defer rpSrv.Close()

	targets := []struct{ name, addr string }{
		{"direct", worker},
		{"llmgw", gw.Addr()},
		{"reverseproxy", rpLn.Addr().String()},
	}
	if addr, stop := startNginx(b, worker); addr != "" {
		defer stop()
		targets = append(targets, struct{ name, addr string }{"nginx", addr})
	}
	reqBody := []byte(`{"model":"m","messages":[{"role":"user","content":"` + strings.Repeat("y", 900) + `"}]}`)
	for _, tg := range targets {
		b.Run(tg.name+"/throughput", func(b *testing.B) {
			c := &fasthttp.HostClient{Addr: tg.addr, MaxConns: 1024}
			b.SetParallelism(16)
			b.ReportAllocs()
			b.ResetTimer()
			b.RunParallel(func(pb *testing.PB) {
				req, resp := fasthttp.AcquireRequest(), fasthttp.AcquireResponse()
				defer fasthttp.ReleaseRequest(req)
				defer fasthttp.ReleaseResponse(resp)
				for pb.Next() {
					benchRequest(req, tg.addr, reqBody)
					if err := c.Do(req, resp); err != nil || resp.StatusCode() != 200 {
						b.Errorf("%s: %v %d", tg.name, err, resp.StatusCode())
						return
					}
				}
			})
		})
		b.Run(tg.name+"/latency", func(b *testing.B) {
			c := &fasthttp.HostClient{Addr: tg.addr, MaxConns: 1}
			req, resp := fasthttp.AcquireRequest(), fasthttp.AcquireResponse()
			defer fasthttp.ReleaseRequest(req)
			defer fasthttp.ReleaseResponse(resp)
			lat := make([]time.Duration, 0, b.N)
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				benchRequest(req, tg.addr, reqBody)
				t0 := time.Now()
				if err := c.Do(req, resp); err != nil || resp.StatusCode() != 200 {
					b.Fatalf("%s: %v %d", tg.name, err, resp.StatusCode())
				}
				lat = append(lat, time.Since(t0))
			}
			slices.Sort(lat)
			b.ReportMetric(float64(lat[len(lat)/2].Nanoseconds())/1e3, "p50-µs")
			b.ReportMetric(float64(lat[len(lat)*99/100].Nanoseconds())/1e3, "p99-µs")
		})
	}
}

func benchRequest(req *fasthttp.Request, addr string, body []byte) {
	req.Reset()
	req.SetRequestURI("http://" + addr + "/v1/chat/completions")
	req.Header.SetMethod(fasthttp.MethodPost)
	req.Header.SetContentType("application/json")
	req.SetBodyRaw(body)
}

func benchServe(b *testing.B, srv *fasthttp.Server) string {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	go srv.Serve(ln)
	b.Cleanup(func() { _ = srv.Shutdown() })
	return ln.Addr().String()
}

// startNginx runs nginx as a reverse proxy to worker when the binary is
// installed (make bench-deps); it returns "" otherwise.
func startNginx(b *testing.B, worker string) (string, func()) {
	bin, err := exec.LookPath("nginx")
	if err != nil {
		b.Log("nginx not installed: skipping the nginx comparison (make bench-deps installs it)")
		return "", nil
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	dir := b.TempDir()
	conf := fmt.Sprintf(`daemon off;
worker_processes 2;
pid %[1]s/nginx.pid;
error_log %[1]s/error.log;
events { worker_connections 4096; }
http {
  access_log off;
  client_body_temp_path %[1]s;
  proxy_temp_path %[1]s;
  upstream w { server %[2]s; keepalive 256; }
  server {
    listen %[3]s;
    location / { proxy_pass http://w; proxy_http_version 1.1; proxy_set_header Connection ""; proxy_buffering off; }
  }
}
`, dir, worker, addr)
	path := filepath.Join(dir, "nginx.conf")
	if err := os.WriteFile(path, []byte(conf), 0o600); err != nil {
		b.Fatal(err)
	}
	cmd := exec.Command(bin, "-c", path, "-p", dir)
	procgroup.Prepare(cmd)
	if err := cmd.Start(); err != nil {
		b.Logf("nginx failed to start: %v", err)
		return "", nil
	}
	if _, err := wait.Until(5*time.Second, func() error {
		c, err := net.Dial("tcp", addr)
		if err == nil {
			c.Close()
		}
		return err
	}); err != nil {
		stopGroup(b, cmd)
		b.Logf("nginx did not listen in time: %v", err)
		return "", nil
	}
	return addr, func() { stopGroup(b, cmd) }
}

// stopGroup kills nginx's master and its forked workers, and reaps the
// master.
func stopGroup(b *testing.B, cmd *exec.Cmd) {
	reaped := make(chan struct{})
	go func() { _ = cmd.Wait(); close(reaped) }()
	if err := procgroup.Kill(cmd, 5*time.Second); err != nil {
		b.Error(err)
	}
	<-reaped
}
