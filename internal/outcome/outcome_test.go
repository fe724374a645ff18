package outcome

import (
	"encoding/json"
	"net/http"
	"testing"
)

// TestEveryOutcome is the table of every outcome: its name, class, status
// and how the router treats it. A new outcome fails here until it is added.
func TestEveryOutcome(t *testing.T) {
	type row struct {
		name               string
		class              Class
		status             int
		retryable, suspect bool
	}
	want := map[Outcome]row{
		OK:                 {"ok", ClassOK, http.StatusOK, false, false},
		AbortedClient:      {"aborted_client", ClassAborted, StatusClientClosedRequest, false, false},
		AbortedPeer:        {"aborted_peer", ClassAborted, http.StatusBadGateway, false, false},
		TimeoutBootstrap:   {"timeout_bootstrap", ClassTimeout, http.StatusGatewayTimeout, true, true},
		TimeoutQueue:       {"timeout_queue", ClassTimeout, http.StatusServiceUnavailable, false, false},
		TimeoutKVHold:      {"timeout_kv_hold", ClassTimeout, http.StatusGatewayTimeout, false, false},
		TimeoutTransfer:    {"timeout_transfer", ClassTimeout, http.StatusGatewayTimeout, false, false},
		TimeoutRequest:     {"timeout_request", ClassTimeout, http.StatusGatewayTimeout, false, false},
		LeaseExpired:       {"lease_expired", ClassTimeout, http.StatusBadGateway, true, true},
		PeerLost:           {"peer_lost", ClassFailed, http.StatusBadGateway, true, true},
		FailedTransfer:     {"failed_transfer", ClassFailed, http.StatusBadGateway, true, false},
		RejectedInvalid:    {"rejected_invalid", ClassRejected, http.StatusBadRequest, false, false},
		RejectedCapacity:   {"rejected_capacity", ClassRejected, http.StatusBadRequest, false, false},
		FailedInternal:     {"failed_internal", ClassFailed, http.StatusInternalServerError, false, false},
		Shutdown:           {"shutdown", ClassAborted, http.StatusServiceUnavailable, true, false},
		Draining:           {"draining", ClassRejected, http.StatusServiceUnavailable, true, false},
		FailedIdentity:     {"failed_identity", ClassFailed, http.StatusBadGateway, false, false},
		PeerRefused:        {"peer_refused", ClassFailed, http.StatusBadGateway, true, false},
		Overloaded:         {"overloaded", ClassRejected, http.StatusTooManyRequests, true, false},
		WorkerUnreachable:  {"worker_unreachable", ClassFailed, http.StatusBadGateway, true, false},
		WorkerStreamBroken: {"worker_stream_broken", ClassFailed, http.StatusBadGateway, true, true},
		NoWorker:           {"no_worker", ClassRejected, http.StatusServiceUnavailable, false, false},
	}
	if len(want) != len(All()) {
		t.Fatalf("table covers %d outcomes, there are %d", len(want), len(All()))
	}
	for _, o := range All() {
		w, ok := want[o]
		if !ok {
			t.Errorf("outcome %d (%s) missing from the table", o, o)
			continue
		}
		if o.String() != w.name || o.Class() != w.class || o.Status() != w.status ||
			o.Retryable() != w.retryable || o.Suspect() != w.suspect {
			t.Errorf("%s: name %q class %s status %d retryable %v suspect %v; want %+v",
				o, o.String(), o.Class(), o.Status(), o.Retryable(), o.Suspect(), w)
		}
		if o.Leaving() != (o == Shutdown || o == Draining) {
			t.Errorf("%s: Leaving %v", o, o.Leaving())
		}
		if o.PeerCaused() != (o == AbortedPeer) {
			t.Errorf("%s: PeerCaused %v", o, o.PeerCaused())
		}
		if o.ClientError() != (w.status >= 400 && w.status < 500 && w.status != http.StatusTooManyRequests) {
			t.Errorf("%s: ClientError %v with status %d", o, o.ClientError(), w.status)
		}
		p, ok := Parse(w.name)
		if !ok || p != o {
			t.Errorf("Parse(%q) = %v, %v", w.name, p, ok)
		}
		b, err := json.Marshal(o)
		if err != nil || string(b) != `"`+w.name+`"` {
			t.Errorf("json %s: %s, %v", o, b, err)
		}
		var back Outcome
		if err := json.Unmarshal(b, &back); err != nil || back != o {
			t.Errorf("json round trip of %s: %v, %v", o, back, err)
		}
	}
	for _, o := range Worker() {
		if o >= WorkerUnreachable {
			t.Errorf("router outcome %s listed among the worker's", o)
		}
	}
}

func TestParseRefusesUnknown(t *testing.T) {
	for _, s := range []string{"", "none", "OK", "model_not_found", "aborted"} {
		if o, ok := Parse(s); ok {
			t.Errorf("Parse(%q) = %s", s, o)
		}
	}
	var o Outcome
	if err := json.Unmarshal([]byte(`"timeout_transfers"`), &o); err == nil {
		t.Error("unknown outcome unmarshalled")
	}
	if _, err := Outcome(200).MarshalText(); err == nil {
		t.Error("out-of-range outcome marshalled")
	}
}

func TestCause(t *testing.T) {
	c := Cause{Outcome: FailedTransfer, Role: "decode", Stage: "awaiting_kv", Detail: "KV checksum mismatch"}
	if !c.Known() {
		t.Fatal("a failed_transfer cause is known")
	}
	if got, want := c.String(), "failed_transfer on decode in awaiting_kv: KV checksum mismatch"; got != want {
		t.Fatalf("String %q, want %q", got, want)
	}
	if (Cause{Outcome: AbortedPeer}).Known() || (Cause{}).Known() {
		t.Fatal("an echo or an empty cause is not a root cause")
	}
}
