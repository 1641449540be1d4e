// Package k8stest runs a real Kubernetes control plane for tests, as
// controller-runtime's envtest does: an etcd and a kube-apiserver on
// 127.0.0.1, certificates generated per run, and a client configuration
// authenticated as a cluster administrator. There is no kubelet and no
// controller manager: Pods, EndpointSlices and the rest are plain API
// objects the test writes.
//
// Binaries: etcd from $LLMGW_ETCD or PATH (Debian's etcd-server package),
// kube-apiserver from $LLMGW_KUBE_APISERVER or <repo>/bin/kube-apiserver
// (make kube-apiserver builds it from the k8s.io/kubernetes module in
// tools/kube-apiserver). Without them a test skips, and fails under CI=true.
package k8stest

import (
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/rsa"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	"math/big"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"syscall"
	"testing"
	"time"

	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
)

// Env is a running control plane.
type Env struct {
	// Config reaches the API server as a member of system:masters.
	Config *rest.Config
	// Client is a clientset over Config.
	Client kubernetes.Interface
	// URL is the API server's https address.
	URL string

	t        testing.TB // the test that started the control plane
	dir      string
	apiBin   string
	apiArgs  []string
	hc       *http.Client
	api      *proc
	restarts int
}

// Binaries returns the etcd and kube-apiserver paths, or why they are not
// there.
func Binaries() (etcd, apiserver string, err error) {
	etcd = os.Getenv("LLMGW_ETCD")
	if etcd == "" {
		if etcd, err = exec.LookPath("etcd"); err != nil {
			return "", "", errors.New("etcd not found (apt-get install etcd-server, or set LLMGW_ETCD)")
		}
	}
	apiserver = os.Getenv("LLMGW_KUBE_APISERVER")
	if apiserver == "" {
		root, rerr := repoRoot()
		if rerr != nil {
			return "", "", rerr
		}
		apiserver = filepath.Join(root, "bin", "kube-apiserver")
	}
	if _, err := os.Stat(apiserver); err != nil {
		return "", "", fmt.Errorf("kube-apiserver not found at %s (make kube-apiserver, or set LLMGW_KUBE_APISERVER)", apiserver)
	}
	return etcd, apiserver, nil
}

// repoRoot walks up from the working directory to the main module's go.mod.
func repoRoot() (string, error) {
	dir, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for {
		b, err := os.ReadFile(filepath.Join(dir, "go.mod"))
		if err == nil && bytes.HasPrefix(b, []byte("module github.com/llmgw/llmgw\n")) {
			return dir, nil
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", errors.New("k8stest: repository root (go.mod of github.com/llmgw/llmgw) not found")
		}
		dir = parent
	}
}

