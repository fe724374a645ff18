package kvxfer

// Binary framing of the KV channel.
//
// A frame is
//
//	uint32 length (big-endian) | uint8 type | payload
//
// where length counts the type byte and the payload. Fixed-width fields
// inside a payload are little-endian. A string is a uint16 byte count
// followed by that many bytes, at most MaxStringBytes. A RoomGen is the 16
// room bytes followed by a uint32 gen. Payloads by type:
//
//	HELLO       u16 version | str model | str digest | i64 layers | i64 kv_heads |
//	            i64 head_dim | str dtype | i64 page_size | u8 auth | 32 nonce bytes
//	            (another version: u16 version | anything, kept as Hello.Foreign)
//	HELLO_OK    (empty) | 32 proof bytes
//	HELLO_ERR   str reason
//	HELLO_CHALLENGE  32 nonce bytes
//	HELLO_PROOF      32 proof bytes
//	PING, PONG  u64 nonce
//	ROOM_OPEN   roomgen | str rid | u32 n_tokens | u64 prompt_hash
//	ROOM_READY  roomgen | u32 n_tokens
//	ROOM_RENEW  u32 count | count × roomgen
//	KV_CHUNK    roomgen | u32 seq | u32 first_page | u32 n_pages | data (the rest of the frame)
//	KV_DONE     roomgen | u32 n_chunks | u32 n_pages | u32 n_tokens | 16 binding bytes |
//	            u32 checksum | i32 first_token | f32 first_logprob
//	KV_ACK      roomgen
//	ABORT       roomgen | u8 outcome | str role | str stage | str detail
//	ABORT_ACK   roomgen
//
// A payload must be consumed exactly: trailing bytes are malformed.

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"math"
	"net"
	"unicode/utf8"

	"github.com/pdserve/pdserve/internal/model"
	"github.com/pdserve/pdserve/internal/outcome"
)

// Codec limits.
const (
	// LengthBytes is the size of a frame's length prefix in bytes.
	LengthBytes = 4
	// HeaderBytes is the size of a frame's length prefix and type byte.
	HeaderBytes = LengthBytes + 1
	// MaxStringBytes is the longest string field, in bytes.
	MaxStringBytes = 4096
	// KVChunkHeaderBytes is the size of a KV_CHUNK frame without its Data:
	// the frame header plus the fixed fields.
	KVChunkHeaderBytes = HeaderBytes + kvChunkFixed
	// MaxHandshakeFrameBytes bounds the length of the handshake's frames
	// (HELLO, HELLO_OK, HELLO_ERR, HELLO_CHALLENGE, HELLO_PROOF: type byte +
	// payload, in bytes). Transports use it as the frame limit before a
	// peer is authenticated.
	MaxHandshakeFrameBytes = 1 + helloMax

	roomGenBytes = 16 + 4
	kvChunkFixed = roomGenBytes + 3*4
	kvDoneBytes  = roomGenBytes + 7*4 + len(Binding{})
	// kvDoneTailMax bounds KV_DONE's optional tail (KVDone.First): a
	// count, then per choice its token, logprob, and top logprobs.
	kvDoneTailMax = 2 + model.MaxForks*(4+4+2+model.MaxLogprobs*8)
	strMax        = 2 + MaxStringBytes
	helloMax      = 2 + 4*strMax + 4*8 + 1 + NonceBytes
)

// NumTypes bounds the frame types: every defined Type t has 0 < t < NumTypes,
// so arrays indexed by Type can have NumTypes entries.
const NumTypes = len(typeNames)

