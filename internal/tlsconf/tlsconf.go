// Package tlsconf builds pdserve's TLS configurations from PEM files: the
// OpenAI front door's (--ssl-certfile, --ssl-keyfile, --ssl-ca-certs) and the
// mutual TLS of the internal channels, the worker API and the KV channel
// (--internal-tls-cert, --internal-tls-key, --internal-tls-ca).
//
// A Source holds the certificate, key and CA pool loaded from its files and
// swaps them atomically on Reload (SIGHUP) or when the files change (Watch):
// every new handshake uses what was loaded last, connections already
// established are not touched, and a reload that fails (a file half
// written, a key that does not match) keeps the previous material.
//
// # Verification
//
// Client certificates are requested, not demanded, at the TLS level, and
// verified against the Source's CA pool in VerifyConnection (chain and
// extended key usage; the CA pool read at the handshake): a certificate
// that does not verify fails the handshake and is reported to OnReject, a
// connection without one is let through (the front door, a worker's /health)
// unless the policy requires one (the KV channel). HTTP handlers that need
// one check that the request has a peer certificate (see HasPeerCert): any
// certificate present passed verification.
//
// Internal peers verify each other against the internal CA alone, not
// against host names: every holder of a certificate of that CA is a member
// of the fleet (addresses of workers are pod IPs and change; the CA is the
// trust boundary, so it must be one dedicated to the fleet).
//
// # Concurrency
//
// A Source is safe for concurrent use; the configurations it returns may be
// used by any number of servers and clients at once.
package tlsconf

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"time"

	"github.com/fsnotify/fsnotify"
	"k8s.io/utils/clock"
)

// Files names the PEM files of a Source. Cert and Key go together; CA is
// optional for the front door (then client certificates are not asked for)
// and required for the internal channels.
type Files struct {
	// Cert is the certificate chain (leaf first), Key its private key.
	Cert, Key string
	// CA is a bundle of CA certificates: client certificates are verified
	// against it (and, internally, servers too).
	CA string
}

// MaxFileBytes bounds each PEM file read.
const MaxFileBytes = 1 << 20

// Rejection reasons passed to OnReject (and counted by reason).
const (
	// RejectNoCertificate: a peer presented no certificate where one is
	// required.
	RejectNoCertificate = "no_certificate"
	// RejectBadCertificate: a peer's certificate does not verify against
	// the CA (another CA, expired, wrong key usage).
	RejectBadCertificate = "bad_certificate"
)

// material is one loaded generation of a Source's files.
type material struct {
	cert *tls.Certificate // nil without Cert/Key
	pool *x509.CertPool   // nil without CA
	raw  [3][]byte        // file contents, to skip reloads that change nothing
}

// Source is a certificate, key and CA pool loaded from Files. See the
// package doc.
type Source struct {
	files Files
	log   *slog.Logger
	cur   atomic.Pointer[material]
	mu    sync.Mutex // serializes Reload
	// reloads counts successful reloads that changed something.
	reloads atomic.Uint64
}

// Load reads files and returns a Source. It returns an error naming the
// file at fault if one cannot be read or parsed, if Cert and Key do not
// match, or if only one of them is given.
func Load(files Files, log *slog.Logger) (*Source, error) {
	if (files.Cert == "") != (files.Key == "") {
		return nil, errors.New("a certificate and its key go together: give both files or neither")
	}
	if files.Cert == "" && files.CA == "" {
		return nil, errors.New("no certificate and no CA given")
	}
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	s := &Source{files: files, log: log}
	m, err := load(files)
	if err != nil {
		return nil, err
	}
	s.cur.Store(m)
	return s, nil
}

func readFile(what, path string) ([]byte, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", what, err)
	}
	defer f.Close()
	b, err := io.ReadAll(io.LimitReader(f, MaxFileBytes+1))
	if err != nil {
		return nil, fmt.Errorf("%s %s: %w", what, path, err)
	}
	if len(b) > MaxFileBytes {
		return nil, fmt.Errorf("%s %s: larger than %d bytes", what, path, MaxFileBytes)
	}
	return b, nil
}

