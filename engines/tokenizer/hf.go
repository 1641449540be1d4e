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

	"golang.org/x/text/unicode/norm"
)

// ErrUnsupported classifies a tokenizer.json (or tokenizer_config.json)
// that is well-formed but uses a component this package does not implement;
// such a tokenizer would not reproduce the engine's ids, so it is refused
// rather than approximated.
var ErrUnsupported = errors.New("tokenizer: unsupported tokenizer component")

// ErrNoChatTemplate is returned by ChatRenderer when tokenizer_config.json is
// absent or has no chat_template.
var ErrNoChatTemplate = errors.New("tokenizer: no chat template")

// HF is a Hugging Face byte-level BPE tokenizer loaded from tokenizer.json,
// with the BOS policy and chat template of the tokenizer_config.json beside
// it. It is immutable after LoadHF and safe for concurrent use.
type HF struct {
	name     string
	model    bpe
	nfc      bool     // normalizer: NFC, or none
	split    splitter // nil: the whole segment is one piece
	prefixSp bool     // ByteLevel add_prefix_space
	// prefixEach: the space is added to each piece of a Split that runs
	// before ByteLevel (the library applies ByteLevel to every piece);
	// otherwise to each segment between added tokens, before ByteLevel's
	// own regex.
	prefixEach bool
	added      addedMatcher
	idToBytes  []string // raw bytes (or added-token text) of each id; "" if unused
	idKnown    []bool

	bosID          uint32
	hasBOS, addBOS bool
	specialVars    map[string]string // special-token template variables
	chatTemplate   string

	renderOnce sync.Once
	renderer   Renderer
	renderErr  error
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
	if err := t.setNormalizer(f.Normalizer); err != nil {
		return nil, err
	}
	if err := t.setPreTokenizer(f.PreTokenizer); err != nil {
		return nil, err
	}
	if len(f.Decoder) > 0 && string(f.Decoder) != "null" {
		var d hfComponent
		if err := json.Unmarshal(f.Decoder, &d); err != nil {
			return nil, fmt.Errorf("tokenizer: parse decoder: %w", err)
		}
		if d.Type != "ByteLevel" {
			return nil, fmt.Errorf("%w: decoder %q", ErrUnsupported, d.Type)
		}
	}
	if err := t.setModel(&f); err != nil {
		return nil, err
	}
	if err := t.setAdded(f.AddedTokens); err != nil {
		return nil, err
	}
	t.bosFromPostProcessor(f.PostProcessor)
	return t, nil
}

func (t *HF) setNormalizer(raw json.RawMessage) error {
	if len(raw) == 0 || string(raw) == "null" {
		return nil
	}
	var n hfComponent
	if err := json.Unmarshal(raw, &n); err != nil {
		return fmt.Errorf("tokenizer: parse normalizer: %w", err)
	}
	var walk func(n hfComponent) error
	walk = func(n hfComponent) error {
		switch n.Type {
		case "NFC":
			t.nfc = true
		case "Sequence":
			for _, c := range n.Normalizers {
				if err := walk(c); err != nil {
					return err
				}
			}
		default:
			return fmt.Errorf("%w: normalizer %q", ErrUnsupported, n.Type)
		}
		return nil
	}
	return walk(n)
}

