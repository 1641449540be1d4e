package kvhash

import (
	"bytes"
	"encoding/hex"
	"encoding/json"
	"os"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/llmgw/llmgw/internal/testfix"
)

type vectorFile struct {
	NoneHashSeed      string        `json:"none_hash_seed"`
	NoneHashSHA256Hex string        `json:"none_hash_sha256_hex"`
	NoneHashXXHashHex string        `json:"none_hash_xxhash_hex"`
	BlockSize         int           `json:"block_size"`
	Fixtures          []hashFixture `json:"fixtures"`
	Models            map[string]struct {
		NoneHashSeed string        `json:"none_hash_seed"`
		BlockSize    int           `json:"block_size"`
		Fixtures     []hashFixture `json:"fixtures"`
	} `json:"models"`
}

type hashFixture struct {
	Name              string   `json:"name"`
	HashAlgo          string   `json:"hash_algo"`
	ParentHashHex     string   `json:"parent_hash_hex"`
	Tokens            []uint32 `json:"tokens"`
	CBORHex           string   `json:"cbor_hex"`
	ExpectedDigestHex string   `json:"expected_digest_hex"`
	ExpectedHash      uint64   `json:"expected_hash_uint64"`
}

func loadVectors(t *testing.T) vectorFile {
	t.Helper()
	raw, err := os.ReadFile(testfix.Path(t, "kv_hash/kv_hash_vectors.json"))
	if err != nil {
		t.Fatalf("read vectors: %v", err)
	}
	var vf vectorFile
	if err := json.Unmarshal(raw, &vf); err != nil {
		t.Fatalf("parse vectors: %v", err)
	}
	if len(vf.Fixtures) == 0 {
		t.Fatal("vector file has no fixtures")
	}
	return vf
}

func mustHex(t *testing.T, s string) []byte {
	t.Helper()
	b, err := hex.DecodeString(s)
	if err != nil {
		t.Fatalf("bad hex %q: %v", s, err)
	}
	return b
}

// TestFixtureVectors checks every per-block vector of kv_hash_vectors.json:
// CBOR bytes, full digest and the published 64-bit key.
func TestFixtureVectors(t *testing.T) {
	vf := loadVectors(t)
	all := slices.Clone(vf.Fixtures)
	for _, m := range vf.Models {
		all = append(all, m.Fixtures...)
	}
	if got, want := len(all), 12; got != want {
		t.Fatalf("got %d fixtures, want %d (file changed?)", got, want)
	}
	for _, tc := range all {
		t.Run(tc.Name, func(t *testing.T) {
			algo, err := ParseAlgo(tc.HashAlgo)
			if err != nil {
				t.Fatalf("ParseAlgo: %v", err)
			}
			parent := mustHex(t, tc.ParentHashHex)
			if tc.CBORHex != "" {
				got := hex.EncodeToString(VLLMBlockCBOR(nil, parent, tc.Tokens))
				if got != tc.CBORHex {
					t.Errorf("cbor:\n got %s\nwant %s", got, tc.CBORHex)
				}
			}
			digest, err := VLLMBlockHash(algo, parent, tc.Tokens)
			if err != nil {
				t.Fatalf("VLLMBlockHash: %v", err)
			}
			if got := hex.EncodeToString(digest); got != tc.ExpectedDigestHex {
				t.Errorf("digest: got %s, want %s", got, tc.ExpectedDigestHex)
			}
			if got := KeyFromDigest(algo, digest); got != tc.ExpectedHash {
				t.Errorf("key: got %d, want %d", got, tc.ExpectedHash)
			}
		})
	}
}

