package kvxfer

import (
	"errors"
	"fmt"
	"strings"
)

// RefusalReason says why a KV handshake was refused, as a decode worker
// reports a (prefill, decode) KV path to the router (the finer reasons a
// worker counts are pdserve_peer_auth_failures_total's).
type RefusalReason uint8

// Refusal reasons.
const (
	// RefusedProtocol: the first frame was not a HELLO, or not a valid one.
	RefusedProtocol RefusalReason = iota
	// RefusedVersion: the peers speak different protocol versions.
	RefusedVersion
	// RefusedAuth: the peers do not share the internal secret (one has
	// none, or a proof failed), or TLS refused a certificate.
	RefusedAuth
	// RefusedFingerprint: the peers' KV layouts differ (model, geometry,
	// dtype, page size).
	RefusedFingerprint
	numRefusalReasons
)

// NumRefusalReasons is the number of refusal reasons (an array bound).
const NumRefusalReasons = int(numRefusalReasons)

var refusalNames = [numRefusalReasons]string{"protocol", "version", "auth", "fingerprint"}

func (r RefusalReason) String() string {
	if r < numRefusalReasons {
		return refusalNames[r]
	}
	return fmt.Sprintf("refusal(%d)", uint8(r))
}

// RefusalReasons lists every reason, in order.
func RefusalReasons() []RefusalReason {
	return []RefusalReason{RefusedProtocol, RefusedVersion, RefusedAuth, RefusedFingerprint}
}

// The HELLO_ERR reason texts of the refusals a Backend decides itself begin
// with these (the version and fingerprint ones) or contain them (the
// internal secret ones), so the dialing side classifies what it was told
// (ClassifyRefusal).
const (
	RefusalTextVersion     = "protocol version"
	RefusalTextAuth        = "internal secret"
	RefusalTextFingerprint = "incompatible KV peer"
)

// ClassifyRefusal returns the reason of a HELLO_ERR text: by the texts
// above, RefusedProtocol for anything else.
func ClassifyRefusal(text string) RefusalReason {
	switch {
	case strings.HasPrefix(text, RefusalTextVersion):
		return RefusedVersion
	case strings.Contains(text, RefusalTextAuth):
		return RefusedAuth
	case strings.HasPrefix(text, RefusalTextFingerprint):
		return RefusedFingerprint
	}
	return RefusedProtocol
}

// RefusedError is a refused handshake: Reason classifies it, Detail is the
// HELLO_ERR text, Msg the whole message. It wraps ErrRefused.
type RefusedError struct {
	Reason RefusalReason
	Detail string
	Msg    string
}

func (e *RefusedError) Error() string { return e.Msg }

// Unwrap returns ErrRefused.
func (e *RefusedError) Unwrap() error { return ErrRefused }

// RefusalOf returns the reason and detail of a refused handshake's error,
// and false if err is no refusal. A refusal that carries no RefusedError
// (another Backend) is RefusedProtocol with err's text.
func RefusalOf(err error) (RefusalReason, string, bool) {
	if !errors.Is(err, ErrRefused) {
		return 0, "", false
	}
	var re *RefusedError
	if errors.As(err, &re) {
		return re.Reason, re.Detail, true
	}
	return RefusedProtocol, err.Error(), true
}

// ConnCounts counts a Backend's connections since it started.
type ConnCounts struct {
	// Dials counts connections started by Connect; Reconnects those of
	// them to an address that had a connection before.
	Dials, Reconnects uint64
	// Live is the number of connections up now (handshake done, not lost).
	Live int
}

// ConnCounter is implemented by backends that count their connections
// (exported as pdserve_kv_dials_total, pdserve_kv_reconnects_total and
// pdserve_kv_connections; refusals by reason are
// pdserve_peer_auth_failures_total{channel="kv"}).
type ConnCounter interface {
	ConnCounts() ConnCounts
}
