// Package auth authenticates pdserve's HTTP callers: API keys on the OpenAI
// front door and its admin API (FrontDoor), and the router on a worker's
// API (PeerAuth: a client certificate of the fleet's CA, requests signed
// with the shared internal secret, or both; Signer signs them).
//
// Every comparison of a secret is constant-time, and nothing secret is
// logged or sent back.
package auth

import (
	"crypto/hmac"
	"crypto/sha256"
	"crypto/subtle"
	"net/http"
	"strings"
)

// Keys is a set of bearer keys (--api-key, --admin-api-key). The zero value
// and nil hold none.
type Keys struct {
	digests [][sha256.Size]byte
}

// NewKeys returns the set of the non-empty keys given.
func NewKeys(keys ...string) *Keys {
	k := &Keys{}
	for _, s := range keys {
		if s != "" {
			k.digests = append(k.digests, sha256.Sum256([]byte(s)))
		}
	}
	return k
}

// Len is the number of keys.
func (k *Keys) Len() int {
	if k == nil {
		return 0
	}
	return len(k.digests)
}

// Match reports whether token is one of the keys. It compares SHA-256
// digests in constant time against every key (no early exit), so neither
// the time taken nor its length says which key, or how much of one, a
// guess matched.
func (k *Keys) Match(token string) bool {
	if k.Len() == 0 {
		return false
	}
	d := sha256.Sum256([]byte(token))
	ok := 0
	for i := range k.digests {
		ok |= subtle.ConstantTimeCompare(d[:], k.digests[i][:])
	}
	return ok == 1
}

// BearerToken returns the token of an "Authorization: Bearer <token>"
// header (the scheme case-insensitive, as RFC 6750 has it), and whether
// there was one.
func BearerToken(r *http.Request) (string, bool) {
	h := r.Header.Get("Authorization")
	scheme, token, ok := strings.Cut(h, " ")
	if !ok || !strings.EqualFold(scheme, "Bearer") {
		return "", false
	}
	token = strings.TrimSpace(token)
	return token, token != ""
}

// Purposes of the keys derived from the internal secret (DeriveKey): one
// key per use, so a MAC made for one channel is worthless on the other.
const (
	PurposeWorkerAPI = "worker-api"
	PurposeKV        = "kv-channel"
)

// DeriveKey derives the key for purpose from the shared internal secret:
// HMAC-SHA256(secret, "pdserve/v1/" + purpose) (the extract-and-expand of
// HKDF, RFC 5869, in one step, for a secret that is already a high-entropy
// key). 32 bytes.
func DeriveKey(secret []byte, purpose string) []byte {
	m := hmac.New(sha256.New, secret)
	m.Write([]byte("pdserve/v1/" + purpose))
	return m.Sum(nil)
}

// MinSecretBytes is the shortest internal secret accepted: it is the key
// of an HMAC whose outputs an attacker may collect, so it must not be
// guessable (32 random bytes, e.g. `openssl rand -hex 32`, are best).
const MinSecretBytes = 16