// TestFixtureChains runs the fixture blocks through a Hasher end to end: the
// seeded root, chaining on the full digest, and the zero root of an unset seed.
func TestFixtureChains(t *testing.T) {
	vf := loadVectors(t)
	byName := map[string]hashFixture{}
	for _, f := range vf.Fixtures {
		byName[f.Name] = f
	}
	qwen := vf.Models["Qwen/Qwen2.5-7B-Instruct"]
	for _, f := range qwen.Fixtures {
		byName[f.Name] = f
	}
	cases := []struct {
		name   string
		algo   Algo
		seed   string
		blocks []string
	}{
		{"sha256_zero_root", SHA256CBOR, "", []string{"sha256_cbor_block0_zeros_parent_16tokens", "sha256_cbor_block1_chained_from_block0"}},
		{"xxhash_zero_root", XXHashCBOR, "", []string{"xxhash_cbor_block0_zeros_parent_16tokens", "xxhash_cbor_block1_chained_from_block0"}},
		{"sha256_seed0", SHA256CBOR, vf.NoneHashSeed, []string{"sha256_cbor_block0_noneHashSeed0_parent_16tokens", "sha256_cbor_block1_chained_from_block0_noneHashSeed0"}},
		{"xxhash_seed0", XXHashCBOR, vf.NoneHashSeed, []string{"xxhash_cbor_block0_noneHashSeed0_parent_16tokens", "xxhash_cbor_block1_chained_from_block0_noneHashSeed0"}},
		{"sha256_seed0_qwen", SHA256CBOR, qwen.NoneHashSeed, []string{"sha256_cbor_block0_noneHashSeed0_qwen25_7b", "sha256_cbor_block1_chained_from_block0_qwen25_7b"}},
		{"xxhash_seed0_qwen", XXHashCBOR, qwen.NoneHashSeed, []string{"xxhash_cbor_block0_noneHashSeed0_qwen25_7b", "xxhash_cbor_block1_chained_from_block0_qwen25_7b"}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			h, err := New(tc.algo, vf.BlockSize, tc.seed)
			if err != nil {
				t.Fatalf("New: %v", err)
			}
			var tokens []uint32
			var want []uint64
			for _, name := range tc.blocks {
				f, ok := byName[name]
				if !ok {
					t.Fatalf("fixture %q missing", name)
				}
				tokens = append(tokens, f.Tokens...)
				want = append(want, f.ExpectedHash)
			}
			// A trailing partial block must not produce a key.
			tokens = append(tokens, 7, 8, 9)
			if got := h.BlockKeys(nil, tokens); !slices.Equal(got, want) {
				t.Errorf("BlockKeys: got %v, want %v", got, want)
			}
			first := byName[tc.blocks[0]]
			if got, want := hex.EncodeToString(NoneHash(tc.algo, tc.seed)), first.ParentHashHex; got != want {
				t.Errorf("NoneHash: got %s, want %s", got, want)
			}
		})
	}
}

func TestNoneHash(t *testing.T) {
	cases := []struct {
		name string
		algo Algo
		seed string
		want string
	}{
		{"sha256_seed0", SHA256CBOR, "0", "4e1195df020de59e0d65a33a4279f1183e7ae4e5d980e309f8b55adff2e61c3e"},
		{"xxhash_seed0", XXHashCBOR, "0", "1ebe36576dcb573f26b99533a20aaeca"},
		{"sha256_unset", SHA256CBOR, "", strings.Repeat("00", 32)},
		{"xxhash_unset", XXHashCBOR, "", strings.Repeat("00", 16)},
		{"sha256_too_long", SHA256CBOR, strings.Repeat("1", 24), strings.Repeat("00", 32)},
		{"sglang_has_no_root", SHA256SGLang, "0", ""},
		{"trtllm_has_no_root", BlockHashTRTLLM, "0", ""},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			if got := hex.EncodeToString(NoneHash(tc.algo, tc.seed)); got != tc.want {
				t.Errorf("got %s, want %s", got, tc.want)
			}
		})
	}
	// The longest accepted seed must be hashed, not zeroed.
	if bytes.Equal(NoneHash(SHA256CBOR, strings.Repeat("1", 23)), make([]byte, 32)) {
		t.Error("23-byte seed: got zero root, want a hashed root")
	}
}

