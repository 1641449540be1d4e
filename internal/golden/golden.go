// Package golden compares test output with golden files and rewrites them
// when the test binary runs with -update.
//
// Importing the package registers the -update flag on the default flag set,
// exactly once per test binary; a test file must therefore not register its
// own -update flag as well (a second registration panics). Import it only
// from _test.go files: a production binary would grow the flag too.
package golden

import (
	"bytes"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"testing"
)

var update = flag.Bool("update", false, "rewrite the golden files instead of comparing with them")

// Update reports whether the test binary runs with -update. It is only
// meaningful after flag parsing, that is inside a test.
func Update() bool { return *update }

// Check compares got with the file at path. Under -update it writes got to
// path (creating missing directories) instead, and the test passes. A
// missing or different file fails the test with both contents shown. Check
// is safe for concurrent use by parallel tests that use different paths.
func Check(t testing.TB, path string, got []byte) {
	t.Helper()
	if *update {
		if err := write(path, got); err != nil {
			t.Fatal(err)
		}
		return
	}
	want, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("golden: reading %s (run with -update to create it): %v", path, err)
	}
	if !bytes.Equal(got, want) {
		t.Errorf("golden: %s differs (run with -update after checking the change):\ngot:\n%s\nwant:\n%s", path, got, want)
	}
}

// File is Check on testdata/name, name being slash-separated and relative
// to the testdata directory of the package under test.
func File(t testing.TB, name string, got []byte) {
	t.Helper()
	Check(t, filepath.Join("testdata", filepath.FromSlash(name)), got)
}

func write(path string, b []byte) error {
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return fmt.Errorf("golden: %w", err)
	}
	if err := os.WriteFile(path, b, 0o644); err != nil {
		return fmt.Errorf("golden: %w", err)
	}
	return nil
}
