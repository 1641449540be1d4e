package tokenizer

// bpe is a byte-level BPE model over raw bytes: the vocabulary's byte-level
// strings are decoded once at load, so encoding never builds the printable
// alphabet form. It is immutable after load and safe for concurrent use.
type bpe struct {
	byteID [256]uint32       // id of each single-byte token
	merges map[uint64]uint64 // left<<32|right -> rank<<32|merged id
}

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

// encode appends the ids of one pre-token to dst. It applies merges lowest
// rank first, leftmost first among equal ranks, as the Hugging Face BPE
// model does. The cost is quadratic in the piece length only in cheap
// array scans; each merge does at most two map look-ups.
func (m *bpe) encode(dst []uint32, piece string) []uint32 {
	n := len(piece)
	switch n {
	case 0:
		return dst
	case 1:
		return append(dst, m.byteID[piece[0]])
	}
	var idBuf, rankBuf, mergedBuf [48]uint32
	ids, ranks, merged := idBuf[:0], rankBuf[:0], mergedBuf[:0]
	if n > len(idBuf) {
		ids = make([]uint32, 0, n)
		ranks = make([]uint32, 0, n)
		merged = make([]uint32, 0, n)
	}
	for i := 0; i < n; i++ {
		ids = append(ids, m.byteID[piece[i]])
	}
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
	return append(dst, ids...)
}
