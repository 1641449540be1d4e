package gateway

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"os"
	"os/exec"
	"strings"
	"sync"
	"syscall"
	"testing"
)

func adminDo(t *testing.T, c *http.Client, method, url, body, token string) (int, map[string]any) {
	t.Helper()
	req, err := http.NewRequest(method, url, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	resp, err := c.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	data, _ := io.ReadAll(resp.Body)
	var m map[string]any
	if len(data) > 0 {
		if err := json.Unmarshal(data, &m); err != nil {
			t.Fatalf("%s %s: non-JSON answer %q", method, url, data)
		}
	}
	return resp.StatusCode, m
}

func errCode(m map[string]any) string {
	e, _ := m["error"].(map[string]any)
	s, _ := e["code"].(string)
	return s
}

func TestAdminAPI(t *testing.T) {
	a := newBackend(t, "a", nil)
	s := startGateway(t, "", nil)
	c := newClient(t)
	base := "http://" + s.AdminAddr()
	valid := fmt.Sprintf(`{"name":"r1","model_name":"m1","sel":8,"endpoints":[{"id":"w1","endpointIP":"127.0.0.1","targetPort":%d}]}`, a.port())

	code, body := adminDo(t, c, "POST", base+"/v1/rules", valid, "")
	if code != 201 {
		t.Fatalf("create: %d %v", code, body)
	}
	if body["kvHashAlgo"] != "sha256_cbor" || body["kvBlockSize"] != float64(16) {
		t.Errorf("create answer lacks resolved defaults: %v", body)
	}
	chwbl, _ := body["chwbl"].(map[string]any)
	if chwbl["load_factor"] != 1.25 || chwbl["replicas"] != float64(160) {
		t.Errorf("chwbl defaults not resolved: %v", chwbl)
	}

	cases := []struct {
		name, method, path, body string
		status                   int
		code                     string
	}{
		{"duplicate create", "POST", "/v1/rules", valid, 409, "rule_exists"},
		{"unknown field", "POST", "/v1/rules", strings.Replace(valid, `"id":"w1"`, `"id":"w1","epRole":1`, 1), 400, "invalid_rule"},
		{"admission failure", "PUT", "/v1/rules/r1", strings.Replace(valid, `"sel":8`, `"sel":9`, 1), 400, ""},
		{"engine change is a conflict", "PUT", "/v1/rules/r1", strings.Replace(valid, `"sel":8`, `"sel":8,"kvEngineType":"sglang"`, 1), 409, ""},
		{"name mismatch", "PUT", "/v1/rules/other", valid, 400, "bad_request"},
		{"malformed JSON", "POST", "/v1/rules", `{"name":`, 400, "invalid_rule"},
		{"missing rule", "GET", "/v1/rules/nope", "", 404, "rule_not_found"},
		{"delete missing", "DELETE", "/v1/rules/nope", "", 404, "rule_not_found"},
		{"bad drain duration", "DELETE", "/v1/rules/r1?drain=soon", "", 400, "bad_request"},
		{"drain unknown endpoint", "POST", "/v1/rules/r1/endpoints/zz/drain", "", 404, "endpoint_not_found"},
		{"unknown path", "GET", "/v1/nothing", "", 404, "not_found"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			code, body := adminDo(t, c, tc.method, base+tc.path, tc.body, "")
			if code != tc.status {
				t.Fatalf("%s %s = %d %v; want %d", tc.method, tc.path, code, body, tc.status)
			}
			e, _ := body["error"].(map[string]any)
			if e == nil || e["message"] == "" {
				t.Errorf("error body %v lacks {error:{code,message}}", body)
			}
			if tc.code != "" && errCode(body) != tc.code {
				t.Errorf("code = %q; want %q", errCode(body), tc.code)
			}
		})
	}

	// YAML update, then read-back equals the applied rule with defaults.
	yaml := fmt.Sprintf("name: r1\nmodel_name: m1\nsel: 0\nchwbl: {load_factor: 2}\nendpoints:\n  - {id: w1, endpointIP: 127.0.0.1, targetPort: %d, weight: 3}\n", a.port())
	code, put := adminDo(t, c, "PUT", base+"/v1/rules/r1", yaml, "")
	if code != 200 {
		t.Fatalf("PUT yaml: %d %v", code, put)
	}
	code, got := adminDo(t, c, "GET", base+"/v1/rules/r1", "", "")
	if code != 200 {
		t.Fatalf("GET: %d", code)
	}
	rb, _ := json.Marshal(got["rule"])
	pb, _ := json.Marshal(put)
	if string(rb) != string(pb) {
		t.Errorf("read-back differs from the effective rule PUT returned:\n got %s\nwant %s", rb, pb)
	}
	status, _ := got["status"].(map[string]any)
	eps, _ := status["endpoints"].([]any)
	if len(eps) != 1 {
		t.Fatalf("status endpoints = %v", status)
	}
	ep0 := eps[0].(map[string]any)
	for _, k := range []string{"available", "healthy", "breaker", "draining", "in_flight"} {
		if _, ok := ep0[k]; !ok {
			t.Errorf("endpoint status lacks %q: %v", k, ep0)
		}
	}

	code, list := adminDo(t, c, "GET", base+"/v1/rules", "", "")
	if rules, _ := list["rules"].([]any); code != 200 || len(rules) != 1 {
		t.Errorf("list = %d %v", code, list)
	}
	for _, p := range []string{"/metrics", "/healthz", "/readyz"} {
		resp, err := c.Get(base + p)
		if err != nil {
			t.Fatal(err)
		}
		data, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 200 {
			t.Errorf("GET %s = %d %s", p, resp.StatusCode, data)
		}
		if p == "/metrics" && !strings.Contains(string(data), "llmgw_inflight_requests") {
			t.Errorf("/metrics lacks llmgw_inflight_requests")
		}
	}
	if code, _ := adminDo(t, c, "DELETE", base+"/v1/rules/r1?drain=1s", "", ""); code != 204 {
		t.Errorf("delete = %d", code)
	}
	if code, _ := adminDo(t, c, "GET", base+"/v1/rules/r1", "", ""); code != 404 {
		t.Errorf("GET after delete = %d", code)
	}
}

