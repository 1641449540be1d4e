package tokenizer

import (
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"testing"
)

// tinySpec describes a small synthetic tokenizer.json: the 256 byte tokens
// (ids 0..255), merges of raw strings (merged tokens take ids from 256 in
// order) and added tokens from id 1000.
type tinySpec struct {
	merges       [][2]string
	added        []string
	normalizer   any
	preTokenizer any
	postProc     any
	mergeLines   bool // write merges as "a b" strings
}

func (s tinySpec) json(t *testing.T) []byte {
	t.Helper()
	vocab := map[string]int{}
	for b := 0; b < 256; b++ {
		vocab[byteLevelEncode(string([]byte{byte(b)}))] = b
	}
	var merges []any
	for _, m := range s.merges {
		l, r := byteLevelEncode(m[0]), byteLevelEncode(m[1])
		if _, ok := vocab[l+r]; !ok {
			vocab[l+r] = len(vocab)
		}
		if s.mergeLines {
			merges = append(merges, l+" "+r)
		} else {
			merges = append(merges, []string{l, r})
		}
	}
	var added []map[string]any
	for i, a := range s.added {
		added = append(added, map[string]any{"id": 1000 + i, "content": a, "special": true})
	}
	pre := s.preTokenizer
	if pre == nil {
		pre = map[string]any{"type": "Sequence", "pretokenizers": []any{
			map[string]any{"type": "Split", "pattern": map[string]any{"Regex": qwenPattern}, "behavior": "Isolated", "invert": false},
			map[string]any{"type": "ByteLevel", "add_prefix_space": false, "use_regex": false},
		}}
	}
	doc := map[string]any{
		"added_tokens":   added,
		"normalizer":     s.normalizer,
		"pre_tokenizer":  pre,
		"post_processor": s.postProc,
		"decoder":        map[string]any{"type": "ByteLevel"},
		"model":          map[string]any{"type": "BPE", "vocab": vocab, "merges": merges},
	}
	data, err := json.Marshal(doc)
	if err != nil {
		t.Fatalf("marshal: %v", err)
	}
	return data
}

// writeTiny writes tokenizer.json (and tokenizer_config.json when cfg is
// not nil) into a fresh directory named slug and returns the json path.
func writeTiny(t *testing.T, slug string, spec tinySpec, cfg any) string {
	t.Helper()
	dir := filepath.Join(t.TempDir(), slug)
	if err := os.Mkdir(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(dir, "tokenizer.json")
	if err := os.WriteFile(path, spec.json(t), 0o644); err != nil {
		t.Fatal(err)
	}
	if cfg != nil {
		data, err := json.Marshal(cfg)
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, "tokenizer_config.json"), data, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return path
}

func TestLoadHFTiny(t *testing.T) {
	// Merge ranks: "l"+"o" first, then "lo"+"w", then "e"+"r" (ids 256..258).
	merges := [][2]string{{"l", "o"}, {"lo", "w"}, {"e", "r"}, {" ", "low"}}
	cases := []struct {
		name string
		spec tinySpec
		text string
		want []uint32
	}{
		{"merges by rank", tinySpec{merges: merges}, "lower", []uint32{257, 258}},
		{"merge lines format", tinySpec{merges: merges, mergeLines: true}, "lower", []uint32{257, 258}},
		{"space joins the word", tinySpec{merges: merges}, "a low", []uint32{'a', 259}},
		{"added token between words", tinySpec{merges: merges, added: []string{"<x>"}}, "low<x>low", []uint32{257, 1000, 257}},
		{"longest added token wins", tinySpec{added: []string{"<a>", "<a>b"}}, "<a>b<a>", []uint32{1001, 1000}},
		{"nfc normalizer composes", tinySpec{normalizer: map[string]any{"type": "NFC"}}, "e\u0301", []uint32{0xC3, 0xA9}},
		{"no normalizer keeps decomposed", tinySpec{}, "e\u0301", []uint32{'e', 0xCC, 0x81}},
		{"split then prefix space on each piece", tinySpec{merges: merges, preTokenizer: map[string]any{"type": "Sequence", "pretokenizers": []any{
			map[string]any{"type": "Split", "pattern": map[string]any{"Regex": qwenPattern}, "behavior": "Isolated"},
			map[string]any{"type": "ByteLevel", "add_prefix_space": true, "use_regex": false},
		}}}, "low,low", []uint32{259, ' ', ',', 257}},
		{"gpt2 regex via ByteLevel use_regex", tinySpec{merges: merges, preTokenizer: map[string]any{"type": "ByteLevel", "add_prefix_space": true, "use_regex": true}}, "low low", []uint32{259, 259}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			tok, err := LoadHF(writeTiny(t, "acme__tiny", tc.spec, nil))
			if err != nil {
				t.Fatalf("LoadHF: %v", err)
			}
			if got := tok.Name(); got != "acme/tiny" {
				t.Errorf("Name() = %q, want %q", got, "acme/tiny")
			}
			got := tok.Encode(nil, tc.text)
			if !slices.Equal(got, tc.want) {
				t.Errorf("Encode(%q) = %v, want %v", tc.text, got, tc.want)
			}
		})
	}
}