func load(files Files) (*material, error) {
	m := &material{}
	if files.Cert != "" {
		certPEM, err := readFile("certificate", files.Cert)
		if err != nil {
			return nil, err
		}
		keyPEM, err := readFile("key", files.Key)
		if err != nil {
			return nil, err
		}
		cert, err := tls.X509KeyPair(certPEM, keyPEM)
		if err != nil {
			return nil, fmt.Errorf("certificate %s with key %s: %w", files.Cert, files.Key, err)
		}
		m.cert = &cert
		m.raw[0], m.raw[1] = certPEM, keyPEM
	}
	if files.CA != "" {
		caPEM, err := readFile("CA bundle", files.CA)
		if err != nil {
			return nil, err
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(caPEM) {
			return nil, fmt.Errorf("CA bundle %s: no PEM certificate in it", files.CA)
		}
		m.pool = pool
		m.raw[2] = caPEM
	}
	return m, nil
}

// Reload reads the files again and, if they parse, swaps them in for new
// handshakes. On error the material loaded before stays in use.
func (s *Source) Reload() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	m, err := load(s.files)
	if err != nil {
		s.log.Warn("TLS reload failed; keeping the certificates loaded before", "err", err)
		return err
	}
	old := s.cur.Load()
	if bytes.Equal(old.raw[0], m.raw[0]) && bytes.Equal(old.raw[1], m.raw[1]) && bytes.Equal(old.raw[2], m.raw[2]) {
		return nil
	}
	s.cur.Store(m)
	s.reloads.Add(1)
	attrs := []any{"cert", s.files.Cert, "ca", s.files.CA}
	if m.cert != nil && m.cert.Leaf != nil {
		attrs = append(attrs, "subject", m.cert.Leaf.Subject.String(), "not_after", m.cert.Leaf.NotAfter)
	}
	s.log.Info("TLS certificates reloaded", attrs...)
	return nil
}

// Reloads counts the reloads that changed the material in use.
func (s *Source) Reloads() uint64 { return s.reloads.Load() }

// Leaf is the certificate in use (nil without one).
func (s *Source) Leaf() *x509.Certificate {
	if m := s.cur.Load(); m.cert != nil {
		return m.cert.Leaf
	}
	return nil
}

// HasCA reports whether the Source has a CA pool (client certificates are
// then verified).
func (s *Source) HasCA() bool { return s.cur.Load().pool != nil }

// watchDebounce is how long Watch waits after a change of a file before it
// reloads, so that a cert and key written one after the other load together.
const watchDebounce = 200 * time.Millisecond

// Watch reloads the Source when one of its files changes (written,
// replaced, renamed into place; also Kubernetes' atomic "..data" swap of a
// mounted secret), until ctx ends. It watches the directories of the files.
// It returns ctx's error, or an error if the watch cannot be set up.
func (s *Source) Watch(ctx context.Context, clk clock.WithDelayedExecution) error {
	if clk == nil {
		clk = clock.RealClock{}
	}
	w, err := fsnotify.NewWatcher()
	if err != nil {
		return fmt.Errorf("watching TLS files: %w", err)
	}
	defer w.Close()
	names := map[string]bool{}
	dirs := map[string]bool{}
	for _, f := range []string{s.files.Cert, s.files.Key, s.files.CA} {
		if f == "" {
			continue
		}
		abs, err := filepath.Abs(f)
		if err != nil {
			return err
		}
		names[abs] = true
		dirs[filepath.Dir(abs)] = true
	}
	for d := range dirs {
		if err := w.Add(d); err != nil {
			return fmt.Errorf("watching TLS files in %s: %w", d, err)
		}
	}
	var (
		mu    sync.Mutex
		timer clock.Timer
	)
	defer func() {
		mu.Lock()
		if timer != nil {
			timer.Stop()
		}
		mu.Unlock()
	}()
	for {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case err, ok := <-w.Errors:
			if !ok {
				return errors.New("TLS file watch closed")
			}
			s.log.Warn("TLS file watch error", "err", err)
		case ev, ok := <-w.Events:
			if !ok {
				return errors.New("TLS file watch closed")
			}
			if !names[ev.Name] && filepath.Base(ev.Name) != "..data" {
				continue
			}
			mu.Lock()
			if timer != nil {
				timer.Stop()
			}
			timer = clk.AfterFunc(watchDebounce, func() { _ = s.Reload() })
			mu.Unlock()
		}
	}
}

