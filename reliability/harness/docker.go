package harness

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
)

// Docker runs one docker CLI command and returns its trimmed standard
// output.
func Docker(ctx context.Context, args ...string) (string, error) {
	cmd := exec.CommandContext(ctx, "docker", args...)
	var stderr strings.Builder
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return "", fmt.Errorf("harness: docker %s: %w: %s", strings.Join(args, " "), err, strings.TrimSpace(stderr.String()))
	}
	return strings.TrimSpace(string(out)), nil
}

// BuildImage builds a FROM scratch image named tag holding a static
// (CGO_ENABLED=0) build of ./cmd/llmgw from the module at root, with the
// binary as entrypoint. Nothing is pulled: scratch is built in. workDir
// receives the binary and the Dockerfile.
//
// runbook/'s docker launcher expects such an image for its simulator
// workers; this is the same recipe, kept here until the two share one
// helper.
func BuildImage(ctx context.Context, root, workDir, tag string) error {
	if _, err := Build(ctx, root, workDir, true); err != nil {
		return err
	}
	dockerfile := "FROM scratch\nCOPY llmgw /llmgw\nENTRYPOINT [\"/llmgw\"]\n"
	if err := os.WriteFile(filepath.Join(workDir, "Dockerfile"), []byte(dockerfile), 0o644); err != nil {
		return fmt.Errorf("harness: write Dockerfile: %w", err)
	}
	_, err := Docker(ctx, "build", "-q", "--label", "llmgw.owner=llmgw-faults", "-t", tag, workDir)
	return err
}
