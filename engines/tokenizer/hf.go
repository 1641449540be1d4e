package tokenizer

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"unicode/utf8"
)

// ErrUnsupported classifies a tokenizer.json (or tokenizer_config.json)
// that is well-formed but uses a component this package does not implement;
// such a tokenizer would not reproduce the engine's ids, so it is refused
// rather than approximated.
var ErrUnsupported = errors.New("tokenizer: unsupported tokenizer component")

// ErrNoChatTemplate is returned by ChatRenderer when tokenizer_config.json is
// absent or has no chat_template.
var ErrNoChatTemplate = errors.New("tokenizer: no chat template")

// HF is a tokenizer loaded from a model's own files: a Hugging Face
// tokenizer.json (byte-level BPE, or SentencePiece-style BPE over
// characters with byte fallback) with the BOS policy and chat template of
// the tokenizer_config.json beside it, or the vocabulary inside a GGUF file
// (LoadGGUF). It is immutable after loading and safe for concurrent use.
type HF struct {
	name  string
	kind  modelKind
	model bpe
	norm  []normStep // normalizers, in order, on each segment between added tokens
	// normCut: a long segment may be normalized and pre-tokenized in parts
	// cut before a space between two ASCII letters (spacedWordCut), so that
	// EncodeUntil normalizes only what it walks. normChunk is the least part
	// (0: defaultNormChunk); tests set it to 1 to cut at every such space.
	normCut   bool
	normChunk int
	// split is the pre-tokenizer before BPE (byte-level: the Split steps
	// before ByteLevel; nil: the whole segment is one piece).
	split splitter
	// blRegex is ByteLevel's own regex (use_regex), applied after the
	// prefix space; nil when ByteLevel does not split.
	blRegex  splitter
	prefixSp bool // ByteLevel add_prefix_space, applied to each piece of split
	meta     metaspace
	// ignoreMerges: a piece that is a vocabulary entry as a whole is that
	// token (Llama-3's ignore_merges; llama.cpp sets it for its llama3
	// pre-tokenizer type).
	ignoreMerges bool
	// pieceID maps a vocabulary entry to its id: raw bytes for byte-level
	// BPE, the token text (with U+2581 for spaces) for the character kinds.
	pieceID      map[string]uint32
	byteTok      [256]uint32 // <0xXX> tokens of byte fallback
	byteFallback bool
	unkID        uint32
	hasUnk       bool
	scores       []float32 // kindSPM: the score of each id
	// spacePrefix (kindSPM): a space before each text segment, which is
	// always the first or follows an added token (llama.cpp's
	// add_space_prefix with is_prev_special).
	spacePrefix bool
	spmWords    bool // kindSPM, kindCharBPE: words merge independently (spmWordsSafe)
	stripLead   bool // Decode drops one leading space (SentencePiece decoders)
	added       addedMatcher
	idToBytes   []string // decoded bytes (or added-token text) of each id; "" if unused
	idKnown     []bool

	bosID          uint32
	hasBOS, addBOS bool
	specialVars    map[string]string // special-token template variables
	chatTemplate   string

	renderOnce sync.Once
	renderer   Renderer
	renderErr  error

	// EncodeUntil's lower bound (initBound): the most bytes one token
	// covers (0: unbounded) and the least ids of a non-empty unit.
	boundOnce  sync.Once
	maxTokLen  int
	minPerUnit int
}

// modelKind is the tokenization algorithm.
type modelKind uint8

const (
	// kindByteBPE: GPT-2 style byte-level BPE (Qwen, Llama-3, GPT-2,
	// DeepSeek, Falcon, StarCoder, EXAONE, ...).
	kindByteBPE modelKind = iota
	// kindCharBPE: BPE over Unicode characters with merges by rank and
	// <0xXX> byte fallback, as tokenizer.json encodes SentencePiece BPE
	// models (Llama-2, Mistral, Phi-3, Gemma-2).
	kindCharBPE
	// kindSPM: SentencePiece BPE from piece scores (a GGUF "llama"
	// vocabulary), as llama.cpp's llm_tokenizer_spm merges: the adjacent
	// pair whose concatenation is the highest-scoring piece first,
	// leftmost among equal scores.
	kindSPM
)

// metaspace is a Metaspace pre-tokenizer: spaces become the replacement
// character, which is also put before the first (or every) segment, and
// with split the text is cut before each replacement character.
type metaspace struct {
	on      bool
	repl    string
	prepend string // "always", "first" or "never"
	split   bool
}

// hfFile is the subset of tokenizer.json that LoadHF reads.
type hfFile struct {
	AddedTokens   []hfAddedToken  `json:"added_tokens"`
	Normalizer    json.RawMessage `json:"normalizer"`
	PreTokenizer  json.RawMessage `json:"pre_tokenizer"`
	PostProcessor json.RawMessage `json:"post_processor"`
	Decoder       json.RawMessage `json:"decoder"`
	Model         struct {
		Type                    string            `json:"type"`
		Vocab                   map[string]uint32 `json:"vocab"`
		Merges                  json.RawMessage   `json:"merges"`
		Dropout                 *float64          `json:"dropout"`
		ContinuingSubwordPrefix *string           `json:"continuing_subword_prefix"`
		EndOfWordSuffix         *string           `json:"end_of_word_suffix"`
		ByteFallback            bool              `json:"byte_fallback"`
		UnkToken                *string           `json:"unk_token"`
		FuseUnk                 bool              `json:"fuse_unk"`
		IgnoreMerges            bool              `json:"ignore_merges"`
	} `json:"model"`
}