func TestBOS(t *testing.T) {
	llama3Post := map[string]any{"type": "TemplateProcessing", "single": []any{
		map[string]any{"SpecialToken": map[string]any{"id": "<s>", "type_id": 0}},
		map[string]any{"Sequence": map[string]any{"id": "A", "type_id": 0}},
	}}
	cases := []struct {
		name    string
		post    any
		cfg     any
		wantID  uint32
		wantAdd bool
	}{
		{"no config", nil, nil, 0, false},
		{"qwen style: no bos", nil, map[string]any{"add_bos_token": false, "bos_token": nil}, 0, false},
		{"add_bos_token with string", nil, map[string]any{"add_bos_token": true, "bos_token": "<s>"}, 1000, true},
		{"add_bos_token with object", nil, map[string]any{"add_bos_token": true, "bos_token": map[string]any{"content": "<s>"}}, 1000, true},
		{"bos set but not added", nil, map[string]any{"add_bos_token": false, "bos_token": "<s>"}, 1000, false},
		{"post-processor adds bos", llama3Post, map[string]any{"bos_token": "<s>"}, 1000, true},
		{"post-processor bos kept without bos_token in config", llama3Post, map[string]any{"eos_token": "<s>"}, 1000, true},
		{"config overrides post-processor", llama3Post, map[string]any{"bos_token": "<s>", "add_bos_token": false}, 1000, false},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			tok, err := LoadHF(writeTiny(t, "m", tinySpec{added: []string{"<s>"}, postProc: tc.post}, tc.cfg))
			if err != nil {
				t.Fatalf("LoadHF: %v", err)
			}
			id, add := tok.BOS()
			if id != tc.wantID || add != tc.wantAdd {
				t.Errorf("BOS() = (%d, %v), want (%d, %v)", id, add, tc.wantID, tc.wantAdd)
			}
		})
	}
	t.Run("qwen3 fixture", func(t *testing.T) {
		if id, add := qwen3(t).BOS(); id != 0 || add {
			t.Errorf("BOS() = (%d, %v), want (0, false)", id, add)
		}
	})
}

