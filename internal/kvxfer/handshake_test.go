package kvxfer

import "testing"

// TestHandshakeProof: a proof depends on the key, the role, both nonces
// and every field of the HELLO; the same inputs give the same proof.
func TestHandshakeProof(t *testing.T) {
	key := []byte("k")
	h := Hello{Version: ProtocolVersion, Fingerprint: Fingerprint{Model: "m", PageSize: 16}, Auth: AuthSecret, Nonce: [NonceBytes]byte{1}}
	ch := HelloChallenge{Nonce: [NonceBytes]byte{2}}
	base, err := HandshakeProof(key, ProofDecode, h, ch)
	if err != nil {
		t.Fatal(err)
	}
	if again, _ := HandshakeProof(key, ProofDecode, h, ch); again != base {
		t.Fatal("the same inputs gave another proof")
	}
	h2, ch2, hfp := h, ch, h
	h2.Nonce[0] = 9
	ch2.Nonce[0] = 9
	hfp.Fingerprint.PageSize = 32
	for name, p := range map[string][MACBytes]byte{
		"key":         must(HandshakeProof([]byte("other"), ProofDecode, h, ch)),
		"role":        must(HandshakeProof(key, ProofPrefill, h, ch)),
		"hello nonce": must(HandshakeProof(key, ProofDecode, h2, ch)),
		"challenge":   must(HandshakeProof(key, ProofDecode, h, ch2)),
		"fingerprint": must(HandshakeProof(key, ProofDecode, hfp, ch)),
	} {
		if p == base {
			t.Errorf("another %s gave the same proof", name)
		}
	}
}

func must(p [MACBytes]byte, err error) [MACBytes]byte {
	if err != nil {
		panic(err)
	}
	return p
}