// Start runs etcd and kube-apiserver until t ends. It skips t when the
// binaries are absent, unless CI is "true", where that is a failure.
func Start(t testing.TB) *Env {
	t.Helper()
	etcdBin, apiBin, err := Binaries()
	if err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatalf("k8stest: %v (required under CI=true; .ci/run runs make k8s-bins)", err)
		}
		t.Skipf("k8stest: %v; skipping the real-API-server suite", err)
	}
	dir := t.TempDir()
	pki, err := writePKI(dir)
	if err != nil {
		t.Fatal(err)
	}

	// A port the kernel chose may be taken again before the process binds
	// it (another control plane starting in parallel): a process that
	// exits before it is ready is started again on new ports.
	var etcdURL string
	for attempt := 1; ; attempt++ {
		etcdPort, peerPort := freePort(t), freePort(t)
		etcdURL = "http://127.0.0.1:" + strconv.Itoa(etcdPort)
		peerURL := "http://127.0.0.1:" + strconv.Itoa(peerPort)
		name := "etcd-" + strconv.Itoa(attempt)
		etcd := startProc(t, dir, name, etcdBin,
			"--name=default", "--data-dir="+filepath.Join(dir, name),
			"--listen-client-urls="+etcdURL, "--advertise-client-urls="+etcdURL,
			"--listen-peer-urls="+peerURL, "--initial-advertise-peer-urls="+peerURL,
			"--initial-cluster=default="+peerURL,
		)
		err := waitHTTP(etcd.done, http.DefaultClient, etcdURL+"/health")
		if err == nil {
			break
		}
		if attempt == 3 || !errors.Is(err, errExited) {
			t.Fatalf("k8stest: %s: %v", name, err)
		}
		t.Logf("k8stest: %s: %v; starting again on new ports\n%s", name, err, logTail(dir, name))
	}

	var cfg *rest.Config
	var hc *http.Client
	var url string
	var api *proc
	var apiArgs []string
	for attempt := 1; ; attempt++ {
		port := freePort(t)
		url = "https://127.0.0.1:" + strconv.Itoa(port)
		name := "kube-apiserver-" + strconv.Itoa(attempt)
		apiArgs = []string{"--etcd-servers=" + etcdURL,
			"--bind-address=127.0.0.1", "--advertise-address=127.0.0.1", "--secure-port=" + strconv.Itoa(port),
			"--cert-dir=" + filepath.Join(dir, "certs"),
			"--tls-cert-file=" + pki.serverCert, "--tls-private-key-file=" + pki.serverKey,
			"--client-ca-file=" + pki.caCert,
			"--service-account-issuer=" + url, "--service-account-key-file=" + pki.saPub, "--service-account-signing-key-file=" + pki.saKey,
			"--service-cluster-ip-range=10.0.0.0/24", "--allow-privileged=true",
			"--authorization-mode=RBAC",
			// No controller manager runs, so no default ServiceAccount
			// exists for the admission plugin to attach to pods (envtest
			// does the same).
			"--disable-admission-plugins=ServiceAccount",
			// The kubernetes Service's endpoints may not be a loopback
			// address; nothing here needs that Service.
			"--endpoint-reconciler-type=none",
		}
		api = startProc(t, dir, name, apiBin, apiArgs...)
		cfg = &rest.Config{
			Host: url,
			TLSClientConfig: rest.TLSClientConfig{
				CAFile: pki.caCert, CertFile: pki.clientCert, KeyFile: pki.clientKey,
			},
			QPS: 200, Burst: 400,
		}
		tlsCfg, err := rest.TLSConfigFor(cfg)
		if err != nil {
			t.Fatal(err)
		}
		hc = &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{TLSClientConfig: tlsCfg}}
		err = waitHTTP(api.done, hc, url+"/readyz")
		if err == nil {
			break
		}
		hc.CloseIdleConnections()
		if attempt == 3 || !errors.Is(err, errExited) {
			t.Fatalf("k8stest: %s: %v", name, err)
		}
		t.Logf("k8stest: %s: %v; starting again on a new port\n%s", name, err, logTail(dir, name))
	}
	hc.CloseIdleConnections()
	cs, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return &Env{Config: cfg, Client: cs, URL: url, t: t, dir: dir, apiBin: apiBin, apiArgs: apiArgs, hc: hc, api: api}
}

// StopAPIServer kills the kube-apiserver (SIGKILL, as a crash: its
// graceful shutdown waits on open watches for longer than a test should),
// while etcd keeps running, and with it every object; StartAPIServer
// starts it again on the same address.
func (e *Env) StopAPIServer(t testing.TB) {
	t.Helper()
	e.hc.CloseIdleConnections()
	if err := e.api.cmd.Process.Kill(); err != nil {
		t.Fatalf("k8stest: killing kube-apiserver: %v", err)
	}
	<-e.api.done
}

// StartAPIServer starts the kube-apiserver StopAPIServer stopped, with the
// same flags and port, and returns once it answers /readyz.
func (e *Env) StartAPIServer(t testing.TB) {
	t.Helper()
	e.restarts++
	// The process belongs to the test that started the control plane,
	// not to the (sub)test restarting it.
	e.api = startProc(e.t, e.dir, "kube-apiserver-restart-"+strconv.Itoa(e.restarts), e.apiBin, e.apiArgs...)
	if err := waitHTTP(e.api.done, e.hc, e.URL+"/readyz"); err != nil {
		t.Fatalf("k8stest: kube-apiserver after a restart: %v", err)
	}
	e.hc.CloseIdleConnections()
}