func TestChatRendererFromConfig(t *testing.T) {
	cases := []struct {
		name    string
		cfg     any
		want    string
		wantErr error
	}{
		{"no config", nil, "", ErrNoChatTemplate},
		{"config without template", map[string]any{"eos_token": "</s>"}, "", ErrNoChatTemplate},
		{
			name: "string template sees special tokens",
			cfg: map[string]any{"bos_token": "<s>", "eos_token": "</s>",
				"chat_template": "{{ bos_token }}{% for m in messages %}[{{ m.role }}]{{ m.content }}{{ eos_token }}{% endfor %}{% if add_generation_prompt %}[assistant]{% endif %}{% if tools %}T{% endif %}"},
			want: "<s>[user]hi</s>[assistant]",
		},
		{
			// transformers compiles templates with trim_blocks and
			// lstrip_blocks: the newline after a block tag and the
			// indentation before one are dropped.
			name: "trim and lstrip blocks",
			cfg:  map[string]any{"chat_template": "{% for m in messages %}\n  {{ m.content }}\n  {% endfor %}\n{% if documents is none and tools is none %}ok{% endif %}"},
			want: "  hi\nok",
		},
		{
			name: "named templates use default",
			cfg: map[string]any{"chat_template": []any{
				map[string]any{"name": "tool_use", "template": "tools"},
				map[string]any{"name": "default", "template": "{{ messages[0].content }}"},
			}},
			want: "hi",
		},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			tok, err := LoadHF(writeTiny(t, "m", tinySpec{added: []string{"<s>", "</s>"}}, tc.cfg))
			if err != nil {
				t.Fatalf("LoadHF: %v", err)
			}
			r, err := tok.ChatRenderer()
			if tc.wantErr != nil {
				if !errors.Is(err, tc.wantErr) {
					t.Fatalf("ChatRenderer() error = %v, want %v", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatalf("ChatRenderer: %v", err)
			}
			got, err := r.Render([]Message{{Role: "user", Content: "hi"}}, true)
			if err != nil || got != tc.want {
				t.Errorf("Render = %q, %v; want %q", got, err, tc.want)
			}
		})
	}
	t.Run("chat_template.jinja beside the config", func(t *testing.T) {
		path := writeTiny(t, "m", tinySpec{}, map[string]any{"eos_token": "</s>"})
		tpl := "{% for m in messages %}{{ m.role }}:{{ m.content }};{% endfor %}"
		if err := os.WriteFile(filepath.Join(filepath.Dir(path), "chat_template.jinja"), []byte(tpl), 0o644); err != nil {
			t.Fatal(err)
		}
		tok, err := LoadHF(path)
		if err != nil {
			t.Fatalf("LoadHF: %v", err)
		}
		r, err := tok.ChatRenderer()
		if err != nil {
			t.Fatalf("ChatRenderer: %v", err)
		}
		if got, err := r.Render([]Message{{Role: "user", Content: "hi"}}, false); err != nil || got != "user:hi;" {
			t.Errorf("Render = %q, %v; want %q", got, err, "user:hi;")
		}
	})
	t.Run("bad template", func(t *testing.T) {
		if _, err := NewJinjaRenderer("{% for %}", nil); err == nil {
			t.Errorf("NewJinjaRenderer(bad) error = nil, want a compile error")
		}
	})
	t.Run("raise_exception surfaces as an error", func(t *testing.T) {
		r, err := NewJinjaRenderer("{{ raise_exception('roles must alternate') }}", nil)
		if err != nil {
			t.Fatalf("NewJinjaRenderer: %v", err)
		}
		if _, err := r.Render(nil, false); err == nil {
			t.Errorf("Render error = nil, want the template's exception")
		}
	})
}

