package tokenizer

import (
	"fmt"
	"path/filepath"
	"slices"
	"strings"
	"unicode/utf8"
)

// GGUF token types (llama.cpp's llama_token_type, written by gguf-py as
// tokenizer.ggml.token_type).
const (
	ggufTokNormal      = 1
	ggufTokUnknown     = 2
	ggufTokControl     = 3
	ggufTokUserDefined = 4
	ggufTokUnused      = 5
	ggufTokByte        = 6
)

// ggufPreSplits gives, for the GGUF pre-tokenizer names (tokenizer.ggml.pre)
// this package supports, the regexes llama.cpp applies in order (each one
// splits the fragments of the one before). The lists are those of
// llm_tokenizer_bpe's constructor in llama.cpp's src/llama-vocab.cpp
// (2025-02-20 snapshot); for the llama3 and qwen2 types the original
// tokenizer.json patterns it quotes are used, which the package's scanner
// implements exactly. The name-to-type mapping is that file's
// llama_vocab::impl::load. Another name is refused: guessing a split
// would silently change the ids.
var ggufPreSplits = func() map[string][]string {
	// runs of CJK ideographs, U+0800..U+4E00 and Hangul (the DeepSeek
	// patterns' [一-龥ࠀ-一가-퟿]).
	const cjkRun = "[\u4e00-\u9fa5\u0800-\u4e00\uac00-\ud7ff]+"
	gpt2 := `'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)`
	starcoder := []string{`\p{N}`, gpt2}
	m := map[string][]string{
		"default": {`[\p{P}\$\+<=>\^~\|]+`, gpt2, `\p{N}+`, `[0-9][0-9][0-9]`},
		"deepseek-llm": {
			"[\r\n]",
			"\\s?[A-Za-z\u00b5\u00c0-\u00d6\u00d8-\u00f6\u00f8-\u01ba\u01bc-\u01bf\u01c4-\u0293\u0295-\u02af\u0370-\u0373\u0376\u0377\u037b-\u037d\u037f\u0386\u0388-\u038a\u038c\u038e-\u03a1\u03a3-\u03f5\u03f7-\u0481\u048a-\u052f\u0531-\u0556\u10a0-\u10c5\u13a0-\u13f5\u13f8-\u13fd\u1c90-\u1cba\u1cbd-\u1cbf\u1d00-\u1d2b\u1d6b-\u1d77\u1d79-\u1d9a\u1e00-\u1f15\u1f18-\u1f1d\u1f20-\u1f45\u1f48-\u1f4d\u1f50-\u1f57\u1f59\u1f5b\u1f5d\u1f5f-\u1f7d\u1f80-\u1fb4\u1fb6-\u1fbc\u1fbe\u1fc2-\u1fc4\u1fc6-\u1fcc\u1fd0-\u1fd3\u1fd6-\u1fdb\u1fe0-\u1fec\u1ff2-\u1ff4\u1ff6-\u1ffc\u2102\u2107\u210a-\u2113\u2115\u2119-\u211d\u2124\u2126\u2128\u212a-\u212d\u212f-\u2134\u2139\u213c-\u213f\u2145-\u2149\u214e\u2183\u2184\u2c00-\u2c7b\u2c7e-\u2ce4\u2ceb-\u2cee\u2cf2\u2cf3\ua640-\ua66d\ua680-\ua69b\ua722-\ua76f\ua771-\ua787\ua78b-\ua78e\uab70-\uabbf\ufb00-\ufb06\ufb13-\ufb17\uff21-\uff3a\uff41-\uff5a\U00010400-\U0001044f\U000104b0-\U000104d3\U000104d8-\U000104fb\U00010c80-\U00010cb2\U00010cc0-\U00010cf2\U000118a0-\U000118df\U0001e900-\U0001e943]+",
			"\\s?[!-/:-~\uff01-\uff0f\uff1a-\uff5e\u2018-\u201f\u3000-\u3002]+",
			`\s+$`,
			cjkRun,
			`\p{N}+`,
		},
		"deepseek-coder": {"[\r\n]", `\s?\p{L}+`, `\s?\p{P}+`, cjkRun, `\p{N}`},
		"falcon":         {`[\p{P}\$\+<=>\^~\|` + "`" + `]+`, gpt2, `[0-9][0-9][0-9]`},
		"gpt-2":          {gpt2},
		"mpt":            {gpt2},
		"starcoder":      starcoder,
		"refact":         starcoder,
		"exaone":         starcoder,
		"smollm":         starcoder,
		"llama-bpe":      {llama3Pattern},
		"qwen2":          {qwenPattern},
	}
	m["llama3"], m["llama-v3"] = m["llama-bpe"], m["llama-bpe"]
	m["deepseek-r1-qwen"] = m["qwen2"]
	m["olmo"] = m["gpt-2"]
	return m
}()

