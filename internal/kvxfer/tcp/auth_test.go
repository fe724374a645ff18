package tcp

import (
	"crypto/tls"
	"errors"
	"strings"
	"testing"

	"github.com/pdserve/pdserve/internal/kvxfer"
	"github.com/pdserve/pdserve/internal/tlsconf"
	"github.com/pdserve/pdserve/internal/tlsconf/tlstest"
)

var fleetKey = []byte("the fleet's key, 32 bytes long..")

// TestSecretHandshake: two sides with the same secret connect after the
// challenge–response (each sends its proof, nothing carries the key) and
// exchange room messages.
func TestSecretHandshake(t *testing.T) {
	p := newPair(t, func(c *Config) { c.Secret = fleetKey })
	if err := p.decode.Send(p.decodePeer, kvxfer.KVAck{RoomGen: roomGen(1)}); err != nil {
		t.Fatal(err)
	}
	p.prefillRec.waitMessages(t, p.prefillPeer, 1)
	ps, ds := p.prefill.Stats(), p.decode.Stats()
	if ps.Sent[kvxfer.TypeHelloChallenge].Frames != 1 || ds.Sent[kvxfer.TypeHelloProof].Frames != 1 {
		t.Errorf("challenge sent %d, proof sent %d, want 1 1", ps.Sent[kvxfer.TypeHelloChallenge].Frames,
			ds.Sent[kvxfer.TypeHelloProof].Frames)
	}
	if got := ps.Sent[kvxfer.TypeHelloOK].Bytes; got != kvxfer.HeaderBytes+kvxfer.MACBytes {
		t.Errorf("HELLO_OK of %d bytes, want %d (with prefill's proof)", got, kvxfer.HeaderBytes+kvxfer.MACBytes)
	}
	if sum(ps.HandshakeFailures)+sum(ds.HandshakeFailures) != 0 {
		t.Errorf("handshake failures %v %v", ps.HandshakeFailures, ds.HandshakeFailures)
	}
}

// fakePrefill accepts decode's connection and answers its HELLO with
// answer, which gets decode's HELLO and the raw peer (after a challenge
// it sent, decode's proof is the next frame).
func fakePrefill(t *testing.T, answer func(p *rawPeer, hello kvxfer.Hello)) (*Backend, *recorder, error) {
	t.Helper()
	ln := rawListener(t)
	decode, rec := newBackend(t, func(c *Config) { c.Secret = fleetKey })
	peer := decode.Connect(ln.Addr().String())
	raw := accept(t, ln)
	hello := raw.read().(kvxfer.Hello)
	answer(raw, hello)
	return decode, rec, rec.waitKind(t, evLost, peer).err
}

// TestDecodeVerifiesPrefill: decode with a secret refuses a prefill that
// does not prove it holds the same one: one that skips the challenge, one
// whose proof is missing or wrong, one that reflects decode's own proof.
func TestDecodeVerifiesPrefill(t *testing.T) {
	challenge := kvxfer.HelloChallenge{Nonce: [kvxfer.NonceBytes]byte{1, 2, 3}}
	for _, tc := range []struct {
		name   string
		answer func(p *rawPeer, hello kvxfer.Hello)
		reason string
		want   string
	}{
		{"no challenge", func(p *rawPeer, _ kvxfer.Hello) { p.write(kvxfer.HelloOK{}) }, FailAuthMode,
			"prefill did not ask for the internal secret"},
		{"no proof", func(p *rawPeer, _ kvxfer.Hello) {
			p.write(challenge)
			p.read()
			p.write(kvxfer.HelloOK{})
		}, FailBadProof, "prefill failed to prove the internal secret"},
		{"another key", func(p *rawPeer, h kvxfer.Hello) {
			p.write(challenge)
			p.read()
			proof, _ := kvxfer.HandshakeProof([]byte("another key"), kvxfer.ProofPrefill, h, challenge)
			p.write(kvxfer.HelloOK{Proof: proof[:]})
		}, FailBadProof, "prefill failed to prove the internal secret"},
		{"decode's own proof reflected", func(p *rawPeer, _ kvxfer.Hello) {
			p.write(challenge)
			mine := p.read().(kvxfer.HelloProof)
			p.write(kvxfer.HelloOK{Proof: mine.MAC[:]})
		}, FailBadProof, "prefill failed to prove the internal secret"},
		{"not a handshake frame", func(p *rawPeer, _ kvxfer.Hello) { p.write(kvxfer.KVAck{}) }, FailMalformed,
			"got KV_ACK"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			decode, rec, err := fakePrefill(t, tc.answer)
			if !errors.Is(err, kvxfer.ErrRefused) || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("PeerLost err %v, want ErrRefused containing %q", err, tc.want)
			}
			if got := decode.Stats().HandshakeFailures; got[tc.reason] != 1 || sum(got) != 1 {
				t.Errorf("decode handshake failures %v, want one %s", got, tc.reason)
			}
			for _, e := range rec.snapshot() {
				if e.kind == evUp {
					t.Error("PeerUp after a refused handshake")
				}
			}
		})
	}
	// The check accepts the right proof: the same fake with the key passes.
	ln := rawListener(t)
	decode, rec := newBackend(t, func(c *Config) { c.Secret = fleetKey })
	peer := decode.Connect(ln.Addr().String())
	raw := accept(t, ln)
	h := raw.read().(kvxfer.Hello)
	raw.write(challenge)
	raw.read()
	proof, _ := kvxfer.HandshakeProof(fleetKey, kvxfer.ProofPrefill, h, challenge)
	raw.write(kvxfer.HelloOK{Proof: proof[:]})
	rec.waitKind(t, evUp, peer)
}

