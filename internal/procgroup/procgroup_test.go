package procgroup

import (
	"bytes"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"
)

// TestKillStopsGrandchildren starts a shell that forks a long-running
// grandchild (as nginx forks its workers) and checks that Kill leaves no
// member of the group.
func TestKillStopsGrandchildren(t *testing.T) {
	cmd := exec.Command("sh", "-c", "sleep 300 & echo $!; wait")
	Prepare(cmd)
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 32)
	n, err := out.Read(buf)
	if err != nil {
		t.Fatal(err)
	}
	child, err := strconv.Atoi(strings.TrimSpace(string(buf[:n])))
	if err != nil {
		t.Fatalf("grandchild pid %q: %v", buf[:n], err)
	}
	reaped := make(chan error, 1)
	go func() { reaped <- cmd.Wait() }()
	if err := Kill(cmd, 5*time.Second); err != nil {
		t.Fatal(err)
	}
	<-reaped
	// Gone, or a zombie waiting for its new parent to reap it: either way
	// it no longer runs.
	if b, err := os.ReadFile("/proc/" + strconv.Itoa(child) + "/stat"); err == nil {
		if i := bytes.LastIndexByte(b, ')'); i < 0 || !bytes.HasPrefix(bytes.TrimSpace(b[i+1:]), []byte("Z")) {
			t.Fatalf("grandchild %d survived Kill: %s", child, b)
		}
	}
}
