package gateway

import (
	"errors"
	"log/slog"
	"net"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/llmgw/llmgw/internal/rawio"
)

// Accept back-off bounds: the first retry after a resource error waits
// acceptBackoffMin, each further one twice as long up to acceptBackoffMax,
// so a listener is accepting again at most acceptBackoffMax after the
// resource frees, while a process out of descriptors spins at most
// 1/acceptBackoffMax times a second.
const (
	acceptBackoffMin = 5 * time.Millisecond
	acceptBackoffMax = 200 * time.Millisecond
	// acceptLogEvery bounds the accept-failure log to one line per
	// listener per period (the metric counts every failure).
	acceptLogEvery = 10 * time.Second
)

// retryListener keeps a data-plane listener alive through accept errors
// that pass. fasthttp's Server.Serve returns on every accept error that is
// not a timeout (fasthttp v1.78.0 server.go, acceptConn: "Permanent error
// when accepting new connections"), which left the port in LISTEN with a
// filling backlog and nothing accepting once descriptors ran out (EMFILE).
// Accept here retries such errors with a back-off instead; only a closed
// listener ends it. While accepting fails the listener is marked failing,
// which /readyz reports.
type retryListener struct {
	net.Listener
	acceptStatus
	errs *prometheus.CounterVec // by listener and reason
	done chan struct{}
	once sync.Once
}

func newRetryListener(ln net.Listener, errs *prometheus.CounterVec, log *slog.Logger) *retryListener {
	return &retryListener{Listener: ln, acceptStatus: acceptStatus{addr: ln.Addr().String(), log: log}, errs: errs, done: make(chan struct{})}
}

func (l *retryListener) Accept() (net.Conn, error) {
	delay := acceptBackoffMin
	for {
		c, err := l.Listener.Accept()
		if err == nil {
			if l.failing.Swap(false) {
				l.log.Info("data listener accepting again", "addr", l.addr)
			}
			return rawio.Wrap(c), nil
		}
		reason, transient := acceptErrorReason(err)
		if !transient {
			select {
			case <-l.done:
				return nil, net.ErrClosed
			default:
			}
			return nil, err
		}
		l.errs.WithLabelValues(l.addr, reason).Inc()
		l.note(err)
		t := time.NewTimer(delay)
		select {
		case <-t.C:
		case <-l.done:
			t.Stop()
			return nil, net.ErrClosed
		}
		delay = min(2*delay, acceptBackoffMax)
	}
}

// acceptStatus is a listener's accept health for /readyz: failing while
// accepting fails for want of resources, with the latest error, logged at
// most once per acceptLogEvery.
type acceptStatus struct {
	addr    string
	log     *slog.Logger
	failing atomic.Bool

	mu       sync.Mutex
	lastErr  string
	lastLog  time.Time
	unlogged int
}

func (a *acceptStatus) note(err error) {
	a.failing.Store(true)
	a.mu.Lock()
	a.lastErr = err.Error()
	a.unlogged++
	now := time.Now()
	if now.Sub(a.lastLog) < acceptLogEvery {
		a.mu.Unlock()
		return
	}
	n := a.unlogged
	a.lastLog, a.unlogged = now, 0
	a.mu.Unlock()
	a.log.Error("data listener cannot accept connections; retrying", "addr", a.addr, "err", err, "failures", n)
}

func (a *acceptStatus) acceptState() (bool, string) {
	if !a.failing.Load() {
		return false, ""
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	return true, a.lastErr
}

func (l *retryListener) Close() error {
	l.once.Do(func() { close(l.done) })
	return l.Listener.Close()
}

// acceptErrorReason classifies an accept error: transient ones (resources
// that free again, a connection reset while queued) are retried, anything
// else ends the listener. reason is the metric label.
func acceptErrorReason(err error) (reason string, transient bool) {
	switch {
	case errors.Is(err, net.ErrClosed):
		return "closed", false
	case errors.Is(err, syscall.EMFILE):
		return "emfile", true
	case errors.Is(err, syscall.ENFILE):
		return "enfile", true
	case errors.Is(err, syscall.ENOBUFS):
		return "enobufs", true
	case errors.Is(err, syscall.ENOMEM):
		return "enomem", true
	case errors.Is(err, syscall.ECONNABORTED), errors.Is(err, syscall.ECONNRESET), errors.Is(err, syscall.EPROTO):
		return "aborted", true
	}
	var ne net.Error
	if errors.As(err, &ne) && ne.Timeout() {
		return "timeout", true
	}
	return "other", false
}