type hfAddedToken struct {
	ID         uint32 `json:"id"`
	Content    string `json:"content"`
	SingleWord bool   `json:"single_word"`
	Lstrip     bool   `json:"lstrip"`
	Rstrip     bool   `json:"rstrip"`
	Normalized bool   `json:"normalized"`
	Special    bool   `json:"special"`
}

// hfComponent is a normalizer, pre-tokenizer, post-processor or decoder
// node of tokenizer.json.
type hfComponent struct {
	Type           string          `json:"type"`
	Normalizers    []hfComponent   `json:"normalizers"`
	Pretokenizers  []hfComponent   `json:"pretokenizers"`
	Pattern        json.RawMessage `json:"pattern"`
	Behavior       string          `json:"behavior"`
	Invert         bool            `json:"invert"`
	AddPrefixSpace bool            `json:"add_prefix_space"`
	UseRegex       *bool           `json:"use_regex"`
	Prepend        string          `json:"prepend"`
	Content        string          `json:"content"`
	Replacement    string          `json:"replacement"`
	PrependScheme  string          `json:"prepend_scheme"`
	Split          *bool           `json:"split"`
	Decoders       []hfComponent   `json:"decoders"`
	Start          int             `json:"start"`
	Stop           int             `json:"stop"`
	Single         []struct {
		SpecialToken *struct {
			ID string `json:"id"`
		} `json:"SpecialToken"`
	} `json:"single"`
}

// hfConfig is the subset of tokenizer_config.json that LoadHF reads.
type hfConfig struct {
	AddBOSToken  *bool           `json:"add_bos_token"`
	BOSToken     json.RawMessage `json:"bos_token"`
	EOSToken     json.RawMessage `json:"eos_token"`
	PadToken     json.RawMessage `json:"pad_token"`
	UnkToken     json.RawMessage `json:"unk_token"`
	ChatTemplate json.RawMessage `json:"chat_template"`
}

// LoadHF loads a Hugging Face tokenizer.json (byte-level BPE with Split +
// ByteLevel pre-tokenizers, NFC or no normalizer, added/special tokens
// recognised in the text). The tokenizer_config.json beside it (same
// directory), when present, supplies BOS policy and the chat template; a
// chat_template.jinja beside it supplies the template when the config has
// none (the layout of newer model repositories).
//
// The name is the directory's name with "__" read as "/" (the slug layout
// "Qwen__Qwen3" gives "Qwen/Qwen3"). Components the package does not
// implement give an error wrapping ErrUnsupported.
func LoadHF(path string) (*HF, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("tokenizer: load %s: %w", path, err)
	}
	dir := filepath.Dir(path)
	cfgPath := filepath.Join(dir, "tokenizer_config.json")
	cfg, err := os.ReadFile(cfgPath)
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		return nil, fmt.Errorf("tokenizer: load %s: %w", cfgPath, err)
	}
	// Newer model repositories keep the template in its own file; it is
	// used when the config has none.
	tplPath := filepath.Join(dir, "chat_template.jinja")
	tpl, err := os.ReadFile(tplPath)
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		return nil, fmt.Errorf("tokenizer: load %s: %w", tplPath, err)
	}
	t, err := LoadHFBytes(strings.ReplaceAll(filepath.Base(dir), "__", "/"), data, cfg, string(tpl))
	if err != nil {
		return nil, fmt.Errorf("tokenizer: load %s: %w", path, err)
	}
	return t, nil
}

// LoadHFBytes is LoadHF on contents already in memory: tokenizer.json,
// tokenizer_config.json (nil: none, so no BOS and no chat template from it)
// and a chat_template.jinja used when the config has no template ("" for
// none).
func LoadHFBytes(name string, tokenizerJSON, configJSON []byte, chatTemplate string) (*HF, error) {
	t, err := parseHF(tokenizerJSON)
	if err != nil {
		return nil, err
	}
	t.name = name
	if configJSON != nil {
		if err := t.applyConfig(configJSON); err != nil {
			return nil, err
		}
	}
	if t.chatTemplate == "" {
		t.chatTemplate = chatTemplate
	}
	return t, nil
}

// parseHF builds a tokenizer from tokenizer.json bytes. It never panics on
// malformed input (see FuzzParseHF).
func parseHF(data []byte) (*HF, error) {
	var f hfFile
	if err := json.Unmarshal(data, &f); err != nil {
		return nil, fmt.Errorf("tokenizer: parse tokenizer.json: %w", err)
	}
	t := &HF{name: "hf"}
	norm, err := parseNormalizer(f.Normalizer)
	if err != nil {
		return nil, err
	}
	t.norm = norm
	if f.Model.ByteFallback || isMetaspace(f.PreTokenizer) || hasSentencePieceNorm(norm) {
		t.kind = kindCharBPE
	}
	if err := t.setPreTokenizer(f.PreTokenizer); err != nil {
		return nil, err
	}
	if err := t.setDecoder(f.Decoder); err != nil {
		return nil, err
	}
	if err := t.setModel(&f); err != nil {
		return nil, err
	}
	if err := t.setAdded(f.AddedTokens); err != nil {
		return nil, err
	}
	t.bosFromPostProcessor(f.PostProcessor)
	t.normCut = t.kind == kindByteBPE && cutsSpacedWords(t.norm, t.split, t.blRegex)
	return t, nil
}

// isMetaspace reports whether the pre-tokenizer is (or contains) Metaspace.
func isMetaspace(raw json.RawMessage) bool {
	var c hfComponent
	if json.Unmarshal(raw, &c) != nil {
		return false
	}
	if c.Type == "Metaspace" {
		return true
	}
	for _, p := range c.Pretokenizers {
		if p.Type == "Metaspace" {
			return true
		}
	}
	return false
}