// LoadGGUF loads the tokenizer stored in a GGUF file's metadata
// (tokenizer.ggml.*), as llama.cpp tokenizes with it: model "gpt2"
// (byte-level BPE with merges and the tokenizer.ggml.pre split) or "llama"
// (SentencePiece scores with byte fallback and a space prefix). Control,
// user-defined and unknown tokens are recognised in the text as added
// tokens (llama-server tokenizes prompts with special-token parsing on).
// Only the metadata is read, never the tensors. The name is general.name,
// or the file's base name.
func LoadGGUF(path string) (*HF, error) {
	meta, err := openGGUFMeta(path)
	if err != nil {
		return nil, err
	}
	t, err := ggufTokenizer(meta)
	if err != nil {
		return nil, fmt.Errorf("tokenizer: load %s: %w", path, err)
	}
	if t.name == "" {
		t.name = strings.TrimSuffix(filepath.Base(path), ".gguf")
	}
	return t, nil
}

func ggufTokenizer(meta ggufMeta) (*HF, error) {
	model, _ := meta.str("tokenizer.ggml.model")
	toks := meta.strings("tokenizer.ggml.tokens")
	if len(toks) == 0 {
		return nil, fmt.Errorf("%w: no tokenizer.ggml.tokens", ErrGGUF)
	}
	if len(toks) > 1<<24 {
		return nil, fmt.Errorf("%w: %d tokens", ErrGGUF, len(toks))
	}
	types := meta.floats("tokenizer.ggml.token_type")
	if types != nil && len(types) != len(toks) {
		return nil, fmt.Errorf("%w: %d token types for %d tokens", ErrGGUF, len(types), len(toks))
	}
	typeOf := func(id int) int {
		if types == nil {
			return ggufTokNormal
		}
		return int(types[id])
	}
	t := &HF{}
	t.name, _ = meta.str("general.name")
	var added []hfAddedToken
	for id, text := range toks {
		switch typeOf(id) {
		case ggufTokControl, ggufTokUserDefined, ggufTokUnknown:
			if text != "" {
				added = append(added, hfAddedToken{ID: uint32(id), Content: text, Special: typeOf(id) != ggufTokUserDefined})
			}
		}
	}
	switch model {
	case "gpt2":
		pre, _ := meta.str("tokenizer.ggml.pre")
		if pre == "" {
			pre = "default" // what llama.cpp falls back to, with a warning
		}
		splits, ok := ggufPreSplits[pre]
		if !ok {
			return nil, fmt.Errorf("%w: GGUF pre-tokenizer %q", ErrUnsupported, pre)
		}
		var seq seqSplitter
		for _, p := range splits {
			sp, err := regexSplit(p)
			if err != nil {
				return nil, err
			}
			seq = append(seq, sp)
		}
		if len(seq) == 1 {
			t.split = seq[0]
		} else {
			t.split = seq
		}
		// llama.cpp: "llama3"-type vocabularies ignore merges for whole
		// vocabulary pieces.
		t.ignoreMerges = pre == "llama-bpe" || pre == "llama3" || pre == "llama-v3"
		var entries []vocabEntry
		for id, text := range toks {
			if tt := typeOf(id); tt == ggufTokNormal || tt == ggufTokByte || tt == ggufTokUnused {
				entries = append(entries, vocabEntry{text: text, id: uint32(id)})
			}
		}
		lines := meta.strings("tokenizer.ggml.merges")
		pairs := make([][2]string, 0, len(lines))
		for i, l := range lines {
			// llama.cpp cuts at the first space after the first byte.
			sp := strings.IndexByte(l[min(1, len(l)):], ' ')
			if sp < 0 {
				return nil, fmt.Errorf("%w: merge %d %q has no space", ErrGGUF, i, l)
			}
			sp += min(1, len(l))
			pairs = append(pairs, [2]string{l[:sp], l[sp+1:]})
		}
		if err := t.setByteLevelVocab(entries, pairs); err != nil {
			return nil, err
		}
		if t.ignoreMerges && t.pieceID == nil {
			return nil, fmt.Errorf("tokenizer: GGUF vocabulary without pieces")
		}
		for len(t.idToBytes) < len(toks) {
			t.idToBytes = append(t.idToBytes, "")
			t.idKnown = append(t.idKnown, false)
		}
	case "llama":
		t.kind = kindSPM
		scores := meta.floats("tokenizer.ggml.scores")
		if len(scores) != len(toks) {
			return nil, fmt.Errorf("%w: %d scores for %d tokens", ErrGGUF, len(scores), len(toks))
		}
		t.scores = make([]float32, len(scores))
		for i, s := range scores {
			t.scores[i] = float32(s)
		}
		t.pieceID = make(map[string]uint32, len(toks))
		t.idToBytes = make([]string, len(toks))
		t.idKnown = make([]bool, len(toks))
		bytes := map[string]uint32{}
		for id, text := range toks {
			switch typeOf(id) {
			case ggufTokNormal, ggufTokUserDefined:
				if _, dup := t.pieceID[text]; !dup {
					t.pieceID[text] = uint32(id)
				}
				t.idToBytes[id], t.idKnown[id] = pieceBytes(text), true
			case ggufTokByte:
				bytes[text] = uint32(id)
			}
		}
		if len(bytes) == 256 {
			for b := 0; b < 256; b++ {
				id, ok := bytes[fmt.Sprintf("<0x%02X>", b)]
				if !ok {
					return nil, fmt.Errorf("%w: byte token <0x%02X> missing", ErrGGUF, b)
				}
				t.byteTok[b] = id
				t.idToBytes[id], t.idKnown[id] = string([]byte{byte(b)}), true
			}
			t.byteFallback = true
		}
		if unk, ok := meta.int("tokenizer.ggml.unknown_token_id"); ok && unk >= 0 && int(unk) < len(toks) {
			t.unkID, t.hasUnk = uint32(unk), true
		}
		t.spacePrefix = true
		if v, ok := meta.bool("tokenizer.ggml.add_space_prefix"); ok {
			t.spacePrefix = v
		}
		t.stripLead = t.spacePrefix
		t.spmWords = spmWordsSafe(t.pieceID)
		t.model.merges = spmMerges(t.pieceID, t.scores)
	default:
		return nil, fmt.Errorf("%w: GGUF tokenizer model %q (gpt2 and llama are supported)", ErrUnsupported, model)
	}
	if err := t.setAdded(added); err != nil {
		return nil, err
	}
	// BOS: llama.cpp adds it for SentencePiece vocabularies and the llama3
	// pre-tokenizer type unless tokenizer.ggml.add_bos_token says otherwise.
	if bos, ok := meta.int("tokenizer.ggml.bos_token_id"); ok && bos >= 0 && int(bos) < len(toks) {
		t.bosID, t.hasBOS = uint32(bos), true
		t.addBOS = t.kind == kindSPM || t.ignoreMerges
		if v, ok := meta.bool("tokenizer.ggml.add_bos_token"); ok {
			t.addBOS = v
		}
	}
	t.specialVars = map[string]string{}
	for key, name := range map[string]string{"bos_token_id": "bos_token", "eos_token_id": "eos_token", "unknown_token_id": "unk_token", "padding_token_id": "pad_token"} {
		if id, ok := meta.int("tokenizer.ggml." + key); ok && id >= 0 && int(id) < len(toks) {
			t.specialVars[name] = toks[id]
		}
	}
	t.chatTemplate, _ = meta.str("tokenizer.chat_template")
	return t, nil
}

// spmMerges turns a SentencePiece vocabulary into BPE merges: every pair of
// pieces whose concatenation is a piece merges into it, ranked by the
// concatenation's score (higher score, lower rank; equal scores share a
// rank, so the leftmost pair goes first, as in llama.cpp's queue).
func spmMerges(pieceID map[string]uint32, scores []float32) map[uint64]uint64 {
	uniq := make([]float32, 0, len(pieceID))
	for _, id := range pieceID {
		uniq = append(uniq, scores[id])
	}
	slices.Sort(uniq)
	uniq = slices.Compact(uniq)
	rankOf := func(sc float32) uint64 {
		i, _ := slices.BinarySearch(uniq, sc)
		return uint64(len(uniq) - 1 - i) // highest score: rank 0
	}
	merges := make(map[uint64]uint64, len(pieceID))
	for p, id := range pieceID {
		r := rankOf(scores[id])
		for i := 1; i < len(p); i++ {
			if !utf8.RuneStart(p[i]) {
				continue
			}
			l, lok := pieceID[p[:i]]
			rt, rok := pieceID[p[i:]]
			if lok && rok {
				merges[pairKey(l, rt)] = r<<32 | uint64(id)
			}
		}
	}
	return merges
}