// Codec errors. Every error returned by DecodePayload and ReadFrame for bad
// input wraps exactly one of these (errors.Is), with a message naming the
// type and field at fault.
var (
	// ErrMalformed: a payload that is truncated, has trailing bytes, or holds
	// an out-of-range field; also a zero frame length.
	ErrMalformed = errors.New("kvxfer: malformed frame")
	// ErrFrameTooLarge: a frame longer than the reader's maximum, or a
	// message whose frame would not fit in a uint32 length.
	ErrFrameTooLarge = errors.New("kvxfer: frame too large")
	// ErrUnknownType: a frame type outside 1 … NumTypes-1, or a Message
	// value that is not one of this package's message types.
	ErrUnknownType = errors.New("kvxfer: unknown frame type")
	// ErrFieldTooLong: an identifier string (RID, auth, fingerprint field)
	// longer than MaxStringBytes given to an encoder.
	ErrFieldTooLong = errors.New("kvxfer: field too long")
)

// payloadBounds returns the smallest and largest payload length of type t
// in bytes (-1 = bounded only by the frame size), and whether t is known.
func payloadBounds(t Type) (lo, hi int, ok bool) {
	switch t {
	case TypeHello:
		return 2, helloMax, true
	case TypeHelloOK:
		return 0, MACBytes, true
	case TypeHelloChallenge:
		return NonceBytes, NonceBytes, true
	case TypeHelloProof:
		return MACBytes, MACBytes, true
	case TypeHelloErr:
		return 2, strMax, true
	case TypePing, TypePong:
		return 8, 8, true
	case TypeRoomOpen:
		return roomGenBytes + 2 + 4 + 8, roomGenBytes + strMax + 4 + 8, true
	case TypeRoomReady:
		return roomGenBytes + 4 + 4, roomGenBytes + 4 + 4, true
	case TypeRoomRenew:
		return 4, -1, true
	case TypeKVChunk:
		return kvChunkFixed, -1, true
	case TypeKVDone:
		return kvDoneBytes, kvDoneBytes + kvDoneTailMax, true
	case TypeKVAck, TypeAbortAck:
		return roomGenBytes, roomGenBytes, true
	case TypeAbort:
		return roomGenBytes + 1 + 3*2, roomGenBytes + 1 + 3*strMax, true
	}
	return 0, 0, false
}

// AppendFrame appends the whole frame of m to buf, including a KVChunk's
// Data, and returns the extended buffer. m must be a value (not a pointer)
// of one of this package's message types.
//
// Free-text fields (HelloErr.Reason, Abort.Cause's strings) longer than
// MaxStringBytes are cut at a UTF-8 boundary at or below that length. It
// returns an error wrapping ErrUnknownType for another Message type,
// ErrFieldTooLong for a longer identifier string, and ErrFrameTooLarge for a
// frame longer than a uint32 length can describe.
func AppendFrame(buf []byte, m Message) ([]byte, error) {
	buf, err := AppendFrameHeader(buf, m)
	if err != nil {
		return buf, err
	}
	if c, ok := m.(KVChunk); ok {
		buf = append(buf, c.Data...)
	}
	return buf, nil
}

