package gateway

import (
	"encoding/json"
	"net/http"
	"strings"
	"testing"
)

// TestAdminNamedValues: a rule written with names (sel: chwbl, ep_role
// names) through the admin API reads back with the numbers and the names
// beside them, the read-back is accepted by PUT unchanged, and an unknown
// name is a 400 invalid_rule naming the nearest one.
func TestAdminNamedValues(t *testing.T) {
	gw := startGateway(t, "", nil)
	c := newClient(t)
	base := "http://" + gw.AdminAddr() + "/v1/rules"
	body := "name: named\nmodel_name: m\nsel: chwbl\nprobe: {disabled: true}\nendpoints:\n  - {id: w1, endpointIP: 127.0.0.1, targetPort: 9, ep_role: normal}\n"
	resp, out := post(t, c, base, body, "Content-Type", "application/yaml")
	if resp.StatusCode != http.StatusCreated {
		t.Fatalf("create: %d %s", resp.StatusCode, out)
	}
	var eff map[string]any
	if err := json.Unmarshal([]byte(out), &eff); err != nil {
		t.Fatal(err)
	}
	if eff["sel"] != float64(8) || eff["sel_name"] != "chwbl" || eff["kvExactModeName"] != "off" {
		t.Fatalf("read back sel %v sel_name %v kvExactModeName %v", eff["sel"], eff["sel_name"], eff["kvExactModeName"])
	}
	eps, _ := eff["endpoints"].([]any)
	if len(eps) != 1 || eps[0].(map[string]any)["ep_role_name"] != "normal" {
		t.Fatalf("endpoints read back %v", eff["endpoints"])
	}

	req, _ := http.NewRequest(http.MethodPut, base+"/named", strings.NewReader(out))
	req.Header.Set("Content-Type", "application/json")
	r2, err := c.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	r2.Body.Close()
	if r2.StatusCode != http.StatusOK {
		t.Fatalf("PUT of the read-back: %d", r2.StatusCode)
	}

	bad := strings.Replace(strings.Replace(body, "name: named", "name: typo", 1), "sel: chwbl", "sel: chwb", 1)
	resp, out = post(t, c, base, bad, "Content-Type", "application/yaml")
	if resp.StatusCode != http.StatusBadRequest || !strings.Contains(out, `"invalid_rule"`) || !strings.Contains(out, `did you mean \"chwbl\"?`) {
		t.Fatalf("unknown name: %d %s", resp.StatusCode, out)
	}
}
