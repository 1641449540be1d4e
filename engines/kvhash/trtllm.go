package kvhash

// TRTLLMBlockKey returns TensorRT-LLM's own engine hash of one block (its
// "v1_block_key"), the value TRT publishes as block_hash in its KV-cache
// events. parent is the previous block's key, 0 for the first block; there is
// no seed. The block is plain text: no cache salt, no per-token extra ids, no
// LoRA task and no multimodal keys (see TRTLLMBlockKeyWith).
//
// This is not the routing key the gateway uses for TRT, which is the SGLang
// chain over the same tokens (New(BlockHashTRTLLM, ...)).
func TRTLLMBlockKey(parent uint64, tokens []uint32) uint64 {
	return TRTLLMBlockKeyWith(parent, tokens, TRTKeyExtras{})
}

// TRTKeyExtras are the optional inputs of TRT-LLM's block key. The zero value
// means none.
type TRTKeyExtras struct {
	// TokenExtraIDs, when non-nil, switches on TRT's "uses extra ids" mode: the
	// extra id of token i (0 if i is past the end) is mixed in after token i.
	TokenExtraIDs []uint64
	// CacheSaltID is mixed into the first block of a sequence (parent 0) when
	// non-zero.
	CacheSaltID uint64
	// LoraTaskID is mixed in after the tokens when non-zero.
	LoraTaskID uint64
}

// TRTLLMBlockKeyWith is TRTLLMBlockKey with cache salt, extra token ids and
// LoRA task id, in TRT's order: salt, tokens (each followed by its extra id),
// LoRA. Multimodal keys are not supported.
func TRTLLMBlockKeyWith(parent uint64, tokens []uint32, x TRTKeyExtras) uint64 {
	seed := uint64(len(tokens)) ^ (parent * 0xbf58476d1ce4e5b9)
	if parent == 0 && x.CacheSaltID != 0 {
		seed = trtMix64(x.CacheSaltID, seed)
	}
	for i, t := range tokens {
		a := t
		a = ((a >> 16) ^ a) * 0x45d9f3b
		a = ((a >> 16) ^ a) * 0x45d9f3b
		a = (a >> 16) ^ a
		// The constant is added in 32-bit arithmetic in TRT's C++ (the token
		// word is a uint32), so it wraps before widening.
		seed ^= uint64(a+0x9e3779b9) + (seed << 6) + (seed >> 2)
		if x.TokenExtraIDs != nil {
			var e uint64
			if i < len(x.TokenExtraIDs) {
				e = x.TokenExtraIDs[i]
			}
			seed = trtMix64(e, seed)
		}
	}
	if x.LoraTaskID != 0 {
		seed = trtMix64(x.LoraTaskID, seed)
	}
	return seed
}

// trtMix64 folds a 64-bit value into seed with TRT's splitmix-style finaliser.
func trtMix64(b, seed uint64) uint64 {
	b = (b ^ (b >> 30)) * 0xbf58476d1ce4e5b9
	b = (b ^ (b >> 27)) * 0x94d049bb133111eb
	b ^= b >> 31
	return seed ^ (b + 0x9e3779b9 + (seed << 6) + (seed >> 2))
}