// AppendFrameHeader is AppendFrame without a KVChunk's Data: for a KVChunk
// the appended bytes are the frame header and fixed fields (whose length
// prefix counts Data), and the frame is complete once the caller writes Data
// right after them. This lets a writer send Data without copying it (e.g.
// with net.Buffers). For other types it appends the whole frame. Errors are
// those of AppendFrame; on error buf is returned unchanged.
func AppendFrameHeader(buf []byte, m Message) ([]byte, error) {
	start := len(buf)
	buf = append(buf, 0, 0, 0, 0, 0) // length and type, set below
	var err error
	extra := 0 // bytes of the frame not in buf (KVChunk.Data)
	// The type switch, not m.Type(), decides the type byte, so a nil
	// pointer in m is an error rather than a panic.
	var t Type
	switch v := m.(type) {
	case Hello:
		t = v.Type()
		buf = binary.LittleEndian.AppendUint16(buf, v.Version)
		if v.Version != ProtocolVersion {
			if len(v.Foreign) > helloMax-2 {
				err = fmt.Errorf("%w: HELLO of version %d with %d foreign bytes", ErrFieldTooLong, v.Version, len(v.Foreign))
				break
			}
			buf = append(buf, v.Foreign...)
			break
		}
		fp := v.Fingerprint
		if buf, err = appendIdent(buf, "fingerprint model", fp.Model); err != nil {
			break
		}
		if buf, err = appendIdent(buf, "fingerprint digest", fp.Digest); err != nil {
			break
		}
		buf = appendInt(buf, fp.Layers)
		buf = appendInt(buf, fp.KVHeads)
		buf = appendInt(buf, fp.HeadDim)
		if buf, err = appendIdent(buf, "fingerprint dtype", fp.DType); err != nil {
			break
		}
		buf = appendInt(buf, fp.PageSize)
		buf = append(buf, byte(v.Auth))
		buf = append(buf, v.Nonce[:]...)
	case HelloOK:
		t = v.Type()
		if len(v.Proof) != 0 && len(v.Proof) != MACBytes {
			err = fmt.Errorf("%w: HELLO_OK proof of %d bytes, want %d", ErrFieldTooLong, len(v.Proof), MACBytes)
			break
		}
		buf = append(buf, v.Proof...)
	case HelloChallenge:
		t = v.Type()
		buf = append(buf, v.Nonce[:]...)
	case HelloProof:
		t = v.Type()
		buf = append(buf, v.MAC[:]...)
	case HelloErr:
		t = v.Type()
		buf = appendReason(buf, v.Reason)
	case Ping:
		t = v.Type()
		buf = binary.LittleEndian.AppendUint64(buf, v.Nonce)
	case Pong:
		t = v.Type()
		buf = binary.LittleEndian.AppendUint64(buf, v.Nonce)
	case RoomOpen:
		t = v.Type()
		buf = appendRoomGen(buf, v.RoomGen)
		if buf, err = appendIdent(buf, "rid", v.RID); err != nil {
			break
		}
		buf = binary.LittleEndian.AppendUint32(buf, v.NTokens)
		buf = binary.LittleEndian.AppendUint64(buf, v.PromptHash)
	case RoomReady:
		t = v.Type()
		buf = appendRoomGen(buf, v.RoomGen)
		buf = binary.LittleEndian.AppendUint32(buf, v.NTokens)
		buf = binary.LittleEndian.AppendUint32(buf, v.CachedPages)
	case RoomRenew:
		t = v.Type()
		if uint64(len(v.Rooms)) > (math.MaxUint32-1-4)/roomGenBytes {
			err = fmt.Errorf("%w: ROOM_RENEW with %d rooms", ErrFrameTooLarge, len(v.Rooms))
			break
		}
		buf = binary.LittleEndian.AppendUint32(buf, uint32(len(v.Rooms)))
		for _, rg := range v.Rooms {
			buf = appendRoomGen(buf, rg)
		}
	case KVChunk:
		t = v.Type()
		buf = appendRoomGen(buf, v.RoomGen)
		buf = binary.LittleEndian.AppendUint32(buf, v.Seq)
		buf = binary.LittleEndian.AppendUint32(buf, v.FirstPage)
		buf = binary.LittleEndian.AppendUint32(buf, v.NPages)
		extra = len(v.Data)
	case KVDone:
		t = v.Type()
		buf = appendRoomGen(buf, v.RoomGen)
		buf = binary.LittleEndian.AppendUint32(buf, v.NChunks)
		buf = binary.LittleEndian.AppendUint32(buf, v.NPages)
		buf = binary.LittleEndian.AppendUint32(buf, v.NTokens)
		buf = append(buf, v.Binding[:]...)
		buf = binary.LittleEndian.AppendUint32(buf, v.Checksum)
		buf = binary.LittleEndian.AppendUint32(buf, uint32(v.FirstToken))
		buf = binary.LittleEndian.AppendUint32(buf, math.Float32bits(v.FirstLogprob))
		buf = binary.LittleEndian.AppendUint32(buf, v.CachedTokens)
		if len(v.First) > 0 {
			buf, err = appendFirst(buf, v)
		}
	case KVAck:
		t = v.Type()
		buf = appendRoomGen(buf, v.RoomGen)
	case Abort:
		t = v.Type()
		buf = appendRoomGen(buf, v.RoomGen)
		buf = append(buf, byte(v.Cause.Outcome))
		buf = appendReason(buf, v.Cause.Role)
		buf = appendReason(buf, v.Cause.Stage)
		buf = appendReason(buf, v.Cause.Detail)
	case AbortAck:
		t = v.Type()
		buf = appendRoomGen(buf, v.RoomGen)
	default:
		err = fmt.Errorf("%w: cannot encode a message of Go type %T", ErrUnknownType, m)
	}
	if err != nil {
		return buf[:start], err
	}
	n := uint64(len(buf)-start-LengthBytes) + uint64(extra)
	if n > math.MaxUint32 {
		return buf[:start], fmt.Errorf("%w: %s frame of %d bytes exceeds the uint32 length", ErrFrameTooLarge, t, n)
	}
	binary.BigEndian.PutUint32(buf[start:], uint32(n))
	buf[start+LengthBytes] = byte(t)
	return buf, nil
}

