// Package outcome says how a request ended: the one enum that the lifecycle
// machine ends requests with, that metrics use as a label, that crosses the
// worker API as the code of an error body, and that the router decides on
// (retry, report, shed). It is a leaf package: it imports nothing of
// pdserve's, so every layer can use the same values.
//
// An Outcome has a class (after llm-d's flow control: rejected before any
// work, timed out, aborted, failed), and answers the two questions the router
// asks of a failed leg: may another pair succeed ([Outcome.Retryable]), and
// is this failure only the echo of the other leg's ([Outcome.PeerCaused]).
// A [Cause] names the first failure of a request: which outcome, on which
// side, in which stage, and why; it travels with the echo so that the router
// knows the root cause without waiting for the other leg's answer.
package outcome

import (
	"fmt"
	"net/http"
)

// Outcome is how a request ended on one worker (or, for the router's own
// outcomes, at the router). The zero value None means "not ended".
type Outcome uint8

// Outcomes a worker's lifecycle machine ends a request with.
const (
	None             Outcome = iota
	OK                       // finished: stop, length or a stop string
	AbortedClient            // the client (or the router on its behalf) aborted
	AbortedPeer              // the other leg failed or aborted: an echo, see Cause
	TimeoutBootstrap         // decode never opened the room (--bootstrap-timeout)
	TimeoutQueue             // waited too long for a batch or for pages (--queue-timeout)
	TimeoutKVHold            // prefill held KV longer than --kv-hold-timeout
	TimeoutTransfer          // the KV transfer made no progress for --transfer-timeout
	TimeoutRequest           // the whole request exceeded --max-request-time
	LeaseExpired             // the peer stopped renewing the room
	PeerLost                 // the KV connection died
	FailedTransfer           // checksum mismatch, incomplete KV, KV bound to another request
	RejectedInvalid          // bad request (empty, too long, duplicate id)
	RejectedCapacity         // can never fit in this worker's pool
	FailedInternal           // the model failed
	Shutdown                 // the worker shut down
	Draining                 // the worker is draining: it takes no new request (503, retried elsewhere)
	FailedIdentity           // the two legs disagree on which request a room is (rid, prompt): never retried
	PeerRefused              // the KV handshake was refused (fingerprint, protocol version, auth)
	Overloaded               // the worker's queue is full (--max-queued-requests), or the router sheds load (429, retried elsewhere)

	// Outcomes of the router's own view of a leg.

	WorkerUnreachable  // a worker could not be reached
	WorkerStreamBroken // a worker broke off its answer
	NoWorker           // no healthy worker (or compatible pair) to send the request to

	count
)

// numWorker is the number of outcomes (None included) a worker can end a
// request with; the router's own come after.
const numWorker = WorkerUnreachable

var names = [count]string{"none", "ok", "aborted_client", "aborted_peer",
	"timeout_bootstrap", "timeout_queue", "timeout_kv_hold", "timeout_transfer",
	"timeout_request", "lease_expired", "peer_lost", "failed_transfer", "rejected_invalid",
	"rejected_capacity", "failed_internal", "shutdown", "draining", "failed_identity", "peer_refused", "overloaded",
	"worker_unreachable", "worker_stream_broken", "no_worker"}

// String is the outcome's name, e.g. "timeout_transfer": the metrics label
// and the code of an error body.
func (o Outcome) String() string {
	if o < count {
		return names[o]
	}
	return fmt.Sprintf("outcome(%d)", uint8(o))
}

// Parse returns the outcome named s. It returns false for a name that is no
// outcome (an error code of another kind, or "").
func Parse(s string) (Outcome, bool) {
	for o := OK; o < count; o++ {
		if names[o] == s {
			return o, true
		}
	}
	return None, false
}

// MarshalText implements encoding.TextMarshaler (JSON as the name).
func (o Outcome) MarshalText() ([]byte, error) {
	if o >= count {
		return nil, fmt.Errorf("outcome: no outcome %d", uint8(o))
	}
	return []byte(names[o]), nil
}

// UnmarshalText implements encoding.TextUnmarshaler. An unknown name is an
// error, so a peer's typo is not read as some other outcome.
func (o *Outcome) UnmarshalText(b []byte) error {
	if len(b) == 0 || string(b) == "none" {
		*o = None
		return nil
	}
	p, ok := Parse(string(b))
	if !ok {
		return fmt.Errorf("outcome: unknown outcome %q", b)
	}
	*o = p
	return nil
}

// Worker lists every outcome a worker's lifecycle can end a request with,
// in enum order (OK first), for metrics labels present from the start.
func Worker() []Outcome {
	out := make([]Outcome, 0, numWorker-1)
	for o := OK; o < numWorker; o++ {
		out = append(out, o)
	}
	return out
}

// All lists every outcome (None excluded), in enum order.
func All() []Outcome {
	out := make([]Outcome, 0, count-1)
	for o := OK; o < count; o++ {
		out = append(out, o)
	}
	return out
}

// Class groups outcomes by what happened to the request, after llm-d's flow
// control (rejected before any work was done; the rest after).
type Class uint8

// Classes.
const (
	ClassNone     Class = iota
	ClassOK             // finished normally
	ClassRejected       // refused before any work was done for it
	ClassTimeout        // a stage's deadline or a lease passed
	ClassAborted        // ended on purpose: the client, the other leg, a shutdown
	ClassFailed         // something broke: a connection, a transfer, the model, a worker
)

var classNames = [...]string{"none", "ok", "rejected", "timeout", "aborted", "failed"}

func (c Class) String() string {
	if int(c) < len(classNames) {
		return classNames[c]
	}
	return fmt.Sprintf("class(%d)", uint8(c))
}