func TestAdminToken(t *testing.T) {
	a := newBackend(t, "a", nil)
	s := startGateway(t, "", func(c *Config) { c.AdminToken = "s3cret" })
	c := newClient(t)
	base := "http://" + s.AdminAddr()
	rule := fmt.Sprintf(`{"name":"r1","model_name":"m1","endpoints":[{"endpointIP":"127.0.0.1","targetPort":%d}]}`, a.port())
	for _, tc := range []struct {
		name, token string
		want        int
	}{{"no token", "", 401}, {"wrong token", "guess", 401}, {"right token", "s3cret", 201}} {
		t.Run(tc.name, func(t *testing.T) {
			if code, body := adminDo(t, c, "POST", base+"/v1/rules", rule, tc.token); code != tc.want {
				t.Errorf("POST = %d %v; want %d", code, body, tc.want)
			}
		})
	}
	if code, _ := adminDo(t, c, "GET", base+"/v1/rules/r1", "", ""); code != 200 {
		t.Errorf("reads need no token: GET = %d", code)
	}
}

func TestNonLoopbackAdminNeedsToken(t *testing.T) {
	_, err := New(Config{StateDir: t.TempDir(), Admin: "0.0.0.0:0"})
	if err == nil || !strings.Contains(err.Error(), "without a token") {
		t.Fatalf("New with a public admin address and no token: %v; want a refusal", err)
	}
	if _, err := New(Config{StateDir: t.TempDir(), Admin: "0.0.0.0:0", AdminToken: "x"}); err != nil {
		t.Errorf("with a token: %v", err)
	}
}

func TestConcurrentAdminWritesReadBackConsistent(t *testing.T) {
	a := newBackend(t, "a", nil)
	s := startGateway(t, "", nil)
	c := newClient(t)
	base := "http://" + s.AdminAddr()
	var wg sync.WaitGroup
	for i := 0; i < 16; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			body := fmt.Sprintf(`{"name":"r","model_name":"m1","sel":0,"chwbl":{"replicas":%d},"endpoints":[{"endpointIP":"127.0.0.1","targetPort":%d}]}`, 10+i, a.port())
			req, _ := http.NewRequest("PUT", base+"/v1/rules/r", strings.NewReader(body))
			resp, err := c.Do(req)
			if err == nil {
				io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
			}
		}()
	}
	wg.Wait()
	st, err := s.Rule("r")
	if err != nil {
		t.Fatal(err)
	}
	stored, err := s.store.Load()
	if err != nil || len(stored) != 1 {
		t.Fatalf("store: %v %d", err, len(stored))
	}
	if got, want := stored[0].Effective().CHWBL.Replicas, st.Rule.CHWBL.Replicas; got != want {
		t.Errorf("persisted replicas %d differ from the running rule's %d", got, want)
	}
}

