package k8s_test

import (
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/llmgw/llmgw/internal/k8stest"
)

// TestImage builds the image the chart names with make image (under a
// tag of its own) and checks it: a FROM scratch image whose only layer is
// the static binary, run as the chart's non-root user, that starts. It
// skips without a Docker daemon, and fails under CI=true.
func TestImage(t *testing.T) {
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Minute)
	defer cancel()
	if out, err := exec.CommandContext(ctx, "docker", "info", "--format", "{{.ServerVersion}}").CombinedOutput(); err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatalf("CI=true and no Docker daemon: %v: %s", err, out)
		}
		t.Skipf("no Docker daemon reachable (set CI=true to make this a failure): %v", err)
	}
	tag := "llmgw-image-test:" + strconv.Itoa(os.Getpid())
	build := exec.CommandContext(ctx, "make", "-C", k8stest.RepoRoot(t), "image", "IMAGE="+tag)
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("make image: %v\n%s", err, out)
	}
	t.Cleanup(func() { _ = exec.Command("docker", "image", "rm", "-f", tag).Run() })
	out, err := exec.CommandContext(ctx, "docker", "image", "inspect", tag).Output()
	if err != nil {
		t.Fatal(err)
	}
	var img []struct {
		Config struct {
			User       string
			Entrypoint []string
		}
		RootFS struct{ Layers []string }
	}
	if err := json.Unmarshal(out, &img); err != nil || len(img) != 1 {
		t.Fatalf("docker image inspect: %v %s", err, out)
	}
	if c := img[0].Config; c.User != "65532:65532" || strings.Join(c.Entrypoint, " ") != "/llmgw" {
		t.Errorf("user %q entrypoint %q, want 65532:65532 (the chart's runAsUser) and /llmgw", c.User, c.Entrypoint)
	}
	if n := len(img[0].RootFS.Layers); n != 1 {
		t.Errorf("%d layers, want 1 (FROM scratch and the binary)", n)
	}
	// A static binary runs with nothing else in the image.
	if out, err := exec.CommandContext(ctx, "docker", "run", "--rm", "--network", "none", tag, "--version").CombinedOutput(); err != nil || !strings.HasPrefix(string(out), "llmgw ") {
		t.Errorf("docker run %s --version: %v: %s", tag, err, out)
	}
}