// WriteFrame writes the frame of m to w, sending a KVChunk's Data without
// copying it (one writev on a *net.TCPConn). It returns the errors of
// AppendFrame, or w's write error.
func WriteFrame(w io.Writer, m Message) error {
	hdr, err := AppendFrameHeader(nil, m)
	if err != nil {
		return err
	}
	bufs := net.Buffers{hdr}
	if c, ok := m.(KVChunk); ok && len(c.Data) > 0 {
		bufs = append(bufs, c.Data)
	}
	_, err = bufs.WriteTo(w)
	return err
}

// appendFirst appends KV_DONE's tail: every choice's first token with its
// top logprobs. First[0] must be FirstToken with FirstLogprob.
func appendFirst(buf []byte, v KVDone) ([]byte, error) {
	switch f := v.First; {
	case len(f) > model.MaxForks:
		return buf, fmt.Errorf("%w: KV_DONE with %d first tokens (max %d)", ErrFieldTooLong, len(f), model.MaxForks)
	case f[0].Token != v.FirstToken || math.Float32bits(f[0].Logprob) != math.Float32bits(v.FirstLogprob):
		return buf, fmt.Errorf("%w: KV_DONE's first choice (%d, %v) is not its FirstToken (%d, %v)",
			ErrMalformed, f[0].Token, f[0].Logprob, v.FirstToken, v.FirstLogprob)
	}
	buf = binary.LittleEndian.AppendUint16(buf, uint16(len(v.First)))
	for _, c := range v.First {
		if len(c.Top) > model.MaxLogprobs {
			return buf, fmt.Errorf("%w: KV_DONE first token with %d top logprobs (max %d)", ErrFieldTooLong, len(c.Top), model.MaxLogprobs)
		}
		buf = binary.LittleEndian.AppendUint32(buf, uint32(c.Token))
		buf = binary.LittleEndian.AppendUint32(buf, math.Float32bits(c.Logprob))
		buf = binary.LittleEndian.AppendUint16(buf, uint16(len(c.Top)))
		for _, t := range c.Top {
			buf = binary.LittleEndian.AppendUint32(buf, uint32(t.ID))
			buf = binary.LittleEndian.AppendUint32(buf, math.Float32bits(t.Logprob))
		}
	}
	return buf, nil
}

func appendRoomGen(buf []byte, rg RoomGen) []byte {
	buf = append(buf, rg.Room[:]...)
	return binary.LittleEndian.AppendUint32(buf, rg.Gen)
}

func appendInt(buf []byte, v int) []byte {
	return binary.LittleEndian.AppendUint64(buf, uint64(int64(v)))
}

func appendString(buf []byte, s string) []byte {
	buf = binary.LittleEndian.AppendUint16(buf, uint16(len(s)))
	return append(buf, s...)
}

func appendIdent(buf []byte, field, s string) ([]byte, error) {
	if len(s) > MaxStringBytes {
		return buf, fmt.Errorf("%w: %s is %d bytes (max %d)", ErrFieldTooLong, field, len(s), MaxStringBytes)
	}
	return appendString(buf, s), nil
}

