// Package testfix locates the repository's checked-in test fixtures
// (testdata/ at the module root, each directory with its PROVENANCE.md), so
// that tests of any package read the same copy and a fresh clone needs
// nothing outside the repository. Import it only from _test.go files.
package testfix

import (
	"compress/gzip"
	"io"
	"os"
	"path/filepath"
	"testing"
)

// Path returns the absolute path of rel under the module root's testdata/
// directory. The root is the nearest directory above the working directory
// (a test's package directory) that holds go.mod. It fails the test when the
// file is missing: a fixture that is not in the repository is a bug, not a
// skip.
func Path(tb testing.TB, rel string) string {
	tb.Helper()
	dir, err := os.Getwd()
	if err != nil {
		tb.Fatalf("testfix: getwd: %v", err)
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			break
		}
		up := filepath.Dir(dir)
		if up == dir {
			tb.Fatalf("testfix: no go.mod above the working directory")
		}
		dir = up
	}
	p := filepath.Join(dir, "testdata", filepath.FromSlash(rel))
	if _, err := os.Stat(p); err != nil {
		tb.Fatalf("testfix: fixture %s: %v", rel, err)
	}
	return p
}

// Read returns the content of the fixture rel (see Path).
func Read(tb testing.TB, rel string) []byte {
	tb.Helper()
	data, err := os.ReadFile(Path(tb, rel))
	if err != nil {
		tb.Fatalf("testfix: %v", err)
	}
	return data
}

// Qwen3Dir writes the embedded Qwen3 tokenizer (engines/tokenizer/models:
// tokenizer.json and tokenizer_config.json) into a fresh temporary
// directory named Qwen__Qwen3 and returns the tokenizer.json path there:
// what a rule's or simulator's tokenizer path points to.
func Qwen3Dir(tb testing.TB) string {
	tb.Helper()
	root := filepath.Dir(Path(tb, "."))
	models := filepath.Join(root, "engines", "tokenizer", "models")
	gz, err := os.Open(filepath.Join(models, "Qwen__Qwen3.tokenizer.json.gz"))
	if err != nil {
		tb.Fatalf("testfix: %v", err)
	}
	defer gz.Close()
	zr, err := gzip.NewReader(gz)
	if err != nil {
		tb.Fatalf("testfix: %v", err)
	}
	data, err := io.ReadAll(zr)
	if err != nil {
		tb.Fatalf("testfix: %v", err)
	}
	cfg, err := os.ReadFile(filepath.Join(models, "Qwen__Qwen3.tokenizer_config.json"))
	if err != nil {
		tb.Fatalf("testfix: %v", err)
	}
	dir := filepath.Join(tb.TempDir(), "Qwen__Qwen3")
	if err := os.Mkdir(dir, 0o755); err != nil {
		tb.Fatalf("testfix: %v", err)
	}
	if err := os.WriteFile(filepath.Join(dir, "tokenizer_config.json"), cfg, 0o644); err != nil {
		tb.Fatalf("testfix: %v", err)
	}
	p := filepath.Join(dir, "tokenizer.json")
	if err := os.WriteFile(p, data, 0o644); err != nil {
		tb.Fatalf("testfix: %v", err)
	}
	return p
}