// TestRecordedHandshakeReplayed: a handshake recorded on the wire (decode's
// HELLO and proof) replayed to prefill fails, because prefill's challenge
// is fresh; and prefill stays up for the real decode.
func TestRecordedHandshakeReplayed(t *testing.T) {
	// Record what a real decode sends to an eavesdropped prefill.
	ln := rawListener(t)
	decode, _ := newBackend(t, func(c *Config) { c.Secret = fleetKey })
	decode.Connect(ln.Addr().String())
	rec := accept(t, ln)
	hello := rec.read().(kvxfer.Hello)
	rec.write(kvxfer.HelloChallenge{Nonce: [kvxfer.NonceBytes]byte{9}})
	proof := rec.read().(kvxfer.HelloProof)

	prefill, prefillRec := newBackend(t, func(c *Config) { c.Secret = fleetKey })
	addr := listen(t, prefill)
	replay := dialRaw(t, addr)
	replay.write(hello)
	if m := replay.read(); m.Type() != kvxfer.TypeHelloChallenge {
		t.Fatalf("prefill answered %s, want HELLO_CHALLENGE", m.Type())
	}
	replay.write(proof)
	if m, ok := replay.read().(kvxfer.HelloErr); !ok || !strings.Contains(m.Reason, "failed to prove") {
		t.Fatalf("replayed proof answered %#v, want HELLO_ERR", m)
	}
	prefillRec.waitAny(t, evLost)
	if got := prefill.Stats().HandshakeFailures[FailBadProof]; got != 1 {
		t.Errorf("bad_proof = %d, want 1", got)
	}
	// A real member still connects.
	member, memberRec := newBackend(t, func(c *Config) { c.Secret = fleetKey })
	memberRec.waitKind(t, evUp, member.Connect(addr))
}

// TestKVChannelTLS: with mutual TLS a member connects; a peer without a
// certificate, with one of another CA, or without TLS is refused and
// counted, and the member's connection is unaffected.
func TestKVChannelTLS(t *testing.T) {
	ca := tlstest.NewCA(t, "fleet")
	other := tlstest.NewCA(t, "other")
	load := func(f tlsconf.Files) *tlsconf.Source {
		s, err := tlsconf.Load(f, nil)
		if err != nil {
			t.Fatal(err)
		}
		return s
	}
	member := load(ca.Issue(t, "member"))
	strangerFiles := other.Issue(t, "stranger")
	stranger := load(tlsconf.Files{Cert: strangerFiles.Cert, Key: strangerFiles.Key, CA: ca.File})
	withTLS := func(s *tlsconf.Source) func(*Config) {
		return func(c *Config) {
			c.TLSServer = s.ServerConfig(tlsconf.RequiredClientCerts, nil)
			c.TLSClient = s.ClientConfig(nil)
		}
	}
	p := newPair(t, withTLS(member))

	noCert := &tls.Config{InsecureSkipVerify: true}
	for _, tc := range []struct {
		name    string
		dial    func(c *Config)
		refused bool // decode learns it was refused (a TLS alert)
	}{
		{"no certificate", func(c *Config) { c.TLSClient = noCert }, true},
		{"another CA", withTLS(stranger), true},
		{"plain TCP", nil, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			before := p.prefill.Stats().HandshakeFailures[FailTLS]
			d, rec := newBackend(t, tc.dial)
			err := rec.waitKind(t, evLost, d.Connect(p.addr)).err
			if errors.Is(err, kvxfer.ErrRefused) != tc.refused {
				t.Errorf("PeerLost err %v, want refused %v", err, tc.refused)
			}
			waitCount(t, p.prefillRec, func() uint64 { return p.prefill.Stats().HandshakeFailures[FailTLS] }, before+1)
		})
	}
	// The member's connection still carries frames.
	if err := p.decode.Send(p.decodePeer, kvxfer.KVAck{RoomGen: roomGen(7)}); err != nil {
		t.Fatal(err)
	}
	p.prefillRec.waitMessages(t, p.prefillPeer, 1)

	// And decode refuses a prefill with another CA's certificate.
	impostor, _ := newBackend(t, withTLS(stranger))
	d, rec := newBackend(t, withTLS(member))
	err := rec.waitKind(t, evLost, d.Connect(listen(t, impostor))).err
	if !errors.Is(err, kvxfer.ErrRefused) || d.Stats().HandshakeFailures[FailTLS] != 1 {
		t.Errorf("decode to an impostor prefill: %v, failures %v", err, d.Stats().HandshakeFailures)
	}
}

// waitCount waits until get returns at least want, checking at every
// event of r (a connection's counters change before its PeerLost).
func waitCount(t *testing.T, r *recorder, get func() uint64, want uint64) {
	t.Helper()
	r.waitUntil(t, "a counter", func([]event) bool { return get() >= want })
}
