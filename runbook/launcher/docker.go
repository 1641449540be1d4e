package launcher

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/ory/dockertest/v3"
	dc "github.com/ory/dockertest/v3/docker"

	"github.com/llmgw/llmgw/engines"
	"github.com/llmgw/llmgw/results"
	"github.com/llmgw/llmgw/runbook"
)

// Ownership labels on every container and network the docker launcher
// creates. Cleanup finds resources by them and touches nothing without.
const (
	LabelRun    = "llmgw.run"
	LabelOwner  = "llmgw.owner"
	OwnerValue  = "llmgw"
	LabelWorker = "llmgw.worker"
)

// SimImageKey is the ImageOverride key that runs `llmgw sim` workers from an
// image of this binary instead of the engine's own image (the test path and
// a GPU-free lab): --image-override sim=llmgw-sim:test.
const SimImageKey = "sim"

// Container ports of the simulator workers.
const (
	simHTTPPort   = 8000
	simEventsPort = 5557
)

// Docker launches workers as containers through dockertest.
//
// The image comes from the profile's launch spec for the engine, unless
// ImageOverride names another one for the engine, or a simulator image
// under SimImageKey. Images are never pulled: a missing image is BLOCKED
// image_unavailable. No reachable daemon is BLOCKED no_docker. An engine
// that needs a GPU is BLOCKED no_gpu unless the daemon's default runtime is
// the NVIDIA runtime (dockertest's HostConfig has no DeviceRequests field,
// so GPUs are requested the runtime's way: NVIDIA_VISIBLE_DEVICES).
//
// Containers are labelled llmgw.run=<run id>, llmgw.owner=llmgw, and
// publish their ports on 127.0.0.1 only, with host ports chosen by the
// kernel. They join Network, or a network created for the run.
//
// A Docker is used by one run at a time; Stop is idempotent.
type Docker struct {
	// Endpoint is the daemon address; "" uses DOCKER_HOST or the default
	// socket.
	Endpoint string
	// Network is an existing network (name or id) to join; "" creates
	// llmgw-<run> for the run and removes it on Stop.
	Network string
	// ImageOverride maps an engine name, or SimImageKey, to an image.
	ImageOverride map[string]string
	// StartTimeout bounds each container's health wait (GET health path
	// until 200); 0 means 1 minute for simulator images, 10 minutes for
	// engines (weights load first).
	StartTimeout time.Duration

	mu        sync.Mutex
	pool      *dockertest.Pool
	resources []*dockertest.Resource
	network   *dockertest.Network
	ledger    *runbook.Ledger
}

// Name implements runbook.Launcher.
func (d *Docker) Name() string { return results.LauncherDocker }

// Simulated reports whether the containers run the simulator image.
func (d *Docker) Simulated() bool { return d.ImageOverride[SimImageKey] != "" }

// ParseImageOverrides parses "key=image" pairs (key: an engine or "sim").
func ParseImageOverrides(pairs []string) (map[string]string, error) {
	out := map[string]string{}
	for _, p := range pairs {
		k, v, ok := strings.Cut(p, "=")
		k, v = strings.TrimSpace(k), strings.TrimSpace(v)
		if !ok || k == "" || v == "" {
			return nil, fmt.Errorf("launcher: --image-override %q: want KEY=IMAGE, e.g. sim=llmgw-sim:test", p)
		}
		if _, err := engines.ParseKind(k); err != nil && k != SimImageKey {
			return nil, fmt.Errorf("launcher: --image-override %q: key must be sim, vllm, sglang, trtllm or llamacpp", p)
		}
		out[k] = v
	}
	return out, nil
}

// connect opens the pool and pings the daemon; failures are no_docker.
func (d *Docker) connect(ctx context.Context) (*dockertest.Pool, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.pool != nil {
		return d.pool, nil
	}
	pool, err := dockertest.NewPool(d.Endpoint)
	if err != nil {
		return nil, &runbook.BlockedError{Code: "no_docker", Detail: "no docker daemon configured", Err: err}
	}
	pctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	if err := pool.Client.PingWithContext(pctx); err != nil {
		return nil, &runbook.BlockedError{Code: "no_docker", Detail: "docker daemon unreachable", Err: err}
	}
	d.pool = pool
	return pool, nil
}

func splitImage(ref string) (repo, tag string) {
	// A tag follows the last ':' after the last '/' (a registry port is not
	// a tag).
	slash := strings.LastIndexByte(ref, '/')
	if c := strings.LastIndexByte(ref, ':'); c > slash {
		return ref[:c], ref[c+1:]
	}
	return ref, "latest"
}