// TestSpecWorkedExamples checks the vLLM examples of engine-contracts §1.6.
func TestSpecWorkedExamples(t *testing.T) {
	seq := func(from, to uint32) []uint32 {
		var out []uint32
		for i := from; i <= to; i++ {
			out = append(out, i)
		}
		return out
	}
	cases := []struct {
		name      string
		algo      Algo
		blockSize int
		tokens    []uint32
		want      []uint64
	}{
		{"sha256_bs4", SHA256CBOR, 4, seq(1, 8), []uint64{2164874634404590027, 17270480062156288726}},
		{"sha256_bs16", SHA256CBOR, 16, seq(1, 32), []uint64{3236607068019569386, 2758186210834249151}},
		{"xxhash_bs16", XXHashCBOR, 16, seq(1, 32), []uint64{882618318818381833, 12890060145260523405}},
		{"sha256_large_ids", SHA256CBOR, 4, []uint32{151644, 24, 255, 65536}, nil},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			h, err := New(tc.algo, tc.blockSize, "0")
			if err != nil {
				t.Fatalf("New: %v", err)
			}
			got := h.BlockKeys(nil, tc.tokens)
			if tc.want == nil {
				// No published vector: cross-check BlockKeys against the
				// one-block reference path instead.
				d, err := VLLMBlockHash(tc.algo, NoneHash(tc.algo, "0"), tc.tokens)
				if err != nil {
					t.Fatalf("VLLMBlockHash: %v", err)
				}
				tc.want = []uint64{KeyFromDigest(tc.algo, d)}
			}
			if !slices.Equal(got, tc.want) {
				t.Errorf("got %v, want %v", got, tc.want)
			}
		})
	}
	// CBOR widths for ids ≥ 24 (spec: 151644 → 1a 0002505c).
	got := hex.EncodeToString(VLLMBlockCBOR(nil, []byte{0xaa}, []uint32{23, 24, 255, 256, 65535, 65536, 151644}))
	want := "8341aa87" + "17" + "1818" + "18ff" + "190100" + "19ffff" + "1a00010000" + "1a0002505c" + "f6"
	if got != want {
		t.Errorf("cbor widths: got %s, want %s", got, want)
	}
}

// TestSGLangVectors checks the SGLang parity vectors of gateway-reference
// §9.2 (five vectors, three of them a single partial page).
func TestSGLangVectors(t *testing.T) {
	seq := func(from, to uint32) []uint32 {
		var out []uint32
		for i := from; i <= to; i++ {
			out = append(out, i)
		}
		return out
	}
	cases := []struct {
		name      string
		blockSize int
		tokens    []uint32
		want      []int64 // as SGLang publishes them
	}{
		{"single_block_bs16_noparent", 16, seq(1, 7), []int64{0x4c816952ba53cc36}},
		{"chain3_bs16", 16, seq(1, 48), []int64{8635429971592222890, 1256577331724852459, 5689809685380680247}},
		{"le_teeth_bs16", 16, []uint32{65537, 2147483646, 2147483647, 2147483648, 4294967295}, []int64{4839613804615831846}},
		{"negative_int64_bs16", 16, []uint32{0}, []int64{-2360060374177730597}},
		{"chain2_bs32", 32, seq(100000, 100063), []int64{476924988540955187, -5051416816229475950}},
		{"spec_bs4", 4, seq(1, 8), []int64{-3488128144981237669, 5674439469042975057}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			// Page by page, as SGLang emits them (the last page may be partial).
			var prior []byte
			var pages []int64
			for off := 0; off < len(tc.tokens); off += tc.blockSize {
				end := min(off+tc.blockSize, len(tc.tokens))
				d := SGLangPageHash(prior, tc.tokens[off:end])
				pages = append(pages, SGLangKey(d))
				prior = d[:]
			}
			if !slices.Equal(pages, tc.want) {
				t.Errorf("SGLangPageHash chain: got %v, want %v", pages, tc.want)
			}
			// Full blocks through the Hasher, for both algorithms bound to
			// this chain.
			nFull := len(tc.tokens) / tc.blockSize
			wantKeys := make([]uint64, nFull)
			for i := range nFull {
				wantKeys[i] = uint64(tc.want[i])
			}
			for _, algo := range []Algo{SHA256SGLang, BlockHashTRTLLM} {
				h, err := New(algo, tc.blockSize, "ignored")
				if err != nil {
					t.Fatalf("New(%s): %v", algo, err)
				}
				if got := h.BlockKeys(nil, tc.tokens); !slices.Equal(got, wantKeys) {
					t.Errorf("%s BlockKeys: got %v, want %v", algo, got, wantKeys)
				}
			}
		})
	}
}

