package llamacpp

import (
	"testing"

	"github.com/llmgw/llmgw/engines"
)

// propsCapture is GET /props of a real llama-server (build b0-unknown,
// run as: llama-server -m tiny-llama.gguf -c 4096 -np 2 -t 1 --alias
// Qwen/Qwen3-0.6B), captured 2026-12-01 and trimmed to the fields the
// Describer reads plus their neighbours.
const propsCapture = `{"default_generation_settings":{"id":0,"id_task":-1,"n_ctx":2048,"speculative":false,"is_processing":false,"non_causal":false,"params":{"n_predict":-1,"seed":4294967295}},"total_slots":2,"model_path":"/work/models/tiny-llama.gguf","bos_token":"<s>","eos_token":"</s>","build_info":"b0-unknown"}`

func TestDescribeProps(t *testing.T) {
	var d engines.Description
	if err := (Adapter{}).Describe("/props", []byte(propsCapture), &d); err != nil {
		t.Fatal(err)
	}
	if d.ContextLength != 2048 || d.Slots != 2 || d.Role != engines.RoleConverged || !d.EventsOff {
		t.Errorf("description = %+v; want n_ctx 2048 per slot, 2 slots, converged, no events", d)
	}
	for _, bad := range []string{`{}`, `[]`, `{"build_info":`, `{"default_generation_settings":"x"}`} {
		if err := (Adapter{}).Describe("/props", []byte(bad), &engines.Description{}); err == nil {
			t.Errorf("Describe(%s) accepted a body that is not llama-server's /props", bad)
		}
	}
	if v, err := (Adapter{}).ParseVersion([]byte(propsCapture)); err != nil || v != "b0-unknown" {
		t.Errorf("version = %q %v", v, err)
	}
}

func TestParseTokens(t *testing.T) {
	// POST /tokenize {"content":"hello world"} on the same server.
	ids, err := Adapter{}.ParseTokens([]byte(`{"tokens":[22172,3186]}`))
	if err != nil || len(ids) != 2 || ids[0] != 22172 {
		t.Errorf("tokens = %v %v", ids, err)
	}
	if _, err := (Adapter{}).ParseTokens([]byte(`{"error":{}}`)); err == nil {
		t.Error("an answer without tokens was accepted")
	}
}

func FuzzDescribe(f *testing.F) {
	f.Add([]byte(propsCapture))
	f.Add([]byte(`{"default_generation_settings":{"n_ctx":-1},"total_slots":-3}`))
	f.Fuzz(func(t *testing.T, b []byte) {
		var d engines.Description
		if err := (Adapter{}).Describe("/props", b, &d); err == nil && (d.ContextLength < 0 || d.Slots < 0) {
			t.Fatalf("negative facts accepted: %+v", d)
		}
		_, _ = Adapter{}.ParseTokens(b)
	})
}