// appendReason appends s cut to at most MaxStringBytes at a UTF-8 boundary.
func appendReason(buf []byte, s string) []byte {
	if len(s) > MaxStringBytes {
		n := MaxStringBytes
		for n > 0 && !utf8.RuneStart(s[n]) {
			n--
		}
		s = s[:n]
	}
	return appendString(buf, s)
}

// DecodePayload decodes the payload of a frame of type t (the bytes after
// the type byte). The message never aliases payload: a KVChunk's Data is a
// fresh copy (nil when empty). Errors wrap ErrUnknownType for an unknown t
// and ErrMalformed for a payload that is truncated, too long, has trailing
// bytes, or holds an out-of-range field.
func DecodePayload(t Type, payload []byte) (Message, error) {
	lo, hi, ok := payloadBounds(t)
	if !ok {
		return nil, fmt.Errorf("%w: %s", ErrUnknownType, t)
	}
	if len(payload) < lo || (hi >= 0 && len(payload) > hi) {
		return nil, boundsError(t, len(payload), lo, hi)
	}
	if t == TypeKVChunk {
		c, err := decodeKVChunkFixed(payload[:kvChunkFixed])
		if err != nil {
			return nil, err
		}
		if data := payload[kvChunkFixed:]; len(data) > 0 {
			c.Data = append([]byte(nil), data...)
		}
		return c, nil
	}
	d := cursor{t: t, b: payload}
	var m Message
	switch t {
	case TypeHello:
		var h Hello
		h.Version = d.u16("version")
		if h.Version != ProtocolVersion {
			if len(d.b) > 0 {
				h.Foreign = append([]byte(nil), d.b...)
			}
			d.b = nil
			m = h
			break
		}
		h.Fingerprint = Fingerprint{
			Model:    d.str("fingerprint model"),
			Digest:   d.str("fingerprint digest"),
			Layers:   d.int("fingerprint layers"),
			KVHeads:  d.int("fingerprint kv_heads"),
			HeadDim:  d.int("fingerprint head_dim"),
			DType:    d.str("fingerprint dtype"),
			PageSize: d.int("fingerprint page_size"),
		}
		h.Auth = AuthMode(d.u8("auth"))
		if h.Auth > AuthSecret && d.err == nil {
			d.err = fmt.Errorf("%w: HELLO auth mode %d is none of none (0), secret (1)", ErrMalformed, h.Auth)
		}
		copy(h.Nonce[:], d.take(NonceBytes, "nonce"))
		m = h
	case TypeHelloOK:
		var ok HelloOK
		if len(d.b) != 0 {
			ok.Proof = append([]byte(nil), d.take(MACBytes, "proof")...)
		}
		m = ok
	case TypeHelloChallenge:
		var c HelloChallenge
		copy(c.Nonce[:], d.take(NonceBytes, "nonce"))
		m = c
	case TypeHelloProof:
		var p HelloProof
		copy(p.MAC[:], d.take(MACBytes, "proof"))
		m = p
	case TypeHelloErr:
		m = HelloErr{Reason: d.str("reason")}
	case TypePing:
		m = Ping{Nonce: d.u64("nonce")}
	case TypePong:
		m = Pong{Nonce: d.u64("nonce")}
	case TypeRoomOpen:
		m = RoomOpen{RoomGen: d.roomGen("room"), RID: d.str("rid"), NTokens: d.u32("n_tokens"),
			PromptHash: d.u64("prompt_hash")}
	case TypeRoomReady:
		m = RoomReady{RoomGen: d.roomGen("room"), NTokens: d.u32("n_tokens"), CachedPages: d.u32("cached_pages")}
	case TypeRoomRenew:
		n := d.u32("count")
		if uint64(n)*roomGenBytes != uint64(len(d.b)) {
			return nil, fmt.Errorf("%w: ROOM_RENEW count %d needs %d bytes of rooms, payload has %d",
				ErrMalformed, n, uint64(n)*roomGenBytes, len(d.b))
		}
		var r RoomRenew
		if n > 0 {
			r.Rooms = make([]RoomGen, n)
			for i := range r.Rooms {
				r.Rooms[i] = d.roomGen("rooms")
			}
		}
		m = r
	case TypeKVDone:
		k := KVDone{RoomGen: d.roomGen("room"), NChunks: d.u32("n_chunks"), NPages: d.u32("n_pages"),
			NTokens: d.u32("n_tokens")}
		copy(k.Binding[:], d.take(len(k.Binding), "binding"))
		k.Checksum, k.FirstToken = d.u32("checksum"), int32(d.u32("first_token"))
		k.FirstLogprob = math.Float32frombits(d.u32("first_logprob"))
		k.CachedTokens = d.u32("cached_tokens")
		if k.CachedTokens > k.NTokens && d.err == nil {
			d.err = fmt.Errorf("%w: KV_DONE says %d cached tokens of %d", ErrMalformed, k.CachedTokens, k.NTokens)
		}
		if len(d.b) > 0 && d.err == nil {
			k.First = d.first(k)
		}
		m = k
	case TypeKVAck:
		m = KVAck{RoomGen: d.roomGen("room")}
	case TypeAbort:
		a := Abort{RoomGen: d.roomGen("room")}
		a.Cause.Outcome = outcome.Outcome(d.u8("outcome"))
		if _, err := a.Cause.Outcome.MarshalText(); err != nil && d.err == nil {
			d.err = fmt.Errorf("%w: ABORT outcome %d is no outcome", ErrMalformed, a.Cause.Outcome)
		}
		a.Cause.Role, a.Cause.Stage, a.Cause.Detail = d.str("role"), d.str("stage"), d.str("detail")
		m = a
	case TypeAbortAck:
		m = AbortAck{RoomGen: d.roomGen("room")}
	}
	if err := d.finish(); err != nil {
		return nil, err
	}
	return m, nil
}

