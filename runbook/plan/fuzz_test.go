package plan

import "testing"

// FuzzReadJSON: a plan file is user input (runbook --plan); it must be
// refused or read, never panic.
func FuzzReadJSON(f *testing.F) {
	f.Add([]byte(`{"engine":"vllm","topology":"converged","answers":[{"key":"engine","status":"known","value":"vllm"}],"stages":[{"n":1,"rule":{"name":"plan","sel":0,"endpoints":[{"endpointIP":"127.0.0.1","targetPort":1}]}}]}`))
	f.Add([]byte(`{"topology":"pd","answers":[{}],"stages":[{"rule":null}]}`))
	f.Fuzz(func(t *testing.T, b []byte) {
		p, err := ReadJSON(b)
		if err == nil && (p.Topology == "" || len(p.Answers) == 0) {
			t.Fatalf("accepted a plan without topology or answers: %+v", p)
		}
	})
}
