package store

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/llmgw/llmgw/gateway/rule"
)

// childEnv names the store directory of the crash child (see
// TestKill9DuringPut); childStartEnv its first version.
const (
	childEnv      = "LLMGW_STORE_CRASH_CHILD_DIR"
	childStartEnv = "LLMGW_STORE_CRASH_CHILD_START"
	childMaxPuts  = 20000
)

func TestMain(m *testing.M) {
	if dir := os.Getenv(childEnv); dir != "" {
		os.Exit(runCrashChild(dir))
	}
	goleak.VerifyTestMain(m)
}

// runCrashChild Puts versions start, start+1, ... of one rule and prints each
// version once Put has returned. It runs until killed; a closed stdout (the
// parent gone) ends it through SIGPIPE, and childMaxPuts bounds it anyway.
func runCrashChild(dir string) int {
	s, err := Open(dir)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	start, err := strconv.Atoi(os.Getenv(childStartEnv))
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	for v := start; v < start+childMaxPuts; v++ {
		if err := s.Put(versioned("crash", v)); err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
		if _, err := fmt.Printf("%d\n", v); err != nil {
			return 1
		}
	}
	return 0
}

// versioned returns a valid rule whose version is stored in kvWarmupSec, a
// field with no default, so that it reads back unchanged. Its endpoint list
// grows with v so that versions differ in size, as real edits do.
func versioned(name string, v int) *rule.Rule {
	r := &rule.Rule{Name: name, ModelName: "m-" + name, KVWarmupSec: v}
	for i := 0; i <= v%7; i++ {
		r.Endpoints = append(r.Endpoints, rule.Endpoint{EndpointIP: "127.0.0.1", TargetPort: 8000 + i})
	}
	return r
}

func openTemp(t *testing.T) *Store {
	t.Helper()
	s, err := Open(filepath.Join(t.TempDir(), "state"))
	if err != nil {
		t.Fatalf("Open: %v", err)
	}
	return s
}

func mustLoad(t *testing.T, s *Store) []*rule.Rule {
	t.Helper()
	rules, err := s.Load()
	if err != nil {
		t.Fatalf("Load: %v", err)
	}
	return rules
}

func names(rules []*rule.Rule) []string {
	out := make([]string, 0, len(rules))
	for _, r := range rules {
		out = append(out, r.Name)
	}
	return out
}

func TestOpen(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "a", "b")
	s, err := Open(dir)
	if err != nil {
		t.Fatalf("Open: %v", err)
	}
	st, err := os.Stat(dir)
	if err != nil {
		t.Fatal(err)
	}
	if got := st.Mode().Perm(); got != 0o700 {
		t.Errorf("dir mode: got %o, want 700", got)
	}
	if s.Dir() != dir {
		t.Errorf("Dir: got %q, want %q", s.Dir(), dir)
	}
	if rules := mustLoad(t, s); len(rules) != 0 {
		t.Errorf("fresh store: got %d rules, want 0", len(rules))
	}

	file := filepath.Join(t.TempDir(), "f")
	if err := os.WriteFile(file, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	tests := []struct{ name, dir string }{
		{"empty name", ""},
		{"regular file", file},
		{"below a regular file", filepath.Join(file, "x")},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if _, err := Open(tc.dir); err == nil {
				t.Errorf("Open(%q): got nil error, want one", tc.dir)
			}
		})
	}
}

