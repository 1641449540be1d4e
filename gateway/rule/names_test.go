package rule

import (
	"encoding/json"
	"strings"
	"testing"
)

// TestNamedValues: sel, kvExactMode and ep_role take a number, a quoted
// number or a name; they read back as the number with the name beside it,
// and the read-back is admitted again unchanged. Unknown names are refused
// with the nearest name.
func TestNamedValues(t *testing.T) {
	cases := []struct {
		name    string
		yaml    string
		sel     Sel
		mode    KVExactMode
		role    EPRole
		wantErr string
	}{
		{"names", "sel: chwbl\nkvExactMode: single_pool\n", SelCHWBL, KVExactSinglePool, RoleNormal, ""},
		{"numbers", "sel: 10\nkvExactMode: 3\n", SelWeightedCHWBL, KVExactSinglePool, RoleNormal, ""},
		{"quoted number", "sel: \"8\"\n", SelCHWBL, KVExactOff, RoleNormal, ""},
		{"every sel name", "sel: least_inflight\n", SelLeastInFlight, KVExactOff, RoleNormal, ""},
		{"unknown sel name", "sel: chwb\n", 0, 0, 0, `sel: unknown name "chwb"; did you mean "chwbl"?`},
		{"unknown mode name", "kvExactMode: singlepool\n", 0, 0, 0, `kvExactMode: unknown name "singlepool"; did you mean "single_pool"?`},
		{"fraction", "sel: 8.5\n", 0, 0, 0, "want integer"},
		{"boolean", "sel: true\n", 0, 0, 0, "sel"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			y := "name: r1\nmodel_name: m\n" + tc.yaml + "endpoints:\n  - {endpointIP: 127.0.0.1, targetPort: 8000}\n"
			r, err := Decode([]byte(y))
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("err = %v; want it to contain %q", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if r.Sel != tc.sel || r.KVExactMode != tc.mode || r.Endpoints[0].EPRole != tc.role {
				t.Fatalf("decoded sel %d mode %d role %d", r.Sel, r.KVExactMode, r.Endpoints[0].EPRole)
			}
			b, err := json.Marshal(r.Effective())
			if err != nil {
				t.Fatal(err)
			}
			var back map[string]any
			if err := json.Unmarshal(b, &back); err != nil {
				t.Fatal(err)
			}
			if back["sel"] != float64(tc.sel) || back["sel_name"] != tc.sel.Name() {
				t.Fatalf("read back sel %v sel_name %v; want %d %q", back["sel"], back["sel_name"], tc.sel, tc.sel.Name())
			}
			again, err := Decode(b)
			if err != nil {
				t.Fatalf("the read-back does not decode: %v", err)
			}
			if err := checkReadBackNames(again); err != nil {
				t.Fatalf("the read-back's names are refused: %v", err)
			}
		})
	}
	t.Run("roles", func(t *testing.T) {
		r, err := Decode([]byte("name: r1\nmodel_name: m\npd_disagg_mode: true\nendpoints:\n  - {endpointIP: 127.0.0.1, targetPort: 8000, ep_role: prefill}\n  - {endpointIP: 127.0.0.1, targetPort: 8001, ep_role: decode}\n"))
		if err != nil {
			t.Fatal(err)
		}
		e := r.Effective()
		if e.Endpoints[0].EPRole != RolePrefill || e.Endpoints[1].EPRole != RoleDecode || e.Endpoints[1].EPRoleName != "decode" {
			t.Fatalf("roles %+v", e.Endpoints)
		}
	})
}

// FuzzDecodeNamed: the named-value decoder never panics and accepts
// exactly the names, integers and quoted integers.
func FuzzDecodeNamed(f *testing.F) {
	for _, s := range []string{`8`, `"chwbl"`, `"8"`, `"x"`, `8.5`, `null`, `"\u0063hwbl"`} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		var s Sel
		if err := s.UnmarshalJSON(b); err == nil && s.Name() == "" && len(b) > 0 && b[0] == '"' {
			var str string
			if json.Unmarshal(b, &str) != nil {
				t.Fatalf("accepted %q, which is not a JSON string", b)
			}
		}
	})
}
