//go:build linux

package evloop

import (
	"math/rand/v2"
	"slices"
	"syscall"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/llmgw/llmgw/internal/rawio"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// run starts l on its own goroutine; the cleanup stops it and waits.
func run(t *testing.T, l *Loop) {
	t.Helper()
	done := make(chan error, 1)
	go func() { done <- l.Run() }()
	t.Cleanup(func() {
		l.Stop()
		if err := <-done; err != nil {
			t.Errorf("Run: %v", err)
		}
		if err := l.Close(); err != nil {
			t.Errorf("Close: %v", err)
		}
	})
}

func newLoop(t *testing.T) *Loop {
	t.Helper()
	l, err := New(Options{})
	if err != nil {
		t.Fatal(err)
	}
	return l
}

// onLoop runs f on l's goroutine and waits for it.
func onLoop(t *testing.T, l *Loop, f func()) {
	t.Helper()
	done := make(chan struct{})
	if !l.Post(func() { f(); close(done) }) {
		t.Fatal("Post refused on a running loop")
	}
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("posted function did not run within 10s")
	}
}

func socketpair(t *testing.T) [2]int {
	t.Helper()
	fds, err := syscall.Socketpair(syscall.AF_UNIX, syscall.SOCK_STREAM|syscall.SOCK_NONBLOCK|syscall.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	return fds
}

type recorder struct {
	fd     int
	events chan uint32
	got    []byte
}

func (r *recorder) Ready(ev uint32) {
	var b [64]byte
	for {
		n, e := rawio.Read(r.fd, b[:])
		if e != 0 || n == 0 {
			break
		}
		r.got = append(r.got, b[:n]...)
	}
	r.events <- ev
}

func TestReadinessReachesItsHandler(t *testing.T) {
	l := newLoop(t)
	run(t, l)
	p := socketpair(t)
	defer syscall.Close(p[1])
	r := &recorder{fd: p[0], events: make(chan uint32, 16)}
	onLoop(t, l, func() {
		if err := l.Add(p[0], r, In|RdHup|Edge); err != nil {
			t.Error(err)
		}
	})
	if _, err := syscall.Write(p[1], []byte("ping")); err != nil {
		t.Fatal(err)
	}
	if ev := <-r.events; ev&In == 0 {
		t.Fatalf("events %#x: want In", ev)
	}
	syscall.Close(p[1])
	// The peer's close: readable (EOF) and hung up, reported once more.
	for ev := range r.events {
		if ev&RdHup != 0 {
			break
		}
	}
	var got []byte
	onLoop(t, l, func() {
		got = r.got
		l.Forget(p[0])
		syscall.Close(p[0])
	})
	if string(got) != "ping" {
		t.Fatalf("read %q, want ping", got)
	}
}

// closer closes victim and registers a fresh descriptor under the same
// number in the middle of a batch; the batch's report for the old
// registration must not reach the new one.
type closer struct {
	l       *Loop
	fd      int
	victim  int
	fresh   *recorder
	freshP  [2]int
	t       *testing.T
	retired chan struct{}
}

func (c *closer) Ready(uint32) {
	if c.retired == nil {
		return
	}
	c.l.Forget(c.victim)
	syscall.Close(c.victim)
	fds, err := syscall.Socketpair(syscall.AF_UNIX, syscall.SOCK_STREAM|syscall.SOCK_NONBLOCK|syscall.SOCK_CLOEXEC, 0)
	if err != nil {
		c.t.Error(err)
		return
	}
	c.freshP = fds
	if fds[0] != c.victim && fds[1] != c.victim {
		c.t.Errorf("the kernel did not reuse %d (got %v); the test cannot build its case", c.victim, fds)
	}
	n := fds[0]
	if fds[1] == c.victim {
		n = fds[1]
	}
	c.fresh.fd = n
	if err := c.l.Add(n, c.fresh, In|Edge); err != nil {
		c.t.Error(err)
	}
	close(c.retired)
	c.retired = nil
}

func TestStaleReportDoesNotReachAReusedDescriptor(t *testing.T) {
	l := newLoop(t)
	a, b := socketpair(t), socketpair(t)
	defer syscall.Close(a[0])
	defer syscall.Close(a[1])
	defer syscall.Close(b[1])
	fresh := &recorder{events: make(chan uint32, 4)}
	c := &closer{l: l, fd: a[0], victim: b[0], fresh: fresh, t: t, retired: make(chan struct{})}
	retired := c.retired
	stale := &recorder{fd: b[0], events: make(chan uint32, 4)}
	if err := l.Add(a[0], c, In|Edge); err != nil {
		t.Fatal(err)
	}
	if err := l.Add(b[0], stale, In|Edge); err != nil {
		t.Fatal(err)
	}
	// Both readable before the loop's first wait: one batch, a's first.
	syscall.Write(a[1], []byte("x"))
	syscall.Write(b[1], []byte("y"))
	run(t, l)
	<-retired
	// A posted function runs after the batch that retired b[0].
	onLoop(t, l, func() {})
	select {
	case ev := <-fresh.events:
		t.Fatalf("the new registration got the old one's report %#x", ev)
	case ev := <-stale.events:
		t.Fatalf("the closed registration got a report %#x", ev)
	default:
	}
	onLoop(t, l, func() {
		l.Forget(fresh.fd)
		syscall.Close(c.freshP[0])
		syscall.Close(c.freshP[1])
	})
}

type firing struct {
	name string
	t    Timer
	l    *Loop
	at   chan fired
}

type fired struct {
	name string
	now  int64
	want int64
}

func (f *firing) Expired() { f.at <- fired{f.name, f.l.Now(), f.t.when} }

func TestTimersFireInOrderNotBefore(t *testing.T) {
	l := newLoop(t)
	run(t, l)
	at := make(chan fired, 8)
	mk := func(name string) *firing {
		f := &firing{name: name, l: l, at: at}
		f.t.Init(f)
		return f
	}
	a, b, c, d := mk("a"), mk("b"), mk("c"), mk("d")
	onLoop(t, l, func() {
		l.Arm(&a.t, l.At(30*time.Millisecond))
		l.Arm(&b.t, l.At(10*time.Millisecond))
		l.Arm(&c.t, l.At(20*time.Millisecond))
		// Moved later after being armed early: fires at the later time.
		l.Arm(&c.t, l.At(40*time.Millisecond))
		// Armed and cancelled: never fires.
		l.Arm(&d.t, l.At(5*time.Millisecond))
		l.Disarm(&d.t)
	})
	var order []string
	for range 3 {
		f := <-at
		if f.now < f.want {
			t.Errorf("%s fired at %d, before its deadline %d", f.name, f.now, f.want)
		}
		order = append(order, f.name)
	}
	if want := []string{"b", "a", "c"}; !slices.Equal(order, want) {
		t.Fatalf("fired %v, want %v", order, want)
	}
	onLoop(t, l, func() {
		if len(l.heap) != 0 {
			t.Errorf("heap holds %d timers after all fired", len(l.heap))
		}
	})
	select {
	case f := <-at:
		t.Fatalf("%s fired after being disarmed", f.name)
	default:
	}
}

// TestTimerHeapAgainstAModel drives the heap with random arms, moves and
// disarms on a manual clock and checks every expiry against a model: each
// armed timer fires exactly once, at the first expire at or after its
// latest deadline, never before it, and disarmed ones never.
func TestTimerHeapAgainstAModel(t *testing.T) {
	for seed := range uint64(50) {
		r := rand.New(rand.NewPCG(seed, 7))
		l := &Loop{}
		type tm struct {
			Timer
			id   int
			want int64 // latest deadline; 0 disarmed
		}
		var fires []int
		ts := make([]*tm, 20)
		for i := range ts {
			x := &tm{id: i}
			x.Init(expirerFunc(func() { fires = append(fires, x.id) }))
			ts[i] = x
		}
		l.now = 1
		for step := 0; step < 400; step++ {
			x := ts[r.IntN(len(ts))]
			switch r.IntN(4) {
			case 0, 1:
				x.want = l.now + 1 + r.Int64N(50)
				l.Arm(&x.Timer, x.want)
			case 2:
				x.want = 0
				l.Disarm(&x.Timer)
			case 3:
				l.now += r.Int64N(10)
				fires = fires[:0]
				l.expire()
				for _, id := range fires {
					y := ts[id]
					if y.want == 0 || y.want > l.now {
						t.Fatalf("seed %d: timer %d fired at %d, want %d", seed, id, l.now, y.want)
					}
					y.want = 0
				}
				for _, y := range ts {
					if y.want != 0 && y.want <= l.now {
						t.Fatalf("seed %d: timer %d due at %d not fired by %d", seed, y.id, y.want, l.now)
					}
				}
			}
			for i, h := range l.heap {
				if h.index != i {
					t.Fatalf("seed %d: heap index %d holds a timer that says %d", seed, i, h.index)
				}
				if p := (i - 1) / 2; i > 0 && l.heap[p].when > h.when {
					t.Fatalf("seed %d: heap order broken at %d", seed, i)
				}
			}
		}
	}
}

type expirerFunc func()

func (f expirerFunc) Expired() { f() }

func TestPostAndStop(t *testing.T) {
	l := newLoop(t)
	done := make(chan error, 1)
	go func() { done <- l.Run() }()
	ran := make(chan int, 100)
	for i := range 100 {
		go l.Post(func() { ran <- i })
	}
	seen := map[int]bool{}
	for range 100 {
		seen[<-ran] = true
	}
	if len(seen) != 100 {
		t.Fatalf("%d distinct posts ran, want 100", len(seen))
	}
	l.Stop()
	l.Stop()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if l.Post(func() { t.Error("ran after Stop") }) {
		t.Fatal("Post accepted after Stop")
	}
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	if err := l.Run(); err != ErrClosed {
		t.Fatalf("Run on a closed loop: %v, want ErrClosed", err)
	}
}
