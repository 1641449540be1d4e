package sim

import (
	"github.com/llmgw/llmgw/engines/tokenizer"
)

// loadHFTokenizer loads a Hugging Face tokenizer.json, its chat template, and
// the model's BOS policy (prepend bos when add is true), exactly as the
// gateway's KV-exact path does.
func loadHFTokenizer(path string) (tok tokenizer.Tokenizer, render tokenizer.Renderer, bos uint32, addBOS bool, err error) {
	hf, err := tokenizer.LoadHF(path)
	if err != nil {
		return nil, nil, 0, false, err
	}
	r, err := hf.ChatRenderer()
	if err != nil {
		return nil, nil, 0, false, err
	}
	bos, addBOS = hf.BOS()
	return hf, r, bos, addBOS, nil
}
