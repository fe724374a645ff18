package tlsconf_test

import (
	"context"
	"crypto/tls"
	"errors"
	"io"
	"net"
	"os"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/pdserve/pdserve/internal/tlsconf"
	"github.com/pdserve/pdserve/internal/tlsconf/tlstest"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// echoServer accepts TLS connections with cfg and echoes what it reads,
// until the test ends.
func echoServer(t *testing.T, cfg *tls.Config) string {
	t.Helper()
	ln, err := tls.Listen("tcp", "127.0.0.1:0", cfg)
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	t.Cleanup(func() {
		ln.Close()
		wg.Wait()
	})
	wg.Go(func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			wg.Go(func() {
				defer c.Close()
				_, _ = io.Copy(c, c)
			})
		}
	})
	return ln.Addr().String()
}

func dial(t *testing.T, addr string, cfg *tls.Config) (*tls.Conn, error) {
	t.Helper()
	c, err := tls.DialWithDialer(&net.Dialer{Timeout: 5 * time.Second}, "tcp", addr, cfg)
	if err != nil {
		return nil, err
	}
	// TLS 1.3 reports a refused client certificate at the first read.
	if _, err := c.Write([]byte("x")); err != nil {
		c.Close()
		return nil, err
	}
	b := make([]byte, 1)
	if _, err := io.ReadFull(c, b); err != nil {
		c.Close()
		return nil, err
	}
	t.Cleanup(func() { c.Close() })
	return c, nil
}

// TestReloadSwapsCertificate: after Reload, new handshakes get the new
// certificate while a connection made before keeps working; a reload
// from a broken file keeps the old certificate.
func TestReloadSwapsCertificate(t *testing.T) {
	ca := tlstest.NewCA(t, "front")
	dir := t.TempDir()
	files := ca.IssueAt(t, dir, "server", time.Now().Add(time.Hour))
	src, err := tlsconf.Load(tlsconf.Files{Cert: files.Cert, Key: files.Key}, nil)
	if err != nil {
		t.Fatal(err)
	}
	addr := echoServer(t, src.ServerConfig(tlsconf.NoClientCerts, nil))
	client := &tls.Config{RootCAs: ca.Pool(), ServerName: "localhost"}
	old, err := dial(t, addr, client)
	if err != nil {
		t.Fatal(err)
	}
	first := old.ConnectionState().PeerCertificates[0].SerialNumber

	ca.IssueAt(t, dir, "server", time.Now().Add(2*time.Hour)) // same paths, new certificate
	if err := src.Reload(); err != nil {
		t.Fatal(err)
	}
	if src.Reloads() != 1 {
		t.Fatalf("Reloads = %d, want 1", src.Reloads())
	}
	c, err := dial(t, addr, client)
	if err != nil {
		t.Fatal(err)
	}
	second := c.ConnectionState().PeerCertificates[0].SerialNumber
	if second.Cmp(first) == 0 {
		t.Fatal("a handshake after Reload got the old certificate")
	}
	// The connection made before the reload still works.
	if _, err := old.Write([]byte("y")); err != nil {
		t.Fatalf("old connection: %v", err)
	}
	b := make([]byte, 1)
	if _, err := io.ReadFull(old, b); err != nil || b[0] != 'y' {
		t.Fatalf("old connection echo: %q, %v", b, err)
	}

	if err := os.WriteFile(files.Cert, []byte("-----BEGIN CERTIFICATE-----\ngarbage\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := src.Reload(); err == nil {
		t.Fatal("Reload of a broken certificate file succeeded")
	}
	c, err = dial(t, addr, client)
	if err != nil {
		t.Fatal(err)
	}
	if got := c.ConnectionState().PeerCertificates[0].SerialNumber; got.Cmp(second) != 0 {
		t.Fatal("a failed reload replaced the certificate")
	}
}

// TestWatchReloadsOnFileChange: rewriting the files makes Watch reload.
func TestWatchReloadsOnFileChange(t *testing.T) {
	ca := tlstest.NewCA(t, "front")
	dir := t.TempDir()
	files := ca.IssueAt(t, dir, "server", time.Now().Add(time.Hour))
	src, err := tlsconf.Load(files, nil)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- src.Watch(ctx, nil) }()
	defer func() {
		cancel()
		if err := <-done; !errors.Is(err, context.Canceled) {
			t.Errorf("Watch: %v", err)
		}
	}()
	before := src.Leaf().SerialNumber
	deadline := time.Now().Add(10 * time.Second)
	// The watch may start after a first write: write until it reloads.
	for src.Reloads() == 0 {
		if time.Now().After(deadline) {
			t.Fatal("no reload within 10s of rewriting the certificate")
		}
		ca.IssueAt(t, dir, "server", time.Now().Add(2*time.Hour))
		waitUntil(t, time.Second, func() bool { return src.Reloads() > 0 })
	}
	if src.Leaf().SerialNumber.Cmp(before) == 0 {
		t.Fatal("Watch reloaded but the certificate is the old one")
	}
}

