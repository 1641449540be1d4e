package tokenizer

import "slices"

// bpe is a byte-level BPE model over raw bytes: the vocabulary's byte-level
// strings are decoded once at load, so encoding never builds the printable
// alphabet form. It is immutable after load and safe for concurrent use.
type bpe struct {
	byteID [256]uint32       // id of each single-byte token, noByte if none
	merges map[uint64]uint64 // left<<32|right -> rank<<32|merged id
	// hasMissing: some byte has no token (byteID noByte); encode drops it.
	hasMissing bool
}

// noByte stands for a byte without a token; it has no merges.
const noByte = ^uint32(0)

const noRank = ^uint32(0)

func pairKey(a, b uint32) uint64 { return uint64(a)<<32 | uint64(b) }

// rankOf returns the merge rank and merged id of the pair (a, b), or noRank.
func (m *bpe) rankOf(a, b uint32) (rank, merged uint32) {
	v, ok := m.merges[pairKey(a, b)]
	if !ok {
		return noRank, 0
	}
	return uint32(v >> 32), uint32(v)
}

// heapThreshold is the piece length from which encode switches from the
// quadratic array scan (fastest for words) to the heap-based merge, whose
// cost is O(n log n): a long run of letters or spaces in a hostile prompt
// must not cost seconds.
const heapThreshold = 48

// encode appends the ids of one pre-token to dst. It applies merges lowest
// rank first, leftmost first among equal ranks, as the Hugging Face BPE
// model does.
func (m *bpe) encode(dst []uint32, piece string) []uint32 {
	if m.hasMissing {
		start := len(dst)
		dst = m.encodeBytes(dst, piece)
		kept := slices.DeleteFunc(dst[start:], func(id uint32) bool { return id == noByte })
		return dst[:start+len(kept)]
	}
	return m.encodeBytes(dst, piece)
}

func (m *bpe) encodeBytes(dst []uint32, piece string) []uint32 {
	switch n := len(piece); {
	case n == 0:
		return dst
	case n == 1:
		return append(dst, m.byteID[piece[0]])
	case n < heapThreshold:
		var buf [heapThreshold]uint32
		ids := buf[:n]
		for i := 0; i < n; i++ {
			ids[i] = m.byteID[piece[i]]
		}
		return append(dst, m.mergeScan(ids)...)
	default:
		ids := make([]uint32, n)
		for i := 0; i < n; i++ {
			ids[i] = m.byteID[piece[i]]
		}
		return m.mergeHeap(dst, ids)
	}
}

// merge appends the result of merging the initial symbols ids (which it
// may overwrite) to dst.
func (m *bpe) merge(dst, ids []uint32) []uint32 {
	if len(ids) < heapThreshold {
		return append(dst, m.mergeScan(ids)...)
	}
	return m.mergeHeap(dst, ids)
}

// mergeScan keeps the pairs' ranks in an array and scans it for the
// minimum before each merge; each merge does at most two map look-ups.
// ids (len < heapThreshold) is merged in place; the result is a prefix of it.
func (m *bpe) mergeScan(ids []uint32) []uint32 {
	var rankBuf, mergedBuf [heapThreshold]uint32
	ranks, merged := rankBuf[:0], mergedBuf[:0]
	// ranks[k] and merged[k] describe the pair (ids[k], ids[k+1]).
	for k := 0; k+1 < len(ids); k++ {
		r, id := m.rankOf(ids[k], ids[k+1])
		ranks = append(ranks, r)
		merged = append(merged, id)
	}
	for len(ids) > 1 {
		best, bestRank := -1, noRank
		for k, r := range ranks {
			if r < bestRank {
				best, bestRank = k, r
			}
		}
		if best < 0 {
			break
		}
		ids[best] = merged[best]
		ids = append(ids[:best+1], ids[best+2:]...)
		ranks = append(ranks[:best], ranks[best+1:]...)
		merged = append(merged[:best], merged[best+1:]...)
		// Refresh the pairs that now include the new symbol.
		if best > 0 {
			ranks[best-1], merged[best-1] = m.rankOf(ids[best-1], ids[best])
		}
		if best < len(ranks) {
			ranks[best], merged[best] = m.rankOf(ids[best], ids[best+1])
		}
	}
	return ids
}

// mergeHeap merges with a min-heap of (rank, position) over a linked list
// of symbols. A heap entry is stale when its left symbol is gone or the
// pair starting there has changed; stale entries are skipped when popped.
// Positions are the original symbol indexes, so equal ranks pop leftmost
// first, as in the array scan. ids is overwritten.
func (m *bpe) mergeHeap(dst, ids []uint32) []uint32 {
	n := len(ids)
	next := make([]int32, n) // -1: last symbol
	prev := make([]int32, n) // -1: first symbol
	alive := make([]bool, n)
	pairRank := make([]uint32, n) // rank of the pair (k, next[k])
	pairMerged := make([]uint32, n)
	h := make(mergeHeap, 0, n)
	for i := 0; i < n; i++ {
		next[i], prev[i], alive[i] = int32(i+1), int32(i-1), true
	}
	next[n-1] = -1
	setPair := func(k int32) {
		if k < 0 || next[k] < 0 {
			if k >= 0 {
				pairRank[k] = noRank
			}
			return
		}
		r, id := m.rankOf(ids[k], ids[next[k]])
		pairRank[k], pairMerged[k] = r, id
		if r != noRank {
			h.push(uint64(r)<<32 | uint64(k))
		}
	}
	for k := int32(0); k < int32(n); k++ {
		setPair(k)
	}
	for len(h) > 0 {
		e := h.pop()
		k, r := int32(uint32(e)), uint32(e>>32)
		if !alive[k] || pairRank[k] != r {
			continue
		}
		right := next[k]
		ids[k] = pairMerged[k]
		alive[right] = false
		next[k] = next[right]
		if next[k] >= 0 {
			prev[next[k]] = k
		}
		setPair(k)
		setPair(prev[k])
	}
	for k := int32(0); k >= 0; k = next[k] {
		dst = append(dst, ids[k])
	}
	return dst
}

// mergeHeap is a binary min-heap of rank<<32|position keys.
type mergeHeap []uint64

func (h *mergeHeap) push(v uint64) {
	*h = append(*h, v)
	s := *h
	for i := len(s) - 1; i > 0; {
		p := (i - 1) / 2
		if s[p] <= s[i] {
			break
		}
		s[p], s[i] = s[i], s[p]
		i = p
	}
}

func (h *mergeHeap) pop() uint64 {
	s := *h
	top := s[0]
	last := len(s) - 1
	s[0] = s[last]
	s = s[:last]
	for i := 0; ; {
		l, small := 2*i+1, i
		if l < len(s) && s[l] < s[small] {
			small = l
		}
		if r := l + 1; r < len(s) && s[r] < s[small] {
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
