package tokenizer

import (
	"encoding/json"
	"testing"

	"github.com/llmgw/llmgw/internal/testfix"
)

func readFixture(tb testing.TB, rel string, v any) {
	tb.Helper()
	if err := json.Unmarshal(testfix.Read(tb, rel), v); err != nil {
		tb.Fatalf("parse fixture %s: %v", rel, err)
	}
}

// qwen3 is the embedded Qwen3 tokenizer, loaded once per test binary: it
// is immutable, and loading 150k merges per test would dominate the run time.
func qwen3(tb testing.TB) *HF {
	tb.Helper()
	tok, err := Qwen3()
	if err != nil {
		tb.Fatalf("Qwen3: %v", err)
	}
	return tok
}

type encodeVectors struct {
	AddSpecialTokens bool `json:"add_special_tokens"`
	Cases            []struct {
		Text string   `json:"text"`
		IDs  []uint32 `json:"ids"`
	} `json:"cases"`
}
