package tokenizer

import (
	"encoding/json"
	"os"
	"path/filepath"
	"sync"
	"testing"
)

// fixturesDir finds shared/fixtures by walking up from the package
// directory: CI lays shared/ beside the project root.
func fixturesDir(tb testing.TB) string {
	tb.Helper()
	dir, err := os.Getwd()
	if err != nil {
		tb.Fatalf("getwd: %v", err)
	}
	for {
		cand := filepath.Join(dir, "shared", "fixtures")
		if st, err := os.Stat(cand); err == nil && st.IsDir() {
			return cand
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			tb.Fatalf("shared/fixtures not found above the package directory")
		}
		dir = parent
	}
}

func readFixture(tb testing.TB, rel string, v any) {
	tb.Helper()
	data, err := os.ReadFile(filepath.Join(fixturesDir(tb), rel))
	if err != nil {
		tb.Fatalf("read fixture: %v", err)
	}
	if err := json.Unmarshal(data, v); err != nil {
		tb.Fatalf("parse fixture %s: %v", rel, err)
	}
}

func qwen3Path(tb testing.TB) string {
	return filepath.Join(fixturesDir(tb), "tokenizers", "Qwen__Qwen3", "tokenizer.json")
}

var (
	qwenOnce sync.Once
	qwenTok  *HF
	qwenErr  error
)

// qwen3 loads the Qwen3 fixture tokenizer once per test binary: it is
// immutable, and loading 150k merges per test would dominate the run time.
func qwen3(tb testing.TB) *HF {
	tb.Helper()
	path := qwen3Path(tb)
	qwenOnce.Do(func() { qwenTok, qwenErr = LoadHF(path) })
	if qwenErr != nil {
		tb.Fatalf("LoadHF(%s): %v", path, qwenErr)
	}
	return qwenTok
}

type encodeVectors struct {
	AddSpecialTokens bool `json:"add_special_tokens"`
	Cases            []struct {
		Text string   `json:"text"`
		IDs  []uint32 `json:"ids"`
	} `json:"cases"`
}
