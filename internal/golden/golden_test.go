package golden

import (
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"testing"
)

// recorder captures failures instead of failing the enclosing test, so the
// failing branches of Check can be asserted on.
type recorder struct {
	testing.TB
	failed bool
	fatal  bool
}

func (r *recorder) Helper()               {}
func (r *recorder) Errorf(string, ...any) { r.failed = true }
func (r *recorder) Fatalf(string, ...any) { r.failed, r.fatal = true, true }
func (r *recorder) Fatal(...any)          { r.failed, r.fatal = true, true }

func TestCheck(t *testing.T) {
	dir := t.TempDir()
	same := filepath.Join(dir, "same.txt")
	if err := os.WriteFile(same, []byte("hello\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		name       string
		update     bool
		path       string
		got        string
		wantFailed bool
		wantFile   string // the file's content afterwards; "" means absent
	}{
		{name: "equal", path: same, got: "hello\n", wantFile: "hello\n"},
		{name: "different", path: same, got: "bye\n", wantFailed: true, wantFile: "hello\n"},
		{name: "missing", path: filepath.Join(dir, "none.txt"), got: "x", wantFailed: true},
		{name: "update writes", update: true, path: filepath.Join(dir, "sub", "new.txt"), got: "fresh\n", wantFile: "fresh\n"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			old := *update
			*update = tc.update
			defer func() { *update = old }()
			r := &recorder{TB: t}
			Check(r, tc.path, []byte(tc.got))
			if r.failed != tc.wantFailed {
				t.Errorf("failed = %v, want %v", r.failed, tc.wantFailed)
			}
			b, err := os.ReadFile(tc.path)
			switch {
			case tc.wantFile == "" && err == nil:
				t.Errorf("file %s exists with %q, want absent", tc.path, b)
			case tc.wantFile != "" && string(b) != tc.wantFile:
				t.Errorf("file content %q (%v), want %q", b, err, tc.wantFile)
			}
		})
	}
}

func TestUpdateFlagRegistered(t *testing.T) {
	f := flag.Lookup("update")
	if f == nil {
		t.Fatal("-update is not registered")
	}
	if got, want := f.Value.String(), fmt.Sprint(Update()); got != want {
		t.Errorf("flag value %s, Update() %s", got, want)
	}
}