func TestRoundTrip(t *testing.T) {
	s := openTemp(t)
	weight := 3
	seed := "42"
	off := false
	in := []*rule.Rule{
		versioned("zeta", 1),
		{
			Name: "alpha", ModelName: "Qwen/Qwen3-0.6B", Listen: "127.0.0.1:9000", Mode: rule.ModeFullProxy, Sel: 8,
			KVEngineType: "sglang", KVExactMode: 1, KVHashSeed: &seed, PDDisaggMode: true, PDBootstrapPort: 8998,
			CBEnable: &off, CB: rule.CBConfig{Origin5xx: -1, OpenFor: rule.Duration(10 * time.Second)},
			CHWBL: rule.CHWBLConfig{LoadFactor: 1.5},
			Probe: rule.ProbeConfig{Path: "/props", Interval: rule.Duration(250 * time.Millisecond), Disabled: true},
			Endpoints: []rule.Endpoint{
				{ID: "p", EndpointIP: "::1", TargetPort: 1, EPRole: 1, BootstrapPort: 9000, Weight: &weight},
				{ID: "d", EndpointIP: "host.example", TargetPort: 2, EPRole: 2, KVEventsEndpoint: "tcp://127.0.0.1:5567"},
			},
		},
		versioned("mid.dle_-x", 5),
	}
	for _, r := range in {
		if err := s.Put(r); err != nil {
			t.Fatalf("Put(%s): %v", r.Name, err)
		}
	}
	got := mustLoad(t, s)
	if want := []string{"alpha", "mid.dle_-x", "zeta"}; !reflect.DeepEqual(names(got), want) {
		t.Fatalf("names: got %v, want %v (sorted)", names(got), want)
	}
	byName := map[string]*rule.Rule{}
	for _, r := range in {
		byName[r.Name] = r
	}
	for _, r := range got {
		if !reflect.DeepEqual(r, byName[r.Name]) {
			t.Errorf("rule %s: got %+v, want %+v", r.Name, r, byName[r.Name])
		}
	}
	// A second store on the same directory (a restart) sees the same rules.
	s2, err := Open(s.Dir())
	if err != nil {
		t.Fatal(err)
	}
	if again := mustLoad(t, s2); !reflect.DeepEqual(again, got) {
		t.Errorf("reopened store: got %v, want %v", names(again), names(got))
	}
}

func TestOverwriteAndDelete(t *testing.T) {
	s := openTemp(t)
	steps := []struct {
		name     string
		do       func() error
		wantVers map[string]int
	}{
		{"put a1", func() error { return s.Put(versioned("a", 1)) }, map[string]int{"a": 1}},
		{"put b1", func() error { return s.Put(versioned("b", 1)) }, map[string]int{"a": 1, "b": 1}},
		{"overwrite a2", func() error { return s.Put(versioned("a", 2)) }, map[string]int{"a": 2, "b": 1}},
		{"delete a", func() error { return s.Delete("a") }, map[string]int{"b": 1}},
		{"delete a again", func() error { return s.Delete("a") }, map[string]int{"b": 1}},
		{"delete never stored", func() error { return s.Delete("nope") }, map[string]int{"b": 1}},
		{"recreate a3", func() error { return s.Put(versioned("a", 3)) }, map[string]int{"a": 3, "b": 1}},
	}
	for _, st := range steps {
		t.Run(st.name, func(t *testing.T) {
			if err := st.do(); err != nil {
				t.Fatalf("%s: %v", st.name, err)
			}
			got := map[string]int{}
			for _, r := range mustLoad(t, s) {
				got[r.Name] = r.KVWarmupSec
			}
			if !reflect.DeepEqual(got, st.wantVers) {
				t.Errorf("versions: got %v, want %v", got, st.wantVers)
			}
		})
	}
	files, err := filepath.Glob(filepath.Join(s.Dir(), "*"))
	if err != nil {
		t.Fatal(err)
	}
	if len(files) != 2 {
		t.Errorf("files: got %v, want a.json and b.json only", files)
	}
}

func TestPutDeleteRefuse(t *testing.T) {
	s := openTemp(t)
	negative := versioned("neg", 1)
	negative.SessionTTL = -1
	tests := []struct {
		name string
		do   func() error
	}{
		{"put nil", func() error { return s.Put(nil) }},
		{"put empty name", func() error { return s.Put(versioned("", 1)) }},
		{"put path name", func() error { return s.Put(versioned("../x", 1)) }},
		{"put dot dot", func() error { return s.Put(versioned("..", 1)) }},
		{"put unreadable back", func() error { return s.Put(negative) }},
		{"delete path name", func() error { return s.Delete("a/b") }},
		{"delete empty", func() error { return s.Delete("") }},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if err := tc.do(); err == nil {
				t.Fatalf("got nil error, want one")
			} else if !strings.HasPrefix(err.Error(), "store: ") {
				t.Errorf("error %q lacks the package prefix", err)
			}
		})
	}
	entries, err := os.ReadDir(s.Dir())
	if err != nil {
		t.Fatal(err)
	}
	if len(entries) != 0 {
		t.Errorf("refused calls left files behind: %v", entries)
	}
}

