package launcher_test

import (
	"archive/tar"
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/ory/dockertest/v3"
	dc "github.com/ory/dockertest/v3/docker"
	"go.uber.org/goleak"

	"github.com/llmgw/llmgw/profiles"
	"github.com/llmgw/llmgw/results"
	"github.com/llmgw/llmgw/runbook"
	"github.com/llmgw/llmgw/runbook/converged"
	"github.com/llmgw/llmgw/runbook/launcher"
)

// simImageTag is the FROM scratch image of this module's static binary
// that the docker tests build and run `llmgw sim` workers from.
const simImageTag = "llmgw-sim:test"

// dockerPool connects to the local daemon. Without one the docker tests
// skip, except under CI=true where a missing daemon is a failure.
func dockerPool(t *testing.T) *dockertest.Pool {
	t.Helper()
	pool, err := dockertest.NewPool("")
	if err == nil {
		err = pool.Client.Ping()
	}
	if err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatalf("CI=true and no docker daemon: %v", err)
		}
		t.Skipf("no docker daemon: %v", err)
	}
	return pool
}

var (
	buildOnce sync.Once
	buildErr  error
)

// simImage builds (once per test binary) a FROM scratch image holding a
// CGO_ENABLED=0 build of cmd/llmgw.
func simImage(t *testing.T, pool *dockertest.Pool) string {
	t.Helper()
	buildOnce.Do(func() {
		dir, err := os.MkdirTemp("", "llmgw-sim-image-")
		if err != nil {
			buildErr = err
			return
		}
		defer os.RemoveAll(dir)
		bin := filepath.Join(dir, "llmgw")
		cmd := exec.Command("go", "build", "-trimpath", "-o", bin, "github.com/llmgw/llmgw/cmd/llmgw")
		cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
		if out, err := cmd.CombinedOutput(); err != nil {
			buildErr = fmt.Errorf("go build: %v\n%s", err, out)
			return
		}
		binData, err := os.ReadFile(bin)
		if err != nil {
			buildErr = err
			return
		}
		var ctxTar bytes.Buffer
		tw := tar.NewWriter(&ctxTar)
		dockerfile := []byte("FROM scratch\nCOPY llmgw /llmgw\nENTRYPOINT [\"/llmgw\"]\n")
		for _, f := range []struct {
			name string
			mode int64
			data []byte
		}{{"Dockerfile", 0o644, dockerfile}, {"llmgw", 0o755, binData}} {
			if err := tw.WriteHeader(&tar.Header{Name: f.name, Mode: f.mode, Size: int64(len(f.data))}); err != nil {
				buildErr = err
				return
			}
			if _, err := tw.Write(f.data); err != nil {
				buildErr = err
				return
			}
		}
		if err := tw.Close(); err != nil {
			buildErr = err
			return
		}
		var log bytes.Buffer
		buildErr = pool.Client.BuildImage(dc.BuildImageOptions{
			Name: simImageTag, InputStream: &ctxTar, OutputStream: &log, RmTmpContainer: true,
			Labels: map[string]string{"llmgw.test": "sim-image"},
		})
		if buildErr != nil {
			buildErr = fmt.Errorf("docker build: %w\n%s", buildErr, log.String())
		}
	})
	if buildErr != nil {
		t.Fatal(buildErr)
	}
	return simImageTag
}

func labelledContainers(t *testing.T, pool *dockertest.Pool, label string) []dc.APIContainers {
	t.Helper()
	cs, err := pool.Client.ListContainers(dc.ListContainersOptions{All: true, Filters: map[string][]string{"label": {label}}})
	if err != nil {
		t.Fatal(err)
	}
	return cs
}

