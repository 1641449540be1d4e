package kvevents_test

import (
	"fmt"

	"github.com/llmgw/llmgw/engines/kvevents"
)

// Encode a batch the way vLLM 0.11 does and decode it back.
func ExampleDecodeBatch() {
	gpu := "GPU"
	rank := int64(0)
	in := kvevents.Batch{TS: 1700000000.5, DPRank: &rank, Events: []kvevents.Event{{
		Kind:        kvevents.BlockStored,
		BlockHashes: []uint64{2164874634404590027},
		TokenIDs:    []uint32{1, 2, 3, 4},
		BlockSize:   4,
		Medium:      &gpu,
	}}}
	payload, err := kvevents.AppendBatch(nil, &in, kvevents.ArrayV011)
	if err != nil {
		panic(err)
	}
	var out kvevents.Batch
	enc, err := kvevents.DecodeBatch(payload, &out)
	if err != nil {
		panic(err)
	}
	e := out.Events[0]
	fmt.Println(len(payload), enc, e.Kind, e.BlockHashes, e.TokenIDs, *e.Medium, *out.DPRank)
	// Output: 47 array-v0.11 BlockStored [2164874634404590027] [1 2 3 4] GPU 0
}
