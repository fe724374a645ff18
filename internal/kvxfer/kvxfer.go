// Package kvxfer is the KV channel between a decode worker and a prefill
// worker: the messages of its protocol, their binary framing, and the Backend
// interface that transports implement (tcp/ is the one used in production).
//
// # Protocol
//
// One long-lived connection per (decode, prefill) pair, opened by decode.
// Every frame is
//
//	uint32 length (of what follows, big-endian) | uint8 type | payload
//
// with length ≤ the configured maximum frame size. Decode starts with HELLO
// carrying the model fingerprint, its authentication mode and a fresh nonce;
// prefill answers HELLO_OK, or HELLO_ERR with a reason naming every
// mismatched field and closes. With a shared secret the two prove to each
// other that they hold it before HELLO_OK (see Handshake below). Then both sides send
// PING every heartbeat interval and answer PONG; a side that hears nothing
// for interval × misses declares the connection dead and fails its rooms.
// Room messages (ROOM_OPEN … ABORT_ACK) carry (room, gen) and are handed to
// the worker's lifecycle machine; the transport never interprets them.
// A malformed frame or an unknown type closes the connection; it never
// crashes the process.
//
// # Handshake
//
// With AuthSecret both sides hold K, a key derived from the fleet's shared
// secret, and the exchange is
//
//	decode  → prefill  HELLO{version, fingerprint, AuthSecret, Nd}
//	prefill → decode   HELLO_CHALLENGE{Np}
//	decode  → prefill  HELLO_PROOF{HMAC-SHA256(K, "decode"  | T)}
//	prefill → decode   HELLO_OK{HMAC-SHA256(K, "prefill" | T)}
//
// where Nd and Np are 32 fresh random bytes of each side and T the SHA-256
// of the HELLO and HELLO_CHALLENGE frames (HandshakeProof). Each side
// checks the other's proof over its own fresh nonce, so a recorded
// handshake cannot be replayed in either direction, a proof made for one
// role is worthless for the other, and the secret never travels. Decode
// proves first: a prefill gives no proof to a peer that has not proven
// itself. Either side refuses a peer whose mode differs from its own.
//
// # Concurrency
//
// A Backend is safe for concurrent use. Handler methods are called from
// transport goroutines and must not block for long.
package kvxfer

import (
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"

	"github.com/pdserve/pdserve/internal/model"
	"github.com/pdserve/pdserve/internal/outcome"
)

// Room identifies one request's KV rendezvous between a prefill and a decode
// worker: 128 random bits minted by the router.
type Room [16]byte

// NewRoom returns a random room.
func NewRoom() Room {
	var r Room
	_, _ = rand.Read(r[:]) // crypto/rand.Read never returns an error
	return r
}

// String is the room as 32 lowercase hex digits.
func (r Room) String() string { return hex.EncodeToString(r[:]) }

// IsZero reports the zero room (never minted).
func (r Room) IsZero() bool { return r == Room{} }

// ParseRoom parses 32 hex digits.
func ParseRoom(s string) (Room, error) {
	var r Room
	if len(s) != 32 {
		return r, fmt.Errorf("room must be 32 hex digits, got %d characters", len(s))
	}
	if _, err := hex.Decode(r[:], []byte(s)); err != nil {
		return r, fmt.Errorf("room: %w", err)
	}
	return r, nil
}

// MarshalText implements encoding.TextMarshaler (JSON as a hex string).
func (r Room) MarshalText() ([]byte, error) { return []byte(r.String()), nil }

// UnmarshalText implements encoding.TextUnmarshaler.
func (r *Room) UnmarshalText(b []byte) error {
	p, err := ParseRoom(string(b))
	if err != nil {
		return err
	}
	*r = p
	return nil
}

// RoomGen is a room and the attempt (generation) using it. A retry of a
// request uses the same room with Gen+1; frames of an older gen are stale.
type RoomGen struct {
	Room Room
	Gen  uint32
}

func (rg RoomGen) String() string { return fmt.Sprintf("%s/%d", rg.Room, rg.Gen) }