// TestCrashLeftovers simulates a crash in the middle of Put: temporary files
// (complete and truncated) sit next to the previous version. Load must return
// the previous version and remove the temporaries.
func TestCrashLeftovers(t *testing.T) {
	s := openTemp(t)
	if err := s.Put(versioned("pool", 1)); err != nil {
		t.Fatal(err)
	}
	full, err := os.ReadFile(filepath.Join(s.Dir(), "pool.json"))
	if err != nil {
		t.Fatal(err)
	}
	leftovers := map[string][]byte{
		".pool.123456.tmp": []byte(strings.ReplaceAll(string(full), `"kvWarmupSec": 1`, `"kvWarmupSec": 2`)),
		".pool.777.tmp":    full[:len(full)/2],
		".other.1.tmp":     nil,
	}
	for name, data := range leftovers {
		if err := os.WriteFile(filepath.Join(s.Dir(), name), data, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	// A file that is neither a rule nor a temporary is left alone.
	if err := os.WriteFile(filepath.Join(s.Dir(), "README"), []byte("x"), 0o600); err != nil {
		t.Fatal(err)
	}
	rules := mustLoad(t, s)
	if len(rules) != 1 || rules[0].Name != "pool" || rules[0].KVWarmupSec != 1 {
		t.Fatalf("after crash: got %+v, want pool version 1", rules)
	}
	for name := range leftovers {
		if _, err := os.Stat(filepath.Join(s.Dir(), name)); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("leftover %s: got %v, want it removed", name, err)
		}
	}
	if _, err := os.Stat(filepath.Join(s.Dir(), "README")); err != nil {
		t.Errorf("unrelated file: got %v, want it kept", err)
	}
}

func TestLoadCorrupt(t *testing.T) {
	tests := []struct {
		name, file, data, wantIn string
	}{
		{"truncated", "a.json", `{"name":"a","endpoi`, "a.json"},
		{"empty", "b.json", ``, "b.json"},
		{"unknown field", "c.json", `{"name":"c","epRole":1}`, "c.json"},
		{"name mismatch", "d.json", `{"name":"x"}`, `holds rule "x", want "d"`},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			s := openTemp(t)
			if err := s.Put(versioned("good", 1)); err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(filepath.Join(s.Dir(), tc.file), []byte(tc.data), 0o600); err != nil {
				t.Fatal(err)
			}
			rules, err := s.Load()
			if !errors.Is(err, ErrCorrupt) {
				t.Fatalf("Load: got (%v, %v), want ErrCorrupt", names(rules), err)
			}
			if !strings.Contains(err.Error(), tc.wantIn) {
				t.Errorf("error %q does not contain %q", err, tc.wantIn)
			}
		})
	}
}

func TestConcurrentPuts(t *testing.T) {
	s := openTemp(t)
	const writers, versions = 16, 5
	var wg sync.WaitGroup
	errs := make(chan error, writers*versions)
	for w := range writers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			name := fmt.Sprintf("rule-%02d", w)
			for v := 1; v <= versions; v++ {
				if err := s.Put(versioned(name, v)); err != nil {
					errs <- err
					return
				}
			}
		}()
	}
	// A reader running alongside must never see a partial file.
	done := make(chan struct{})
	var loadErr error
	var readerWG sync.WaitGroup
	readerWG.Add(1)
	go func() {
		defer readerWG.Done()
		for {
			select {
			case <-done:
				return
			default:
			}
			if _, err := s.Load(); err != nil {
				loadErr = err
				return
			}
		}
	}()
	wg.Wait()
	close(done)
	readerWG.Wait()
	close(errs)
	for err := range errs {
		t.Errorf("Put: %v", err)
	}
	if loadErr != nil {
		t.Errorf("concurrent Load: %v", loadErr)
	}
	rules := mustLoad(t, s)
	if len(rules) != writers {
		t.Fatalf("got %d rules, want %d", len(rules), writers)
	}
	for i, r := range rules {
		if want := fmt.Sprintf("rule-%02d", i); r.Name != want || r.KVWarmupSec != versions {
			t.Errorf("rules[%d]: got %s v%d, want %s v%d", i, r.Name, r.KVWarmupSec, want, versions)
		}
	}
}

