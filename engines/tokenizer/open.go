package tokenizer

import (
	"crypto/sha256"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"
)

// ErrNoSource classifies a tokenizer source that does not lead to a model's
// tokenizer files.
var ErrNoSource = errors.New("tokenizer: no tokenizer source")

// Resolve finds the tokenizer file that source names for model (a Hugging
// Face model id such as "Qwen/Qwen3-0.6B"; may be empty when source is a
// file). source is one of:
//
//   - a tokenizer.json file (its tokenizer_config.json is read beside it);
//   - a .gguf file (the vocabulary in its metadata);
//   - a directory: the model's snapshot itself (tokenizer.json in it), or a
//     models directory holding the snapshot as <org>__<name>/,
//     <org>/<name>/ or the Hugging Face cache layout
//     models--<org>--<name>/snapshots/<revision>/ (the revision that
//     refs/main names, else the only or newest snapshot).
//
// It only looks at the file system; Open loads.
func Resolve(source, model string) (string, error) {
	st, err := os.Stat(source)
	if err != nil {
		return "", fmt.Errorf("%w: %w", ErrNoSource, err)
	}
	if !st.IsDir() {
		return source, nil
	}
	try := []string{filepath.Join(source, "tokenizer.json")}
	if org, name, ok := strings.Cut(model, "/"); ok && org != "" && name != "" && !strings.Contains(name, "/") {
		try = append(try,
			filepath.Join(source, org+"__"+name, "tokenizer.json"),
			filepath.Join(source, org, name, "tokenizer.json"))
		if snap, ok := hfCacheSnapshot(filepath.Join(source, "models--"+org+"--"+name)); ok {
			try = append(try, filepath.Join(snap, "tokenizer.json"))
		}
	}
	for _, p := range try {
		if st, err := os.Stat(p); err == nil && !st.IsDir() {
			return p, nil
		}
	}
	if model == "" {
		return "", fmt.Errorf("%w: %s has no tokenizer.json (and no model name to look for a snapshot under it)", ErrNoSource, source)
	}
	return "", fmt.Errorf("%w: no tokenizer.json for %s in %s (looked for %s)", ErrNoSource, model, source, strings.Join(try, ", "))
}

// hfCacheSnapshot picks the snapshot directory of a Hugging Face cache
// entry: the one refs/main names, else the newest.
func hfCacheSnapshot(repo string) (string, bool) {
	if ref, err := os.ReadFile(filepath.Join(repo, "refs", "main")); err == nil {
		p := filepath.Join(repo, "snapshots", strings.TrimSpace(string(ref)))
		if st, err := os.Stat(p); err == nil && st.IsDir() {
			return p, true
		}
	}
	ents, err := os.ReadDir(filepath.Join(repo, "snapshots"))
	if err != nil || len(ents) == 0 {
		return "", false
	}
	type snap struct {
		path string
		mod  int64
	}
	var snaps []snap
	for _, e := range ents {
		if info, err := e.Info(); err == nil && e.IsDir() {
			snaps = append(snaps, snap{filepath.Join(repo, "snapshots", e.Name()), info.ModTime().UnixNano()})
		}
	}
	if len(snaps) == 0 {
		return "", false
	}
	sort.Slice(snaps, func(i, j int) bool { return snaps[i].mod > snaps[j].mod })
	return snaps[0].path, true
}

// openCache shares loaded tokenizers by content: an *HF is immutable, and a
// gateway with several rules on one model (or tests that copy the same
// files) would otherwise hold one 100 MB copy each. Keys are SHA-256 of the
// files read, so a file changed on disk loads anew.
var openCache = struct {
	sync.Mutex
	m map[[32]byte]*HF
}{m: map[[32]byte]*HF{}}

// openCacheMax bounds openCache: the distinct tokenizers one process serves.
const openCacheMax = 16

