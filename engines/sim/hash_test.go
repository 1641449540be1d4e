package sim

import (
	"encoding/json"
	"os"
	"strings"
	"testing"

	"github.com/llmgw/llmgw/engines"
	"github.com/llmgw/llmgw/internal/testfix"
)

// TestHashFixtures checks that the keys the sim publishes for a prompt are
// the recorded vLLM keys of testdata/kv_hash (the PYTHONHASHSEED
// "0" chains: block 0 then block 1 chained from it).
func TestHashFixtures(t *testing.T) {
	data, err := os.ReadFile(testfix.Path(t, "kv_hash/kv_hash_vectors.json"))
	if err != nil {
		t.Fatalf("read fixtures: %v", err)
	}
	var fx struct {
		Fixtures []struct {
			Name     string   `json:"name"`
			Algo     string   `json:"hash_algo"`
			Tokens   []uint32 `json:"tokens"`
			Expected uint64   `json:"expected_hash_uint64"`
		} `json:"fixtures"`
	}
	if err := json.Unmarshal(data, &fx); err != nil {
		t.Fatal(err)
	}
	byName := map[string]int{}
	for i, f := range fx.Fixtures {
		byName[f.Name] = i
	}
	for _, algo := range []string{"sha256_cbor", "xxhash_cbor"} {
		t.Run(algo, func(t *testing.T) {
			b0 := fx.Fixtures[byName[algo+"_block0_noneHashSeed0_parent_16tokens"]]
			b1 := fx.Fixtures[byName[algo+"_block1_chained_from_block0_noneHashSeed0"]]
			if b0.Name == "" || b1.Name == "" || !strings.HasPrefix(b1.Name, algo) {
				t.Fatalf("fixtures for %s not found", algo)
			}
			s := startSim(t, Config{Engine: engines.VLLM, KVEvents: KVEventsOff, HashAlgo: algo, HashSeed: "0"})
			keys := s.blockKeys(append(append([]uint32(nil), b0.Tokens...), b1.Tokens...))
			if len(keys) != 2 || keys[0] != b0.Expected || keys[1] != b1.Expected {
				t.Errorf("keys: got %v, want [%d %d]", keys, b0.Expected, b1.Expected)
			}
		})
	}
}
