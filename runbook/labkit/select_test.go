package labkit

import (
	"encoding/json"
	"testing"

	"github.com/llmgw/llmgw/profiles"
	"github.com/llmgw/llmgw/runbook"
)

type namedLauncher struct{}

func (namedLauncher) Name() string    { return "sim" }
func (namedLauncher) Simulated() bool { return true }

func TestSelect(t *testing.T) {
	c, err := LoadCatalog(nil)
	if err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		name       string
		engine     string
		profile    string
		wantOK     bool
		wantStatus string
		wantCode   string
		wantFiles  []string
	}{
		{name: "vllm qwen", engine: profiles.EngineVLLM, profile: "qwen3-0.6b", wantOK: true},
		{name: "unknown profile", engine: profiles.EngineVLLM, profile: "no-such-model", wantStatus: "FAIL", wantCode: "UNKNOWN_PROFILE"},
		{name: "known-blocked tuple", engine: profiles.EngineTRTLLM, profile: "exaone-3.5-7.8b-instruct", wantStatus: "BLOCKED", wantCode: "architecture_unsupported", wantFiles: []string{"tuple.json"}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			r := &runbook.Run{ID: "20261130T010203Z-x-abc123"}
			sel, fail, ok := Select(r, c, Tuple{Engine: tc.engine, Profile: tc.profile, Topology: "converged", Launcher: namedLauncher{},
				Workers: 2, KVEvents: true, Extra: map[string]any{"mode": "exact"}})
			if ok != tc.wantOK {
				t.Fatalf("ok = %v, want %v (outcome %+v)", ok, tc.wantOK, fail)
			}
			if !ok {
				if string(fail.Status) != tc.wantStatus || fail.Code != tc.wantCode {
					t.Errorf("outcome %s %s, want %s %s", fail.Status, fail.Code, tc.wantStatus, tc.wantCode)
				}
				var files []string
				for _, e := range fail.Evidence {
					files = append(files, e.Name)
				}
				if len(files) != len(tc.wantFiles) || (len(files) > 0 && files[0] != tc.wantFiles[0]) {
					t.Errorf("evidence %v, want %v", files, tc.wantFiles)
				}
				return
			}
			sp := sel.Spec
			if sp.RunID != r.ID || sp.Workers != 2 || !sp.KVEvents || sp.Model != sel.Profile.Model.ServedName || sp.BlockSize == 0 || sp.EventEncoding != EventEncoding(tc.engine) {
				t.Errorf("launch spec %+v", sp)
			}
			b, err := json.Marshal(sel.Info)
			if err != nil {
				t.Fatal(err)
			}
			var info map[string]any
			_ = json.Unmarshal(b, &info)
			for _, k := range []string{"engine", "engine_version", "profile", "served_name", "topology", "launcher", "kv_hash_seed", "block_size", "hash_algo", "mode"} {
				if _, ok := info[k]; !ok {
					t.Errorf("tuple.json lacks %q: %s", k, b)
				}
			}
		})
	}
}
