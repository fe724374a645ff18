package kvxfer

import (
	"crypto/hmac"
	"crypto/sha256"
)

// Proof roles of HandshakeProof: the side that makes the proof.
const (
	ProofDecode  = "pdserve kv decode"
	ProofPrefill = "pdserve kv prefill"
)

// HandshakeProof is the proof that the side role (ProofDecode,
// ProofPrefill) holds key in the handshake that began with hello and
// challenge:
//
//	HMAC-SHA256(key, role | 0x00 | SHA-256(frame(hello) | frame(challenge)))
//
// Both nonces are in the transcript, so each side's proof is fresh for the
// other; the role keeps a decode proof from passing as a prefill one. key
// is the KV channel's key derived from the shared secret (auth.DeriveKey
// with auth.PurposeKV). It returns the encoding error of hello (a field
// too long), which a hello that was decoded never has.
func HandshakeProof(key []byte, role string, hello Hello, challenge HelloChallenge) ([MACBytes]byte, error) {
	var out [MACBytes]byte
	t := sha256.New()
	f, err := AppendFrame(nil, hello)
	if err != nil {
		return out, err
	}
	t.Write(f)
	f, _ = AppendFrame(f[:0], challenge)
	t.Write(f)
	m := hmac.New(sha256.New, key)
	m.Write([]byte(role))
	m.Write([]byte{0})
	m.Write(t.Sum(nil))
	copy(out[:], m.Sum(nil))
	return out, nil
}
