package labkit

import (
	"errors"
	"io/fs"
	"strings"
	"testing"
	"testing/fstest"

	"github.com/llmgw/llmgw/profiles"
)

// embeddedCatalogFS copies the embedded catalog into a writable map FS so
// that a test can break one file.
func embeddedCatalogFS(t *testing.T) fstest.MapFS {
	t.Helper()
	sub, err := profiles.EmbeddedFS()
	if err != nil {
		t.Fatal(err)
	}
	m := fstest.MapFS{}
	err = fs.WalkDir(sub, ".", func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		data, err := fs.ReadFile(sub, p)
		m[p] = &fstest.MapFile{Data: data}
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	return m
}

func TestCheckCatalogEmbedded(t *testing.T) {
	c, err := profiles.Load()
	if err != nil {
		t.Fatal(err)
	}
	if err := CheckCatalog(c); err != nil {
		t.Fatalf("the embedded catalog is incoherent with the engine adapters: %v", err)
	}
}

// TestCheckCatalogBroken: a profile that an engine would not run the way
// the catalog says is refused at the boundary, naming the file and field
// (these checks lived in profiles before the adapters owned them; the
// messages are unchanged).
func TestCheckCatalogBroken(t *testing.T) {
	const gemma = "profiles/gemma-2-9b-it.yaml"
	const qwen = "profiles/qwen3-0.6b.yaml"
	tests := []struct {
		name    string
		file    string
		old     string // text replaced once in file
		new     string
		wantErr string
	}{
		{"block size zero", gemma, "vllm:\n    block_size: 16", "vllm:\n    block_size: 0",
			"profiles/gemma-2-9b-it.yaml: engines.vllm.block_size: must be ≥ 1"},
		{"incoherent hash", qwen, "hash_algo: sha256_sglang", "hash_algo: sha256_cbor", "engines.sglang.hash_algo: must be one of sha256_sglang"},
		{"seed mismatch", qwen, `PYTHONHASHSEED: "0"`, `PYTHONHASHSEED: "1"`, "engines.vllm.launch.env.PYTHONHASHSEED: must be \"0\""},
		{"vllm block flag disagrees", qwen, "- \"--block-size\"\n        - \"16\"", "- \"--block-size\"\n        - \"32\"", "engines.vllm.launch.args: --block-size \"32\" must equal block_size 16"},
		{"sglang page size disagrees", qwen, "- \"--page-size\"\n        - \"16\"", "- \"--page-size\"\n        - \"64\"", "engines.sglang.launch.args: --page-size"},
		{"trtllm not pytorch", qwen, "- \"--backend\"\n        - \"pytorch\"", "- \"--backend\"\n        - \"tensorrt\"", "engines.trtllm.launch.args: must pass --backend pytorch"},
		{"trtllm block reuse off", qwen, "enable_block_reuse: true", "enable_block_reuse: false", "engines.trtllm.launch.files[0].content: kv_cache_config.enable_block_reuse"},
		{"trtllm events off", qwen, "event_buffer_max_size: 4096", "event_buffer_max_size: 0", "kv_cache_config.event_buffer_max_size must be ≥ 1"},
		{"trtllm tokens per block", qwen, "tokens_per_block: 32", "tokens_per_block: 16", "tokens_per_block 16 must equal block_size 32"},
		{"llamacpp block size", qwen, "block_size: 0", "block_size: 16", "engines.llamacpp.block_size: must be 0"},
		{"events port mismatch", qwen, "- {name: kv-events, port: 5557}", "- {name: kv-events, port: 6000}", "engines.vllm.launch.ports: port \"kv-events\" is 6000"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			m := embeddedCatalogFS(t)
			f, ok := m[tc.file]
			if !ok {
				t.Fatalf("no file %s in the catalog", tc.file)
			}
			src := string(f.Data)
			if !strings.Contains(src, tc.old) {
				t.Fatalf("%s does not contain %q", tc.file, tc.old)
			}
			m[tc.file] = &fstest.MapFile{Data: []byte(strings.Replace(src, tc.old, tc.new, 1))}
			c, err := profiles.LoadFS(m)
			if err == nil {
				err = CheckCatalog(c)
			}
			if err == nil {
				t.Fatalf("LoadFS+CheckCatalog = nil error; want one containing %q", tc.wantErr)
			}
			if !errors.Is(err, profiles.ErrInvalid) {
				t.Errorf("error = %v; want it to wrap profiles.ErrInvalid", err)
			}
			if !strings.Contains(err.Error(), tc.wantErr) {
				t.Errorf("error = %q; want it to contain %q", err, tc.wantErr)
			}
			if _, err := LoadCatalog(c); c != nil && err == nil {
				t.Errorf("LoadCatalog accepted the broken catalog")
			}
		})
	}
}