func TestTRTLLMBlockKey(t *testing.T) {
	first := TRTLLMBlockKey(0, []uint32{1, 2, 3, 4})
	cases := []struct {
		name   string
		parent uint64
		tokens []uint32
		extras TRTKeyExtras
		want   uint64
	}{
		{"first_block", 0, []uint32{1, 2, 3, 4}, TRTKeyExtras{}, 924206229973855},
		{"chained", first, []uint32{5, 6}, TRTKeyExtras{}, 6875034662206558884},
		{"lora_123", 0, []uint32{1, 2, 3, 4}, TRTKeyExtras{LoraTaskID: 123}, 15718075209399076427},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			if got := TRTLLMBlockKeyWith(tc.parent, tc.tokens, tc.extras); got != tc.want {
				t.Errorf("got %d, want %d", got, tc.want)
			}
		})
	}
	if got := TRTLLMBlockKey(0, []uint32{1, 2, 3, 4}); got != 924206229973855 {
		t.Errorf("TRTLLMBlockKey: got %d, want 924206229973855", got)
	}
	// Extras must change the key (they are part of TRT's block identity).
	base := TRTLLMBlockKey(0, []uint32{1, 2, 3, 4})
	for _, x := range []TRTKeyExtras{{CacheSaltID: 9}, {TokenExtraIDs: []uint64{}}, {TokenExtraIDs: []uint64{0, 0, 0, 7}}} {
		if TRTLLMBlockKeyWith(0, []uint32{1, 2, 3, 4}, x) == base {
			t.Errorf("extras %+v: key unchanged", x)
		}
	}
}

func TestParseAlgoAndNew(t *testing.T) {
	cases := []struct {
		name      string
		algo      string
		blockSize int
		wantErr   string
	}{
		{"sha256_cbor", "sha256_cbor", 16, ""},
		{"xxhash_cbor", "xxhash_cbor", 16, ""},
		{"sha256_sglang", "sha256_sglang", 1, ""},
		{"blockhash_trtllm", "blockhash_trtllm", 32, ""},
		{"unknown_algo", "sha256", 16, "valid algorithms are sha256_cbor, xxhash_cbor, sha256_sglang, blockhash_trtllm"},
		{"zero_block", "sha256_cbor", 0, "block size 0 out of range"},
		{"huge_block", "sha256_sglang", MaxBlockSize + 1, "out of range"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			_, err := New(Algo(tc.algo), tc.blockSize, "0")
			if tc.wantErr == "" {
				if err != nil {
					t.Fatalf("New: got error %v, want nil", err)
				}
				if _, err := ParseAlgo(tc.algo); err != nil {
					t.Fatalf("ParseAlgo: got error %v, want nil", err)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
				t.Fatalf("got error %v, want one containing %q", err, tc.wantErr)
			}
		})
	}
}

