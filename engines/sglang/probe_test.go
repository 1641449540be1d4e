package sglang

import (
	"testing"

	"github.com/llmgw/llmgw/engines"
)

// serverInfo carries the fields of SGLang's /get_server_info the Describer
// reads, with kv_events_config as the JSON string ServerArgs holds.
// Constructed from the source (python/sglang/srt/server_args.py), not
// captured from a running server.
const serverInfo = `{"model_path":"Qwen/Qwen3-0.6B","page_size":16,"disaggregation_mode":"prefill","disaggregation_bootstrap_port":8998,"kv_events_config":"{\"publisher\":\"zmq\",\"endpoint\":\"tcp://*:5557\"}","context_length":4096,"version":"0.5.19"}`

func TestDescribe(t *testing.T) {
	a := &Adapter{}
	var d engines.Description
	if err := a.Describe("/get_server_info", []byte(serverInfo), &d); err != nil {
		t.Fatal(err)
	}
	if d.BlockSize != 16 || d.Role != engines.RolePrefill || d.BootstrapPort != 8998 || d.Events != "tcp://*:5557" || d.ContextLength != 4096 {
		t.Errorf("description = %+v", d)
	}
	cases := []struct {
		name, body string
		role       engines.Role
		boot       int
		off        bool
	}{
		{"converged, events off", `{"page_size":16,"disaggregation_mode":"null","disaggregation_bootstrap_port":8998,"kv_events_config":null,"version":"0.5.19"}`, engines.RoleConverged, 0, true},
		{"decode, object config", `{"page_size":16,"disaggregation_mode":"decode","disaggregation_bootstrap_port":8998,"kv_events_config":{"publisher":"zmq","endpoint":"tcp://10.0.0.2:5557","replay_endpoint":"tcp://10.0.0.2:6557"},"version":"0.5.19"}`, engines.RoleDecode, 0, false},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			var d engines.Description
			if err := a.Describe("/get_server_info", []byte(tc.body), &d); err != nil {
				t.Fatal(err)
			}
			if d.Role != tc.role || d.BootstrapPort != tc.boot || d.EventsOff != tc.off {
				t.Errorf("description = %+v", d)
			}
		})
	}
	for _, bad := range []string{`{}`, `{"version":"1","disaggregation_mode":"both"}`, `{"version":"1","kv_events_config":"{bad"}`} {
		if err := a.Describe("/get_server_info", []byte(bad), &engines.Description{}); err == nil {
			t.Errorf("Describe(%s) accepted", bad)
		}
	}
}

func FuzzDescribe(f *testing.F) {
	f.Add([]byte(serverInfo))
	f.Add([]byte(`{"version":"x","page_size":-1,"disaggregation_mode":"prefill","disaggregation_bootstrap_port":70000}`))
	f.Fuzz(func(t *testing.T, b []byte) {
		var d engines.Description
		if err := (&Adapter{}).Describe("/get_server_info", b, &d); err == nil {
			if d.BlockSize < 0 || d.BootstrapPort < 0 || d.BootstrapPort > 65535 {
				t.Fatalf("out-of-range facts accepted: %+v", d)
			}
		}
	})
}
