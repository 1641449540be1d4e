// Package tokenizer turns prompts into token ids the way an engine does, so
// that the gateway's block hashes equal the engine's. The gateway's KV-exact
// path and the simulator share this package: a tokenization mismatch between
// them would be a hash-parity bug caught nowhere else.
package tokenizer

// Tokenizer encodes text into token ids.
//
// Implementations are safe for concurrent use and keep no reference to their
// arguments. Encode recognises special-token text (e.g. "<|im_end|>") as the
// special id, as Hugging Face tokenizers do with encode_special_tokens=false,
// and never adds BOS/EOS: whether a model's engine prepends a BOS is the
// caller's per-model policy (see BOS).
type Tokenizer interface {
	// Name identifies the tokenizer in logs and status (e.g.
	// "Qwen/Qwen3-0.6B").
	Name() string
	// Encode appends the ids of text to dst and returns the extended slice.
	Encode(dst []uint32, text string) []uint32
	// Decode returns the text of ids. Unknown ids are skipped.
	Decode(ids []uint32) string
}

// Message is one chat message as a chat template sees it. Content arrays of
// the OpenAI API are flattened to their text parts, joined without separator,
// before rendering (what vLLM does for text-only models).
type Message struct {
	Role    string
	Content string
}

// Renderer renders a conversation into the prompt text the engine tokenizes.
// Implementations are safe for concurrent use.
type Renderer interface {
	// Render returns the prompt text for msgs; with addGenerationPrompt the
	// assistant turn header is appended, as engines do for chat completions.
	Render(msgs []Message, addGenerationPrompt bool) (string, error)
}
