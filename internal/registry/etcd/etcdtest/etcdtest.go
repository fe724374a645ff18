// Package etcdtest runs a real etcd server in process for tests (etcd's
// server/v3/embed), on loopback ports chosen at start, and can stop and
// restart it on the same ports and data (or on an empty one), to test an
// outage of the registry.
package etcdtest

import (
	"fmt"
	"net"
	"net/url"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"go.etcd.io/etcd/server/v3/embed"
)

// Server is one embedded etcd member.
type Server struct {
	t          testing.TB
	dir        string
	clientURL  url.URL
	peerURL    url.URL
	mu         sync.Mutex
	etcd       *embed.Etcd
	startCount int
}

// Start starts an etcd member in a temporary directory of t; it is stopped
// when t ends.
func Start(t testing.TB) *Server {
	t.Helper()
	s := &Server{t: t, dir: filepath.Join(t.TempDir(), "etcd")}
	s.clientURL = url.URL{Scheme: "http", Host: freeAddr(t)}
	s.peerURL = url.URL{Scheme: "http", Host: freeAddr(t)}
	if err := s.start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Stop)
	return s
}

// freeAddr returns a loopback address whose port was free a moment ago
// (etcd must advertise the port it listens on, so port 0 will not do, and a
// restart must bind the same one).
func freeAddr(t testing.TB) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().String()
}

func (s *Server) start() error {
	cfg := embed.NewConfig()
	cfg.Name = "pdserve-test"
	cfg.Dir = s.dir
	cfg.Logger = "zap"
	cfg.LogLevel = "error"
	cfg.LogOutputs = []string{"/dev/null"}
	cfg.ListenClientUrls = []url.URL{s.clientURL}
	cfg.AdvertiseClientUrls = []url.URL{s.clientURL}
	cfg.ListenPeerUrls = []url.URL{s.peerURL}
	cfg.AdvertisePeerUrls = []url.URL{s.peerURL}
	cfg.InitialCluster = fmt.Sprintf("%s=%s", cfg.Name, s.peerURL.String())
	// Elections in a single-member cluster are immediate; keep them short.
	cfg.TickMs = 10
	cfg.ElectionMs = 100
	e, err := embed.StartEtcd(cfg)
	if err != nil {
		return fmt.Errorf("start etcd: %w", err)
	}
	select {
	case <-e.Server.ReadyNotify():
	case err := <-e.Err():
		e.Close()
		return fmt.Errorf("etcd failed to start: %w", err)
	case <-time.After(30 * time.Second):
		e.Close()
		return fmt.Errorf("etcd not ready within 30s")
	}
	s.mu.Lock()
	s.etcd = e
	s.startCount++
	s.mu.Unlock()
	return nil
}

// Endpoint is the client URL, e.g. http://127.0.0.1:34567.
func (s *Server) Endpoint() string { return s.clientURL.String() }

// Stop stops the member (its data stays for Restart). It is idempotent.
func (s *Server) Stop() {
	s.mu.Lock()
	e := s.etcd
	s.etcd = nil
	s.mu.Unlock()
	if e != nil {
		e.Close()
		<-e.Server.StopNotify()
	}
}

// RestartEmpty starts the stopped member again on the same ports with a
// new, empty data directory: every key and lease is gone, as after an etcd
// restored from nothing.
func (s *Server) RestartEmpty() {
	s.t.Helper()
	s.dir = filepath.Join(s.t.TempDir(), "etcd")
	if err := s.start(); err != nil {
		s.t.Fatal(err)
	}
}

// Restart starts the stopped member again on the same ports and data.
func (s *Server) Restart() {
	s.t.Helper()
	if err := s.start(); err != nil {
		s.t.Fatal(err)
	}
}
