package upstream

import (
	"sync"
	"testing"
	"time"
)

// fakeClock is a settable clock for breaker tests.
type fakeClock struct {
	mu  sync.Mutex
	now time.Time
}

func (c *fakeClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

func (c *fakeClock) advance(d time.Duration) {
	c.mu.Lock()
	c.now = c.now.Add(d)
	c.mu.Unlock()
}

func TestBreakerTransitions(t *testing.T) {
	type step struct {
		do   string // conn, 5xx, 4xx, ok, wait, trial
		want BreakerState
	}
	cases := []struct {
		name  string
		cfg   BreakerConfig
		steps []step
	}{
		{"opens after consecutive connection failures", BreakerConfig{Failures: 3},
			[]step{{"conn", Closed}, {"conn", Closed}, {"conn", Open}}},
		{"a success resets the connection streak", BreakerConfig{Failures: 3},
			[]step{{"conn", Closed}, {"conn", Closed}, {"ok", Closed}, {"conn", Closed}, {"conn", Closed}, {"conn", Open}}},
		{"a 4xx proves the connection and resets its streak", BreakerConfig{Failures: 2},
			[]step{{"conn", Closed}, {"4xx", Closed}, {"conn", Closed}, {"conn", Open}}},
		{"origin 5xx streak demotes", BreakerConfig{Origin5xx: 3},
			[]step{{"5xx", Closed}, {"5xx", Closed}, {"5xx", Open}}},
		{"a 4xx does not reset the 5xx streak", BreakerConfig{Origin5xx: 3},
			[]step{{"5xx", Closed}, {"4xx", Closed}, {"5xx", Closed}, {"5xx", Open}}},
		{"4xx answers between 5xx neither count nor reset (the reference's streak)", BreakerConfig{Origin5xx: 3},
			[]step{{"5xx", Closed}, {"4xx", Closed}, {"4xx", Closed}, {"5xx", Closed}, {"4xx", Closed}, {"5xx", Open}}},
		{"only an answer below 400 resets the 5xx streak", BreakerConfig{Origin5xx: 3},
			[]step{{"5xx", Closed}, {"4xx", Closed}, {"5xx", Closed}, {"ok", Closed}, {"5xx", Closed}, {"4xx", Closed}, {"5xx", Closed}, {"5xx", Open}}},
		{"a success resets the 5xx streak", BreakerConfig{Origin5xx: 2},
			[]step{{"5xx", Closed}, {"ok", Closed}, {"5xx", Closed}, {"5xx", Open}}},
		{"5xx and connection streaks are separate", BreakerConfig{Failures: 2, Origin5xx: 2},
			[]step{{"conn", Closed}, {"5xx", Closed}, {"conn", Closed}, {"5xx", Open}}},
		{"demotion disabled", BreakerConfig{Origin5xx: -1},
			[]step{{"5xx", Closed}, {"5xx", Closed}, {"5xx", Closed}, {"5xx", Closed}}},
		{"half-open after the open period, closed by a good trial", BreakerConfig{Failures: 1, OpenFor: time.Second},
			[]step{{"conn", Open}, {"wait", HalfOpen}, {"ok", Closed}}},
		{"a failed trial reopens at once", BreakerConfig{Failures: 5, OpenFor: time.Second},
			[]step{{"conn", Closed}, {"conn", Closed}, {"conn", Closed}, {"conn", Closed}, {"conn", Open}, {"wait", HalfOpen}, {"conn", Open}}},
		{"a 5xx trial reopens", BreakerConfig{Failures: 1, OpenFor: time.Second},
			[]step{{"conn", Open}, {"wait", HalfOpen}, {"5xx", Open}}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			clk := &fakeClock{now: time.Unix(1000, 0)}
			tc.cfg.Now = clk.Now
			var changes []BreakerState
			tc.cfg.OnChange = func(_, to BreakerState) { changes = append(changes, to) }
			b := NewBreaker(tc.cfg)
			for i, s := range tc.steps {
				switch s.do {
				case "conn":
					b.RecordConnFailure()
				case "5xx":
					b.RecordOrigin5xx()
				case "4xx":
					b.RecordClientError()
				case "ok":
					b.RecordSuccess()
				case "wait":
					clk.advance(b.cfg.OpenFor)
				}
				if got := b.State(); got != s.want {
					t.Fatalf("step %d (%s): state %s; want %s", i, s.do, got, s.want)
				}
			}
			if len(changes) == 0 && tc.steps[len(tc.steps)-1].want != Closed {
				t.Errorf("OnChange never called")
			}
		})
	}
}

func TestHalfOpenAdmitsLimitedTrials(t *testing.T) {
	clk := &fakeClock{now: time.Unix(1000, 0)}
	b := NewBreaker(BreakerConfig{Failures: 1, OpenFor: time.Second, HalfOpenTrials: 2, Now: clk.Now})
	e := New("e", "127.0.0.1", 1, "127.0.0.1:1", 1, RoleNormal, 0, b)
	b.RecordConnFailure()
	if e.Available() {
		t.Fatal("available while open")
	}
	clk.advance(time.Second)
	var releases []func()
	for i := 0; i < 2; i++ {
		if !e.Available() {
			t.Fatalf("trial %d refused", i)
		}
		releases = append(releases, e.Acquire())
	}
	if e.Available() {
		t.Error("a third trial admitted while two are in flight")
	}
	for _, r := range releases {
		r()
	}
	if e.InFlight() != 0 {
		t.Errorf("in-flight %d after releases", e.InFlight())
	}
}

func TestEndpointAvailability(t *testing.T) {
	cases := []struct {
		name  string
		setup func(e *Endpoint)
		want  bool
	}{
		{"fresh", func(*Endpoint) {}, true},
		{"probe down", func(e *Endpoint) { e.SetDown(true) }, false},
		{"draining", func(e *Endpoint) { e.SetDraining(true) }, false},
		{"breaker open", func(e *Endpoint) { e.Breaker().Trip() }, false},
		{"back up", func(e *Endpoint) { e.SetDown(true); e.SetDown(false) }, true},
		{"undrained", func(e *Endpoint) { e.SetDraining(true); e.SetDraining(false) }, true},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			e := New("e", "127.0.0.1", 1, "127.0.0.1:1", 1, RoleNormal, 0, NewBreaker(BreakerConfig{}))
			tc.setup(e)
			if got := e.Available(); got != tc.want {
				t.Errorf("Available() = %v; want %v", got, tc.want)
			}
		})
	}
}

func TestCopyStateFrom(t *testing.T) {
	old := New("e", "h", 1, "h:1", 1, RoleNormal, 0, NewBreaker(BreakerConfig{}))
	old.SetDraining(true)
	old.SetDown(true)
	old.Breaker().Trip()
	n := New("e", "h", 1, "h:1", 1, RoleNormal, 0, NewBreaker(BreakerConfig{}))
	n.CopyStateFrom(old)
	if !n.Draining() || !n.Down() || n.Breaker().State() != Open {
		t.Errorf("state not carried over: draining %v down %v breaker %s", n.Draining(), n.Down(), n.Breaker().State())
	}
}

func TestAcquireDoesNotAllocate(t *testing.T) {
	e := New("e", "h", 1, "h:1", 1, RoleNormal, 0, NewBreaker(BreakerConfig{}))
	if n := testing.AllocsPerRun(100, func() {
		if e.Available() {
			e.Acquire()()
		}
	}); n != 0 {
		t.Errorf("Available+Acquire+release allocates %.1f times; want 0", n)
	}
}
