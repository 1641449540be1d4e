// Package all registers every engine adapter. Import it (blank) wherever
// engines.For is called: cmd/llmgw and the gateway do.
package all

import (
	_ "github.com/llmgw/llmgw/engines/llamacpp"
	_ "github.com/llmgw/llmgw/engines/sglang"
	_ "github.com/llmgw/llmgw/engines/trtllm"
	_ "github.com/llmgw/llmgw/engines/vllm"
)
