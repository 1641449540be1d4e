package engines_test

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/llmgw/llmgw/engines"
	_ "github.com/llmgw/llmgw/engines/all"
)

// TestEveryAdapterHasFixtures fails when a registered adapter lacks the
// fixture set its conformance suite replays. An engine's set lives in its
// package, engines/<kind>/testdata:
//
//	PROVENANCE   where every fixture came from: the capture of the real
//	             engine or the public source (repository, path, commit),
//	             and what could not be established
//	cases/       one or more case files (captures or source-derived cases)
//
// A fifth engine is not done until it has both.
func TestEveryAdapterHasFixtures(t *testing.T) {
	adapters := engines.Registered()
	if len(adapters) != len(engines.Kinds()) {
		t.Errorf("registered %d adapters, want one per kind (%d)", len(adapters), len(engines.Kinds()))
	}
	for _, a := range adapters {
		kind := string(a.Kind())
		t.Run(kind, func(t *testing.T) {
			dir := filepath.Join(kind, "testdata")
			prov, err := os.Stat(filepath.Join(dir, "PROVENANCE"))
			switch {
			case err != nil:
				t.Errorf("%s: no fixture provenance: %v", kind, err)
			case !prov.Mode().IsRegular() || prov.Size() == 0:
				t.Errorf("%s: %s/PROVENANCE must be a non-empty file", kind, dir)
			}
			entries, err := os.ReadDir(filepath.Join(dir, "cases"))
			if err != nil {
				t.Fatalf("%s: no fixture cases: %v", kind, err)
			}
			n := 0
			for _, e := range entries {
				if e.Type().IsRegular() {
					n++
				}
			}
			if n == 0 {
				t.Errorf("%s: %s/cases holds no case file", kind, dir)
			}
		})
	}
}
