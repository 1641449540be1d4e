package peerwatch

import (
	"bufio"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"math/big"
	"net"
	"testing"
	"time"
)

// pair returns both ends of a loopback TCP connection.
func pair(t *testing.T) (client, server net.Conn) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	acc := make(chan net.Conn, 1)
	go func() {
		c, _ := ln.Accept()
		acc <- c
	}()
	client, err = net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	server = <-acc
	if server == nil {
		t.Fatal("accept failed")
	}
	t.Cleanup(func() { client.Close(); server.Close() })
	return client, server
}

func TestWatch(t *testing.T) {
	cases := []struct {
		name     string
		act      func(c net.Conn) // what the client does
		wantGone bool
	}{
		{"client closes", func(c net.Conn) { c.Close() }, true},
		{"client half-closes", func(c net.Conn) { _ = c.(*net.TCPConn).CloseWrite() }, true},
		{"client resets", func(c net.Conn) { _ = c.(*net.TCPConn).SetLinger(0); c.Close() }, true},
		{"client pipelines a request", func(c net.Conn) { _, _ = c.Write([]byte("GET / HTTP/1.1\r\n\r\n")) }, false},
	}
	starts := []struct {
		name  string
		watch func(net.Conn, func()) *Watcher
	}{
		{"at once", Watch},
		// A deferred watch that starts (the timer fires at once) behaves
		// as Watch, whether the client acts before or after the start.
		{"deferred", func(c net.Conn, gone func()) *Watcher { return WatchAfter(c, gone, time.Nanosecond) }},
	}
	for _, start := range starts {
		for _, tc := range cases {
			t.Run(start.name+"/"+tc.name, func(t *testing.T) { testWatchCase(t, start.watch, tc.act, tc.wantGone) })
		}
	}
}

func testWatchCase(t *testing.T, watch func(net.Conn, func()) *Watcher, act func(net.Conn), wantGone bool) {
	client, server := pair(t)
	gone := make(chan struct{}, 1)
	w := watch(server, func() { gone <- struct{}{} })
	act(client)
	if wantGone {
		select {
		case <-gone:
		case <-time.After(10 * time.Second):
			t.Fatal("the watch did not report the client gone")
		}
		w.Stop()
		return
	}
	// Pipelined bytes end the watch without a verdict and are left
	// for the server to read.
	w.Stop()
	select {
	case <-gone:
		t.Fatal("pipelined bytes reported as a closed client")
	default:
	}
	_ = server.SetReadDeadline(time.Now().Add(5 * time.Second))
	line, err := bufio.NewReader(server).ReadString('\n')
	if err != nil || line != "GET / HTTP/1.1\r\n" {
		t.Fatalf("server read %q, %v after the watch; want the pipelined request line", line, err)
	}
}

// TestDeferredStoppedBeforeStart: a deferred watch stopped before its
// delay ran nothing: a client that already closed is not reported, and the
// connection is untouched.
func TestDeferredStoppedBeforeStart(t *testing.T) {
	client, server := pair(t)
	gone := make(chan struct{}, 1)
	w := WatchAfter(server, func() { gone <- struct{}{} }, time.Hour)
	client.Close()
	w.Stop()
	select {
	case <-gone:
		t.Fatal("a watch stopped before its start reported the client")
	default:
	}
	_ = server.SetReadDeadline(time.Now().Add(5 * time.Second))
	var b [1]byte
	if n, err := server.Read(b[:]); n != 0 || err == nil {
		t.Fatalf("read after stop: %d bytes, %v; want end of stream", n, err)
	}
}

// TestDeferredStopRacesStart stops deferred watches whose start is due at
// once, so Stop meets the start at every stage; every Stop must return
// (one that missed the start's arm would wait on a peek forever) and leave
// the connection readable.
func TestDeferredStopRacesStart(t *testing.T) {
	client, server := pair(t)
	for i := range 2000 {
		w := WatchAfter(server, func() { t.Error("quiet connection reported gone") }, time.Duration(i%3))
		w.Stop()
	}
	if _, err := client.Write([]byte("x")); err != nil {
		t.Fatal(err)
	}
	_ = server.SetReadDeadline(time.Now().Add(5 * time.Second))
	var b [1]byte
	if _, err := server.Read(b[:]); err != nil {
		t.Fatalf("read after the watches: %v", err)
	}
}

