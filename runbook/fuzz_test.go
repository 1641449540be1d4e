package runbook

import (
	"os"
	"path/filepath"
	"testing"
)

// FuzzReadLedger: a ledger file may be damaged or hand-edited; decoding
// never panics, and what decodes re-encodes to a loadable ledger.
func FuzzReadLedger(f *testing.F) {
	f.Add([]byte(`{"run_id":"r1","launcher":"docker","created":"2026-11-30T01:00:00Z","containers":["abc"],"rules":[{"admin":"http://127.0.0.1:8081","name":"rb-1","embedded":true}]}`))
	f.Add([]byte(`{"run_id":"r1","pids":[1,2],"dirs":["/tmp/x"]}`))
	f.Add([]byte(`{"run_id":"r1","unknown":1}`))
	f.Add([]byte(`not json`))
	f.Fuzz(func(t *testing.T, data []byte) {
		dir := t.TempDir()
		p := filepath.Join(dir, "r1.json")
		if err := os.WriteFile(p, data, 0o644); err != nil {
			t.Fatal(err)
		}
		st, err := readLedger(p)
		if err != nil {
			return
		}
		l := &Ledger{path: p, state: st}
		if err := l.Update(func(*LedgerState) {}); err != nil {
			t.Fatalf("re-encode: %v", err)
		}
		if _, err := readLedger(p); err != nil {
			t.Fatalf("re-encoded ledger does not load: %v", err)
		}
	})
}