// Launch implements runbook.Launcher.
func (d *Docker) Launch(ctx context.Context, spec runbook.LaunchSpec) ([]runbook.Worker, error) {
	if spec.Workers < 1 {
		return nil, fmt.Errorf("launcher: docker: %d workers: want at least 1", spec.Workers)
	}
	pool, err := d.connect(ctx)
	if err != nil {
		return nil, err
	}
	d.ledger = spec.Ledger
	image, simMode := d.ImageOverride[SimImageKey], true
	if image == "" {
		simMode = false
		image = d.ImageOverride[spec.Engine]
		if image == "" {
			image = spec.Launch.Image
		}
	}
	if image == "" {
		return nil, &runbook.BlockedError{Code: "image_unavailable", Detail: "the profile names no image for " + spec.Engine}
	}
	var gpuEnv []string
	if !simMode && spec.Launch.GPUs > 0 {
		info, err := pool.Client.Info()
		if err != nil {
			return nil, &runbook.BlockedError{Code: "no_docker", Detail: "docker info failed", Err: err}
		}
		if info.DefaultRuntime != "nvidia" {
			return nil, &runbook.BlockedError{Code: "no_gpu", Detail: fmt.Sprintf("%s needs %d GPU(s) and the daemon's default runtime is %q, not nvidia", spec.Engine, spec.Launch.GPUs, info.DefaultRuntime)}
		}
		gpuEnv = []string{"NVIDIA_VISIBLE_DEVICES=all", "NVIDIA_DRIVER_CAPABILITIES=compute,utility"}
	}
	if _, err := pool.Client.InspectImage(image); err != nil {
		if errors.Is(err, dc.ErrNoSuchImage) {
			return nil, &runbook.BlockedError{Code: "image_unavailable", Detail: fmt.Sprintf("image %s is not present locally (llmgw never pulls; load or build it first)", image)}
		}
		return nil, fmt.Errorf("launcher: docker: inspect image %s: %w", image, err)
	}
	if !simMode && len(spec.Launch.Files) > 0 {
		return nil, &runbook.BlockedError{Code: "launch_unsupported", Detail: fmt.Sprintf("%s's launch spec needs files written into the container (%s); the docker launcher does not stage files yet", spec.Engine, spec.Launch.Files[0].Path)}
	}
	labels := map[string]string{LabelRun: spec.RunID, LabelOwner: OwnerValue}
	netID := d.Network
	if netID == "" {
		n, err := pool.CreateNetwork("llmgw-"+spec.RunID, func(o *dc.CreateNetworkOptions) { o.Labels = labels })
		if err != nil {
			return nil, fmt.Errorf("launcher: docker: create network: %w", err)
		}
		d.mu.Lock()
		d.network = n
		d.mu.Unlock()
		if err := spec.Ledger.Update(func(st *runbook.LedgerState) { st.Networks = append(st.Networks, n.Network.ID) }); err != nil {
			return nil, err
		}
		netID = n.Network.ID
	}
	timeout := d.StartTimeout
	if timeout <= 0 {
		timeout = 10 * time.Minute // real engines load weights first
		if simMode {
			timeout = time.Minute
		}
	}
	repo, tag := splitImage(image)
	var out []runbook.Worker
	for i := 0; i < spec.Workers; i++ {
		id := fmt.Sprintf("w%d", i+1)
		opts := &dockertest.RunOptions{
			Name: "llmgw-" + spec.RunID + "-" + id, Repository: repo, Tag: tag, NetworkID: netID,
			Labels: map[string]string{LabelRun: spec.RunID, LabelOwner: OwnerValue, LabelWorker: id},
		}
		httpPort, eventsPort, replayPort := simHTTPPort, 0, 0
		if simMode {
			opts.Cmd = simArgs(spec)
			if spec.KVEvents && engines.KVOf(engines.Kind(spec.Engine)).PublishesZMQ() {
				eventsPort = simEventsPort
			}
		} else {
			opts.Entrypoint, opts.Cmd = spec.Launch.Command, spec.Launch.Args
			for k, v := range spec.Launch.Env {
				opts.Env = append(opts.Env, k+"="+v)
			}
			slices.Sort(opts.Env)
			opts.Env = append(opts.Env, gpuEnv...)
			httpPort, eventsPort, replayPort = spec.Launch.Port("http"), spec.Launch.Port("kv-events"), spec.Launch.Port("kv-replay")
			for _, m := range spec.Launch.Mounts {
				b := m.Source + ":" + m.Target
				if m.ReadOnly {
					b += ":ro"
				}
				opts.Mounts = append(opts.Mounts, b)
			}
		}
		opts.PortBindings = map[dc.Port][]dc.PortBinding{}
		for _, p := range []int{httpPort, eventsPort, replayPort} {
			if p > 0 {
				port := dc.Port(strconv.Itoa(p) + "/tcp")
				opts.ExposedPorts = append(opts.ExposedPorts, string(port))
				opts.PortBindings[port] = []dc.PortBinding{{HostIP: "127.0.0.1", HostPort: ""}}
			}
		}
		res, err := pool.RunWithOptions(opts, func(hc *dc.HostConfig) {
			hc.PublishAllPorts = false // loopback bindings above only
			hc.AutoRemove = false      // keep logs until Stop
			hc.RestartPolicy = dc.RestartPolicy{Name: "no"}
		})
		if err != nil {
			return nil, fmt.Errorf("launcher: docker: run %s: %w", opts.Name, err)
		}
		d.mu.Lock()
		d.resources = append(d.resources, res)
		d.mu.Unlock()
		if err := spec.Ledger.Update(func(st *runbook.LedgerState) { st.Containers = append(st.Containers, res.Container.ID) }); err != nil {
			return nil, err
		}
		w := runbook.Worker{ID: id, HTTP: net.JoinHostPort("127.0.0.1", res.GetPort(strconv.Itoa(httpPort)+"/tcp")),
			HealthPath: healthPath(spec), Owner: "docker:" + res.Container.ID[:12]}
		if eventsPort > 0 {
			w.Events = "tcp://" + net.JoinHostPort("127.0.0.1", res.GetPort(strconv.Itoa(eventsPort)+"/tcp"))
		}
		if replayPort > 0 {
			w.Replay = "tcp://" + net.JoinHostPort("127.0.0.1", res.GetPort(strconv.Itoa(replayPort)+"/tcp"))
		}
		if err := waitHealthy(ctx, pool, res, "http://"+w.HTTP+w.HealthPath, timeout); err != nil {
			return nil, fmt.Errorf("launcher: docker: %s: %w", opts.Name, err)
		}
		out = append(out, w)
	}
	return out, nil
}

