package tokenizer

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"testing"
)

func caseName(i int, text string) string {
	r := []rune(text)
	if len(r) > 24 {
		r = r[:24]
	}
	return fmt.Sprintf("%02d_%q", i, string(r))
}

// TestEncodeVectors checks every reference vector of the Qwen3 fixture
// (ids from an independent implementation, add_special_tokens=false).
func TestEncodeVectors(t *testing.T) {
	tok := qwen3(t)
	var ev encodeVectors
	readFixture(t, "tokenizers/Qwen__Qwen3/encode_vectors.json", &ev)
	if ev.AddSpecialTokens {
		t.Fatalf("fixture add_special_tokens = true, want false (Encode adds none)")
	}
	if got, want := len(ev.Cases), 36; got != want {
		t.Fatalf("fixture has %d cases, want %d", got, want)
	}
	for i, tc := range ev.Cases {
		t.Run(caseName(i, tc.Text), func(t *testing.T) {
			got := tok.Encode(nil, tc.Text)
			if !slices.Equal(got, tc.IDs) {
				t.Errorf("Encode(%q)\n got %v\nwant %v", tc.Text, got, tc.IDs)
			}
		})
	}
}

// TestEncodeMatchesPythonReference compares Encode with ids from an
// independent Python reference (the slow transformers algorithm with the
// `regex` module as the pre-tokenizer engine) on 300 pseudo-random texts
// mixing scripts, emoji, contractions, digits, whitespace kinds, special
// tokens and broken special tokens. See testdata/gen_qwen3_bpe_reference.py.
func TestEncodeMatchesPythonReference(t *testing.T) {
	tok := qwen3(t)
	data, err := os.ReadFile(filepath.Join("testdata", "qwen3_bpe_reference.json"))
	if err != nil {
		t.Fatal(err)
	}
	var fx encodeVectors
	if err := json.Unmarshal(data, &fx); err != nil {
		t.Fatal(err)
	}
	if len(fx.Cases) != 300 {
		t.Fatalf("got %d cases, want 300", len(fx.Cases))
	}
	for i, tc := range fx.Cases {
		t.Run(caseName(i, tc.Text), func(t *testing.T) {
			if got := tok.Encode(nil, tc.Text); !slices.Equal(got, tc.IDs) {
				t.Errorf("Encode(%q)\n got %v\nwant %v", tc.Text, got, tc.IDs)
			}
		})
	}
}