// ClientCerts says what a server asks of its clients.
type ClientCerts int

const (
	// NoClientCerts: none are asked for (a front door without a CA).
	NoClientCerts ClientCerts = iota
	// OptionalClientCerts: asked for, verified when given (the front
	// door with --ssl-ca-certs; a worker's HTTP port, whose /health and
	// /livez stay open while the worker API demands one).
	OptionalClientCerts
	// RequiredClientCerts: a connection without one fails the handshake
	// (the KV channel).
	RequiredClientCerts
)

// ServerConfig returns a server configuration that presents the Source's
// current certificate and treats client certificates as certs says,
// verifying them against the current CA pool; onReject (may be nil) is
// called with the reason of every refused handshake. The Source must have a
// certificate, and a CA for certs other than NoClientCerts.
func (s *Source) ServerConfig(certs ClientCerts, onReject func(reason string)) *tls.Config {
	cfg := &tls.Config{
		MinVersion: tls.VersionTLS12,
		NextProtos: []string{"h2", "http/1.1"},
		GetCertificate: func(*tls.ClientHelloInfo) (*tls.Certificate, error) {
			if m := s.cur.Load(); m.cert != nil {
				return m.cert, nil
			}
			return nil, errors.New("no server certificate loaded")
		},
	}
	if certs == NoClientCerts {
		return cfg
	}
	cfg.ClientAuth = tls.RequestClientCert
	cfg.VerifyConnection = func(cs tls.ConnectionState) error {
		if len(cs.PeerCertificates) == 0 {
			if certs == RequiredClientCerts {
				reject(onReject, RejectNoCertificate)
				return errors.New("a client certificate is required")
			}
			return nil
		}
		if err := s.verify(cs.PeerCertificates, x509.ExtKeyUsageClientAuth); err != nil {
			reject(onReject, RejectBadCertificate)
			return err
		}
		return nil
	}
	return cfg
}

// ClientConfig returns the configuration of an internal client (the
// router calling workers, decode dialing prefill): it presents the
// Source's current certificate and verifies the server's against the
// current CA pool, not its host name (see the package doc); onReject (may
// be nil) is called when the server's certificate does not verify.
func (s *Source) ClientConfig(onReject func(reason string)) *tls.Config {
	return &tls.Config{
		MinVersion: tls.VersionTLS12,
		// Verification is VerifyConnection's: chain and key usage against
		// the internal CA, no host name.
		InsecureSkipVerify: true,
		GetClientCertificate: func(*tls.CertificateRequestInfo) (*tls.Certificate, error) {
			if m := s.cur.Load(); m.cert != nil {
				return m.cert, nil
			}
			return &tls.Certificate{}, nil // none: the server decides
		},
		VerifyConnection: func(cs tls.ConnectionState) error {
			if len(cs.PeerCertificates) == 0 {
				reject(onReject, RejectNoCertificate)
				return errors.New("the server presented no certificate")
			}
			if err := s.verify(cs.PeerCertificates, x509.ExtKeyUsageServerAuth); err != nil {
				reject(onReject, RejectBadCertificate)
				return err
			}
			return nil
		},
	}
}

func reject(f func(string), reason string) {
	if f != nil {
		f(reason)
	}
}

// verify checks a peer's chain (leaf first) against the current CA pool
// for usage.
func (s *Source) verify(chain []*x509.Certificate, usage x509.ExtKeyUsage) error {
	pool := s.cur.Load().pool
	if pool == nil {
		return errors.New("no CA to verify the peer's certificate against")
	}
	inter := x509.NewCertPool()
	for _, c := range chain[1:] {
		inter.AddCert(c)
	}
	_, err := chain[0].Verify(x509.VerifyOptions{Roots: pool, Intermediates: inter,
		KeyUsages: []x509.ExtKeyUsage{usage}})
	if err != nil {
		return fmt.Errorf("peer certificate %q: %w", chain[0].Subject.CommonName, err)
	}
	return nil
}
