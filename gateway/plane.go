package gateway

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"runtime"
	"sync"
	"syscall"
)

// Data planes.
//
// A data listener is served by one of two planes:
//
//   - the loop plane (Linux; the default there): event loops, one locked
//     thread each, that read requests, route them, talk to the workers and
//     relay their answers without a goroutine per connection
//     (loopplane_linux.go). It serves the requests of plain rules:
//     everything but P/D and KV-exact rules, rules with backend TLS and
//     rules whose endpoints are host names;
//   - the goroutine plane: fasthttp's server, a goroutine per connection
//     (proxy.go). It serves every request the loop plane does not, with
//     the same behaviour, and a TLS data plane entirely.
//
// A connection starts on the loop plane. The first request the loop plane
// does not serve itself (a rule above, a request it does not parse as
// plain HTTP/1.1 with a Content-Length body, or any request the gateway
// answers with an error before routing) hands the connection to the
// goroutine plane, unconsumed bytes included, for the rest of its life:
// the goroutine plane parses that request again from its first byte and
// answers it. So both planes answer every request the same way, and the
// loop plane needs no second copy of the gateway's rarer paths.

const (
	// PlaneLoop serves data connections with event loops (Linux).
	PlaneLoop = "loop"
	// PlaneGoroutine serves them with a goroutine per connection.
	PlaneGoroutine = "goroutine"
)

// maxUpstreamHead bounds a worker's answer head (both planes: the
// goroutine plane's HostClient reads it with a buffer this size).
const maxUpstreamHead = 4096

// errAnswerHeadTooLarge: a worker's answer head over maxUpstreamHead (the
// loop plane's; fasthttp's is an *ErrSmallBuffer).
var errAnswerHeadTooLarge = errors.New("gateway: the answer's header block is over the read buffer")

// defaultLoops is the loop plane's default number of event loops: one per
// CPU the process may run on (its affinity mask, as runtime.NumCPU reads
// it), at most GOMAXPROCS. More loops than CPUs only take turns on them.
func defaultLoops() int {
	return max(1, min(runtime.NumCPU(), runtime.GOMAXPROCS(0)))
}

// handoffReasons are the values of llmgw_loop_handoffs_total's reason
// label: why the loop plane gave a connection to the goroutine plane.
var handoffReasons = []string{
	"http10",       // not HTTP/1.1
	"chunked_body", // a request body without Content-Length
	"expect",       // Expect: 100-continue
	"too_large",    // header block or body over the gateway's limits
	"malformed",    // a head the loop plane does not parse as plain HTTP/1.1
	"route",        // a path or method the goroutine plane answers (/v1/models, audio forms, 404, 405)
	"rejected",     // a request the gateway refuses before routing (400, 404 model)
	"rule",         // a rule the loop plane does not serve (loopServes)
	"uri",          // a target fasthttp normalises (percent-encoding, dot segments, //)
}

// loopServes reports whether the loop plane serves rt's requests, and why
// not: a P/D rule, a KV-exact rule, backend TLS and endpoints named by
// host (whose addresses the loop cannot resolve without blocking) go to the
// goroutine plane.
func (rt *ruleRuntime) loopServes() (bool, string) {
	switch {
	case rt.pd != nil:
		return false, "P/D rule"
	case rt.kv != nil:
		return false, "KV-exact rule"
	case rt.tlsCfg != nil:
		return false, "backend TLS"
	}
	for _, ep := range rt.eps {
		if _, err := netip.ParseAddrPort(ep.Addr); err != nil {
			return false, fmt.Sprintf("endpoint %s is a host name", ep.ID)
		}
	}
	return true, ""
}

// loopAddrs are rt's endpoint addresses by Index when the loop plane
// serves rt, else nil (buildRuntime keeps them as rt.loopEPs).
func (rt *ruleRuntime) loopAddrs() []netip.AddrPort {
	if ok, _ := rt.loopServes(); !ok {
		return nil
	}
	out := make([]netip.AddrPort, len(rt.eps))
	for i, ep := range rt.eps {
		ap := netip.MustParseAddrPort(ep.Addr)
		out[i] = netip.AddrPortFrom(ap.Addr().Unmap(), ap.Port())
	}
	return out
}

// handoffListener is the goroutine plane's listener behind a loop plane:
// its connections are the ones the loop plane hands over.
type handoffListener struct {
	addr net.Addr
	ch   chan net.Conn
	done chan struct{}
	once sync.Once
	wg   sync.WaitGroup // deliveries that waited for room
}

func newHandoffListener(addr net.Addr) *handoffListener {
	return &handoffListener{addr: addr, ch: make(chan net.Conn, 256), done: make(chan struct{})}
}

// Accept returns the next handed-over connection.
func (h *handoffListener) Accept() (net.Conn, error) {
	select {
	case c := <-h.ch:
		return c, nil
	case <-h.done:
		return nil, net.ErrClosed
	}
}

// Close ends Accept and closes every connection not yet accepted.
func (h *handoffListener) Close() error {
	h.once.Do(func() {
		close(h.done)
		go func() {
			h.wg.Wait()
			for {
				select {
				case c := <-h.ch:
					c.Close()
				default:
					return
				}
			}
		}()
	})
	return nil
}

// Addr is the data listener's address.
func (h *handoffListener) Addr() net.Addr { return h.addr }

// give hands c over without blocking the caller (an event loop): when the
// queue is full a goroutine waits for room. A closed listener closes c.
func (h *handoffListener) give(c net.Conn) {
	select {
	case <-h.done:
		c.Close()
		return
	default:
	}
	select {
	case h.ch <- c:
		return
	default:
	}
	h.wg.Add(1)
	go func() {
		defer h.wg.Done()
		select {
		case h.ch <- c:
		case <-h.done:
			c.Close()
		}
	}()
}

// prefixConn is a handed-over connection whose first reads return the
// bytes the loop plane had read from it already.
type prefixConn struct {
	net.Conn
	pre []byte
}

func (c *prefixConn) Read(p []byte) (int, error) {
	if len(c.pre) > 0 {
		n := copy(p, c.pre)
		c.pre = c.pre[n:]
		return n, nil
	}
	return c.Conn.Read(p)
}

// SyscallConn is the socket's, for the client-disconnect watch (which
// looks at the socket only: bytes still in pre are a pipelined request,
// which ends a watch without a verdict anyway).
func (c *prefixConn) SyscallConn() (syscall.RawConn, error) {
	sc, ok := c.Conn.(syscall.Conn)
	if !ok {
		return nil, fmt.Errorf("gateway: handed-over connection %T has no socket", c.Conn)
	}
	return sc.SyscallConn()
}
