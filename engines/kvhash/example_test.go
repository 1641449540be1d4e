package kvhash_test

import (
	"fmt"

	"github.com/llmgw/llmgw/engines/kvhash"
)

// The routing keys vLLM publishes for two 4-token blocks with
// --prefix-caching-hash-algo sha256_cbor and PYTHONHASHSEED=0.
func ExampleNew() {
	h, err := kvhash.New(kvhash.SHA256CBOR, 4, "0")
	if err != nil {
		panic(err)
	}
	fmt.Println(h.BlockKeys(nil, []uint32{1, 2, 3, 4, 5, 6, 7, 8, 9}))
	// Output: [2164874634404590027 17270480062156288726]
}

// SGLang publishes the first 8 bytes of its page digest as a signed int64.
func ExampleSGLangPageHash() {
	d := kvhash.SGLangPageHash(nil, []uint32{1, 2, 3, 4})
	fmt.Println(kvhash.SGLangKey(d))
	// Output: -3488128144981237669
}