func boundsError(t Type, n, lo, hi int) error {
	switch {
	case lo == hi:
		return fmt.Errorf("%w: %s payload is %d bytes, want %d", ErrMalformed, t, n, lo)
	case n < lo:
		return fmt.Errorf("%w: %s payload is %d bytes, want at least %d", ErrMalformed, t, n, lo)
	default:
		return fmt.Errorf("%w: %s payload is %d bytes, want at most %d", ErrMalformed, t, n, hi)
	}
}

func decodeKVChunkFixed(p []byte) (KVChunk, error) {
	d := cursor{t: TypeKVChunk, b: p}
	c := KVChunk{RoomGen: d.roomGen("room"), Seq: d.u32("seq"), FirstPage: d.u32("first_page"),
		NPages: d.u32("n_pages")}
	return c, d.finish()
}

// cursor reads little-endian fields from a payload, remembering the first
// error; reads after an error return zero values.
type cursor struct {
	t   Type
	b   []byte
	err error
}

func (d *cursor) take(n int, field string) []byte {
	if d.err != nil {
		return nil
	}
	if len(d.b) < n {
		d.err = fmt.Errorf("%w: %s payload truncated in %s: need %d bytes, have %d",
			ErrMalformed, d.t, field, n, len(d.b))
		return nil
	}
	p := d.b[:n:n]
	d.b = d.b[n:]
	return p
}

func (d *cursor) u8(field string) uint8 {
	if p := d.take(1, field); p != nil {
		return p[0]
	}
	return 0
}

func (d *cursor) u16(field string) uint16 {
	if p := d.take(2, field); p != nil {
		return binary.LittleEndian.Uint16(p)
	}
	return 0
}

func (d *cursor) u32(field string) uint32 {
	if p := d.take(4, field); p != nil {
		return binary.LittleEndian.Uint32(p)
	}
	return 0
}

func (d *cursor) u64(field string) uint64 {
	if p := d.take(8, field); p != nil {
		return binary.LittleEndian.Uint64(p)
	}
	return 0
}

