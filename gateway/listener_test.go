package gateway

import (
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"github.com/valyala/fasthttp"

	"github.com/llmgw/llmgw/internal/wait"
)

// sickListener fails every Accept with err until healed, then accepts
// from the real listener under it.
type sickListener struct {
	net.Listener
	err    error
	healed atomic.Bool
	fails  atomic.Int64
}

func (l *sickListener) Accept() (net.Conn, error) {
	if !l.healed.Load() {
		l.fails.Add(1)
		return nil, l.err
	}
	return l.Listener.Accept()
}

// TestAcceptErrorsDoNotStopTheListener: fasthttp ends Serve on the first
// accept error that is not a timeout; behind retryListener a resource error
// (EMFILE, ENFILE, ENOBUFS, ENOMEM, ECONNABORTED) is retried, counted and
// reported, and the server answers again once it clears. A non-transient
// error still ends Serve.
func TestAcceptErrorsDoNotStopTheListener(t *testing.T) {
	sysErr := func(e syscall.Errno) error {
		return &net.OpError{Op: "accept", Net: "tcp", Err: os.NewSyscallError("accept4", e)}
	}
	cases := []struct {
		name      string
		err       error
		reason    string
		transient bool
	}{
		{"emfile", sysErr(syscall.EMFILE), "emfile", true},
		{"enfile", sysErr(syscall.ENFILE), "enfile", true},
		{"enobufs", sysErr(syscall.ENOBUFS), "enobufs", true},
		{"enomem", sysErr(syscall.ENOMEM), "enomem", true},
		{"econnaborted", sysErr(syscall.ECONNABORTED), "aborted", true},
		{"einval", sysErr(syscall.EINVAL), "other", false},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			tcp, err := net.Listen("tcp", "127.0.0.1:0")
			if err != nil {
				t.Fatal(err)
			}
			sick := &sickListener{Listener: tcp, err: tc.err}
			errs := prometheus.NewCounterVec(prometheus.CounterOpts{Name: "x"}, []string{"listener", "reason"})
			rl := newRetryListener(sick, errs, slog.New(slog.NewTextHandler(io.Discard, nil)))
			srv := &fasthttp.Server{Handler: func(ctx *fasthttp.RequestCtx) { ctx.SetBodyString("ok") }, Logger: discardLogger{}}
			served := make(chan error, 1)
			go func() { served <- srv.Serve(rl) }()
			defer func() {
				_ = srv.Shutdown()
				<-served
			}()
			if !tc.transient {
				select {
				case err := <-served:
					if err == nil || !strings.Contains(err.Error(), "accept4") {
						t.Fatalf("Serve returned %v; want the accept error", err)
					}
					served <- nil
				case <-time.After(10 * time.Second):
					t.Fatal("Serve kept running on a non-transient accept error")
				}
				return
			}
			wait.For(t, 5*time.Second, "retried accept failures", func() bool { return sick.fails.Load() >= 3 })
			failing, why := rl.acceptState()
			if !failing || !strings.Contains(why, "accept4") {
				t.Fatalf("acceptState() = %v, %q while accept fails; want true and the error", failing, why)
			}
			var m dto.Metric
			if err := errs.WithLabelValues(rl.addr, tc.reason).Write(&m); err != nil {
				t.Fatal(err)
			}
			if got := m.GetCounter().GetValue(); got < 3 {
				t.Errorf("accept error metric {reason=%q} = %v; want >= 3", tc.reason, got)
			}
			sick.healed.Store(true)
			c := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{DisableKeepAlives: true}}
			resp, err := c.Get("http://" + tcp.Addr().String() + "/")
			if err != nil {
				t.Fatalf("request after the accept errors cleared: %v", err)
			}
			resp.Body.Close()
			if resp.StatusCode != 200 {
				t.Fatalf("status %d", resp.StatusCode)
			}
			if failing, _ := rl.acceptState(); failing {
				t.Error("acceptState() still failing after a successful accept")
			}
			select {
			case err := <-served:
				t.Fatalf("Serve returned %v during transient accept errors", err)
			default:
			}
		})
	}
}