// TestKill9KeepsAcknowledgedRules runs a gateway in a child process, applies
// rules through its admin API, kills it with SIGKILL, restarts it on the
// same state dir, and checks that every acknowledged rule is served again.
func TestKill9KeepsAcknowledgedRules(t *testing.T) {
	a := newBackend(t, "a", nil)
	dir := t.TempDir()
	c := newClient(t)
	start := func() (*exec.Cmd, string, string) {
		cmd := exec.Command(os.Args[0], "-test.run=^$")
		cmd.Env = append(os.Environ(), "LLMGW_TEST_CHILD_GATEWAY="+dir)
		out, err := cmd.StdoutPipe()
		if err != nil {
			t.Fatal(err)
		}
		cmd.Stderr = os.Stderr
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		line, err := bufio.NewReader(out).ReadString('\n')
		if err != nil {
			cmd.Process.Kill()
			cmd.Wait()
			t.Fatalf("child gateway did not start: %v", err)
		}
		var addrs struct{ Data, Admin string }
		if err := json.Unmarshal([]byte(line), &addrs); err != nil {
			t.Fatalf("child said %q", line)
		}
		return cmd, addrs.Data, addrs.Admin
	}
	cmd, _, admin := start()
	const n = 20
	for i := 0; i < n; i++ {
		body := fmt.Sprintf(`{"name":"r%d","model_name":"m%d","endpoints":[{"endpointIP":"127.0.0.1","targetPort":%d}]}`, i, i, a.port())
		if code, m := adminDo(t, c, "POST", "http://"+admin+"/v1/rules", body, ""); code != 201 {
			t.Fatalf("create r%d: %d %v", i, code, m)
		}
	}
	if err := cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	_ = cmd.Wait()
	c.Transport.(*http.Transport).CloseIdleConnections()

	cmd, data, admin := start()
	defer func() {
		cmd.Process.Signal(syscall.SIGKILL)
		cmd.Wait()
	}()
	code, list := adminDo(t, c, "GET", "http://"+admin+"/v1/rules", "", "")
	rules, _ := list["rules"].([]any)
	if code != 200 || len(rules) != n {
		t.Fatalf("after kill -9: %d rules (%d); want %d", len(rules), code, n)
	}
	resp, body := post(t, c, "http://"+data+"/v1/chat/completions", `{"model":"m7","messages":[{"role":"user","content":"x"}]}`)
	if resp.StatusCode != 200 {
		t.Errorf("restored rule does not serve: %d %s", resp.StatusCode, body)
	}
}

// runChildGateway is the child side of TestKill9KeepsAcknowledgedRules.
func runChildGateway(dir string) {
	s, err := New(Config{Listen: "127.0.0.1:0", Admin: "127.0.0.1:0", StateDir: dir,
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(2)
	}
	if err := s.Start(context.Background()); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(2)
	}
	fmt.Printf("{\"Data\":%q,\"Admin\":%q}\n", s.Addr(), s.AdminAddr())
	select {} // until killed
}

// TestPprof: profiles are off by default, served with --pprof, and behind
// the admin token when one is set.
func TestPprof(t *testing.T) {
	c := newClient(t)
	for _, tc := range []struct {
		name        string
		pprof       bool
		token, sent string
		want        int
	}{
		{"off by default", false, "", "", 404},
		{"on without a token", true, "", "", 200},
		{"on, token set, none sent", true, "s3cret", "", 401},
		{"on, token set and sent", true, "s3cret", "s3cret", 200},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := startGateway(t, "", func(cfg *Config) { cfg.Pprof, cfg.AdminToken = tc.pprof, tc.token })
			req, _ := http.NewRequest("GET", "http://"+s.AdminAddr()+"/debug/pprof/cmdline", nil)
			if tc.sent != "" {
				req.Header.Set("Authorization", "Bearer "+tc.sent)
			}
			resp, err := c.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			if resp.StatusCode != tc.want {
				t.Fatalf("GET /debug/pprof/cmdline = %d; want %d", resp.StatusCode, tc.want)
			}
		})
	}
}

// TestAdminWrongMethodIs405: a path the admin API serves under other
// methods answers 405 with Allow (the catch-all used to make it 404); an
// unknown path stays 404.
func TestAdminWrongMethodIs405(t *testing.T) {
	s := startGateway(t, "", nil)
	c := newClient(t)
	cases := []struct {
		method, path string
		status       int
		allow        string
	}{
		{"PATCH", "/v1/rules/x", 405, "GET, PUT, DELETE"},
		{"OPTIONS", "/readyz", 405, "GET"},
		{"PATCH", "/v1/rules", 405, "GET, POST"},
		{"GET", "/nope", 404, ""},
	}
	for _, tc := range cases {
		t.Run(tc.method+" "+tc.path, func(t *testing.T) {
			req, _ := http.NewRequest(tc.method, "http://"+s.AdminAddr()+tc.path, nil)
			resp, err := c.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			resp.Body.Close()
			if resp.StatusCode != tc.status || resp.Header.Get("Allow") != tc.allow {
				t.Errorf("%s %s = %d Allow %q; want %d Allow %q", tc.method, tc.path, resp.StatusCode, resp.Header.Get("Allow"), tc.status, tc.allow)
			}
		})
	}
}
