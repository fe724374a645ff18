package kvxfer

import (
	"errors"
	"fmt"
	"testing"
)

// TestRefusalOf: a Backend's RefusedError keeps its reason and detail
// through wrapping; another backend's refusal is a protocol refusal; an
// error that is no refusal is none.
func TestRefusalOf(t *testing.T) {
	re := &RefusedError{Reason: RefusedAuth, Detail: RefusalTextAuth, Msg: "kv handshake with p:1 refused: auth token mismatch"}
	for _, tt := range []struct {
		err    error
		why    RefusalReason
		detail string
		ok     bool
	}{
		{re, RefusedAuth, RefusalTextAuth, true},
		{fmt.Errorf("connect: %w", re), RefusedAuth, RefusalTextAuth, true},
		{fmt.Errorf("kv handshake %w: odd", ErrRefused), RefusedProtocol, "kv handshake refused: odd", true},
		{errors.New("connection reset"), 0, "", false},
	} {
		why, detail, ok := RefusalOf(tt.err)
		if why != tt.why || detail != tt.detail || ok != tt.ok {
			t.Errorf("RefusalOf(%q) = %s %q %v, want %s %q %v", tt.err, why, detail, ok, tt.why, tt.detail, tt.ok)
		}
	}
	if !errors.Is(re, ErrRefused) {
		t.Error("RefusedError does not wrap ErrRefused")
	}
	for text, want := range map[string]RefusalReason{
		"protocol version 9 vs 3 (decode vs prefill)":        RefusedVersion,
		"decode failed to prove the internal secret":         RefusedAuth,
		"incompatible KV peer (decode vs prefill): layers 4": RefusedFingerprint,
		"first frame is KV_ACK, want HELLO":                  RefusedProtocol,
	} {
		if got := ClassifyRefusal(text); got != want {
			t.Errorf("ClassifyRefusal(%q) = %s, want %s", text, got, want)
		}
	}
}