// Type is a frame type.
type Type uint8

// Frame types.
const (
	TypeHello     Type = 1
	TypeHelloOK   Type = 2
	TypeHelloErr  Type = 3
	TypePing      Type = 4
	TypePong      Type = 5
	TypeRoomOpen  Type = 6
	TypeRoomReady Type = 7
	TypeRoomRenew Type = 8
	TypeKVChunk   Type = 9
	TypeKVDone    Type = 10
	TypeKVAck     Type = 11
	TypeAbort     Type = 12
	TypeAbortAck  Type = 13
	// Version 4: the shared-secret challenge–response.
	TypeHelloChallenge Type = 14
	TypeHelloProof     Type = 15
)

var typeNames = [...]string{"", "HELLO", "HELLO_OK", "HELLO_ERR", "PING", "PONG", "ROOM_OPEN",
	"ROOM_READY", "ROOM_RENEW", "KV_CHUNK", "KV_DONE", "KV_ACK", "ABORT", "ABORT_ACK",
	"HELLO_CHALLENGE", "HELLO_PROOF"}

func (t Type) String() string {
	if int(t) < len(typeNames) && t != 0 {
		return typeNames[t]
	}
	return fmt.Sprintf("TYPE(%d)", uint8(t))
}

// ProtocolVersion is sent in HELLO; peers with another version are refused.
// Version 2: ABORT carries a structured cause. Version 3: KV_DONE carries
// the KV's Binding to its request. Version 4: the shared secret is proven by
// challenge–response (HELLO carries the mode and a nonce instead of the
// secret; HELLO_CHALLENGE, HELLO_PROOF; HELLO_OK carries prefill's proof).
// Version 5: the prefix cache (ROOM_READY carries the prompt pages decode
// holds from its cache, KV_DONE the prompt tokens prefill took from its).
const ProtocolVersion = 5

// Message is one decoded frame.
type Message interface {
	Type() Type
}

// AuthMode is how a HELLO's sender authenticates beyond the transport.
type AuthMode uint8

// Authentication modes.
const (
	// AuthNone: no shared secret (the channel is open, or TLS alone
	// authenticates it).
	AuthNone AuthMode = 0
	// AuthSecret: the challenge–response over the shared secret.
	AuthSecret AuthMode = 1
)

func (m AuthMode) String() string {
	switch m {
	case AuthNone:
		return "none"
	case AuthSecret:
		return "secret"
	}
	return fmt.Sprintf("AuthMode(%d)", uint8(m))
}

// NonceBytes is the size of a handshake nonce, MACBytes of a proof.
const (
	NonceBytes = 32
	MACBytes   = 32
)

// Hello opens a connection (decode → prefill). A HELLO of another Version
// than ProtocolVersion is decoded up to its version only: the rest of its
// payload is kept as Foreign (and encoded back as is), so that a peer of
// another version is refused for its version, not as malformed.
type Hello struct {
	Version     uint16
	Fingerprint Fingerprint
	Auth        AuthMode
	// Nonce is 32 fresh random bytes (the challenge to prefill).
	Nonce [NonceBytes]byte
	// Foreign is the payload after the version of a HELLO of another
	// version (nil for ProtocolVersion).
	Foreign []byte
}

// HelloOK accepts a connection. Proof is prefill's proof of the shared
// secret (HandshakeProof), nil without one.
type HelloOK struct{ Proof []byte }

// HelloChallenge (prefill → decode) asks a peer that announced AuthSecret
// to prove it holds the secret: Nonce is 32 fresh random bytes.
type HelloChallenge struct{ Nonce [NonceBytes]byte }

// HelloProof (decode → prefill) is decode's proof of the shared secret
// (HandshakeProof).
type HelloProof struct{ MAC [MACBytes]byte }

// HelloErr refuses a connection; the sender closes it after this frame.
type HelloErr struct{ Reason string }

// Ping asks for a Pong with the same nonce.
type Ping struct{ Nonce uint64 }