// hasSentencePieceNorm reports a normalizer that writes U+2581 for spaces:
// the tokenizer.json form of a SentencePiece model.
func hasSentencePieceNorm(steps []normStep) bool {
	for _, s := range steps {
		if s.op == normReplace && s.b == "\u2581" {
			return true
		}
	}
	return false
}

// setDecoder checks that the decoder is one Decode implements: ByteLevel
// for byte-level BPE; for SentencePiece-style models Replace(U+2581 -> " "),
// ByteFallback, Fuse, Strip(" ", 1, 0) and Metaspace, in a Sequence.
func (t *HF) setDecoder(raw json.RawMessage) error {
	if len(raw) == 0 || string(raw) == "null" {
		return nil
	}
	var d hfComponent
	if err := json.Unmarshal(raw, &d); err != nil {
		return fmt.Errorf("tokenizer: parse decoder: %w", err)
	}
	steps := []hfComponent{d}
	if d.Type == "Sequence" {
		steps = d.Decoders
	}
	for _, s := range steps {
		switch {
		case s.Type == "ByteLevel" && t.kind == kindByteBPE:
		case t.kind == kindCharBPE && (s.Type == "ByteFallback" || s.Type == "Fuse"):
		case t.kind == kindCharBPE && s.Type == "Replace":
			p, err := stringPattern(s.Pattern)
			if err != nil || p != "\u2581" || s.Content != " " {
				return fmt.Errorf("%w: decoder Replace other than U+2581 -> space", ErrUnsupported)
			}
		case t.kind == kindCharBPE && s.Type == "Strip":
			if s.Content != " " || s.Start > 1 || s.Stop != 0 {
				return fmt.Errorf("%w: decoder Strip other than one leading space", ErrUnsupported)
			}
			t.stripLead = s.Start == 1
		case t.kind == kindCharBPE && s.Type == "Metaspace":
			t.stripLead = s.PrependScheme != "never"
		default:
			return fmt.Errorf("%w: decoder %q", ErrUnsupported, s.Type)
		}
	}
	return nil
}

func (t *HF) setPreTokenizer(raw json.RawMessage) error {
	if len(raw) == 0 || string(raw) == "null" {
		if t.kind == kindCharBPE {
			return nil // SentencePiece style: the normalizer did the spaces
		}
		return fmt.Errorf("%w: no pre-tokenizer (a ByteLevel one is required)", ErrUnsupported)
	}
	var root hfComponent
	if err := json.Unmarshal(raw, &root); err != nil {
		return fmt.Errorf("tokenizer: parse pre_tokenizer: %w", err)
	}
	steps := []hfComponent{root}
	if root.Type == "Sequence" {
		steps = root.Pretokenizers
	}
	var splits seqSplitter
	byteLevel := false
	for _, s := range steps {
		if byteLevel || t.meta.on {
			return fmt.Errorf("%w: pre-tokenizer %q after ByteLevel or Metaspace", ErrUnsupported, s.Type)
		}
		switch s.Type {
		case "Split":
			sp, err := newSplit(s)
			if err != nil {
				return err
			}
			splits = append(splits, sp)
		case "ByteLevel":
			if t.kind != kindByteBPE {
				return fmt.Errorf("%w: ByteLevel pre-tokenizer with a SentencePiece-style model", ErrUnsupported)
			}
			byteLevel = true
			t.prefixSp = s.AddPrefixSpace
			// use_regex defaults to true in the library.
			if s.UseRegex == nil || *s.UseRegex {
				t.blRegex, _ = regexSplit(gpt2Pattern)
			}
		case "Metaspace":
			t.meta = metaspace{on: true, repl: s.Replacement, prepend: s.PrependScheme, split: s.Split == nil || *s.Split}
			if t.meta.repl == "" {
				t.meta.repl = "\u2581"
			}
			if t.meta.prepend == "" { // files older than prepend_scheme
				t.meta.prepend = map[bool]string{true: "always", false: "never"}[s.AddPrefixSpace]
			}
			if t.meta.prepend != "always" && t.meta.prepend != "first" && t.meta.prepend != "never" {
				return fmt.Errorf("%w: Metaspace prepend_scheme %q", ErrUnsupported, t.meta.prepend)
			}
		default:
			return fmt.Errorf("%w: pre-tokenizer %q", ErrUnsupported, s.Type)
		}
	}
	if t.kind == kindByteBPE && !byteLevel {
		return fmt.Errorf("%w: pre-tokenizer without ByteLevel", ErrUnsupported)
	}
	switch len(splits) {
	case 0:
	case 1:
		t.split = splits[0]
	default:
		t.split = splits
	}
	return nil
}