// TestLargeBlocks exercises the pooled scratch path (blocks too large for the
// stack buffer) against the single-block reference functions.
func TestLargeBlocks(t *testing.T) {
	const bs = 1024
	tokens := make([]uint32, 2*bs+5)
	for i := range tokens {
		tokens[i] = uint32(i*7919 + 1)
	}
	for _, algo := range []Algo{SHA256CBOR, XXHashCBOR, SHA256SGLang} {
		t.Run(string(algo), func(t *testing.T) {
			h, err := New(algo, bs, "42")
			if err != nil {
				t.Fatalf("New: %v", err)
			}
			var want []uint64
			parent := NoneHash(algo, "42")
			for i := range 2 {
				block := tokens[i*bs : (i+1)*bs]
				if algo == SHA256SGLang {
					d := SGLangPageHash(parent, block)
					parent = d[:]
				} else {
					parent, err = VLLMBlockHash(algo, parent, block)
					if err != nil {
						t.Fatalf("VLLMBlockHash: %v", err)
					}
				}
				want = append(want, KeyFromDigest(algo, parent))
			}
			if got := h.BlockKeys(nil, tokens); !slices.Equal(got, want) {
				t.Errorf("got %v, want %v", got, want)
			}
		})
	}
}

func TestBlockKeysAppendsAndAllocs(t *testing.T) {
	tokens := make([]uint32, 16*64)
	for i := range tokens {
		tokens[i] = uint32(i)
	}
	for _, algo := range Algos() {
		t.Run(string(algo), func(t *testing.T) {
			h, err := New(algo, 16, "0")
			if err != nil {
				t.Fatalf("New: %v", err)
			}
			prefix := []uint64{1, 2}
			got := h.BlockKeys(slices.Clone(prefix), tokens)
			if len(got) != 66 || got[0] != 1 || got[1] != 2 {
				t.Fatalf("got len %d prefix %v, want 66 keys after the 2-element prefix", len(got), got[:2])
			}
			dst := make([]uint64, 0, 64)
			if n := testing.AllocsPerRun(20, func() { dst = h.BlockKeys(dst[:0], tokens) }); n != 0 {
				t.Errorf("allocs per BlockKeys with room in dst: got %v, want 0", n)
			}
		})
	}
}

// TestConcurrentUse shares one Hasher between goroutines; run with -race.
func TestConcurrentUse(t *testing.T) {
	tokens := make([]uint32, 16*8)
	for i := range tokens {
		tokens[i] = uint32(i * 3)
	}
	for _, algo := range Algos() {
		h, err := New(algo, 16, "0")
		if err != nil {
			t.Fatalf("New: %v", err)
		}
		want := h.BlockKeys(nil, tokens)
		var wg sync.WaitGroup
		errs := make(chan string, 8)
		for range 8 {
			wg.Go(func() {
				for range 50 {
					if got := h.BlockKeys(nil, tokens); !slices.Equal(got, want) {
						errs <- string(algo)
						return
					}
				}
			})
		}
		wg.Wait()
		close(errs)
		for a := range errs {
			t.Errorf("%s: concurrent BlockKeys disagreed with the sequential result", a)
		}
	}
}

func BenchmarkBlockKeys2048x16(b *testing.B) {
	tokens := make([]uint32, 2048*16)
	for i := range tokens {
		tokens[i] = uint32(i*2654435761) % 151936
	}
	for _, algo := range Algos() {
		b.Run(string(algo), func(b *testing.B) {
			h, err := New(algo, 16, "0")
			if err != nil {
				b.Fatalf("New: %v", err)
			}
			dst := make([]uint64, 0, 2048)
			b.SetBytes(int64(len(tokens) * 4))
			b.ReportAllocs()
			for b.Loop() {
				dst = h.BlockKeys(dst[:0], tokens)
			}
		})
	}
}

func BenchmarkTRTLLMBlockKey(b *testing.B) {
	tokens := make([]uint32, 32)
	for i := range tokens {
		tokens[i] = uint32(i * 31)
	}
	var k uint64
	for b.Loop() {
		k = TRTLLMBlockKey(k, tokens)
	}
}
