package adminclient_test

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"net"
	"net/http"
	"strconv"
	"testing"

	"github.com/llmgw/llmgw/gateway"
	"github.com/llmgw/llmgw/gateway/adminclient"
)

// startGateway runs a real gateway whose admin API requires token on
// mutating calls.
func startGateway(t *testing.T, token string) string {
	t.Helper()
	gw, err := gateway.New(gateway.Config{Listen: "127.0.0.1:0", Admin: "127.0.0.1:0", StateDir: t.TempDir(), AdminToken: token,
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	if err := gw.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { gw.Close() })
	return "http://" + gw.AdminAddr() + "/"
}

func ruleJSON(t *testing.T, name string, port int) []byte {
	t.Helper()
	b, err := json.Marshal(map[string]any{
		"name": name, "model_name": "m-" + name, "probe": map[string]any{"disabled": true},
		"endpoints": []map[string]any{{"id": "w1", "endpointIP": "127.0.0.1", "targetPort": port}},
	})
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// TestClientAgainstAGateway drives every call of the client against a real
// gateway and checks the answers and the error classification.
func TestClientAgainstAGateway(t *testing.T) {
	ctx := context.Background()
	base := startGateway(t, "tok")
	c, err := adminclient.New(base, "tok", nil)
	if err != nil {
		t.Fatal(err)
	}
	if c.Base()+"/" != base {
		t.Errorf("Base() = %q; want %q without the trailing slash", c.Base(), base)
	}
	if _, err := c.Create(ctx, ruleJSON(t, "a", 9)); err != nil {
		t.Fatalf("Create: %v", err)
	}
	_, err = c.Create(ctx, ruleJSON(t, "a", 9))
	var ae *adminclient.Error
	if !errors.As(err, &ae) || !errors.Is(err, adminclient.ErrAPI) || ae.Status != http.StatusConflict || ae.Code != "rule_exists" {
		t.Errorf("Create twice: %v; want a 409 rule_exists *Error", err)
	}
	if _, err := c.Put(ctx, "b", ruleJSON(t, "b", 10)); err != nil {
		t.Fatalf("Put: %v", err)
	}
	st, raw, err := c.Rule(ctx, "b")
	if err != nil || st.Rule == nil || st.Rule.ModelName != "m-b" || len(raw) == 0 {
		t.Fatalf("Rule(b) = %+v, %v; want model m-b", st, err)
	}
	rules, err := c.Rules(ctx)
	if err != nil || len(rules) != 2 {
		t.Fatalf("Rules = %d rules, %v; want 2", len(rules), err)
	}
	if raw, err := c.SetDraining(ctx, "b", "w1", true); err != nil {
		t.Errorf("SetDraining(w1): %v", err)
	} else {
		var st gateway.RuleStatus
		if err := json.Unmarshal(raw, &st); err != nil || len(st.Status.Endpoints) != 1 || !st.Status.Endpoints[0].Draining {
			t.Errorf("status after drain = %s (%v); want w1 draining", raw, err)
		}
	}
	if _, err := c.SetDraining(ctx, "b", "", false); err != nil {
		t.Errorf("SetDraining(every endpoint, undrain): %v", err)
	}
	_, _, err = c.Inventory(ctx, "b", 0)
	if !errors.As(err, &ae) || ae.Status != http.StatusBadRequest || ae.Message == "" {
		t.Errorf("Inventory of a rule without kvExactMode: %v; want a 400 with the gateway's message", err)
	}
	if _, err := c.Decisions(ctx, "b"); err != nil {
		t.Errorf("Decisions: %v", err)
	}
	for _, tc := range []struct {
		name        string
		wantExisted bool
	}{{"a", true}, {"a", false}} {
		existed, err := c.Delete(ctx, tc.name, 0)
		if err != nil || existed != tc.wantExisted {
			t.Errorf("Delete(%s) = %v, %v; want existed %v", tc.name, existed, err, tc.wantExisted)
		}
	}

	noToken, err := adminclient.New(base, "", nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := noToken.Rules(ctx); err != nil {
		t.Errorf("reading without a token: %v; want it allowed", err)
	}
	_, err = noToken.Delete(ctx, "b", 0)
	if !errors.As(err, &ae) || ae.Status != http.StatusUnauthorized {
		t.Errorf("Delete without the token: %v; want 401", err)
	}
}

func TestNewRefusesBadURLs(t *testing.T) {
	for _, base := range []string{"", "127.0.0.1:8081", "ftp://h:1", "http://"} {
		if _, err := adminclient.New(base, "", nil); !errors.Is(err, adminclient.ErrURL) {
			t.Errorf("New(%q) = %v; want ErrURL", base, err)
		}
	}
}

// TestUnreachable: a gateway that is not there is a transport error, not
// an API answer.
func TestUnreachable(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port := ln.Addr().(*net.TCPAddr).Port
	ln.Close()
	c, err := adminclient.New("http://127.0.0.1:"+strconv.Itoa(port), "", nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.Rules(context.Background()); err == nil || errors.Is(err, adminclient.ErrAPI) {
		t.Errorf("Rules of a closed port: %v; want a transport error", err)
	}
}