func (t *HF) setModel(f *hfFile) error {
	m := &f.Model
	if m.Type != "" && m.Type != "BPE" {
		return fmt.Errorf("%w: model %q", ErrUnsupported, m.Type)
	}
	if m.Dropout != nil && *m.Dropout != 0 {
		return fmt.Errorf("%w: BPE dropout", ErrUnsupported)
	}
	if (m.ContinuingSubwordPrefix != nil && *m.ContinuingSubwordPrefix != "") ||
		(m.EndOfWordSuffix != nil && *m.EndOfWordSuffix != "") {
		return fmt.Errorf("%w: BPE continuing_subword_prefix or end_of_word_suffix", ErrUnsupported)
	}
	if m.ByteFallback && t.kind != kindCharBPE {
		return fmt.Errorf("%w: byte_fallback with a byte-level model", ErrUnsupported)
	}
	if len(m.Vocab) == 0 {
		return fmt.Errorf("tokenizer: parse model: empty vocabulary")
	}
	t.ignoreMerges = m.IgnoreMerges
	pairs, err := parseMerges(m.Merges)
	if err != nil {
		return err
	}
	entries := make([]vocabEntry, 0, len(m.Vocab))
	for tok, id := range m.Vocab {
		entries = append(entries, vocabEntry{text: tok, id: id})
	}
	if t.kind == kindByteBPE {
		err = t.setByteLevelVocab(entries, pairs)
	} else {
		err = t.setCharVocab(entries, pairs, m.ByteFallback)
	}
	if err != nil {
		return err
	}
	if m.UnkToken != nil && *m.UnkToken != "" {
		id, ok := m.Vocab[*m.UnkToken]
		if !ok {
			return fmt.Errorf("tokenizer: parse model: unk_token %q is not in the vocabulary", *m.UnkToken)
		}
		t.unkID, t.hasUnk = id, true
	}
	if t.kind == kindCharBPE && !t.byteFallback && !t.hasUnk {
		return fmt.Errorf("%w: SentencePiece-style BPE with neither byte_fallback nor unk_token", ErrUnsupported)
	}
	return nil
}

type vocabEntry struct {
	text string
	id   uint32
}

// setByteLevelVocab installs a byte-level vocabulary (entries in the
// printable byte alphabet) and its merges (token text pairs, by rank).
func (t *HF) setByteLevelVocab(entries []vocabEntry, pairs [][2]string) error {
	rawToID := make(map[string]uint32, len(entries))
	maxID := uint32(0)
	for _, e := range entries {
		raw, ok := byteLevelDecode(e.text)
		if !ok {
			return fmt.Errorf("tokenizer: parse model: vocabulary entry %q is not byte-level", e.text)
		}
		rawToID[raw] = e.id
		maxID = max(maxID, e.id)
	}
	if maxID > 1<<24 {
		return fmt.Errorf("tokenizer: parse model: id %d out of range", maxID)
	}
	t.idToBytes = make([]string, maxID+1)
	t.idKnown = make([]bool, maxID+1)
	for raw, id := range rawToID {
		t.idToBytes[id], t.idKnown[id] = raw, true
	}
	missing := 0
	for b := 0; b < 256; b++ {
		id, ok := rawToID[string([]byte{byte(b)})]
		if !ok {
			// Some vocabularies (Falcon, StarCoder, MPT) lack bytes that
			// valid UTF-8 never has (0xC0, 0xC1, ...) or rare controls.
			// Both the Hugging Face library and llama.cpp drop such a byte
			// when no merge covers it; the sentinel has no merges and is
			// dropped after merging.
			id = noByte
			t.model.hasMissing = true
			missing++
		}
		t.model.byteID[b] = id
	}
	if missing > 64 {
		return fmt.Errorf("tokenizer: parse model: %d of the 256 bytes have no token: not a byte-level vocabulary", missing)
	}
	if t.ignoreMerges {
		t.pieceID = rawToID
	}
	return t.setMerges(pairs, func(tok string) (uint32, bool) {
		raw, ok := byteLevelDecode(tok)
		if !ok {
			return 0, false
		}
		id, ok := rawToID[raw]
		return id, ok
	})
}

// setCharVocab installs a SentencePiece-style vocabulary: token texts with
// U+2581 for a space, <0xXX> byte tokens when byteFallback is set.
func (t *HF) setCharVocab(entries []vocabEntry, pairs [][2]string, byteFallback bool) error {
	t.pieceID = make(map[string]uint32, len(entries))
	maxID := uint32(0)
	for _, e := range entries {
		t.pieceID[e.text] = e.id
		maxID = max(maxID, e.id)
	}
	if maxID > 1<<24 {
		return fmt.Errorf("tokenizer: parse model: id %d out of range", maxID)
	}
	t.idToBytes = make([]string, maxID+1)
	t.idKnown = make([]bool, maxID+1)
	for _, e := range entries {
		t.idToBytes[e.id], t.idKnown[e.id] = pieceBytes(e.text), true
	}
	if byteFallback {
		if err := t.setByteTokens(); err != nil {
			return err
		}
	}
	t.spmWords = spmWordsSafe(t.pieceID)
	return t.setMerges(pairs, func(tok string) (uint32, bool) {
		id, ok := t.pieceID[tok]
		return id, ok
	})
}

// setByteTokens finds the 256 <0xXX> tokens of byte fallback in pieceID.
func (t *HF) setByteTokens() error {
	for b := 0; b < 256; b++ {
		id, ok := t.pieceID[fmt.Sprintf("<0x%02X>", b)]
		if !ok {
			return fmt.Errorf("tokenizer: parse model: byte fallback token <0x%02X> is missing", b)
		}
		t.byteTok[b] = id
		t.idToBytes[id] = string([]byte{byte(b)})
	}
	t.byteFallback = true
	return nil
}

// pieceBytes is the text a SentencePiece piece stands for (U+2581 is a
// space).
func pieceBytes(p string) string { return strings.ReplaceAll(p, "\u2581", " ") }

func (t *HF) setMerges(pairs [][2]string, idOf func(string) (uint32, bool)) error {
	t.model.merges = make(map[uint64]uint64, len(pairs))
	for rank, p := range pairs {
		l, lok := idOf(p[0])
		r, rok := idOf(p[1])
		merged, mok := idOf(p[0] + p[1])
		if !lok || !rok || !mok {
			return fmt.Errorf("tokenizer: parse model: merge %d (%q %q) names a token not in the vocabulary", rank, p[0], p[1])
		}
		k := pairKey(l, r)
		if _, dup := t.model.merges[k]; !dup { // the first (lowest) rank wins
			t.model.merges[k] = uint64(rank)<<32 | uint64(merged)
		}
	}
	return nil
}

