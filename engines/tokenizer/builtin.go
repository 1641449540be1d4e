package tokenizer

import (
	"strings"
	"unicode/utf8"
)

// Builtin is the deterministic tokenizer used when no tokenizer.json is
// configured: by the simulator's default personas and by a gateway rule whose
// workers are those simulators.
//
// It is reversible and needs no vocabulary file. Text is cut into pieces at
// whitespace boundaries (the space stays at the front of the word, as in
// byte-level BPE), then each piece into chunks of at most 3 bytes; a chunk of
// n bytes b0..b(n-1) has id n<<24 | b0 | b1<<8 | b2<<16. The three ChatML
// special tokens have ids 1..3 and are recognised in the text. This gives
// about 3 bytes per token, close to a real BPE's density, so block counts and
// latencies in simulations are of a realistic order.
type Builtin struct{}

// Special token ids of the builtin tokenizer.
const (
	BuiltinEndOfText uint32 = 1 // <|endoftext|>
	BuiltinIMStart   uint32 = 2 // <|im_start|>
	BuiltinIMEnd     uint32 = 3 // <|im_end|>
)

var builtinSpecials = [...]struct {
	text string
	id   uint32
}{
	{"<|endoftext|>", BuiltinEndOfText},
	{"<|im_start|>", BuiltinIMStart},
	{"<|im_end|>", BuiltinIMEnd},
}

// Name implements Tokenizer.
func (Builtin) Name() string { return "builtin" }

// Encode implements Tokenizer.
func (Builtin) Encode(dst []uint32, text string) []uint32 {
	for len(text) > 0 {
		// Find the next special token; encode the plain text before it.
		next, nextID, nextLen := len(text), uint32(0), 0
		if i := strings.Index(text, "<|"); i >= 0 {
			for j := i; j >= 0 && j < len(text); {
				matched := false
				for _, sp := range builtinSpecials {
					if strings.HasPrefix(text[j:], sp.text) {
						next, nextID, nextLen, matched = j, sp.id, len(sp.text), true
						break
					}
				}
				if matched {
					break
				}
				k := strings.Index(text[j+2:], "<|")
				if k < 0 {
					break
				}
				j += 2 + k
			}
		}
		dst = encodePlain(dst, text[:next])
		if nextLen == 0 {
			break
		}
		dst = append(dst, nextID)
		text = text[next+nextLen:]
	}
	return dst
}

func encodePlain(dst []uint32, s string) []uint32 {
	for len(s) > 0 {
		// A piece: leading whitespace run's last byte glued to the following
		// word, like " hello"; a whitespace run alone is its own piece.
		end := 0
		for end < len(s) && isSpace(s[end]) {
			end++
		}
		if end > 0 && end < len(s) {
			end-- // leave one space to lead the word
			if end == 0 {
				end = 1
				for end < len(s) && !isSpace(s[end]) {
					end++
				}
			}
		} else if end == 0 {
			for end < len(s) && !isSpace(s[end]) {
				end++
			}
		}
		dst = appendChunks(dst, s[:end])
		s = s[end:]
	}
	return dst
}

// appendChunks cuts piece into chunks of at most 3 bytes without splitting a
// UTF-8 sequence where it can avoid it (a rune longer than 3 bytes is split).
func appendChunks(dst []uint32, piece string) []uint32 {
	for len(piece) > 0 {
		n := 0
		for n < len(piece) {
			_, size := utf8.DecodeRuneInString(piece[n:])
			if n+size > 3 {
				break
			}
			n += size
		}
		if n == 0 {
			n = min(3, len(piece))
		}
		id := uint32(n) << 24
		for i := 0; i < n; i++ {
			id |= uint32(piece[i]) << (8 * i)
		}
		dst = append(dst, id)
		piece = piece[n:]
	}
	return dst
}

func isSpace(b byte) bool { return b == ' ' || b == '\n' || b == '\t' || b == '\r' }

// Decode implements Tokenizer.
func (Builtin) Decode(ids []uint32) string {
	var b strings.Builder
	for _, id := range ids {
		n := id >> 24
		if n == 0 {
			for _, sp := range builtinSpecials {
				if sp.id == id {
					b.WriteString(sp.text)
				}
			}
			continue
		}
		if n > 3 {
			continue
		}
		for i := uint32(0); i < n; i++ {
			b.WriteByte(byte(id >> (8 * i)))
		}
	}
	return b.String()
}

// ChatML renders conversations in the ChatML layout used by Qwen models:
// "<|im_start|>role\ncontent<|im_end|>\n" per message, then
// "<|im_start|>assistant\n" when a generation prompt is asked for. It is the
// builtin renderer that pairs with Builtin; real models use their own Jinja
// template (see the HF loader in this package).
type ChatML struct{}

// Render implements Renderer.
func (ChatML) Render(msgs []Message, addGenerationPrompt bool) (string, error) {
	var b strings.Builder
	for _, m := range msgs {
		b.WriteString("<|im_start|>")
		b.WriteString(m.Role)
		b.WriteByte('\n')
		b.WriteString(m.Content)
		b.WriteString("<|im_end|>\n")
	}
	if addGenerationPrompt {
		b.WriteString("<|im_start|>assistant\n")
	}
	return b.String(), nil
}

var (
	_ Tokenizer = Builtin{}
	_ Renderer  = ChatML{}
)
