package sglang

import (
	"testing"

	"github.com/llmgw/llmgw/engines/adaptertest"
)

// TestAdapterFacts checks every fact the adapter states against
// testdata/adapter.json and testdata/cases/metrics.json, which cite SGLang's
// source.
func TestAdapterFacts(t *testing.T) { adaptertest.Check(t, &Adapter{}) }
