package tokenizer

import (
	"strings"
	"unicode/utf8"
)

// charBPE encodes one piece of a SentencePiece-style tokenizer.json model:
// each character is its vocabulary entry, or its UTF-8 bytes as <0xXX>
// tokens (byte_fallback), or unk; then merges apply by rank as in byte-level
// BPE.
func (t *HF) charBPE(dst []uint32, piece string, st *encodeState) []uint32 {
	if piece == "" {
		return dst
	}
	unit := func(w string) {
		if !st.next(dst) {
			st.count(t.unitMin(len(w)))
			return
		}
		dst = t.charWord(dst, w)
	}
	if t.spmWords && len(piece) > heapThreshold {
		splitWords(piece, unit)
		return dst
	}
	unit(piece)
	return dst
}

// charWord is charBPE on one piece, with no word split.
func (t *HF) charWord(dst []uint32, piece string) []uint32 {
	if t.ignoreMerges {
		if id, ok := t.pieceID[piece]; ok {
			return append(dst, id)
		}
	}
	var buf [heapThreshold]uint32
	ids := buf[:0]
	lastUnk := false
	for i := 0; i < len(piece); {
		_, w := utf8.DecodeRuneInString(piece[i:])
		if id, ok := t.pieceID[piece[i:i+w]]; ok {
			ids = append(ids, id)
			lastUnk = false
		} else if t.byteFallback {
			for j := i; j < i+w; j++ {
				ids = append(ids, t.byteTok[piece[j]])
			}
			lastUnk = false
		} else if !lastUnk { // consecutive unknowns fuse into one unk
			ids = append(ids, t.unkID)
			lastUnk = true
		}
		i += w
	}
	return t.model.merge(dst, ids)
}

// spmEncode is llama.cpp's SentencePiece tokenizer (llm_tokenizer_spm_session
// in src/llama-vocab.cpp) on text whose spaces are already U+2581: the text
// starts as one symbol per UTF-8 character; the adjacent pair whose
// concatenation is a vocabulary piece with the highest score merges first,
// the leftmost among equal scores; a final symbol that is not a piece (a
// character outside the vocabulary) is written as its <0xXX> byte tokens.
//
// That is BPE with a merge for every pair of pieces whose concatenation is
// a piece, ranked by the concatenation's score (spmMerges): spmEncode runs
// the same merge loop as the tokenizer.json form. TestSPMMatchesLlamaCpp
// checks it against a literal transcription of llama.cpp's algorithm.
func (t *HF) spmEncode(dst []uint32, text string, st *encodeState) []uint32 {
	return t.charBPE(dst, text, st)
}

// splitWords cuts text before each U+2581 that follows another character.
// When no vocabulary piece has U+2581 after another character
// (spmWordsSafe), no merge can produce a symbol across such a cut, since
// every merged symbol is a piece: the words merge independently, in the
// same order, to the same tokens.
func splitWords(text string, fn func(word string)) {
	const sp = "\u2581"
	for text != "" {
		cut := len(text)
		for i := 0; i < len(text); {
			j := strings.Index(text[i:], sp)
			if j < 0 {
				break
			}
			j += i
			if j > 0 && !strings.HasSuffix(text[:j], sp) {
				cut = j
				break
			}
			i = j + len(sp)
		}
		fn(text[:cut])
		text = text[cut:]
	}
}

// spmWordsSafe reports whether no piece has U+2581 after another
// character: then spmEncode may merge word by word.
func spmWordsSafe(pieces map[string]uint32) bool {
	for p := range pieces {
		if i := strings.Index(p, "\u2581"); i >= 0 {
			rest := strings.TrimLeft(p, "\u2581")
			if strings.Contains(rest, "\u2581") {
				return false
			}
		}
	}
	return true
}