// parseMerges accepts both encodings of BPE merges: "a b" strings (older
// files) and ["a", "b"] pairs (newer files, which allow spaces in tokens).
func parseMerges(raw json.RawMessage) ([][2]string, error) {
	var pairs [][2]string
	if err := json.Unmarshal(raw, &pairs); err == nil {
		return pairs, nil
	}
	var lines []string
	if err := json.Unmarshal(raw, &lines); err != nil {
		return nil, fmt.Errorf("tokenizer: parse merges: %w", err)
	}
	pairs = make([][2]string, len(lines))
	for i, l := range lines {
		a, b, ok := strings.Cut(l, " ")
		if !ok {
			return nil, fmt.Errorf("tokenizer: parse merges: line %d %q has no space", i, l)
		}
		pairs[i] = [2]string{a, b}
	}
	return pairs, nil
}

func (t *HF) setAdded(toks []hfAddedToken) error {
	for _, a := range toks {
		if a.Content == "" {
			return fmt.Errorf("tokenizer: parse added_tokens: empty content for id %d", a.ID)
		}
		if a.SingleWord {
			return fmt.Errorf("%w: single_word added token %q", ErrUnsupported, a.Content)
		}
		if a.ID > 1<<24 {
			return fmt.Errorf("tokenizer: parse added_tokens: id %d out of range", a.ID)
		}
		for int(a.ID) >= len(t.idToBytes) {
			t.idToBytes = append(t.idToBytes, "")
			t.idKnown = append(t.idKnown, false)
		}
		t.idToBytes[a.ID], t.idKnown[a.ID] = a.Content, true
	}
	t.added = newAddedMatcher(toks)
	return nil
}

// bosFromPostProcessor records a BOS that the post-processor template puts
// first (Llama 3 style TemplateProcessing); tokenizer_config's add_bos_token,
// when present, overrides it.
func (t *HF) bosFromPostProcessor(raw json.RawMessage) {
	if len(raw) == 0 || string(raw) == "null" {
		return
	}
	var p hfComponent
	if json.Unmarshal(raw, &p) != nil || p.Type != "TemplateProcessing" || len(p.Single) == 0 || p.Single[0].SpecialToken == nil {
		return
	}
	if id, ok := t.added.idOf(p.Single[0].SpecialToken.ID); ok {
		t.bosID, t.hasBOS, t.addBOS = id, true, true
	}
}

// tokenText reads a special-token entry of tokenizer_config.json: null, a
// string, or an object with "content". ok is false for null or absent.
func tokenText(raw json.RawMessage) (text string, ok bool, err error) {
	if len(raw) == 0 || string(raw) == "null" {
		return "", false, nil
	}
	if err := json.Unmarshal(raw, &text); err == nil {
		return text, true, nil
	}
	var obj struct {
		Content string `json:"content"`
	}
	if err := json.Unmarshal(raw, &obj); err != nil {
		return "", false, fmt.Errorf("tokenizer: parse special token %s: %w", raw, err)
	}
	return obj.Content, true, nil
}

func (t *HF) applyConfig(data []byte) error {
	var c hfConfig
	if err := json.Unmarshal(data, &c); err != nil {
		return fmt.Errorf("tokenizer: parse tokenizer_config.json: %w", err)
	}
	t.specialVars = map[string]string{}
	for _, e := range []struct {
		name string
		raw  json.RawMessage
	}{{"bos_token", c.BOSToken}, {"eos_token", c.EOSToken}, {"pad_token", c.PadToken}, {"unk_token", c.UnkToken}} {
		text, ok, err := tokenText(e.raw)
		if err != nil {
			return err
		}
		if ok {
			t.specialVars[e.name] = text
		}
	}
	if bos, ok := t.specialVars["bos_token"]; ok {
		id, known := t.tokenID(bos)
		if !known {
			return fmt.Errorf("tokenizer: bos_token %q is not in the vocabulary", bos)
		}
		t.bosID, t.hasBOS = id, true
	}
	// Without a bos_token the post-processor's BOS, if any, stands.
	if c.AddBOSToken != nil {
		t.addBOS = *c.AddBOSToken && t.hasBOS
	}
	tpl, err := chatTemplateText(c.ChatTemplate)
	if err != nil {
		return err
	}
	t.chatTemplate = tpl
	return nil
}

// chatTemplateText reads chat_template: a string, or a list of named
// templates of which "default" is the one used for plain chats.
func chatTemplateText(raw json.RawMessage) (string, error) {
	if len(raw) == 0 || string(raw) == "null" {
		return "", nil
	}
	var s string
	if err := json.Unmarshal(raw, &s); err == nil {
		return s, nil
	}
	var named []struct {
		Name     string `json:"name"`
		Template string `json:"template"`
	}
	if err := json.Unmarshal(raw, &named); err != nil {
		return "", fmt.Errorf("tokenizer: parse chat_template: %w", err)
	}
	for _, n := range named {
		if n.Name == "default" {
			return n.Template, nil
		}
	}
	return "", nil
}

// tokenID returns the id of a token's text: an added token, or a single
// vocabulary entry.
func (t *HF) tokenID(text string) (uint32, bool) {
	if id, ok := t.added.idOf(text); ok {
		return id, true
	}
	for id, raw := range t.idToBytes {
		if t.idKnown[id] && raw == text {
			return uint32(id), true
		}
	}
	return 0, false
}

// Name implements Tokenizer.
func (t *HF) Name() string { return t.name }