// TestKill9DuringPut re-executes the test binary as a child that Puts
// versions of one rule in a loop and prints each acknowledged version. The
// parent SIGKILLs it after a few acknowledgements, at a point where a Put is
// almost certainly in flight, and checks that the store holds a parseable
// version at least as new as the last acknowledged one.
func TestKill9DuringPut(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "state")
	next := 1
	for round, killAfter := range []int{1, 7, 20} {
		t.Run(fmt.Sprintf("round %d kill after %d acks", round, killAfter), func(t *testing.T) {
			lastAck := runAndKill(t, dir, next, killAfter)
			s, err := Open(dir)
			if err != nil {
				t.Fatal(err)
			}
			rules := mustLoad(t, s)
			if len(rules) != 1 || rules[0].Name != "crash" {
				t.Fatalf("after kill: got %v, want the rule \"crash\"", names(rules))
			}
			got := rules[0].KVWarmupSec
			if got < lastAck {
				t.Fatalf("after kill: got version %d, want >= last acknowledged %d", got, lastAck)
			}
			if !reflect.DeepEqual(rules[0], versioned("crash", got)) {
				t.Errorf("version %d: got %+v, want %+v", got, rules[0], versioned("crash", got))
			}
			next = got + 1
		})
	}
}

// runAndKill starts the crash child on dir from version start, kills it with
// SIGKILL once it has acknowledged killAfter versions, and returns the last
// version it acknowledged (acks already written before the kill count).
func runAndKill(t *testing.T, dir string, start, killAfter int) int {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), childEnv+"="+dir, childStartEnv+"="+strconv.Itoa(start))
	var stderr strings.Builder
	cmd.Stderr = &stderr
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	sc := bufio.NewScanner(out)
	acks, lastAck, killed := 0, 0, false
	for sc.Scan() {
		v, err := strconv.Atoi(sc.Text())
		if err != nil {
			t.Errorf("child printed %q", sc.Text())
			continue
		}
		if v <= lastAck {
			t.Errorf("child acknowledged %d after %d", v, lastAck)
		}
		lastAck = v
		if acks++; acks == killAfter && !killed {
			if err := cmd.Process.Signal(syscall.SIGKILL); err != nil {
				t.Fatalf("kill: %v", err)
			}
			killed = true
		}
	}
	err = cmd.Wait()
	var exitErr *exec.ExitError
	if !errors.As(err, &exitErr) {
		t.Fatalf("child: got %v, want death by SIGKILL (stderr: %s)", err, stderr.String())
	}
	if ws, ok := exitErr.Sys().(syscall.WaitStatus); !ok || !ws.Signaled() || ws.Signal() != syscall.SIGKILL {
		t.Fatalf("child: got %v, want death by SIGKILL (stderr: %s)", err, stderr.String())
	}
	if !killed {
		t.Fatalf("child ended after %d acks before the kill point %d", acks, killAfter)
	}
	return lastAck
}

// BenchmarkPut measures one durable rule write (two fsyncs and a rename).
func BenchmarkPut(b *testing.B) {
	s, err := Open(b.TempDir())
	if err != nil {
		b.Fatal(err)
	}
	r := versioned("bench", 6)
	b.ReportAllocs()
	for b.Loop() {
		if err := s.Put(r); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkLoad measures a start-up load of 100 stored rules.
func BenchmarkLoad(b *testing.B) {
	s, err := Open(b.TempDir())
	if err != nil {
		b.Fatal(err)
	}
	for i := range 100 {
		if err := s.Put(versioned(fmt.Sprintf("r%03d", i), i)); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportAllocs()
	for b.Loop() {
		if _, err := s.Load(); err != nil {
			b.Fatal(err)
		}
	}
}