func (d *cursor) int(field string) int {
	v := int64(d.u64(field))
	if int64(int(v)) != v && d.err == nil {
		d.err = fmt.Errorf("%w: %s %s %d does not fit in an int", ErrMalformed, d.t, field, v)
	}
	return int(v)
}

func (d *cursor) str(field string) string {
	n := int(d.u16(field + " length"))
	if d.err == nil && n > MaxStringBytes {
		d.err = fmt.Errorf("%w: %s %s is %d bytes (max %d)", ErrMalformed, d.t, field, n, MaxStringBytes)
	}
	return string(d.take(n, field))
}

func (d *cursor) roomGen(field string) RoomGen {
	var rg RoomGen
	if p := d.take(16, field); p != nil {
		copy(rg.Room[:], p)
	}
	rg.Gen = d.u32(field + " gen")
	return rg
}

// first reads KV_DONE's tail (see appendFirst) for k.
func (d *cursor) first(k KVDone) []FirstToken {
	n := int(d.u16("first count"))
	if d.err == nil && (n == 0 || n > model.MaxForks) {
		d.err = fmt.Errorf("%w: KV_DONE carries %d first tokens (1 to %d)", ErrMalformed, n, model.MaxForks)
	}
	var out []FirstToken
	for i := 0; i < n && d.err == nil; i++ {
		c := FirstToken{Token: int32(d.u32("first token")), Logprob: math.Float32frombits(d.u32("first logprob"))}
		nt := int(d.u16("top count"))
		if nt > model.MaxLogprobs && d.err == nil {
			d.err = fmt.Errorf("%w: KV_DONE first token with %d top logprobs (max %d)", ErrMalformed, nt, model.MaxLogprobs)
			break
		}
		if nt > 0 && d.err == nil {
			if len(d.b) < nt*8 {
				d.err = fmt.Errorf("%w: KV_DONE first token needs %d bytes of top logprobs, %d left", ErrMalformed, nt*8, len(d.b))
				break
			}
			c.Top = make([]model.TokenLogprob, nt)
			for j := range c.Top {
				c.Top[j] = model.TokenLogprob{ID: int32(d.u32("top id")), Logprob: math.Float32frombits(d.u32("top logprob"))}
			}
		}
		out = append(out, c)
	}
	if d.err == nil && (out[0].Token != k.FirstToken || math.Float32bits(out[0].Logprob) != math.Float32bits(k.FirstLogprob)) {
		d.err = fmt.Errorf("%w: KV_DONE's first choice (%d) is not its first token (%d)", ErrMalformed, out[0].Token, k.FirstToken)
	}
	return out
}

func (d *cursor) finish() error {
	if d.err == nil && len(d.b) > 0 {
		d.err = fmt.Errorf("%w: %s payload has %d trailing bytes", ErrMalformed, d.t, len(d.b))
	}
	return d.err
}

// FrameReader reads frames from a stream, reusing one scratch buffer for
// payloads. It is not safe for concurrent use.
type FrameReader struct {
	// AllocData, if set, returns the buffer a KVChunk's Data of n > 0 bytes
	// is read into (len n; a shorter buffer is replaced by a fresh one). It
	// lets a receiver recycle buffers; nil allocates a fresh one per frame.
	AllocData func(n int) []byte

	r   io.Reader
	hdr [HeaderBytes]byte
	buf []byte
}

// NewFrameReader returns a FrameReader reading from r. Wrap a network
// connection in a bufio.Reader first; large KVChunk data is read straight
// into its destination either way.
func NewFrameReader(r io.Reader) *FrameReader { return &FrameReader{r: r} }

