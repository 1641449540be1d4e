package tokenizer

import (
	"strings"
	"testing"

	"github.com/llmgw/llmgw/internal/testfix"
)

// benchProse is English prose written for this benchmark (about 3 KB):
// ordinary sentences with punctuation, numbers and paragraph breaks.
const benchProse = `The gateway sits in front of a small fleet of inference engines and decides, for every request, which one should do the work. Most of the time the answer is easy: pick the least busy engine and move on. The interesting cases are the long conversations, where the same system prompt and the same first turns arrive again and again, and the engine that served them last time still holds their attention keys and values in memory.

Routing such a request to that engine saves the whole prefill of the shared prefix. On a seven billion parameter model that can be several hundred milliseconds for a prompt of a few thousand tokens, which is the difference between an answer that feels instant and one that feels slow. It also frees the other engines to do useful work instead of recomputing what already exists somewhere else in the cluster.

To know which engine holds which blocks, the gateway listens to the events the engines publish whenever they store or evict a block of sixteen tokens. Each block is named by a hash of its tokens and of the block before it, so a prompt's blocks form a chain, and two prompts share blocks exactly as far as they share tokens. The gateway computes the same chain for an incoming request and asks, for each engine, how many of the first blocks it already has.

None of this works unless the gateway turns text into exactly the tokens the engine would produce. A single differing token early in the prompt shifts every block boundary after it, and the hashes no longer match anything. That is why the tokenizer must be the model's own, loaded from the same file, with the same treatment of special markers such as the start and end of a turn, and the same chat template to lay out the messages.

There are a few traps along the way. Some tokenizers normalize text before splitting it; some add a beginning-of-sequence token and some do not; some templates inject a default system message when the client sends none. Each of these is a rule the engine follows silently, and each one, if missed, turns every cache lookup into a miss without any error being reported anywhere.

Speed matters too, though less than correctness. A busy gateway may see a few thousand requests per second, each with a prompt of a few thousand tokens, and it has to tokenize all of them before it can route any. At one million tokens per second per core, a prompt of four thousand tokens costs four milliseconds; a faster tokenizer leaves more of the budget for everything else, and a cache of recent prefixes removes most of the work for repeated conversations.

In practice, the numbers look like this: 2,048 blocks of 16 tokens hash in well under a millisecond, an index of 100,000 blocks per engine fits in a few megabytes, and the whole decision, from the first byte of the request to the choice of engine, takes less time than the network round trip to the engine itself. That leaves the engines free to spend 99% of their time generating text, which is what they are for.
`

func BenchmarkEncodeProse(b *testing.B) {
	for _, bc := range []struct {
		name string
		tok  func(testing.TB) *HF
	}{
		{"scanner", qwen3},
		{"regexp2", qwen3Regexp2},
	} {
		b.Run(bc.name, func(b *testing.B) {
			tok := bc.tok(b)
			n := len(tok.Encode(nil, benchProse))
			dst := make([]uint32, 0, n)
			b.SetBytes(int64(len(benchProse)))
			b.ResetTimer()
			for b.Loop() {
				dst = tok.Encode(dst[:0], benchProse)
			}
			b.ReportMetric(float64(n)*float64(b.N)/b.Elapsed().Seconds(), "tokens/s")
		})
	}
}

func BenchmarkDecodeProse(b *testing.B) {
	tok := qwen3(b)
	ids := tok.Encode(nil, benchProse)
	b.SetBytes(int64(len(benchProse)))
	for b.Loop() {
		_ = tok.Decode(ids)
	}
}

func BenchmarkLoadHF(b *testing.B) {
	path := testfix.Qwen3Dir(b)
	for b.Loop() {
		if _, err := LoadHF(path); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkRenderQwen3(b *testing.B) {
	r, err := qwen3(b).ChatRenderer()
	if err != nil {
		b.Fatal(err)
	}
	msgs := []Message{
		{Role: "system", Content: "You are a helpful assistant."},
		{Role: "user", Content: strings.Repeat("Tell me about caches. ", 20)},
		{Role: "assistant", Content: "Caches keep recent results close."},
		{Role: "user", Content: "And prefix caches?"},
	}
	for b.Loop() {
		if _, err := r.Render(msgs, true); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkEncodeLongPiece encodes a 64 KB run of letters, one pre-token:
// the hostile case for BPE, linear-logarithmic with the heap merge.
func BenchmarkEncodeLongPiece(b *testing.B) {
	tok := qwen3(b)
	s := strings.Repeat("abcdefghij", 6554)
	b.SetBytes(int64(len(s)))
	for b.Loop() {
		_ = tok.Encode(nil, s)
	}
}
