package rule

import (
	"bytes"
	"encoding/json"
	"flag"
	"os"
	"path/filepath"
	"testing"
	"time"
)

var update = flag.Bool("update", false, "rewrite testdata/effective.golden.json")

// TestEffectiveGolden pins the effective form of every example under
// testdata. Run with -update after an intended change of defaults and review
// the diff.
func TestEffectiveGolden(t *testing.T) {
	got := make(map[string]*Rule)
	for _, file := range exampleFiles(t) {
		got[filepath.Base(file)] = mustDecodeFile(t, file).Effective()
	}
	got["minimal.json"] = mustDecode(t, minimalJSON).Effective()
	out, err := json.MarshalIndent(got, "", "  ")
	if err != nil {
		t.Fatal(err)
	}
	out = append(out, '\n')
	const golden = "testdata/effective.golden.json"
	if *update {
		if err := os.WriteFile(golden, out, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	want, err := os.ReadFile(golden)
	if err != nil {
		t.Fatalf("%v (run go test -run TestEffectiveGolden -update)", err)
	}
	if !bytes.Equal(out, want) {
		t.Errorf("effective rules differ from %s (run with -update to accept):\n got %s", golden, out)
	}
}

func mustDecode(t testing.TB, s string) *Rule {
	t.Helper()
	r, err := Decode([]byte(s))
	if err != nil {
		t.Fatalf("Decode: %v", err)
	}
	return r
}

func TestEffectiveDefaults(t *testing.T) {
	plain := plainRule().Effective()
	pd := pdRule().Effective()
	vllmPD := pdRule()
	vllmPD.KVEngineType = ""
	vpd := vllmPD.Effective()
	llama := plainRule()
	llama.KVEngineType = "llamacpp"
	shortProbe := plainRule()
	shortProbe.Probe.Interval = Duration(time.Second)
	tests := []struct {
		name      string
		got, want any
	}{
		{"mode", plain.Mode, ModeFullProxy},
		{"engine", plain.KVEngineType, "vllm"},
		{"vllm hash", plain.KVHashAlgo, "sha256_cbor"},
		{"sglang hash", pd.KVHashAlgo, "sha256_sglang"},
		{"trtllm hash", trtRule().Effective().KVHashAlgo, "blockhash_trtllm"},
		{"llamacpp no hash", llama.Effective().KVHashAlgo, ""},
		{"seed", *plain.KVHashSeed, "0"},
		{"block size", plain.KVBlockSize, 16},
		{"zmq port", plain.KVZmqPort, 5557},
		{"dp ranks", plain.KVDpRankCount, 1},
		{"sglang pd bootstrap", pd.PDBootstrapPort, 8998},
		{"vllm pd no bootstrap", vpd.PDBootstrapPort, 0},
		{"plain no bootstrap", plain.PDBootstrapPort, 0},
		{"cb enabled", *plain.CBEnable, true},
		{"cb failures", plain.CB.Failures, 5},
		{"pd cb failures", pd.CB.Failures, 3},
		{"cb open for", plain.CB.OpenFor.Std(), 30 * time.Second},
		{"cb trials", plain.CB.HalfOpenTrials, 3},
		{"cb origin 5xx", plain.CB.Origin5xx, 3},
		{"chwbl load factor", plain.CHWBL.LoadFactor, 1.25},
		{"chwbl replicas", plain.CHWBL.Replicas, 160},
		{"chwbl prefix", plain.CHWBL.PrefixBytes, 2048},
		{"probe path", plain.Probe.Path, "/health"},
		{"probe interval", plain.Probe.Interval.Std(), 5 * time.Second},
		{"probe timeout", plain.Probe.Timeout.Std(), 2 * time.Second},
		{"probe timeout capped by interval", shortProbe.Effective().Probe.Timeout.Std(), time.Second},
		{"probe failures", plain.Probe.Failures, 2},
		{"probe successes", plain.Probe.Successes, 1},
		{"connect", plain.Timeouts.Connect.Std(), 2 * time.Second},
		{"first byte", plain.Timeouts.FirstByte.Std(), 60 * time.Second},
		{"idle", plain.Timeouts.Idle.Std(), 120 * time.Second},
		{"prefill", plain.Timeouts.Prefill.Std(), 30 * time.Second},
		{"session ttl", plain.SessionTTL.Std(), time.Hour},
		{"endpoint id", plain.Endpoints[0].ID, "127.0.0.1:8001"},
		{"ipv6 endpoint id", EndpointID("::1", 80), "[::1]:80"},
		{"weight", *plain.Endpoints[0].Weight, 1},
		{"nixl_port has no default (an endpoint without one is named by its targetPort)", plain.Endpoints[1].NixlPort, 0},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if tc.got != tc.want {
				t.Errorf("got %v, want %v", tc.got, tc.want)
			}
		})
	}
}

func TestEffectiveKeepsExplicitValues(t *testing.T) {
	r := mustDecodeFile(t, "testdata/trtllm-pd.json")
	e := r.Effective()
	if *e.CBEnable {
		t.Errorf("cb_enable: got true, want the explicit false")
	}
	if e.CB.Origin5xx != -1 || e.CB.Failures != 4 || e.CB.OpenFor.Std() != 10*time.Second {
		t.Errorf("cb: got %+v, want failures 4, open_for 10s, origin_5xx -1", e.CB)
	}
	if *e.Endpoints[1].Weight != 3 || e.KVBlockSize != 32 {
		t.Errorf("got weight %d block size %d, want 3 and 32", *e.Endpoints[1].Weight, e.KVBlockSize)
	}
}

func TestEffectiveIdempotentAndCopies(t *testing.T) {
	for _, file := range exampleFiles(t) {
		t.Run(filepath.Base(file), func(t *testing.T) {
			r := mustDecodeFile(t, file)
			before := r.Clone()
			e := r.Effective()
			if !equalRules(r, before) {
				t.Fatalf("Effective modified its receiver")
			}
			if ee := e.Effective(); !equalRules(ee, e) {
				t.Errorf("Effective not idempotent:\n got %+v\nwant %+v", ee, e)
			}
			// The copy is deep: writing through its pointers and slices
			// must not reach the original.
			*e.KVHashSeed = "changed"
			*e.CBEnable = !*e.CBEnable
			*e.Endpoints[0].Weight = 999
			e.Endpoints[0].ID = "changed"
			if !equalRules(r, before) {
				t.Errorf("mutating Effective() changed the original")
			}
		})
	}
	var nilRule *Rule
	if nilRule.Effective() != nil || nilRule.Clone() != nil {
		t.Errorf("nil rule: got non-nil Effective or Clone")
	}
}