// ReadFrame reads and decodes one frame whose length (type byte + payload,
// in bytes) is at most maxFrame. It returns the message and the size of the
// whole frame in bytes (length prefix included). Messages never alias the
// reader's buffer; a KVChunk's Data is a fresh allocation (or comes from
// AllocData).
//
// It returns io.EOF if the stream ends cleanly before a frame, an error
// wrapping io.ErrUnexpectedEOF if it ends inside one, an error wrapping
// ErrFrameTooLarge for a length above maxFrame (checked before allocating
// anything), ErrUnknownType for an unknown type and ErrMalformed for a zero
// length or a bad payload (see DecodePayload). Other read errors (e.g. a
// deadline) are returned wrapped. After an error the stream position is
// undefined.
func (fr *FrameReader) ReadFrame(maxFrame int) (Message, int, error) {
	if _, err := io.ReadFull(fr.r, fr.hdr[:LengthBytes]); err != nil {
		if err == io.EOF {
			return nil, 0, io.EOF
		}
		return nil, 0, fmt.Errorf("kvxfer: reading frame length: %w", err)
	}
	n := binary.BigEndian.Uint32(fr.hdr[:LengthBytes])
	if n == 0 {
		return nil, 0, fmt.Errorf("%w: zero frame length (no type byte)", ErrMalformed)
	}
	if uint64(n) > uint64(max(maxFrame, 0)) {
		return nil, 0, fmt.Errorf("%w: frame of %d bytes exceeds the maximum of %d", ErrFrameTooLarge, n, maxFrame)
	}
	if _, err := io.ReadFull(fr.r, fr.hdr[LengthBytes:]); err != nil {
		return nil, 0, fmt.Errorf("kvxfer: reading frame type: %w", eofToUnexpected(err))
	}
	t := Type(fr.hdr[LengthBytes])
	size := int(n) - 1
	lo, hi, ok := payloadBounds(t)
	if !ok {
		return nil, 0, fmt.Errorf("%w: %s", ErrUnknownType, t)
	}
	if size < lo || (hi >= 0 && size > hi) {
		return nil, 0, boundsError(t, size, lo, hi)
	}
	frameBytes := LengthBytes + int(n)
	if t == TypeKVChunk {
		// Read the fixed fields into the scratch buffer and Data straight
		// into its own allocation: no copy of the bulk bytes.
		fixed := fr.scratch(kvChunkFixed)
		if _, err := io.ReadFull(fr.r, fixed); err != nil {
			return nil, 0, fmt.Errorf("kvxfer: reading %s: %w", t, eofToUnexpected(err))
		}
		c, err := decodeKVChunkFixed(fixed)
		if err != nil {
			return nil, 0, err
		}
		if size > kvChunkFixed {
			c.Data = fr.allocData(size - kvChunkFixed)
			if _, err := io.ReadFull(fr.r, c.Data); err != nil {
				return nil, 0, fmt.Errorf("kvxfer: reading %s data: %w", t, eofToUnexpected(err))
			}
		}
		return c, frameBytes, nil
	}
	payload := fr.scratch(size)
	if _, err := io.ReadFull(fr.r, payload); err != nil {
		return nil, 0, fmt.Errorf("kvxfer: reading %s payload: %w", t, eofToUnexpected(err))
	}
	m, err := DecodePayload(t, payload)
	if err != nil {
		return nil, 0, err
	}
	return m, frameBytes, nil
}

func (fr *FrameReader) allocData(n int) []byte {
	if fr.AllocData != nil {
		if b := fr.AllocData(n); cap(b) >= n {
			return b[:n]
		}
	}
	return make([]byte, n)
}

// scratch returns the reader's buffer resized to n bytes.
func (fr *FrameReader) scratch(n int) []byte {
	if cap(fr.buf) < n {
		fr.buf = make([]byte, n)
	}
	return fr.buf[:n]
}

func eofToUnexpected(err error) error {
	if err == io.EOF {
		return io.ErrUnexpectedEOF
	}
	return err
}

// ReadFrame reads one frame from r with a fresh FrameReader; see
// FrameReader.ReadFrame for maxFrame and the errors. Use a FrameReader to
// read a stream of frames.
func ReadFrame(r io.Reader, maxFrame int) (Message, error) {
	m, _, err := NewFrameReader(r).ReadFrame(maxFrame)
	return m, err
}