// CutsBefore reports whether text is an added token in front of which a
// prompt may be cut and the two parts encoded apart with the same ids as
// the whole: an added token that does not absorb the whitespace before it
// (lstrip). Text is split at added tokens before anything else, so nothing
// else crosses such a cut.
func (t *HF) CutsBefore(text string) bool {
	_, ok := t.added.idOf(text)
	return ok && !t.added.stripsLeft(text)
}

// BOS reports the beginning-of-sequence token and whether the engine
// prepends it to a prompt (tokenizer_config's add_bos_token with a
// bos_token set). Encode never adds it; the caller applies this policy.
// For Qwen there is no BOS: id 0, add false.
func (t *HF) BOS() (id uint32, add bool) {
	if !t.hasBOS {
		return 0, false
	}
	return t.bosID, t.addBOS
}

// Encode implements Tokenizer: added-token text is recognised as its id
// (leftmost, longest match first), the text between is normalized,
// pre-tokenized and BPE-encoded. No BOS/EOS is added.
func (t *HF) Encode(dst []uint32, text string) []uint32 {
	var st encodeState
	return t.encode(dst, text, &st)
}

// EncodeUntil is Encode in independent units, asking more before each one
// whether to go on. A unit is what the BPE merges on its own: an added
// token, or one pre-tokenizer piece (a word, for SentencePiece models whose
// words merge independently). No merge crosses a unit boundary, so the ids
// of the units encoded are exactly the first ids Encode gives, whatever is
// left unencoded. more sees every id appended so far (dst included).
//
// When more returns false the rest of text is not encoded, only walked:
// rest is a lower bound on the number of ids Encode would have appended for
// it (each added token is one id; a non-empty piece is at least one id, and
// at least its length over the longest token's when every token covers
// bounded bytes), and done is false. With done, ids is Encode(dst, text)
// and rest is 0.
func (t *HF) EncodeUntil(dst []uint32, text string, more func(ids []uint32) bool) (ids []uint32, rest int, done bool) {
	return t.EncodeUntilEnough(dst, text, more, nil)
}

// EncodeUntilEnough is EncodeUntil that also stops counting once enough
// reports that the bound reached (rest so far) is enough for the caller:
// rest is then a lower bound that may be far below the true count, and the
// rest of text is not even walked. A nil enough counts to the end.
func (t *HF) EncodeUntilEnough(dst []uint32, text string, more func(ids []uint32) bool, enough func(rest int) bool) (ids []uint32, rest int, done bool) {
	st := encodeState{more: more, enough: enough}
	defer func() {
		// The pre-tokenizers walk a whole segment with a callback; the
		// only way out of one part way is this panic, raised by count
		// and caught here alone.
		if r := recover(); r != nil {
			if _, ok := r.(enoughCounted); !ok {
				panic(r)
			}
			ids, rest, done = st.ids, st.rest, false
		}
	}()
	dst = t.encode(dst, text, &st)
	return dst, st.rest, !st.stopped
}

// enoughCounted is the panic that ends counting once enough says so.
type enoughCounted struct{}

// encodeState carries EncodeUntil's question and what it counted once
// stopped; the zero value encodes everything.
type encodeState struct {
	more    func([]uint32) bool
	enough  func(int) bool
	stopped bool
	ids     []uint32 // the ids when more refused
	rest    int
}

// next reports whether the next unit is to be encoded.
func (st *encodeState) next(dst []uint32) bool {
	if !st.stopped && st.more != nil && !st.more(dst) {
		st.stopped, st.ids = true, dst
	}
	return !st.stopped
}

// count adds n to the bound on the ids not encoded.
func (st *encodeState) count(n int) {
	st.rest += n
	if st.enough != nil && st.enough(st.rest) {
		panic(enoughCounted{})
	}
}

func (t *HF) encode(dst []uint32, text string, st *encodeState) []uint32 {
	first := true
	t.added.each(text, func(seg string, id uint32, isAdded bool) {
		if isAdded {
			if st.next(dst) {
				dst = append(dst, id)
			} else {
				st.count(1)
			}
		} else {
			dst = t.encodeSegment(dst, seg, first, st)
		}
		first = false
	})
	return dst
}

// unitMin is the least number of ids a non-empty unit of n bytes encodes
// to (n in the form the model merges: raw bytes for byte-level BPE, U+2581
// for spaces for the character kinds).
func (t *HF) unitMin(n int) int {
	if n == 0 {
		return 0
	}
	t.boundOnce.Do(t.initBound)
	if t.maxTokLen == 0 {
		return t.minPerUnit
	}
	return max(t.minPerUnit, (n+t.maxTokLen-1)/t.maxTokLen)
}

// initBound finds how many bytes one token can cover at most. A byte-level
// model missing some byte tokens drops those bytes (a unit may give no id
// at all), and SentencePiece's unknown token fuses a run of unknown
// characters of any length: then only the weaker bounds hold.
func (t *HF) initBound() {
	t.minPerUnit = 1
	if t.kind == kindByteBPE && t.model.hasMissing {
		t.minPerUnit = 0
		return
	}
	if t.kind != kindByteBPE && t.hasUnk && !t.byteFallback {
		return
	}
	for id, raw := range t.idToBytes {
		if !t.idKnown[id] {
			continue
		}
		n := len(raw)
		if t.kind != kindByteBPE { // the merged form writes a space as U+2581
			n += 2 * strings.Count(raw, " ")
		}
		t.maxTokLen = max(t.maxTokLen, n)
	}
	t.maxTokLen = max(t.maxTokLen, 4) // a byte-fallback token covers 1 byte
}