// Pong answers a Ping.
type Pong struct{ Nonce uint64 }

// RoomOpen (decode → prefill) announces that decode admitted the request and
// starts decode's lease on the room. NTokens and PromptHash let prefill check
// that both legs carry the same request.
type RoomOpen struct {
	RoomGen
	RID        string
	NTokens    uint32
	PromptHash uint64
}

// RoomReady (decode → prefill): decode holds pages for NTokens prompt tokens;
// prefill may send KV. CachedPages (version 5) is how many of the prompt's
// first pages decode already holds from its prefix cache: prefill sends
// KV_CHUNKs only for pages CachedPages … P−1, and KV_DONE still counts,
// binds and checksums all P pages. A CachedPages above P fails the room.
type RoomReady struct {
	RoomGen
	NTokens     uint32
	CachedPages uint32
}

// RoomRenew lists the rooms the sender still holds for the receiver on this
// connection; a room held for a peer that stops listing it is released
// within one lease.
type RoomRenew struct{ Rooms []RoomGen }

// KVChunk (prefill → decode) carries the bytes of NPages consecutive prompt
// pages starting at prompt page index FirstPage (0 = the page holding
// tokens 0 … PageSize-1). len(Data) == NPages × page bytes.
type KVChunk struct {
	RoomGen
	Seq       uint32
	FirstPage uint32
	NPages    uint32
	Data      []byte
}

// KVDone (prefill → decode) ends a transfer of the KV of a prompt of
// NTokens tokens in NPages pages, sent in NChunks chunks. Binding ties the
// KV to its request: BindKVConstrained of this RoomGen, NTokens, the
// PageHash the sender recorded with each of the NPages pages and the
// digest of the request's constraint, if any (see BindKV); the receiver
// compares it with the binding of its own request before it uses any of the
// KV. Checksum is CRC-32C (Castagnoli) over the bytes of all NPages pages in
// order, as the receiver will use them (its cached prefix included).
// FirstToken is the token prefill sampled after the prompt, with its
// log-probability. CachedTokens (version 5) is how many prompt tokens
// prefill did not compute because its prefix cache held their KV (the
// API's usage.prompt_tokens_details.cached_tokens); it is informational and
// bounded by NTokens.
//
// First, an optional tail of the frame, holds every choice's first token
// for a request with n > 1 choices or top logprobs: First[i] is choice i's
// (First[0] is FirstToken with FirstLogprob), each with its most likely
// alternatives. A request that asks for neither sends none, so the frame is
// the same as before the tail existed; a router sends a request that needs
// it only to workers that list the feature (workerapi.Info.Features), so a
// peer that predates it never receives one.
type KVDone struct {
	RoomGen
	NChunks      uint32
	NPages       uint32
	NTokens      uint32
	Binding      Binding
	Checksum     uint32
	FirstToken   int32
	FirstLogprob float32
	CachedTokens uint32
	First        []FirstToken
}

// FirstToken is one choice's first token in KV_DONE: the token, its
// log-probability and its top alternatives (at most model.MaxLogprobs).
type FirstToken struct {
	Token   int32
	Logprob float32
	Top     []model.TokenLogprob
}

// KVAck (decode → prefill): the KV arrived and verified; prefill may free it.
type KVAck struct{ RoomGen }

// Abort tells the peer that the room failed or was aborted, and why. Cause
// is the room's first failure as the sender knows it: its outcome, the side
// and stage where it happened, and a detail for people. Cause.Outcome is
// outcome.None when the sender knows no root cause (a room it never held);
// Cause.Detail then says what it does know.
type Abort struct {
	RoomGen
	Cause outcome.Cause
}

// Reason is the abort's cause as one line of text.
func (a Abort) Reason() string {
	if a.Cause.Outcome == outcome.None {
		return a.Cause.Detail
	}
	return a.Cause.String()
}

// AbortAck answers an Abort.
type AbortAck struct{ RoomGen }