func TestLoadHFErrors(t *testing.T) {
	seq := func(steps ...any) any { return map[string]any{"type": "Sequence", "pretokenizers": steps} }
	byteLevel := map[string]any{"type": "ByteLevel", "use_regex": false}
	cases := []struct {
		name        string
		data        string // raw tokenizer.json; empty means spec
		spec        tinySpec
		unsupported bool
	}{
		{name: "not json", data: "{"},
		{name: "empty vocabulary", data: `{"model":{"type":"BPE","vocab":{},"merges":[]},"pre_tokenizer":{"type":"ByteLevel"}}`},
		{name: "unigram model", data: `{"model":{"type":"Unigram","vocab":{"a":0}},"pre_tokenizer":{"type":"ByteLevel"}}`, unsupported: true},
		{name: "missing byte token", data: `{"model":{"type":"BPE","vocab":{"a":0},"merges":[]},"pre_tokenizer":{"type":"ByteLevel"}}`},
		{name: "lowercase normalizer", spec: tinySpec{normalizer: map[string]any{"type": "Lowercase"}}, unsupported: true},
		{name: "whitespace pre-tokenizer", spec: tinySpec{preTokenizer: map[string]any{"type": "Whitespace"}}, unsupported: true},
		{name: "split without byte level", spec: tinySpec{preTokenizer: seq(map[string]any{"type": "Split", "pattern": map[string]any{"Regex": "a"}, "behavior": "Isolated"})}, unsupported: true},
		{name: "split removed behaviour", spec: tinySpec{preTokenizer: seq(map[string]any{"type": "Split", "pattern": map[string]any{"Regex": "a"}, "behavior": "Removed"}, byteLevel)}, unsupported: true},
		{name: "bad split regex", spec: tinySpec{preTokenizer: seq(map[string]any{"type": "Split", "pattern": map[string]any{"Regex": "(("}, "behavior": "Isolated"}, byteLevel)}},
		{name: "regex replace normalizer", spec: tinySpec{normalizer: map[string]any{"type": "Replace", "pattern": map[string]any{"Regex": " +"}, "content": " "}}, unsupported: true},
		{name: "split merged with next", spec: tinySpec{preTokenizer: seq(map[string]any{"type": "Split", "pattern": map[string]any{"String": "x"}, "behavior": "MergedWithNext"}, byteLevel)}, unsupported: true},
		{name: "inverted split", spec: tinySpec{preTokenizer: seq(map[string]any{"type": "Split", "pattern": map[string]any{"Regex": "a"}, "behavior": "Isolated", "invert": true}, byteLevel)}, unsupported: true},
		{name: "metaspace bad scheme", data: `{"model":{"type":"BPE","vocab":{"a":0,"<0x00>":1},"merges":[],"byte_fallback":true,"unk_token":"a"},"pre_tokenizer":{"type":"Metaspace","replacement":"▁","prepend_scheme":"sometimes"}}`, unsupported: true},
		{name: "byte fallback without byte tokens", data: `{"model":{"type":"BPE","vocab":{"a":0},"merges":[],"byte_fallback":true},"pre_tokenizer":{"type":"Metaspace","replacement":"▁","prepend_scheme":"first"}}`},
		{name: "unknown decoder", data: `{"model":{"type":"BPE","vocab":{"a":0},"merges":[],"unk_token":"a"},"normalizer":{"type":"Replace","pattern":{"String":" "},"content":"▁"},"decoder":{"type":"CTC"}}`, unsupported: true},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			path := filepath.Join(dir, "tokenizer.json")
			data := []byte(tc.data)
			if tc.data == "" {
				data = tc.spec.json(t)
			}
			if err := os.WriteFile(path, data, 0o644); err != nil {
				t.Fatal(err)
			}
			_, err := LoadHF(path)
			if err == nil {
				t.Fatalf("LoadHF succeeded, want an error")
			}
			if got := errors.Is(err, ErrUnsupported); got != tc.unsupported {
				t.Errorf("errors.Is(%v, ErrUnsupported) = %v, want %v", err, got, tc.unsupported)
			}
		})
	}
	t.Run("missing file", func(t *testing.T) {
		_, err := LoadHF(filepath.Join(t.TempDir(), "nope", "tokenizer.json"))
		if !errors.Is(err, os.ErrNotExist) {
			t.Errorf("LoadHF(missing) error = %v, want os.ErrNotExist", err)
		}
	})
	t.Run("bos not in vocabulary", func(t *testing.T) {
		_, err := LoadHF(writeTiny(t, "m", tinySpec{}, map[string]any{"bos_token": "<nope>", "add_bos_token": true}))
		if err == nil {
			t.Errorf("LoadHF succeeded, want an error for an unknown bos_token")
		}
	})
}
