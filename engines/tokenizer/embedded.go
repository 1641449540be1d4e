package tokenizer

import (
	"bytes"
	"compress/gzip"
	_ "embed"
	"fmt"
	"io"
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