// TestStopWithoutEvent: stop ends a watch on a quiet connection, reports
// nothing, and leaves the connection readable.
func TestStopWithoutEvent(t *testing.T) {
	client, server := pair(t)
	gone := false
	w := Watch(server, func() { gone = true })
	w.Stop()
	if gone {
		t.Fatal("quiet connection reported gone")
	}
	if _, err := client.Write([]byte("x")); err != nil {
		t.Fatal(err)
	}
	_ = server.SetReadDeadline(time.Now().Add(5 * time.Second))
	var b [1]byte
	if _, err := server.Read(b[:]); err != nil {
		t.Fatalf("read after stop: %v", err)
	}
}

// tlsPair returns both ends of a loopback TLS connection, handshake done.
func tlsPair(t *testing.T) (client, server *tls.Conn) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "127.0.0.1"},
		IPAddresses: []net.IP{net.IPv4(127, 0, 0, 1)}, NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour)}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	cert := tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key}
	c, s := pair(t)
	server = tls.Server(s, &tls.Config{Certificates: []tls.Certificate{cert}})
	client = tls.Client(c, &tls.Config{InsecureSkipVerify: true}) // a throwaway cert made above
	errc := make(chan error, 1)
	go func() { errc <- server.Handshake() }()
	if err := client.Handshake(); err != nil {
		t.Fatal(err)
	}
	if err := <-errc; err != nil {
		t.Fatal(err)
	}
	return client, server
}

// TestWatchTLS: a TLS client's Close (close_notify, then FIN) reports it
// gone; application data (a pipelined request) does not.
func TestWatchTLS(t *testing.T) {
	cases := []struct {
		name     string
		act      func(c *tls.Conn)
		wantGone bool
	}{
		{"client closes", func(c *tls.Conn) { c.Close() }, true},
		{"client sends a request", func(c *tls.Conn) { _, _ = c.Write([]byte("GET / HTTP/1.1\r\n\r\n")) }, false},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			client, server := tlsPair(t)
			gone := make(chan struct{}, 1)
			w := Watch(server, func() { gone <- struct{}{} })
			tc.act(client)
			if tc.wantGone {
				select {
				case <-gone:
				case <-time.After(10 * time.Second):
					t.Fatal("the watch did not report the TLS client gone")
				}
				w.Stop()
				return
			}
			// The record reaches the server's socket at once on loopback;
			// the watch must end without a verdict when stopped, and leave
			// the record to the server.
			w.Stop()
			_ = server.SetReadDeadline(time.Now().Add(5 * time.Second))
			line, err := bufio.NewReader(server).ReadString('\n')
			if err != nil || line != "GET / HTTP/1.1\r\n" {
				t.Fatalf("server read %q, %v; want the request line", line, err)
			}
			select {
			case <-gone:
				t.Fatal("application data reported as a closed client")
			default:
			}
		})
	}
}

// TestDeferredShareOneQueue: deferred watches with different delays wait
// in one queue under one timer; each starts when due (in any order of
// adding), one that is not due is never started, and every watch stopped
// leaves the queue.
func TestDeferredShareOneQueue(t *testing.T) {
	delays := []time.Duration{time.Hour, 2 * time.Millisecond, time.Nanosecond, 50 * time.Millisecond, time.Hour}
	type watched struct {
		w    *Watcher
		gone chan struct{}
	}
	var ws []watched
	for _, d := range delays {
		client, server := pair(t)
		gone := make(chan struct{}, 1)
		ws = append(ws, watched{WatchAfter(server, func() { gone <- struct{}{} }, d), gone})
		client.Close()
	}
	for i, d := range delays {
		if d == time.Hour {
			continue
		}
		select {
		case <-ws[i].gone:
		case <-time.After(10 * time.Second):
			t.Fatalf("watch %d (delay %v): the closed client was not reported", i, d)
		}
	}
	for i, d := range delays {
		if d == time.Hour {
			select {
			case <-ws[i].gone:
				t.Errorf("watch %d (delay %v) started before it was due", i, d)
			default:
			}
		}
		ws[i].w.Stop()
	}
	pending.mu.Lock()
	left := len(pending.q)
	pending.mu.Unlock()
	if left != 0 {
		t.Fatalf("%d watches left in the queue after every Stop", left)
	}
}