// freePort asks the kernel for a free port on 127.0.0.1. etcd and
// kube-apiserver cannot take an inherited listener, so the port is closed
// before they bind it; a lost race shows as a start failure with the
// process log.
func freePort(t testing.TB) int {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port
}

// proc is a running control-plane process; done closes when it exits.
type proc struct {
	cmd  *exec.Cmd
	done chan struct{}
}

// stop ends the process (SIGTERM, then SIGKILL after 15 s).
func (p *proc) stop() error {
	select {
	case <-p.done:
		return nil
	default:
	}
	if err := p.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		return err
	}
	select {
	case <-p.done:
	case <-time.After(15 * time.Second):
		_ = p.cmd.Process.Kill()
		<-p.done
	}
	return nil
}

// startProc runs a control-plane process until the test ends; its output
// goes to <dir>/<name>.log, shown when the test fails.
func startProc(t testing.TB, dir, name, bin string, args ...string) *proc {
	t.Helper()
	logPath := filepath.Join(dir, name+".log")
	lf, err := os.Create(logPath)
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(bin, args...)
	cmd.Stdout, cmd.Stderr = lf, lf
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		lf.Close()
		t.Fatalf("k8stest: starting %s: %v", name, err)
	}
	p := &proc{cmd: cmd, done: make(chan struct{})}
	go func() { _ = cmd.Wait(); close(p.done) }()
	t.Cleanup(func() {
		_ = p.stop()
		lf.Close()
		if t.Failed() {
			b, _ := os.ReadFile(logPath)
			if len(b) > 4000 {
				b = b[len(b)-4000:]
			}
			t.Logf("%s log (tail):\n%s", name, b)
		}
	})
	return p
}

// logTail is the end of a process's log, for a start that failed.
func logTail(dir, name string) string {
	b, _ := os.ReadFile(filepath.Join(dir, name+".log"))
	if len(b) > 2000 {
		b = b[len(b)-2000:]
	}
	return string(b)
}

// errExited: the process ended before it was ready.
var errExited = errors.New("exited before it was ready")

// waitHTTP polls url until it answers 200, for up to two minutes (the API
// server's first start on two busy cores takes tens of seconds), or until
// the process exits.
func waitHTTP(exited <-chan struct{}, hc *http.Client, url string) error {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	tick := time.NewTicker(200 * time.Millisecond)
	defer tick.Stop()
	var last string
	for {
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
		resp, err := hc.Do(req)
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return nil
			}
			last = resp.Status
		} else {
			last = err.Error()
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("not ready at %s after 2 minutes: %s", url, last)
		case <-exited:
			return fmt.Errorf("%w (last answer from %s: %s)", errExited, url, last)
		case <-tick.C:
		}
	}
}

type pkiFiles struct {
	caCert, serverCert, serverKey, clientCert, clientKey, saKey, saPub string
}