// encodeOrdinary encodes text with no added-token recognition (the library's
// encode_special_tokens=true behaviour, which engines do not use).
func (t *HF) encodeOrdinary(dst []uint32, seg string) []uint32 {
	var st encodeState
	return t.encodeSegment(dst, seg, true, &st)
}

// encodeSegment encodes one segment between added tokens; first reports
// that it starts the text (Metaspace's prepend_scheme "first"). Each unit
// asks st first; once st has stopped, units are only counted.
//
// With normCut a segment longer than the chunk is encoded part by part, so
// that a caller who stops early (EncodeUntil) has normalized only the parts
// it reached, not a whole 256 KiB user turn. The parts give the ids of the
// whole: see cutsSpacedWords.
func (t *HF) encodeSegment(dst []uint32, seg string, first bool, st *encodeState) []uint32 {
	if !t.normCut {
		return t.encodePart(dst, seg, first, st)
	}
	chunk := t.normChunk
	if chunk <= 0 {
		chunk = defaultNormChunk
	}
	for seg != "" {
		k := spacedWordCut(seg, chunk)
		dst = t.encodePart(dst, seg[:k], first, st)
		seg, first = seg[k:], false
	}
	return dst
}

// defaultNormChunk is the least part of a segment encodeSegment normalizes
// at once: large enough that cutting costs nothing on short prompts, small
// next to the openings a KV-exact decision walks (tens of KiB).
const defaultNormChunk = 4 << 10

// spacedWordCut is the first index k >= min of s with an ASCII letter
// before it, a space at it and an ASCII letter after that, or len(s).
func spacedWordCut(s string, min int) int {
	for i := max(min, 1); i+1 < len(s); {
		j := strings.IndexByte(s[i:], ' ')
		if j < 0 {
			break
		}
		i += j
		if i+1 < len(s) && isASCIILetter(s[i-1]) && isASCIILetter(s[i+1]) {
			return i
		}
		i++
	}
	return len(s)
}

// cutsSpacedWords reports whether a byte-level tokenizer's normalization and
// pre-tokenization give the same pieces for a text as for its two parts cut
// before a space that sits between two ASCII letters ("ab|_cd"), so that
// encodeSegment may cut there:
//   - NFC and NFKC leave ASCII as it is and nothing composes across the
//     space (U+0020 is a starter that is no composition's second
//     character), so normalizing the parts gives the whole's normalization;
//     Prepend and Replace (which would apply to each part, or match across
//     the cut) are not cut-safe, and without normalizers there is nothing
//     to save;
//   - the Qwen/Llama-3 and GPT-2 patterns (qwenScanner, gpt2Scanner, and
//     ByteLevel's own regex, which is gpt2Pattern) end a run of letters at
//     the space and start the next piece there (" ?\p{L}+" or
//     "[^\r\n\p{L}\p{N}]?\p{L}+"), reading nothing past the letter
//     before it to end the run; a \p{N} split leaves both letters in gaps
//     that the pattern then cuts there. Literal and other regex Splits are
//     not analysed and not cut. add_prefix_space adds a space only where a
//     piece does not start with one, so it is the same for the second part.
//
// FuzzNormCutMatchesWhole checks it against encoding the segment whole.
func cutsSpacedWords(steps []normStep, split, blRegex splitter) bool {
	if len(steps) == 0 {
		return false
	}
	for _, st := range steps {
		if st.op != normNFC && st.op != normNFKC {
			return false
		}
	}
	// regex: some splitter cuts at the space; a \p{N} split may come
	// before or after it.
	regex := false
	cuts := func(sp splitter, numbersToo bool) bool {
		switch sp.(type) {
		case qwenScanner, gpt2Scanner:
			regex = true
			return true
		case numberSplitter:
			return numbersToo
		}
		return false
	}
	if seq, ok := split.(seqSplitter); ok {
		for _, sp := range seq {
			if !cuts(sp, true) {
				return false
			}
		}
	} else if split != nil && !cuts(split, false) {
		return false
	}
	if blRegex != nil && !cuts(blRegex, false) {
		return false
	}
	return regex
}

// encodePart is encodeSegment on one part of a segment.
func (t *HF) encodePart(dst []uint32, seg string, first bool, st *encodeState) []uint32 {
	if seg == "" {
		return dst
	}
	seg = applyNorm(t.norm, seg)
	switch t.kind {
	case kindSPM:
		if t.spacePrefix {
			seg = " " + seg
		}
		return t.spmEncode(dst, strings.ReplaceAll(seg, " ", "\u2581"), st)
	case kindCharBPE:
		if t.meta.on {
			seg = strings.ReplaceAll(seg, " ", t.meta.repl)
			if (t.meta.prepend == "always" || (t.meta.prepend == "first" && first)) && !strings.HasPrefix(seg, t.meta.repl) {
				seg = t.meta.repl + seg
			}
		}
		emit := func(p string) { dst = t.charBPE(dst, p, st) }
		if t.meta.on && t.meta.split {
			inner := emit
			emit = func(p string) { splitBefore(p, t.meta.repl, inner) }
		}
		if t.split != nil {
			t.split.split(seg, emit)
		} else {
			emit(seg)
		}
		return dst
	}
	piece := func(p string) {
		if p == "" {
			return
		}
		if !st.next(dst) {
			st.count(t.unitMin(len(p)))
			return
		}
		if t.ignoreMerges {
			if id, ok := t.pieceID[p]; ok {
				dst = append(dst, id)
				return
			}
		}
		dst = t.model.encode(dst, p)
	}
	emit := piece
	if t.blRegex != nil {
		emit = func(p string) { t.blRegex.split(p, piece) }
	}
	if t.prefixSp {
		inner := emit
		emit = func(p string) { inner(withPrefixSpace(p)) }
	}
	if t.split == nil {
		emit(seg)
	} else {
		t.split.split(seg, emit)
	}
	return dst
}