// Class returns the outcome's class.
func (o Outcome) Class() Class {
	switch o {
	case OK:
		return ClassOK
	case RejectedInvalid, RejectedCapacity, NoWorker, Draining, Overloaded:
		return ClassRejected
	case TimeoutBootstrap, TimeoutQueue, TimeoutKVHold, TimeoutTransfer, TimeoutRequest, LeaseExpired:
		return ClassTimeout
	case AbortedClient, AbortedPeer, Shutdown:
		return ClassAborted
	case PeerLost, FailedTransfer, FailedInternal, WorkerUnreachable, WorkerStreamBroken, FailedIdentity, PeerRefused:
		return ClassFailed
	}
	return ClassNone
}

// Retryable reports a failure that another (prefill, decode) pair may not
// have: a worker that could not be reached, broke off its answer, is
// shutting down or draining, a lost, silent or refused KV connection, a
// corrupted transfer, a worker whose own queue is full (overloaded: another
// worker may have room, and only when none has does the client get the
// 429), a decode worker that never opened the room (timeout_bootstrap: it
// froze or lost its way to the prefill worker). The router retries those
// (before the client saw a token). Other rejections, timeouts and an
// identity mismatch are not retried: the
// request itself, or the fleet's load, would fail it again.
func (o Outcome) Retryable() bool {
	switch o {
	case WorkerUnreachable, WorkerStreamBroken, PeerLost, LeaseExpired, FailedTransfer, Shutdown, Draining, PeerRefused,
		Overloaded, TimeoutBootstrap:
		return true
	}
	return false
}

// Migratable reports a failure of the worker, not of the request: it
// could not be reached or broke off its answer (killed, its node lost), it
// is shutting down or draining (a drain that ran out of time), or its KV
// connection was lost or went silent. A request whose output had begun
// reaching the client when one of these ended its leg is continued on
// another pair from where it stopped (the router's --max-migrations).
// Rejections, timeouts of the request itself, a corrupted transfer and the
// model's own failures are not: they would follow the request.
func (o Outcome) Migratable() bool {
	switch o {
	case WorkerUnreachable, WorkerStreamBroken, Shutdown, Draining, PeerLost, LeaseExpired:
		return true
	}
	return false
}

// Leaving reports an answer that says the worker is going away (shutting
// down or draining): it is taken out of new pairs at once, and a retry never
// goes back to it.
func (o Outcome) Leaving() bool { return o == Shutdown || o == Draining }

// PeerCaused reports an outcome that only echoes the other leg's failure:
// the root cause is the other side's (see Cause).
func (o Outcome) PeerCaused() bool { return o == AbortedPeer }

// Suspect reports a failure that may come from a worker that is frozen or
// cut off rather than from the request (a lost or silent peer, a broken
// stream, a room decode never opened): before a retry, the router checks
// that both workers of the failed pair still answer.
func (o Outcome) Suspect() bool {
	switch o {
	case PeerLost, LeaseExpired, WorkerStreamBroken, TimeoutBootstrap:
		return true
	}
	return false
}

// StatusClientClosedRequest (499, nginx's convention) is the status of a
// request whose client went away.
const StatusClientClosedRequest = 499

// Status is the HTTP status that answers a request ending with o: 200 for
// OK; 400 for rejections; 429 when the server sheds load (overloaded, sent
// with Retry-After); 499 for a client abort; 503 when the worker is busy or
// leaving; 504 for timeouts; 502 when a peer or the transfer failed; 500
// otherwise.
func (o Outcome) Status() int {
	switch o {
	case OK:
		return http.StatusOK
	case RejectedInvalid, RejectedCapacity:
		return http.StatusBadRequest
	case Overloaded:
		return http.StatusTooManyRequests
	case AbortedClient:
		return StatusClientClosedRequest
	case TimeoutQueue, Shutdown, NoWorker, Draining:
		return http.StatusServiceUnavailable
	case TimeoutBootstrap, TimeoutKVHold, TimeoutTransfer, TimeoutRequest:
		return http.StatusGatewayTimeout
	case AbortedPeer, LeaseExpired, PeerLost, FailedTransfer, WorkerUnreachable, WorkerStreamBroken, FailedIdentity, PeerRefused:
		return http.StatusBadGateway
	}
	return http.StatusInternalServerError
}

// ClientError reports whether o is the request's own fault (a 4xx answer
// other than 429), so an OpenAI error body has type invalid_request_error,
// not server_error. A 429 (overloaded) is the server's state, not the
// request's fault: its type is server_error.
func (o Outcome) ClientError() bool {
	s := o.Status()
	return s >= 400 && s < 500 && s != http.StatusTooManyRequests
}

// Cause is the first failure of a request: what ended it, where, and why.
// A worker whose request ends because the other leg failed (AbortedPeer)
// carries the other side's Cause, so whoever reads either answer first
// learns the root cause.
type Cause struct {
	// Outcome is the root cause's outcome; never AbortedPeer once known.
	Outcome Outcome `json:"outcome"`
	// Role is the side that failed first: "prefill", "decode",
	// "colocated" or "router".
	Role string `json:"role,omitempty"`
	// Stage is the stage the request was in on that side (e.g.
	// "awaiting_kv"), "" if it had none yet.
	Stage string `json:"stage,omitempty"`
	// Detail says why, for people.
	Detail string `json:"detail,omitempty"`
}

// Known reports whether c names a root cause.
func (c Cause) Known() bool { return c.Outcome != None && c.Outcome != AbortedPeer }

// String is "<outcome> on <role> in <stage>: <detail>".
func (c Cause) String() string {
	s := c.Outcome.String()
	if c.Role != "" {
		s += " on " + c.Role
	}
	if c.Stage != "" {
		s += " in " + c.Stage
	}
	if c.Detail != "" {
		s += ": " + c.Detail
	}
	return s
}
