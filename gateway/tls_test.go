package gateway

import (
	"bytes"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"io"
	"log/slog"
	"math/big"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/valyala/fasthttp"

	"github.com/llmgw/llmgw/internal/wait"
)

// selfSigned writes a certificate for 127.0.0.1 and its key to dir.
func selfSigned(t *testing.T, dir string) (certFile, keyFile string, pool *x509.CertPool) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tpl := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "llmgw-test"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		IPAddresses: []net.IP{net.ParseIP("127.0.0.1")}, KeyUsage: x509.KeyUsageDigitalSignature,
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	der, err := x509.CreateCertificate(rand.Reader, tpl, tpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	kb, _ := x509.MarshalECPrivateKey(key)
	certFile, keyFile = filepath.Join(dir, "cert.pem"), filepath.Join(dir, "key.pem")
	os.WriteFile(certFile, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o600)
	os.WriteFile(keyFile, pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: kb}), 0o600)
	cert, _ := x509.ParseCertificate(der)
	pool = x509.NewCertPool()
	pool.AddCert(cert)
	return certFile, keyFile, pool
}

func TestTLSDataPlane(t *testing.T) {
	a := newBackend(t, "a", nil)
	certFile, keyFile, pool := selfSigned(t, t.TempDir())
	s := startGateway(t, "", func(c *Config) { c.TLSCert, c.TLSKey = certFile, keyFile })
	mustApply(t, s, ruleYAML("r", "m1", "", a))
	tr := &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool}}
	t.Cleanup(tr.CloseIdleConnections)
	c := &http.Client{Transport: tr, Timeout: 10 * time.Second}
	resp, body := post(t, c, "https://"+s.Addr()+"/v1/chat/completions", chatBody)
	if resp.StatusCode != 200 || resp.TLS == nil {
		t.Fatalf("over TLS: %d tls=%v %s", resp.StatusCode, resp.TLS != nil, body)
	}
	// Plain HTTP to the TLS listener does not get a completion.
	plain := newClient(t)
	req, _ := http.NewRequest("POST", "http://"+s.Addr()+"/v1/chat/completions", strings.NewReader(chatBody))
	if r, err := plain.Do(req); err == nil {
		io.Copy(io.Discard, r.Body)
		r.Body.Close()
		if r.StatusCode == 200 {
			t.Errorf("plain HTTP on the TLS listener was served")
		}
	}
	if _, err := New(Config{StateDir: t.TempDir(), TLSCert: certFile}); err == nil {
		t.Errorf("a certificate without a key was accepted")
	}
}

func TestPayloadsNotLoggedByDefault(t *testing.T) {
	a := newBackend(t, "a", nil)
	for _, on := range []bool{false, true} {
		var logs bytes.Buffer
		s := startGateway(t, "", func(c *Config) {
			c.Logger = slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
			c.LogPayloads = on
		})
		mustApply(t, s, ruleYAML("r", "m1", "", a))
		post(t, newClient(t), "http://"+s.Addr()+"/v1/chat/completions", `{"model":"m1","messages":[{"role":"user","content":"my secret diagnosis"}]}`)
		s.Close()
		if got := strings.Contains(logs.String(), "my secret diagnosis"); got != on {
			t.Errorf("log-payloads=%v: payload in logs = %v", on, got)
		}
	}
}

func TestBackendTLS(t *testing.T) {
	dir := t.TempDir()
	certFile, keyFile, _ := selfSigned(t, dir)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var probes, hits atomicCounter
	srv := &fasthttp.Server{Handler: func(ctx *fasthttp.RequestCtx) {
		if string(ctx.Path()) == "/health" {
			probes.add()
			return
		}
		hits.add()
		ctx.SetContentType("application/json")
		ctx.SetBodyString(`{"id":"tls-backend"}`)
	}}
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = srv.ServeTLS(ln, certFile, keyFile)
	}()
	t.Cleanup(func() { srv.Shutdown(); <-done })
	_, port, _ := net.SplitHostPort(ln.Addr().String())
	s := startGateway(t, "", nil)
	mustApply(t, s, fmt.Sprintf("name: r\nmodel_name: m1\nprobe: {interval: 50ms, timeout: 40ms}\nbackend_tls: {ca_file: %q}\nendpoints:\n  - {endpointIP: 127.0.0.1, targetPort: %s}\n", certFile, port))
	resp, body := post(t, newClient(t), "http://"+s.Addr()+"/v1/chat/completions", chatBody)
	if resp.StatusCode != 200 || !strings.Contains(body, "tls-backend") {
		t.Fatalf("through backend TLS: %d %s", resp.StatusCode, body)
	}
	wait.For(t, 5*time.Second, "an https probe", func() bool { return probes.load() > 0 })
	st, _ := s.Rule("r")
	if !st.Status.Endpoints[0].Healthy {
		t.Errorf("TLS backend not healthy by its https probe")
	}
	// Without the CA the certificate is refused: 502, not a silent plain-text fallback.
	otherCA, _, _ := selfSigned(t, t.TempDir())
	mustApply(t, s, fmt.Sprintf("name: r2\nmodel_name: m2\nprobe: {disabled: true}\nbackend_tls: {ca_file: %q}\nendpoints:\n  - {endpointIP: 127.0.0.1, targetPort: %s}\n", otherCA, port))
	resp, body = post(t, newClient(t), "http://"+s.Addr()+"/v1/chat/completions", `{"model":"m2","messages":[{"role":"user","content":"x"}]}`)
	if resp.StatusCode != 502 {
		t.Errorf("untrusted backend certificate: %d %s; want 502", resp.StatusCode, body)
	}
}

type atomicCounter struct{ n atomic.Int64 }

func (c *atomicCounter) add()        { c.n.Add(1) }
func (c *atomicCounter) load() int64 { return c.n.Load() }