// writePKI generates a CA, a serving certificate for 127.0.0.1, an admin
// client certificate (O=system:masters) and a service-account signing key.
func writePKI(dir string) (*pkiFiles, error) {
	d := filepath.Join(dir, "pki")
	if err := os.MkdirAll(d, 0o700); err != nil {
		return nil, err
	}
	p := &pkiFiles{}
	caKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, err
	}
	now := time.Now()
	caTmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "llmgw-k8stest-ca"},
		NotBefore: now.Add(-time.Hour), NotAfter: now.Add(24 * time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature,
	}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, &caKey.PublicKey, caKey)
	if err != nil {
		return nil, err
	}
	ca, err := x509.ParseCertificate(caDER)
	if err != nil {
		return nil, err
	}
	p.caCert = filepath.Join(d, "ca.crt")
	if err := writePEM(p.caCert, "CERTIFICATE", caDER); err != nil {
		return nil, err
	}
	leaf := func(name string, serial int64, tmpl *x509.Certificate) (string, string, error) {
		k, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
		if err != nil {
			return "", "", err
		}
		tmpl.SerialNumber = big.NewInt(serial)
		tmpl.NotBefore, tmpl.NotAfter = now.Add(-time.Hour), now.Add(24*time.Hour)
		tmpl.KeyUsage = x509.KeyUsageDigitalSignature
		der, err := x509.CreateCertificate(rand.Reader, tmpl, ca, &k.PublicKey, caKey)
		if err != nil {
			return "", "", err
		}
		kd, err := x509.MarshalECPrivateKey(k)
		if err != nil {
			return "", "", err
		}
		c, kp := filepath.Join(d, name+".crt"), filepath.Join(d, name+".key")
		if err := writePEM(c, "CERTIFICATE", der); err != nil {
			return "", "", err
		}
		return c, kp, writePEM(kp, "EC PRIVATE KEY", kd)
	}
	if p.serverCert, p.serverKey, err = leaf("server", 2, &x509.Certificate{
		Subject: pkix.Name{CommonName: "kube-apiserver"}, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		IPAddresses: []net.IP{net.IPv4(127, 0, 0, 1)}, DNSNames: []string{"localhost"},
	}); err != nil {
		return nil, err
	}
	if p.clientCert, p.clientKey, err = leaf("admin", 3, &x509.Certificate{
		Subject: pkix.Name{CommonName: "llmgw-test-admin", Organization: []string{"system:masters"}}, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth},
	}); err != nil {
		return nil, err
	}
	sa, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		return nil, err
	}
	pub, err := x509.MarshalPKIXPublicKey(&sa.PublicKey)
	if err != nil {
		return nil, err
	}
	p.saKey, p.saPub = filepath.Join(d, "sa.key"), filepath.Join(d, "sa.pub")
	if err := writePEM(p.saKey, "RSA PRIVATE KEY", x509.MarshalPKCS1PrivateKey(sa)); err != nil {
		return nil, err
	}
	return p, writePEM(p.saPub, "PUBLIC KEY", pub)
}

func writePEM(path, typ string, der []byte) error {
	return os.WriteFile(path, pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: der}), 0o600)
}

// Helm returns the Helm CLI ($LLMGW_HELM or <repo>/bin/helm, built by make
// helm from helm.sh/helm/v3 in tools/helm). It skips t when it is absent,
// unless CI is "true", where that is a failure.
func Helm(t testing.TB) string {
	t.Helper()
	p := os.Getenv("LLMGW_HELM")
	if p == "" {
		root, err := repoRoot()
		if err != nil {
			t.Fatal(err)
		}
		p = filepath.Join(root, "bin", "helm")
	}
	if _, err := os.Stat(p); err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatalf("k8stest: helm not found at %s (make helm); required under CI=true (.ci/run runs make k8s-bins)", p)
		}
		t.Skipf("k8stest: helm not found at %s (make helm, or set LLMGW_HELM); skipping", p)
	}
	return p
}

// RepoRoot is the main module's directory.
func RepoRoot(t testing.TB) string {
	t.Helper()
	root, err := repoRoot()
	if err != nil {
		t.Fatal(err)
	}
	return root
}

// Kubeconfig writes a kubeconfig file for the control plane (for code that
// loads its client configuration the way a user's tools do) and returns
// its path.
func (e *Env) Kubeconfig(t testing.TB) string {
	t.Helper()
	cfg := clientcmdapi.NewConfig()
	cfg.Clusters["k8stest"] = &clientcmdapi.Cluster{Server: e.Config.Host, CertificateAuthority: e.Config.CAFile}
	cfg.AuthInfos["admin"] = &clientcmdapi.AuthInfo{ClientCertificate: e.Config.CertFile, ClientKey: e.Config.KeyFile}
	cfg.Contexts["k8stest"] = &clientcmdapi.Context{Cluster: "k8stest", AuthInfo: "admin"}
	cfg.CurrentContext = "k8stest"
	p := filepath.Join(t.TempDir(), "kubeconfig")
	if err := clientcmd.WriteToFile(*cfg, p); err != nil {
		t.Fatal(err)
	}
	return p
}
