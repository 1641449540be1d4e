package tokenizer

import (
	"strings"
	"sync"
	"unicode/utf8"
)

// charBPE encodes one piece of a SentencePiece-style tokenizer.json model:
// each character is its vocabulary entry, or its UTF-8 bytes as <0xXX>
// tokens (byte_fallback), or unk; then merges apply by rank as in byte-level
// BPE.
func (t *HF) charBPE(dst []uint32, piece string) []uint32 {
	if piece == "" {
		return dst
	}
	if t.spmWords && len(piece) > heapThreshold {
		splitWords(piece, func(w string) { dst = t.charWord(dst, w) })
		return dst
	}
	return t.charWord(dst, piece)
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
// Symbols are byte ranges of text, so a candidate is text[start:end] and
// looking it up allocates nothing.
func (t *HF) spmEncode(dst []uint32, text string) []uint32 {
	if !t.spmWords {
		return t.spmWord(dst, text)
	}
	splitWords(text, func(w string) { dst = t.spmWord(dst, w) })
	return dst
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

// spmWord runs the SentencePiece merge on one word.
func (t *HF) spmWord(dst []uint32, text string) []uint32 {
	n := utf8.RuneCountInString(text)
	if n == 0 {
		return dst
	}
	sc := spmPool.Get().(*spmScratch)
	defer spmPool.Put(sc)
	if cap(sc.buf) < 4*n {
		sc.buf = make([]int32, 4*n)
	}
	buf := sc.buf[:4*n]
	start, end, next, prev := buf[0:n], buf[n:2*n], buf[2*n:3*n], buf[3*n:]
	k := 0
	for i := 0; i < len(text); k++ {
		_, w := utf8.DecodeRuneInString(text[i:])
		start[k], end[k], prev[k], next[k] = int32(i), int32(i+w), int32(k-1), int32(k+1)
		i += w
	}
	next[n-1] = -1
	h := sc.heap[:0]
	add := func(l, r int32) {
		if l < 0 || r < 0 {
			return
		}
		id, ok := t.pieceID[text[start[l]:end[r]]]
		if !ok {
			return
		}
		h.push(spmBigram{score: t.scores[id], left: l, right: r, size: end[r] - start[l]})
	}
	for i := int32(1); i < int32(n); i++ {
		add(i-1, i)
	}
	for len(h) > 0 {
		b := h.pop()
		l, r := b.left, b.right
		// Stale: a side already merged, or the pair changed since.
		if end[l] == start[l] || end[r] == start[r] || end[r]-start[l] != b.size || next[l] != r {
			continue
		}
		end[l] = end[r]
		start[r] = end[r] // empty: merged away
		next[l] = next[r]
		if next[r] >= 0 {
			prev[next[r]] = l
		}
		add(prev[l], l)
		add(l, next[l])
	}
	sc.heap = h
	for i := int32(0); i >= 0; i = next[i] {
		sym := text[start[i]:end[i]]
		if id, ok := t.pieceID[sym]; ok {
			dst = append(dst, id)
			continue
		}
		if t.byteFallback {
			for j := 0; j < len(sym); j++ {
				dst = append(dst, t.byteTok[sym[j]])
			}
		} else if t.hasUnk {
			dst = append(dst, t.unkID)
		}
	}
	return dst
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

// spmScratch is the per-call working memory of spmWord, pooled: a prompt
// has one word per space, and allocating for each would be most of the cost.
type spmScratch struct {
	buf  []int32
	heap spmHeap
}

var spmPool = sync.Pool{New: func() any { return new(spmScratch) }}

// spmBigram is a merge candidate: higher score first, then leftmost.
type spmBigram struct {
	score       float32
	left, right int32
	size        int32
}

func (a spmBigram) before(b spmBigram) bool {
	return a.score > b.score || (a.score == b.score && a.left < b.left)
}

type spmHeap []spmBigram

func (h *spmHeap) push(v spmBigram) {
	*h = append(*h, v)
	s := *h
	for i := len(s) - 1; i > 0; {
		p := (i - 1) / 2
		if !s[i].before(s[p]) {
			break
		}
		s[p], s[i] = s[i], s[p]
		i = p
	}
}

func (h *spmHeap) pop() spmBigram {
	s := *h
	top := s[0]
	last := len(s) - 1
	s[0] = s[last]
	s = s[:last]
	for i := 0; ; {
		l, small := 2*i+1, i
		if l < len(s) && s[l].before(s[small]) {
			small = l
		}
		if r := l + 1; r < len(s) && s[r].before(s[small]) {
			small = r
		}
		if small == i {
			break
		}
		s[i], s[small] = s[small], s[i]
		i = small
	}
	*h = s
	return top
}