// Open resolves source for model (see Resolve) and loads the tokenizer:
// LoadGGUF for a .gguf file, LoadHF otherwise. Loads of identical files
// share one *HF.
func Open(source, model string) (*HF, error) {
	path, err := Resolve(source, model)
	if err != nil {
		return nil, err
	}
	if strings.HasSuffix(strings.ToLower(path), ".gguf") {
		return LoadGGUF(path) // only the metadata is read; not worth hashing gigabytes
	}
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("tokenizer: load %s: %w", path, err)
	}
	h := sha256.New()
	h.Write(data)
	dir := filepath.Dir(path)
	for _, side := range []string{"tokenizer_config.json", "chat_template.jinja"} {
		b, err := os.ReadFile(filepath.Join(dir, side))
		if err != nil && !errors.Is(err, os.ErrNotExist) {
			return nil, fmt.Errorf("tokenizer: load %s: %w", filepath.Join(dir, side), err)
		}
		fmt.Fprintf(h, "\x00%s\x00%d\x00", side, len(b))
		h.Write(b)
	}
	var key [32]byte
	h.Sum(key[:0])
	openCache.Lock()
	t, ok := openCache.m[key]
	openCache.Unlock()
	if ok {
		return t, nil
	}
	t, err = LoadHF(path)
	if err != nil {
		return nil, err
	}
	openCache.Lock()
	if prev, ok := openCache.m[key]; ok {
		t = prev
	} else {
		if len(openCache.m) >= openCacheMax {
			for k := range openCache.m { // drop one: sharing is an optimisation
				delete(openCache.m, k)
				break
			}
		}
		openCache.m[key] = t
	}
	openCache.Unlock()
	return t, nil
}

// maxChatTemplateSource bounds the side files CheckChatTemplate reads (a
// tokenizer_config.json is kilobytes; a few hold a long template).
const maxChatTemplateSource = 16 << 20

// CheckChatTemplate reports whether the tokenizer at path (a file as
// Resolve returns it) comes with the chat template its loader uses: for a
// tokenizer.json, a chat_template in the tokenizer_config.json beside it or
// a chat_template.jinja beside it (LoadHF). It reads only those side files;
// a .gguf carries its template in its metadata, read when it is loaded, and
// is not checked here. The error wraps ErrNoChatTemplate and names what is
// missing.
func CheckChatTemplate(path string) error {
	if strings.HasSuffix(strings.ToLower(path), ".gguf") {
		return nil
	}
	dir := filepath.Dir(path)
	tplPath := filepath.Join(dir, "chat_template.jinja")
	if st, err := os.Stat(tplPath); err == nil && st.Mode().IsRegular() && st.Size() > 0 {
		return nil
	}
	cfgPath := filepath.Join(dir, "tokenizer_config.json")
	f, err := os.Open(cfgPath)
	if errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("%w: %s has no tokenizer_config.json beside it (nor a chat_template.jinja)", ErrNoChatTemplate, path)
	}
	if err != nil {
		return fmt.Errorf("tokenizer: %w", err)
	}
	defer f.Close()
	data, err := io.ReadAll(io.LimitReader(f, maxChatTemplateSource+1))
	if err != nil {
		return fmt.Errorf("tokenizer: read %s: %w", cfgPath, err)
	}
	if len(data) > maxChatTemplateSource {
		return fmt.Errorf("tokenizer: %s is larger than %d bytes", cfgPath, maxChatTemplateSource)
	}
	var c struct {
		ChatTemplate json.RawMessage `json:"chat_template"`
	}
	if err := json.Unmarshal(data, &c); err != nil {
		return fmt.Errorf("tokenizer: parse %s: %w", cfgPath, err)
	}
	tpl, err := chatTemplateText(c.ChatTemplate)
	if err != nil {
		return fmt.Errorf("%s: %w", cfgPath, err)
	}
	if tpl == "" {
		return fmt.Errorf("%w: %s has no chat_template (and there is no chat_template.jinja beside it)", ErrNoChatTemplate, cfgPath)
	}
	return nil
}