func TestDockerLauncherRunsSimContainers(t *testing.T) {
	pool := dockerPool(t)
	image := simImage(t, pool)
	net, err := pool.CreateNetwork(fmt.Sprintf("llmgw-test-%d", time.Now().UnixNano()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = pool.RemoveNetwork(net) })
	out := t.TempDir()
	runID := fmt.Sprintf("dockertest-%d", time.Now().UnixNano())
	led, err := runbook.OpenLedger(out, runID, results.LauncherDocker)
	if err != nil {
		t.Fatal(err)
	}
	d := &launcher.Docker{ImageOverride: map[string]string{launcher.SimImageKey: image}, Network: net.Network.ID, StartTimeout: 30 * time.Second}
	t.Cleanup(func() { _ = d.Stop(context.Background()) })
	ws, err := d.Launch(t.Context(), runbook.LaunchSpec{RunID: runID, Engine: "vllm", Model: "Qwen/Qwen3-0.6B", Workers: 2, BlockSize: 16, HashSeed: "0", EventEncoding: "map", KVEvents: true, Ledger: led})
	if err != nil {
		t.Fatalf("Launch: %v", err)
	}
	for _, w := range ws {
		resp, err := http.Get("http://" + w.HTTP + "/health")
		if err != nil {
			t.Fatalf("worker %s health: %v", w.ID, err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK || w.Events == "" {
			t.Errorf("worker %s: health %d, events %q; want 200 and an events endpoint", w.ID, resp.StatusCode, w.Events)
		}
	}
	cs := labelledContainers(t, pool, launcher.LabelRun+"="+runID)
	if len(cs) != 2 {
		t.Fatalf("containers labelled with the run = %d; want 2", len(cs))
	}
	for _, c := range cs {
		if c.Labels[launcher.LabelOwner] != launcher.OwnerValue {
			t.Errorf("container %s owner label = %q; want %q", c.ID[:12], c.Labels[launcher.LabelOwner], launcher.OwnerValue)
		}
		for _, p := range c.Ports {
			if p.PublicPort != 0 && p.IP != "127.0.0.1" {
				t.Errorf("container %s publishes %d on %s; want loopback only", c.ID[:12], p.PrivatePort, p.IP)
			}
		}
	}
	if got := led.State().Containers; len(got) != 2 {
		t.Errorf("ledger containers = %d; want 2", len(got))
	}
	for i := 0; i < 2; i++ { // Stop is idempotent
		if err := d.Stop(t.Context()); err != nil {
			t.Fatalf("Stop #%d: %v", i+1, err)
		}
	}
	if cs := labelledContainers(t, pool, launcher.LabelRun+"="+runID); len(cs) != 0 {
		t.Errorf("%d containers left after Stop", len(cs))
	}
	if got := led.State().Containers; len(got) != 0 {
		t.Errorf("ledger still lists %d containers after Stop", len(got))
	}
}

func TestConvergedRunbookOnDockerSims(t *testing.T) {
	pool := dockerPool(t)
	image := simImage(t, pool)
	for _, tc := range []struct{ name, engine, mode string }{
		{"vllm exact", "vllm", "exact"},
		{"llamacpp rr", "llamacpp", "rr"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			o := &converged.Options{Engine: tc.engine, Mode: tc.mode,
				Launcher:      &launcher.Docker{ImageOverride: map[string]string{launcher.SimImageKey: image}, StartTimeout: 30 * time.Second},
				HealthTimeout: 30 * time.Second, ReadyTimeout: 20 * time.Second}
			if err := o.Validate(); err != nil {
				t.Fatal(err)
			}
			out := t.TempDir()
			store, err := results.Open(out)
			if err != nil {
				t.Fatal(err)
			}
			rep, err := converged.Execute(t.Context(), o, store, out, nil)
			if err != nil {
				t.Fatal(err)
			}
			if rep.Summary.Verdict != results.StatusPass {
				for _, s := range rep.Steps {
					t.Logf("%s: %s %s %s", s.Name, s.Status, s.ReasonCode, s.Reason)
				}
				t.Fatalf("verdict = %s; want PASS", rep.Summary.Verdict)
			}
			if tu := rep.Summary.Tuple; tu.Launcher != results.LauncherDocker || !tu.SimulatedWorkers {
				t.Errorf("tuple launcher %q simulated %v; want docker, simulated", tu.Launcher, tu.SimulatedWorkers)
			}
			if cs := labelledContainers(t, pool, launcher.LabelRun+"="+rep.Summary.ID); len(cs) != 0 {
				t.Errorf("%d containers left after the run", len(cs))
			}
		})
	}
}

func TestDockerBlockedNeverFails(t *testing.T) {
	cat, err := profiles.Load()
	if err != nil {
		t.Fatal(err)
	}
	p, _ := cat.Get("qwen3-0.6b")
	ls, _ := p.Launch("vllm")
	cases := []struct {
		name     string
		docker   *launcher.Docker
		needsDmn bool
		want     string
	}{
		{"no daemon", &launcher.Docker{Endpoint: "unix:///nonexistent/llmgw-test-docker.sock"}, false, "no_docker"},
		{"gpu engine without the nvidia runtime", &launcher.Docker{}, true, "no_gpu"},
		{"image not present", &launcher.Docker{ImageOverride: map[string]string{"vllm": "llmgw-absent-image:never"}}, true, "image_unavailable"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			spec := runbook.LaunchSpec{RunID: "blocked-test", Engine: "vllm", Launch: ls, Model: "Qwen/Qwen3-0.6B", Workers: 1}
			if tc.needsDmn {
				pool := dockerPool(t)
				if info, err := pool.Client.Info(); err == nil && info.DefaultRuntime == "nvidia" && tc.want == "no_gpu" {
					t.Skip("this daemon has the nvidia runtime")
				}
				if tc.want == "image_unavailable" {
					spec.Launch.GPUs = 0
				}
			}
			done := make(chan error, 1)
			go func() { _, err := tc.docker.Launch(t.Context(), spec); done <- err }()
			var err error
			select {
			case err = <-done:
			case <-time.After(30 * time.Second):
				t.Fatal("Launch hung")
			}
			b := runbook.AsBlocked(err)
			if b == nil || b.Code != tc.want {
				t.Fatalf("Launch error = %v; want BLOCKED %s", err, tc.want)
			}
			if err := tc.docker.Stop(t.Context()); err != nil {
				t.Errorf("Stop after a blocked launch: %v", err)
			}
			if tc.want == "image_unavailable" {
				if _, err := dockerPool(t).Client.InspectImage("llmgw-absent-image:never"); err == nil {
					t.Errorf("the missing image was pulled")
				}
			}
		})
	}
}

