package tcp

import (
	"bytes"
	"io"
	"net"
	"sync"
	"testing"
	"time"

	"github.com/pdserve/pdserve/internal/kvxfer"
)

// FuzzHandshake plays arbitrary bytes as the decode side of a connection
// to a prefill's handshake, with and without a secret. It must never panic
// or hang; with a secret it must never accept (a proof cannot be guessed);
// without one it accepts only a stream that begins with a HELLO of this
// version and fingerprint that announces no secret.
func FuzzHandshake(f *testing.F) {
	hello := kvxfer.Hello{Version: kvxfer.ProtocolVersion, Fingerprint: testFP}
	f.Add(false, frame(f, hello))
	secretHello := hello
	secretHello.Auth = kvxfer.AuthSecret
	f.Add(true, append(frame(f, secretHello), frame(f, kvxfer.HelloProof{})...))
	f.Add(true, frame(f, hello))
	f.Add(false, frame(f, kvxfer.Hello{Version: 3, Foreign: []byte("old")}))
	f.Add(false, []byte("GET / HTTP/1.1\r\n\r\n"))
	f.Add(true, append(frame(f, secretHello), frame(f, kvxfer.HelloOK{})...))
	f.Fuzz(func(t *testing.T, secret bool, data []byte) {
		cfg := Config{Fingerprint: testFP, HandshakeTimeout: 2 * time.Second}
		if secret {
			cfg.Secret = fleetKey
		}
		b := New(cfg)
		defer b.Close()
		server, client := net.Pipe()
		b.mu.Lock()
		c := b.newConnLocked("fuzz", server)
		b.mu.Unlock()
		var wg sync.WaitGroup
		wg.Go(func() { _, _ = io.Copy(io.Discard, client) })
		wg.Go(func() {
			_, _ = client.Write(data)
			// All of data has been read: whatever the handshake waits for
			// now will not come (the handshake set its deadline before its
			// first read).
			_ = server.SetReadDeadline(time.Now().Add(5 * time.Millisecond))
		})
		_, err := c.handshake()
		accepted := err == nil
		c.fail(ErrClosed)
		client.Close()
		wg.Wait()
		if !accepted {
			return
		}
		if secret {
			t.Fatalf("a handshake with a secret accepted %x", data)
		}
		m, err := kvxfer.ReadFrame(bytes.NewReader(data), kvxfer.MaxHandshakeFrameBytes)
		h, ok := m.(kvxfer.Hello)
		if err != nil || !ok || h.Version != kvxfer.ProtocolVersion || h.Auth != kvxfer.AuthNone || h.Fingerprint.Mismatch(testFP) != "" {
			t.Fatalf("accepted a stream that does not begin with a matching HELLO: %x (%v)", data, err)
		}
	})
}