// simArgs is the `llmgw sim` command line of a simulator container,
// coherent with the rule: block size, hash seed, event encoding.
func simArgs(spec runbook.LaunchSpec) []string {
	args := []string{"sim", "--engine", spec.Engine, "--model", spec.Model, "--listen", fmt.Sprintf("0.0.0.0:%d", simHTTPPort)}
	if spec.BlockSize > 0 {
		args = append(args, "--block-size", strconv.Itoa(spec.BlockSize))
	}
	if spec.HashSeed != "" {
		args = append(args, "--hash-seed", spec.HashSeed)
	}
	if spec.KVEvents && engines.KVOf(engines.Kind(spec.Engine)).PublishesZMQ() {
		// Bound on every interface inside the container; the replay socket
		// stays on the container's loopback, so the rule gets no replay
		// endpoint from this launcher.
		args = append(args, "--kv-events", fmt.Sprintf("tcp://*:%d", simEventsPort))
		if spec.EventEncoding != "" {
			args = append(args, "--event-encoding", spec.EventEncoding)
		}
	} else {
		args = append(args, "--kv-events", "off")
	}
	return args
}

// waitHealthy waits until the worker's health endpoint answers 200 (a
// published port accepts connections through docker's proxy before the
// process listens, so a TCP connect proves nothing), failing early when the
// container has exited.
func waitHealthy(ctx context.Context, pool *dockertest.Pool, res *dockertest.Resource, url string, timeout time.Duration) error {
	deadline := time.NewTimer(timeout)
	defer deadline.Stop()
	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
	last := "no answer yet"
	for {
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
		if err != nil {
			return err
		}
		resp, err := httpClient.Do(req)
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return nil
			}
			last = fmt.Sprintf("health answered %d", resp.StatusCode)
		} else {
			last = err.Error()
		}
		if ct, ierr := pool.Client.InspectContainer(res.Container.ID); ierr == nil && !ct.State.Running {
			return fmt.Errorf("container %s (exit code %d) before it was healthy", ct.State.Status, ct.State.ExitCode)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-deadline.C:
			return fmt.Errorf("%s not healthy within %v: %s", url, timeout, last)
		case <-tick.C:
		}
	}
}

// Stop removes every container and the run's network. Idempotent.
func (d *Docker) Stop(context.Context) error {
	d.mu.Lock()
	pool, res, n := d.pool, d.resources, d.network
	d.resources, d.network = nil, nil
	d.mu.Unlock()
	if pool == nil {
		return nil
	}
	var errs []error
	for _, r := range res {
		if err := pool.Purge(r); err != nil && !isNoSuchContainer(err) {
			errs = append(errs, fmt.Errorf("launcher: docker: remove %s: %w", r.Container.Name, err))
			continue
		}
		errs = append(errs, d.ledger.Update(func(st *runbook.LedgerState) {
			st.Containers = slices.DeleteFunc(st.Containers, func(id string) bool { return id == r.Container.ID })
		}))
	}
	if n != nil {
		if err := pool.RemoveNetwork(n); err != nil {
			errs = append(errs, fmt.Errorf("launcher: docker: remove network: %w", err))
		} else {
			errs = append(errs, d.ledger.Update(func(st *runbook.LedgerState) {
				st.Networks = slices.DeleteFunc(st.Networks, func(id string) bool { return id == n.Network.ID })
			}))
		}
	}
	return errors.Join(errs...)
}

func isNoSuchContainer(err error) bool {
	var nsc *dc.NoSuchContainer
	return errors.As(err, &nsc)
}

var _ runbook.Launcher = (*Docker)(nil)