// splitBefore cuts s before each occurrence of sep (a Split with behavior
// MergedWithNext, which Metaspace uses).
func splitBefore(s, sep string, fn func(string)) {
	for s != "" {
		i := strings.Index(s[1:], sep)
		if i < 0 {
			fn(s)
			return
		}
		fn(s[:i+1])
		s = s[i+1:]
	}
}

// withPrefixSpace is ByteLevel's add_prefix_space: a space before text that
// does not start with one.
func withPrefixSpace(s string) string {
	if s == "" || s[0] == ' ' {
		return s
	}
	return " " + s
}

// Decode implements Tokenizer. Byte-level tokens are turned back into their
// bytes and added tokens into their text; unknown ids are skipped. The
// result is the raw byte concatenation: a cut in the middle of a UTF-8
// sequence is returned as is, not replaced by U+FFFD.
func (t *HF) Decode(ids []uint32) string {
	n := 0
	for _, id := range ids {
		if int(id) < len(t.idToBytes) {
			n += len(t.idToBytes[id])
		}
	}
	var b strings.Builder
	b.Grow(n)
	for _, id := range ids {
		if int(id) < len(t.idToBytes) {
			b.WriteString(t.idToBytes[id])
		}
	}
	out := b.String()
	if t.stripLead && strings.HasPrefix(out, " ") {
		out = out[1:]
	}
	return out
}

// addedMatcher finds added tokens in text, leftmost first and, among those
// starting at the same place, longest first (the Hugging Face library's
// Aho-Corasick LeftmostLongest). lstrip/rstrip tokens absorb the whitespace
// beside them, as the library does.
type addedMatcher struct {
	first  [256]bool               // bytes that can start an added token
	starts string                  // those bytes, for strings.IndexAny
	byByte map[byte][]hfAddedToken // candidates by first byte, longest first
	byText map[string]uint32
}

func newAddedMatcher(toks []hfAddedToken) addedMatcher {
	m := addedMatcher{byByte: map[byte][]hfAddedToken{}, byText: map[string]uint32{}}
	for _, a := range toks {
		m.first[a.Content[0]] = true
		m.byByte[a.Content[0]] = append(m.byByte[a.Content[0]], a)
		m.byText[a.Content] = a.ID
	}
	for _, c := range m.byByte {
		sort.SliceStable(c, func(i, j int) bool { return len(c[i].Content) > len(c[j].Content) })
	}
	var starts []byte
	for b := range 256 {
		if m.first[b] {
			starts = append(starts, byte(b))
		}
	}
	m.starts = string(starts)
	return m
}

// nextStart is the index of the first byte at or after i that can start an
// added token, or len(text). A prompt is mostly plain text: with one such
// byte (Qwen3's added tokens all start with '<') the search is
// strings.IndexByte, vectorised; with several ASCII ones IndexAny; a first
// byte outside ASCII (which IndexAny would read as part of a rune) takes
// the byte loop.
func (m *addedMatcher) nextStart(text string, i int) int {
	switch {
	case len(m.starts) == 1:
		if j := strings.IndexByte(text[i:], m.starts[0]); j >= 0 {
			return i + j
		}
		return len(text)
	case m.starts[len(m.starts)-1] < utf8.RuneSelf:
		if j := strings.IndexAny(text[i:], m.starts); j >= 0 {
			return i + j
		}
		return len(text)
	}
	for ; i < len(text) && !m.first[text[i]]; i++ {
	}
	return i
}

// stripsLeft reports whether text is an added token that absorbs the
// whitespace before it (lstrip).
func (m *addedMatcher) stripsLeft(text string) bool {
	if len(text) == 0 {
		return false
	}
	for _, a := range m.byByte[text[0]] {
		if a.Content == text {
			return a.Lstrip
		}
	}
	return false
}

func (m *addedMatcher) idOf(text string) (uint32, bool) {
	id, ok := m.byText[text]
	return id, ok
}

// each calls fn for the consecutive segments of text: plain text
// (isAdded false; possibly empty only when text is) and added tokens.
func (m *addedMatcher) each(text string, fn func(seg string, id uint32, isAdded bool)) {
	if len(m.byText) == 0 {
		fn(text, 0, false)
		return
	}
	start := 0 // start of the pending plain segment
	for i := m.nextStart(text, 0); i < len(text); i = m.nextStart(text, i+1) {
		for _, a := range m.byByte[text[i]] {
			if !strings.HasPrefix(text[i:], a.Content) {
				continue
			}
			segEnd, next := i, i+len(a.Content)
			if a.Lstrip {
				for segEnd > start && isSpace(text[segEnd-1]) {
					segEnd--
				}
			}
			if a.Rstrip {
				for next < len(text) && isSpace(text[next]) {
					next++
				}
			}
			if segEnd > start {
				fn(text[start:segEnd], 0, false)
			}
			fn(a.Content, a.ID, true)
			start = next
			i = next - 1
			break
		}
	}
	if start < len(text) {
		fn(text[start:], 0, false)
	}
}

var _ Tokenizer = (*HF)(nil)

// isSpace is the whitespace an lstrip/rstrip added token absorbs. The
// Hugging Face library strips Unicode whitespace; only ASCII whitespace is
// handled here (no catalog model's lstrip/rstrip token sits next to other
// whitespace in its chat template).
func isSpace(b byte) bool { return b == ' ' || b == '\n' || b == '\t' || b == '\r' }