func (Hello) Type() Type     { return TypeHello }
func (HelloOK) Type() Type   { return TypeHelloOK }
func (HelloErr) Type() Type  { return TypeHelloErr }
func (Ping) Type() Type      { return TypePing }
func (Pong) Type() Type      { return TypePong }
func (RoomOpen) Type() Type  { return TypeRoomOpen }
func (RoomReady) Type() Type { return TypeRoomReady }
func (RoomRenew) Type() Type { return TypeRoomRenew }
func (KVChunk) Type() Type   { return TypeKVChunk }
func (KVDone) Type() Type    { return TypeKVDone }
func (KVAck) Type() Type     { return TypeKVAck }
func (Abort) Type() Type     { return TypeAbort }
func (AbortAck) Type() Type  { return TypeAbortAck }

func (HelloChallenge) Type() Type { return TypeHelloChallenge }
func (HelloProof) Type() Type     { return TypeHelloProof }

// ErrRefused is wrapped (errors.Is) by the error a Backend passes to
// Handler.PeerLost for a connection whose handshake was refused, by either
// side: another protocol version, another model fingerprint, wrong auth, a
// first frame that is not HELLO. The same pair would be refused again
// until one of the workers changes, so its rooms fail with
// outcome.PeerRefused rather than as a lost peer.
var ErrRefused = errors.New("refused")

// PeerID names one connection within a process. A reconnect to the same
// address gets a new PeerID, so state tied to a dead connection can never be
// confused with the new one.
type PeerID uint64

// Handler receives what a Backend hears. Methods are called from transport
// goroutines; they must hand work off and return promptly.
type Handler interface {
	// PeerUp is called once when a connection's handshake succeeded.
	PeerUp(peer PeerID, remote string)
	// HandleMessage is called for every room message (ROOM_OPEN … ABORT_ACK)
	// in the order received on that connection.
	HandleMessage(peer PeerID, m Message)
	// PeerLost is called exactly once per connection that was returned by
	// Connect or accepted, when it closes for any reason (handshake refused,
	// heartbeat missed, malformed frame, Close), with that reason; for a
	// refused handshake the error wraps ErrRefused.
	PeerLost(peer PeerID, err error)
}

// Backend moves KV channel messages between workers.
type Backend interface {
	// Listen accepts connections on addr (prefill side) until Close. It
	// returns the address actually bound (addr may use port 0).
	Listen(addr string) (string, error)
	// Connect returns the live connection to a prefill's KV address, opening
	// one if there is none (decode side). It does not block: messages sent
	// before the handshake completes are queued, and a failed dial or
	// handshake is reported through Handler.PeerLost.
	Connect(addr string) PeerID
	// Send queues m on the connection without blocking. It returns an error
	// if the connection is closed or unknown; the message is then dropped.
	Send(peer PeerID, m Message) error
	// Remote returns the remote address of a connection ("" if unknown).
	Remote(peer PeerID) string
	// Close closes every connection and listener and waits for the
	// backend's goroutines to exit.
	Close() error
}

// DropCounter is implemented by backends that drop frames themselves
// (malformed input, injected faults); the counts, by reason, are exported
// as pdserve_kv_frames_dropped_total next to the lifecycle machine's.
type DropCounter interface {
	DroppedFrames() map[string]uint64
}

// ShutdownNotifier is implemented by backends that can be told, ahead of
// Close, that their process is shutting down. A connection lost from then on
// is expected (in a process that runs several workers, a peer that shut down
// first), so the backend logs it at debug level, not as a warning. A loss
// while the process runs on stays a warning.
type ShutdownNotifier interface {
	// ShuttingDown marks the backend as shutting down; its connections stay
	// open until Close. It does not block.
	ShuttingDown()
}

// PeerCloser is implemented by backends that can close one connection on
// demand (fault injection, an operator dropping a bad peer).
type PeerCloser interface {
	// ClosePeer closes one connection; its rooms fail through
	// Handler.PeerLost with err, which is called exactly once per
	// connection as for any other failure. An unknown or already closed
	// peer is a no-op. It does not block.
	ClosePeer(peer PeerID, err error)
}