// waitUntil polls cond every 10 ms for at most d.
func waitUntil(t *testing.T, d time.Duration, cond func() bool) bool {
	t.Helper()
	end := time.Now().Add(d)
	for !cond() {
		if time.Now().After(end) {
			return false
		}
		<-time.After(10 * time.Millisecond)
	}
	return true
}

// TestClientCertificates: optional client certificates let a client
// without one through and refuse one from another CA; required ones
// refuse a client without one; each refusal is reported with its reason.
func TestClientCertificates(t *testing.T) {
	ca := tlstest.NewCA(t, "fleet")
	other := tlstest.NewCA(t, "other")
	serverFiles := ca.Issue(t, "server")
	src, err := tlsconf.Load(serverFiles, nil)
	if err != nil {
		t.Fatal(err)
	}
	member, err := tlsconf.Load(ca.Issue(t, "member"), nil)
	if err != nil {
		t.Fatal(err)
	}
	strangerFiles := other.Issue(t, "stranger")
	stranger, err := tlsconf.Load(tlsconf.Files{Cert: strangerFiles.Cert, Key: strangerFiles.Key, CA: ca.File}, nil)
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	var reasons []string
	onReject := func(r string) {
		mu.Lock()
		reasons = append(reasons, r)
		mu.Unlock()
	}
	noCert := &tls.Config{RootCAs: ca.Pool(), ServerName: "localhost"}
	for _, tc := range []struct {
		name   string
		certs  tlsconf.ClientCerts
		client *tls.Config
		ok     bool
		reason string
	}{
		{"optional, member", tlsconf.OptionalClientCerts, member.ClientConfig(nil), true, ""},
		{"optional, none", tlsconf.OptionalClientCerts, noCert, true, ""},
		{"optional, other CA", tlsconf.OptionalClientCerts, stranger.ClientConfig(nil), false, tlsconf.RejectBadCertificate},
		{"required, member", tlsconf.RequiredClientCerts, member.ClientConfig(nil), true, ""},
		{"required, none", tlsconf.RequiredClientCerts, noCert, false, tlsconf.RejectNoCertificate},
		{"required, other CA", tlsconf.RequiredClientCerts, stranger.ClientConfig(nil), false, tlsconf.RejectBadCertificate},
	} {
		t.Run(tc.name, func(t *testing.T) {
			mu.Lock()
			reasons = nil
			mu.Unlock()
			addr := echoServer(t, src.ServerConfig(tc.certs, onReject))
			_, err := dial(t, addr, tc.client)
			if (err == nil) != tc.ok {
				t.Fatalf("dial: err %v, want ok %v", err, tc.ok)
			}
			mu.Lock()
			defer mu.Unlock()
			if tc.reason == "" && len(reasons) > 0 || tc.reason != "" && (len(reasons) != 1 || reasons[0] != tc.reason) {
				t.Fatalf("rejections %v, want [%s]", reasons, tc.reason)
			}
		})
	}
}

// TestClientVerifiesServer: an internal client refuses a server whose
// certificate is not from the fleet's CA, and accepts one that is,
// whatever host name it dialed.
func TestClientVerifiesServer(t *testing.T) {
	ca := tlstest.NewCA(t, "fleet")
	other := tlstest.NewCA(t, "other")
	impostor, err := tlsconf.Load(other.Issue(t, "impostor"), nil)
	if err != nil {
		t.Fatal(err)
	}
	member, err := tlsconf.Load(ca.Issue(t, "member"), nil)
	if err != nil {
		t.Fatal(err)
	}
	var rejected []string
	client := member.ClientConfig(func(r string) { rejected = append(rejected, r) })
	if _, err := dial(t, echoServer(t, impostor.ServerConfig(tlsconf.NoClientCerts, nil)), client); err == nil {
		t.Fatal("client accepted a server certificate from another CA")
	}
	if len(rejected) != 1 || rejected[0] != tlsconf.RejectBadCertificate {
		t.Fatalf("rejections %v, want [bad_certificate]", rejected)
	}
	if _, err := dial(t, echoServer(t, member.ServerConfig(tlsconf.RequiredClientCerts, nil)), client); err != nil {
		t.Fatalf("member to member: %v", err)
	}
}

// TestLoadErrors: a certificate without its key, or a key that does not
// match, is refused naming the files.
func TestLoadErrors(t *testing.T) {
	ca := tlstest.NewCA(t, "x")
	a, b := ca.Issue(t, "a"), ca.Issue(t, "b")
	if _, err := tlsconf.Load(tlsconf.Files{Cert: a.Cert}, nil); err == nil {
		t.Error("a certificate without a key loaded")
	}
	if _, err := tlsconf.Load(tlsconf.Files{Cert: a.Cert, Key: b.Key}, nil); err == nil {
		t.Error("a certificate with another's key loaded")
	}
	if _, err := tlsconf.Load(tlsconf.Files{CA: a.Key}, nil); err == nil {
		t.Error("a CA bundle without certificates loaded")
	}
}
