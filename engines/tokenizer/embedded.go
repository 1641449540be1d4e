package tokenizer

import (
	"bytes"
	"compress/gzip"
	_ "embed"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sync"
)

// The Qwen3 tokenizer (tokenizer.json and tokenizer_config.json as published
// with the Qwen3 models; provenance in models/PROVENANCE.md) is embedded,
// gzip-compressed, so that the simulator's default ids are a real model's
// ids and tests need no file outside the repository.
var (
	//go:embed models/Qwen__Qwen3.tokenizer.json.gz
	qwen3TokenizerGz []byte
	//go:embed models/Qwen__Qwen3.tokenizer_config.json
	qwen3Config []byte
)

// Qwen3Name is the name of the embedded tokenizer.
const Qwen3Name = "Qwen/Qwen3"

var (
	qwen3Once sync.Once
	qwen3Tok  *HF
	qwen3Err  error
)

// Qwen3 returns the embedded Qwen3 tokenizer (the same vocabulary and merges
// as Qwen2.5), decompressed and parsed on first use and shared afterwards
// (an *HF is immutable). Loading costs about half a second and 90 MB of
// transient allocation, once per process.
func Qwen3() (*HF, error) {
	qwen3Once.Do(func() {
		zr, err := gzip.NewReader(bytes.NewReader(qwen3TokenizerGz))
		if err != nil {
			qwen3Err = fmt.Errorf("tokenizer: embedded Qwen3: %w", err)
			return
		}
		data, err := io.ReadAll(zr)
		if err != nil {
			qwen3Err = fmt.Errorf("tokenizer: embedded Qwen3: %w", err)
			return
		}
		qwen3Tok, qwen3Err = LoadHFBytes(Qwen3Name, data, qwen3Config, "")
	})
	return qwen3Tok, qwen3Err
}

// ExportQwen3 writes the embedded Qwen3 tokenizer (tokenizer.json and
// tokenizer_config.json) under dir as the snapshot directory Qwen__Qwen3
// and returns the tokenizer.json path: what a gateway rule's kvTokenizer
// names when its workers are simulators with their default tokenizer. The
// files are written to a temporary name and renamed, so concurrent exports
// to the same dir are safe; an existing identical export is kept.
func ExportQwen3(dir string) (string, error) {
	zr, err := gzip.NewReader(bytes.NewReader(qwen3TokenizerGz))
	if err != nil {
		return "", fmt.Errorf("tokenizer: embedded Qwen3: %w", err)
	}
	data, err := io.ReadAll(zr)
	if err != nil {
		return "", fmt.Errorf("tokenizer: embedded Qwen3: %w", err)
	}
	snap := filepath.Join(dir, "Qwen__Qwen3")
	if err := os.MkdirAll(snap, 0o755); err != nil {
		return "", fmt.Errorf("tokenizer: export Qwen3: %w", err)
	}
	for _, f := range []struct {
		name string
		data []byte
	}{{"tokenizer_config.json", qwen3Config}, {"tokenizer.json", data}} {
		p := filepath.Join(snap, f.name)
		if old, err := os.ReadFile(p); err == nil && bytes.Equal(old, f.data) {
			continue
		}
		tmp, err := os.CreateTemp(snap, f.name+".*")
		if err != nil {
			return "", fmt.Errorf("tokenizer: export Qwen3: %w", err)
		}
		_, werr := tmp.Write(f.data)
		cerr := tmp.Close()
		if err := errors.Join(werr, cerr); err != nil {
			os.Remove(tmp.Name())
			return "", fmt.Errorf("tokenizer: export Qwen3: %w", err)
		}
		if err := os.Rename(tmp.Name(), p); err != nil {
			os.Remove(tmp.Name())
			return "", fmt.Errorf("tokenizer: export Qwen3: %w", err)
		}
	}
	return filepath.Join(snap, "tokenizer.json"), nil
}