func (t *HF) setPreTokenizer(raw json.RawMessage) error {
	if len(raw) == 0 || string(raw) == "null" {
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
	var pattern string
	byteLevel := false
	for _, s := range steps {
		switch s.Type {
		case "Split":
			if pattern != "" || byteLevel {
				return fmt.Errorf("%w: Split must come once, before ByteLevel", ErrUnsupported)
			}
			var p struct {
				Regex  *string `json:"Regex"`
				String *string `json:"String"`
			}
			if err := json.Unmarshal(s.Pattern, &p); err != nil {
				return fmt.Errorf("tokenizer: parse Split pattern: %w", err)
			}
			if p.Regex == nil || *p.Regex == "" || s.Behavior != "Isolated" || s.Invert {
				return fmt.Errorf("%w: Split other than an Isolated, non-inverted regex", ErrUnsupported)
			}
			pattern = *p.Regex
		case "ByteLevel":
			if byteLevel {
				return fmt.Errorf("%w: two ByteLevel pre-tokenizers", ErrUnsupported)
			}
			byteLevel = true
			t.prefixSp = s.AddPrefixSpace
			t.prefixEach = pattern != ""
			// use_regex defaults to true in the library.
			if s.UseRegex == nil || *s.UseRegex {
				if pattern != "" {
					return fmt.Errorf("%w: Split followed by a regex ByteLevel", ErrUnsupported)
				}
				pattern = gpt2Pattern
			}
		default:
			return fmt.Errorf("%w: pre-tokenizer %q", ErrUnsupported, s.Type)
		}
	}
	if !byteLevel {
		return fmt.Errorf("%w: pre-tokenizer without ByteLevel", ErrUnsupported)
	}
	switch pattern {
	case "":
		t.split = nil
	case qwenPattern:
		t.split = qwenScanner{}
	default:
		rs, err := newRegexSplitter(pattern)
		if err != nil {
			return err
		}
		t.split = rs
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
		(m.EndOfWordSuffix != nil && *m.EndOfWordSuffix != "") || m.ByteFallback || m.IgnoreMerges {
		return fmt.Errorf("%w: BPE option (subword prefix/suffix, byte_fallback or ignore_merges)", ErrUnsupported)
	}
	if len(m.Vocab) == 0 {
		return fmt.Errorf("tokenizer: parse model: empty vocabulary")
	}
	rawToID := make(map[string]uint32, len(m.Vocab))
	maxID := uint32(0)
	for tok, id := range m.Vocab {
		raw, ok := byteLevelDecode(tok)
		if !ok {
			return fmt.Errorf("tokenizer: parse model: vocabulary entry %q is not byte-level", tok)
		}
		rawToID[raw] = id
		maxID = max(maxID, id)
	}
	if maxID > 1<<24 {
		return fmt.Errorf("tokenizer: parse model: id %d out of range", maxID)
	}
	t.idToBytes = make([]string, maxID+1)
	t.idKnown = make([]bool, maxID+1)
	for raw, id := range rawToID {
		t.idToBytes[id], t.idKnown[id] = raw, true
	}
	for b := 0; b < 256; b++ {
		id, ok := rawToID[string([]byte{byte(b)})]
		if !ok {
			return fmt.Errorf("tokenizer: parse model: byte 0x%02x has no token", b)
		}
		t.model.byteID[b] = id
	}
	pairs, err := parseMerges(m.Merges)
	if err != nil {
		return err
	}
	t.model.merges = make(map[uint64]uint64, len(pairs))
	for rank, p := range pairs {
		l, lok := m.Vocab[p[0]]
		r, rok := m.Vocab[p[1]]
		merged, mok := m.Vocab[p[0]+p[1]]
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
// (leftmost, longest match first), the text between is NFC-normalized when
// the tokenizer says so, pre-tokenized and BPE-encoded. No BOS/EOS is added.
func (t *HF) Encode(dst []uint32, text string) []uint32 {
	t.added.each(text, func(seg string, id uint32, isAdded bool) {
		if isAdded {
			dst = append(dst, id)
			return
		}
		dst = t.encodeOrdinary(dst, seg)
	})
	return dst
}

// encodeOrdinary encodes text with no added-token recognition (the library's
// encode_special_tokens=true behaviour, which engines do not use).
func (t *HF) encodeOrdinary(dst []uint32, seg string) []uint32 {
	if t.nfc {
		seg = norm.NFC.String(seg)
	}
	if t.prefixSp && !t.prefixEach {
		seg = withPrefixSpace(seg)
	}
	if t.split == nil {
		return t.model.encode(dst, seg)
	}
	if t.prefixSp && t.prefixEach {
		t.split.split(seg, func(piece string) { dst = t.model.encode(dst, withPrefixSpace(piece)) })
		return dst
	}
	t.split.split(seg, func(piece string) { dst = t.model.encode(dst, piece) })
	return dst
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
	return b.String()
}

// addedMatcher finds added tokens in text, leftmost first and, among those
// starting at the same place, longest first (the Hugging Face library's
// Aho-Corasick LeftmostLongest). lstrip/rstrip tokens absorb the whitespace
// beside them, as the library does.
type addedMatcher struct {
	first  [256]bool               // bytes that can start an added token
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
	return m
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
	for i := 0; i < len(text); i++ {
		if !m.first[text[i]] {
			continue
		}
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