func TestCleanupTwiceRemovesOnlyWhatTheRunOwns(t *testing.T) {
	pool := dockerPool(t)
	image := simImage(t, pool)
	// A container this tool does not own: no llmgw labels.
	foreign, err := pool.RunWithOptions(&dockertest.RunOptions{Repository: "llmgw-sim", Tag: "test", Cmd: []string{"sim", "--engine", "vllm", "--listen", "0.0.0.0:8000", "--kv-events", "off"}},
		func(hc *dc.HostConfig) { hc.PublishAllPorts = false })
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = pool.Purge(foreign) })
	out := t.TempDir()
	runID := fmt.Sprintf("cleanup-%d", time.Now().UnixNano())
	led, err := runbook.OpenLedger(out, runID, results.LauncherDocker)
	if err != nil {
		t.Fatal(err)
	}
	tmp := t.TempDir()
	if err := led.Update(func(s *runbook.LedgerState) { s.Dirs = append(s.Dirs, tmp) }); err != nil {
		t.Fatal(err)
	}
	d := &launcher.Docker{ImageOverride: map[string]string{launcher.SimImageKey: image}, StartTimeout: 30 * time.Second}
	if _, err := d.Launch(t.Context(), runbook.LaunchSpec{RunID: runID, Engine: "sglang", Model: "m", Workers: 1, Ledger: led}); err != nil {
		t.Fatal(err)
	}
	// The run "dies" here: nothing stops the container but cleanup.
	rep, err := launcher.Cleanup(t.Context(), launcher.CleanupOptions{Out: out, RunID: runID})
	if err != nil {
		t.Fatalf("first cleanup: %v", err)
	}
	if len(rep.Containers) != 1 || len(rep.Networks) != 1 || len(rep.Dirs) != 1 {
		t.Errorf("first cleanup removed %d containers, %d networks, %d dirs; want 1, 1, 1", len(rep.Containers), len(rep.Networks), len(rep.Dirs))
	}
	if cs := labelledContainers(t, pool, launcher.LabelRun+"="+runID); len(cs) != 0 {
		t.Errorf("%d run containers left", len(cs))
	}
	rep, err = launcher.Cleanup(t.Context(), launcher.CleanupOptions{Out: out, RunID: runID})
	if err != nil || !rep.Nothing() {
		t.Errorf("second cleanup = %+v, %v; want nothing to do", rep, err)
	}
	if c, err := pool.Client.InspectContainer(foreign.Container.ID); err != nil || !c.State.Running {
		t.Errorf("the unlabelled container was touched: %v", err)
	}
	_ = io.Discard
}

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m,
		// net/http keep-alive connections of the docker client close on
		// their own idle timeout; everything the launchers start is checked.
		goleak.IgnoreTopFunction("net/http.(*persistConn).readLoop"),
		goleak.IgnoreTopFunction("net/http.(*persistConn).writeLoop"),
		goleak.IgnoreTopFunction("internal/poll.runtime_pollWait"),
		goleak.IgnoreAnyFunction("github.com/valyala/fasthttp.(*HostClient).connsCleaner"),
		goleak.IgnoreAnyFunction("github.com/valyala/fasthttp.(*workerPool).Start.func2"),
		goleak.IgnoreAnyFunction("github.com/valyala/fasthttp.(*TCPDialer).tcpAddrsClean"),
		goleak.IgnoreAnyFunction("github.com/valyala/fasthttp.updateServerDate.func1"),
		goleak.IgnoreAnyFunction("github.com/go-zeromq/zmq4.(*pubMWriter).run"),
	)
}
