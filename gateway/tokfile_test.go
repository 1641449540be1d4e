//go:build unix

package gateway

import (
	"errors"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/llmgw/llmgw/gateway/rule"
)

// TestKVTokenizerSpecialFilesRefused: a kvTokenizer naming a FIFO, a device
// or an oversize file is refused with 400 at once, and the admin API keeps
// answering. Before the fix the FIFO's open blocked under the admin lock
// (every admin call hung) and the rule ended in 500.
func TestKVTokenizerSpecialFilesRefused(t *testing.T) {
	dir := t.TempDir()
	fifo := filepath.Join(dir, "tokenizer.fifo")
	if err := syscall.Mkfifo(fifo, 0o600); err != nil {
		t.Fatal(err)
	}
	huge := filepath.Join(dir, "huge.json")
	f, err := os.Create(huge)
	if err != nil {
		t.Fatal(err)
	}
	if err := f.Truncate(maxTokenizerFileBytes + 1); err != nil { // sparse
		t.Fatal(err)
	}
	f.Close()
	a := newBackend(t, "a", nil)
	s := startGateway(t, "", nil)
	cases := []struct{ name, path, want string }{
		{"fifo", fifo, "named pipe"},
		{"device", "/dev/zero", "device"},
		{"oversize", huge, "the limit is"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			done := make(chan error, 1)
			go func() {
				_, err := s.Apply(mustDecode(t, ruleYAML("r", "m1", "kvTokenizer: "+tc.path+"\n", a)), false)
				done <- err
			}()
			var err error
			select {
			case err = <-done:
			case <-time.After(10 * time.Second):
				t.Fatal("Apply blocked on the kvTokenizer path")
			}
			var ae *rule.AdmissionError
			if !errors.As(err, &ae) || !strings.Contains(ae.Message, tc.want) {
				t.Fatalf("Apply error = %v; want an admission error containing %q", err, tc.want)
			}
			if code, _ := adminStatusFor(err); code != http.StatusBadRequest {
				t.Errorf("admin status %d; want 400", code)
			}
		})
	}
}
