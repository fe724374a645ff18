package kvxfer

import (
	"bytes"
	"encoding/binary"
	"errors"
	"io"
	"math"
	"slices"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"

	"github.com/pdserve/pdserve/internal/model"
	"github.com/pdserve/pdserve/internal/outcome"
)

// cmpMsg compares messages: []byte with bytes.Equal (nil equals empty) and
// RoomGen with ==, both far faster than cmp's reflective walk on large
// messages; NaN equals NaN.
var cmpMsg = cmp.Options{
	cmp.Comparer(bytes.Equal),
	cmp.Comparer(func(a, b RoomGen) bool { return a == b }),
	cmpopts.EquateNaNs(),
}

func testRoomGen(b byte, gen uint32) RoomGen {
	var r Room
	for i := range r {
		r[i] = b + byte(i)
	}
	return RoomGen{Room: r, Gen: gen}
}

// sampleMessages holds at least one message of every type, with fields at
// their extremes.
func sampleMessages() []Message {
	rg := testRoomGen(0xa0, 7)
	fp := Fingerprint{Model: "llama-3-8b", Digest: "sha256:abc", Layers: 32, KVHeads: 8,
		HeadDim: 128, DType: "bf16", PageSize: 16}
	return []Message{
		Hello{Version: ProtocolVersion, Fingerprint: fp, Auth: AuthSecret, Nonce: [NonceBytes]byte{0: 1, 31: 0xff}},
		Hello{Version: ProtocolVersion, Fingerprint: Fingerprint{Layers: -1, KVHeads: math.MinInt32,
			HeadDim: math.MaxInt32, PageSize: 0, Model: strings.Repeat("m", MaxStringBytes)}},
		Hello{Version: 3, Foreign: []byte("\x0allama-3-8b and the rest of a version 3 HELLO")},
		Hello{},
		HelloOK{},
		HelloOK{Proof: bytes.Repeat([]byte{0xab}, MACBytes)},
		HelloChallenge{Nonce: [NonceBytes]byte{0: 2, 31: 0xfe}},
		HelloProof{MAC: [MACBytes]byte{0: 3, 31: 0xfd}},
		HelloErr{Reason: "incompatible KV peer: page_size 16 vs 32"},
		HelloErr{},
		Ping{Nonce: 0},
		Ping{Nonce: math.MaxUint64},
		Pong{Nonce: 42},
		RoomOpen{RoomGen: rg, RID: "cmpl-123", NTokens: 1000, PromptHash: 0xdeadbeefcafef00d},
		RoomReady{RoomGen: rg, NTokens: math.MaxUint32},
		RoomReady{RoomGen: rg, NTokens: 1000, CachedPages: 62},
		RoomRenew{},
		RoomRenew{Rooms: []RoomGen{rg, testRoomGen(1, 0), testRoomGen(2, math.MaxUint32)}},
		KVChunk{RoomGen: rg, Seq: 3, FirstPage: 12, NPages: 4, Data: bytes.Repeat([]byte{1, 2, 3, 4, 5}, 1000)},
		KVChunk{RoomGen: rg},
		KVDone{RoomGen: rg, NChunks: 4, NPages: 16, NTokens: 250, Checksum: 0x12345678, FirstToken: -5,
			FirstLogprob: -0.25, Binding: Binding{0: 0xb1, 7: 0x77, 15: 0xff}},
		KVDone{RoomGen: rg, NChunks: 1, NPages: 16, NTokens: 250, CachedTokens: 240, Checksum: 1, FirstToken: 7},
		KVDone{RoomGen: rg, FirstLogprob: float32(math.NaN())},
		KVDone{RoomGen: rg, NChunks: 1, NPages: 2, NTokens: 20, FirstToken: 3, FirstLogprob: -1.5,
			First: []FirstToken{{Token: 3, Logprob: -1.5, Top: []model.TokenLogprob{{ID: 3, Logprob: -1.5}, {ID: 9, Logprob: float32(math.Inf(-1))}}},
				{Token: 11, Logprob: -0.5}, {Token: 0, Logprob: 0, Top: []model.TokenLogprob{{ID: 0}}}}},
		KVAck{RoomGen: rg},
		Abort{RoomGen: rg, Cause: outcome.Cause{Detail: "client disconnected"}},
		Abort{RoomGen: rg, Cause: outcome.Cause{Outcome: outcome.FailedTransfer, Role: "decode", Stage: "awaiting_kv",
			Detail: "KV checksum mismatch"}},
		AbortAck{RoomGen: rg},
	}
}

func mustFrame(t testing.TB, m Message) []byte {
	t.Helper()
	b, err := AppendFrame(nil, m)
	if err != nil {
		t.Fatalf("AppendFrame(%#v): %v", m, err)
	}
	return b
}

func TestSamplesCoverEveryType(t *testing.T) {
	seen := map[Type]bool{}
	for _, m := range sampleMessages() {
		seen[m.Type()] = true
	}
	for ty := Type(1); int(ty) < NumTypes; ty++ {
		if !seen[ty] {
			t.Errorf("no sample message of type %s", ty)
		}
	}
}

func TestRoundTrip(t *testing.T) {
	for _, m := range sampleMessages() {
		t.Run(m.Type().String(), func(t *testing.T) {
			frame := mustFrame(t, m)
			if got := binary.BigEndian.Uint32(frame); int(got) != len(frame)-LengthBytes {
				t.Fatalf("length prefix %d, frame has %d bytes after it", got, len(frame)-LengthBytes)
			}
			if Type(frame[LengthBytes]) != m.Type() {
				t.Fatalf("type byte %d, want %d", frame[LengthBytes], m.Type())
			}
			got, n, err := NewFrameReader(bytes.NewReader(frame)).ReadFrame(len(frame))
			if err != nil {
				t.Fatalf("ReadFrame: %v", err)
			}
			if n != len(frame) {
				t.Errorf("ReadFrame reported %d frame bytes, want %d", n, len(frame))
			}
			if d := cmp.Diff(m, got, cmpMsg); d != "" {
				t.Errorf("ReadFrame round trip (-sent +got):\n%s", d)
			}
			got, err = DecodePayload(m.Type(), frame[HeaderBytes:])
			if err != nil {
				t.Fatalf("DecodePayload: %v", err)
			}
			if d := cmp.Diff(m, got, cmpMsg); d != "" {
				t.Errorf("DecodePayload round trip (-sent +got):\n%s", d)
			}
			var w bytes.Buffer
			if err := WriteFrame(&w, m); err != nil {
				t.Fatalf("WriteFrame: %v", err)
			}
			if !bytes.Equal(w.Bytes(), frame) {
				t.Errorf("WriteFrame wrote %x, AppendFrame %x", w.Bytes(), frame)
			}
		})
	}
}

func TestDecodedDataDoesNotAlias(t *testing.T) {
	frame := mustFrame(t, KVChunk{NPages: 1, Data: []byte("abcd")})
	m, err := DecodePayload(TypeKVChunk, frame[HeaderBytes:])
	if err != nil {
		t.Fatal(err)
	}
	frame[len(frame)-1] = 'X'
	if got := string(m.(KVChunk).Data); got != "abcd" {
		t.Errorf("Data changed with the payload buffer: %q", got)
	}
}

// TestWireFormat pins the byte layout so that a change to it is deliberate.
func TestWireFormat(t *testing.T) {
	rg := RoomGen{Room: Room{15: 0xff}, Gen: 0x01020304}
	tests := []struct {
		m    Message
		want []byte
	}{
		{Ping{Nonce: 0x0102}, []byte{0, 0, 0, 9, 4, 2, 1, 0, 0, 0, 0, 0, 0}},
		{HelloOK{}, []byte{0, 0, 0, 1, 2}},
		{HelloErr{Reason: "no"}, []byte{0, 0, 0, 5, 3, 2, 0, 'n', 'o'}},
		{Abort{RoomGen: rg, Cause: outcome.Cause{Outcome: outcome.PeerLost, Role: "p", Detail: "x"}},
			append(append([]byte{0, 0, 0, 30, 12, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff}, 4, 3, 2, 1),
				byte(outcome.PeerLost), 1, 0, 'p', 0, 0, 1, 0, 'x')},
		{KVAck{RoomGen: rg}, append([]byte{0, 0, 0, 21, 11, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff},
			4, 3, 2, 1)},
		{RoomRenew{Rooms: []RoomGen{rg}}, append([]byte{0, 0, 0, 25, 8, 1, 0, 0, 0,
			0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff}, 4, 3, 2, 1)},
		// roomgen | n_chunks | n_pages | n_tokens | binding | checksum | first_token | first_logprob | cached_tokens
		{KVDone{RoomGen: rg, NChunks: 1, NPages: 2, NTokens: 3, Binding: Binding{0: 0xb0, 15: 0xbf}, Checksum: 0x0a0b0c0d,
			FirstToken: -1, FirstLogprob: -2, CachedTokens: 2},
			slices.Concat([]byte{0, 0, 0, 65, 10, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 4, 3, 2, 1},
				[]byte{1, 0, 0, 0, 2, 0, 0, 0, 3, 0, 0, 0},
				[]byte{0xb0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xbf},
				[]byte{0x0d, 0x0c, 0x0b, 0x0a, 0xff, 0xff, 0xff, 0xff, 0, 0, 0, 0xc0, 2, 0, 0, 0})},
		// roomgen | n_tokens | cached_pages
		{RoomReady{RoomGen: rg, NTokens: 33, CachedPages: 2},
			slices.Concat([]byte{0, 0, 0, 29, 7, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 4, 3, 2, 1},
				[]byte{33, 0, 0, 0, 2, 0, 0, 0})},
	}
	for _, tt := range tests {
		if got := mustFrame(t, tt.m); !bytes.Equal(got, tt.want) {
			t.Errorf("%s: encoded % x, want % x", tt.m.Type(), got, tt.want)
		}
	}
}

func TestReadFrameStream(t *testing.T) {
	var stream []byte
	msgs := sampleMessages()
	for _, m := range msgs {
		stream = append(stream, mustFrame(t, m)...)
	}
	fr := NewFrameReader(bytes.NewReader(stream))
	for i, want := range msgs {
		got, _, err := fr.ReadFrame(1 << 20)
		if err != nil {
			t.Fatalf("frame %d: %v", i, err)
		}
		if d := cmp.Diff(want, got, cmpMsg); d != "" {
			t.Fatalf("frame %d (-want +got):\n%s", i, d)
		}
	}
	if _, _, err := fr.ReadFrame(1 << 20); err != io.EOF {
		t.Fatalf("after the last frame: err = %v, want io.EOF", err)
	}
}

func TestTruncatedStream(t *testing.T) {
	for _, m := range sampleMessages() {
		frame := mustFrame(t, m)
		for cut := 1; cut < len(frame); cut++ {
			_, err := ReadFrame(bytes.NewReader(frame[:cut]), len(frame))
			if !errors.Is(err, io.ErrUnexpectedEOF) {
				t.Fatalf("%s cut to %d of %d bytes: err = %v, want io.ErrUnexpectedEOF", m.Type(), cut, len(frame), err)
			}
		}
	}
	if _, err := ReadFrame(bytes.NewReader(nil), 100); err != io.EOF {
		t.Errorf("empty stream: err = %v, want io.EOF", err)
	}
}

// withPayload returns a frame of type t around payload.
func withPayload(t Type, payload []byte) []byte {
	b := binary.BigEndian.AppendUint32(nil, uint32(len(payload)+1))
	b = append(b, byte(t))
	return append(b, payload...)
}

func TestTruncatedPayload(t *testing.T) {
	for _, m := range sampleMessages() {
		payload := mustFrame(t, m)[HeaderBytes:]
		if len(payload) == 0 || (m.Type() == TypeKVChunk && len(payload) > kvChunkFixed) || isForeignHello(m) {
			continue // nothing to cut, or a shorter Data (foreign payload) is still valid
		}
		short := payload[:len(payload)-1]
		_, err := ReadFrame(bytes.NewReader(withPayload(m.Type(), short)), 1<<20)
		if !errors.Is(err, ErrMalformed) {
			t.Errorf("%s payload cut by one byte: err = %v, want ErrMalformed", m.Type(), err)
		}
		if _, err := DecodePayload(m.Type(), short); !errors.Is(err, ErrMalformed) {
			t.Errorf("DecodePayload %s cut by one byte: err = %v, want ErrMalformed", m.Type(), err)
		}
	}
}

func TestTrailingGarbage(t *testing.T) {
	for _, m := range sampleMessages() {
		if m.Type() == TypeKVChunk || isForeignHello(m) {
			continue // Data (a foreign HELLO's payload) runs to the end of the frame
		}
		payload := append(mustFrame(t, m)[HeaderBytes:], 0x5a)
		_, err := ReadFrame(bytes.NewReader(withPayload(m.Type(), payload)), 1<<20)
		if !errors.Is(err, ErrMalformed) {
			t.Errorf("%s with a trailing byte: err = %v, want ErrMalformed", m.Type(), err)
		}
	}
}

// isForeignHello: a HELLO of another version, whose payload after the
// version is opaque.
func isForeignHello(m Message) bool {
	h, ok := m.(Hello)
	return ok && h.Version != ProtocolVersion
}

// TestForeignHello: a HELLO of another version decodes to its version (so
// the peer is refused for it), whatever follows.
func TestForeignHello(t *testing.T) {
	v3 := append([]byte{3, 0}, []byte("\x0allama-3-8b...anything")...)
	m, err := DecodePayload(TypeHello, v3)
	if err != nil {
		t.Fatal(err)
	}
	if h := m.(Hello); h.Version != 3 || !bytes.Equal(h.Foreign, v3[2:]) {
		t.Fatalf("decoded %#v", h)
	}
	if _, err := DecodePayload(TypeHello, []byte{3}); !errors.Is(err, ErrMalformed) {
		t.Fatalf("a HELLO without a whole version: %v", err)
	}
}

func TestMalformedFields(t *testing.T) {
	rg := appendRoomGen(nil, testRoomGen(0, 1))
	longStr := binary.LittleEndian.AppendUint16(nil, MaxStringBytes+1)
	longStr = append(longStr, bytes.Repeat([]byte{'a'}, MaxStringBytes+1)...)
	tests := []struct {
		name    string
		frame   []byte
		wantErr error
		wantMsg string
	}{
		{"zero length", []byte{0, 0, 0, 0, 4}, ErrMalformed, "zero frame length"},
		{"type 0", withPayload(0, nil), ErrUnknownType, "TYPE(0)"},
		{"type 16", withPayload(16, nil), ErrUnknownType, "TYPE(16)"},
		{"type 255", withPayload(255, []byte{1, 2, 3}), ErrUnknownType, "TYPE(255)"},
		{"renew count too big", withPayload(TypeRoomRenew, append([]byte{2, 0, 0, 0}, rg...)), ErrMalformed,
			"ROOM_RENEW count 2"},
		{"renew count huge", withPayload(TypeRoomRenew, []byte{0xff, 0xff, 0xff, 0xff}), ErrMalformed,
			"ROOM_RENEW count 4294967295"},
		{"renew partial room", withPayload(TypeRoomRenew, append([]byte{1, 0, 0, 0}, rg[:19]...)), ErrMalformed,
			"ROOM_RENEW count 1"},
		{"abort reason too long", withPayload(TypeAbort, append(append(append([]byte(nil), rg...), 0, 0, 0, 0, 0), longStr...)),
			ErrMalformed, "ABORT detail is 4097 bytes"},
		{"abort outcome out of range", withPayload(TypeAbort, append(append([]byte(nil), rg...), 200, 0, 0, 0, 0, 0, 0)),
			ErrMalformed, "ABORT outcome 200 is no outcome"},
		{"hello string too long", withPayload(TypeHello, append([]byte{ProtocolVersion, 0}, longStr...)), ErrMalformed,
			"fingerprint model is 4097 bytes"},
		{"string length past end", withPayload(TypeHelloErr, []byte{5, 0, 'a'}), ErrMalformed,
			"HELLO_ERR payload truncated in reason"},
		{"ping short", withPayload(TypePing, []byte{1, 2, 3}), ErrMalformed, "PING payload is 3 bytes, want 8"},
		{"hello ok with a short proof", withPayload(TypeHelloOK, []byte{0}), ErrMalformed, "HELLO_OK payload truncated in proof"},
		{"hello auth mode out of range", withPayload(TypeHello, helloWithAuth(7)), ErrMalformed, "HELLO auth mode 7"},
		{"challenge short", withPayload(TypeHelloChallenge, make([]byte, 31)), ErrMalformed, "HELLO_CHALLENGE payload is 31 bytes, want 32"},
		{"proof long", withPayload(TypeHelloProof, make([]byte, 33)), ErrMalformed, "HELLO_PROOF payload is 33 bytes, want 32"},
		{"kv chunk short", withPayload(TypeKVChunk, rg), ErrMalformed, "KV_CHUNK payload is 20 bytes"},
		{"kv done cached tokens above n_tokens", withPayload(TypeKVDone, slices.Concat(rg,
			[]byte{1, 0, 0, 0, 1, 0, 0, 0, 16, 0, 0, 0}, make([]byte, 16+12), []byte{17, 0, 0, 0})),
			ErrMalformed, "KV_DONE says 17 cached tokens of 16"},
		{"kv done tail with no first token", withPayload(TypeKVDone, slices.Concat(rg, make([]byte, kvDoneBytes-len(rg)), []byte{0, 0})),
			ErrMalformed, "KV_DONE carries 0 first tokens"},
		{"kv done tail truncated", withPayload(TypeKVDone, slices.Concat(rg, make([]byte, kvDoneBytes-len(rg)), []byte{1, 0, 0, 0})),
			ErrMalformed, "truncated"},
		{"kv done tail top past end", withPayload(TypeKVDone, slices.Concat(rg, make([]byte, kvDoneBytes-len(rg)), []byte{1, 0}, make([]byte, 8), []byte{2, 0}, make([]byte, 8))),
			ErrMalformed, "needs 16 bytes of top logprobs"},
		{"kv done tail first choice differs", withPayload(TypeKVDone, slices.Concat(rg, make([]byte, kvDoneBytes-len(rg)), []byte{1, 0, 5, 0, 0, 0}, make([]byte, 6))),
			ErrMalformed, "is not its first token"},
		{"kv done tail trailing bytes", withPayload(TypeKVDone, slices.Concat(rg, make([]byte, kvDoneBytes-len(rg)), []byte{1, 0}, make([]byte, 10), []byte{7})),
			ErrMalformed, "trailing"},
		{"room ready without cached pages (version 4)", withPayload(TypeRoomReady, slices.Concat(rg, []byte{1, 0, 0, 0})),
			ErrMalformed, "ROOM_READY payload is 24 bytes, want 28"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := ReadFrame(bytes.NewReader(tt.frame), 1<<20)
			if !errors.Is(err, tt.wantErr) || !strings.Contains(err.Error(), tt.wantMsg) {
				t.Fatalf("err = %v, want %v containing %q", err, tt.wantErr, tt.wantMsg)
			}
		})
	}
}

// helloWithAuth is a current-version HELLO payload with auth mode a.
func helloWithAuth(a byte) []byte {
	f, _ := AppendFrame(nil, Hello{Version: ProtocolVersion})
	p := f[HeaderBytes:]
	p[len(p)-NonceBytes-1] = a
	return p
}

func TestOversizedLengthRejectedBeforeReading(t *testing.T) {
	for _, n := range []uint32{1<<20 + 1, 1 << 31, math.MaxUint32} {
		frame := binary.BigEndian.AppendUint32(nil, n)
		frame = append(frame, byte(TypeKVChunk), 1, 2, 3)
		r := bytes.NewReader(frame)
		_, err := ReadFrame(r, 1<<20)
		if !errors.Is(err, ErrFrameTooLarge) || !strings.Contains(err.Error(), "exceeds the maximum of 1048576") {
			t.Errorf("length %d: err = %v, want ErrFrameTooLarge", n, err)
		}
		if r.Len() != len(frame)-LengthBytes {
			t.Errorf("length %d: reader consumed %d bytes, want only the length prefix", n, len(frame)-r.Len())
		}
	}
	// A fixed-size type with a large length is refused after the header,
	// before its payload is read or a buffer allocated for it.
	frame := binary.BigEndian.AppendUint32(nil, 60<<20)
	frame = append(frame, byte(TypePing), 1, 2, 3)
	r := bytes.NewReader(frame)
	if _, err := ReadFrame(r, 64<<20); !errors.Is(err, ErrMalformed) {
		t.Errorf("60 MiB PING: err = %v, want ErrMalformed", err)
	}
	if r.Len() != 3 {
		t.Errorf("60 MiB PING: reader consumed %d bytes, want %d", len(frame)-r.Len(), HeaderBytes)
	}
}

func TestReadFrameAllocations(t *testing.T) {
	frame := mustFrame(t, Ping{Nonce: 9})
	r := bytes.NewReader(frame)
	fr := NewFrameReader(r)
	allocs := testing.AllocsPerRun(100, func() {
		r.Reset(frame)
		if _, _, err := fr.ReadFrame(100); err != nil {
			t.Fatal(err)
		}
	})
	// One allocation boxes the Ping into the Message interface.
	if allocs > 1 {
		t.Errorf("ReadFrame of a PING allocates %v times, want ≤ 1", allocs)
	}
}

func TestEncodeErrors(t *testing.T) {
	long := strings.Repeat("x", MaxStringBytes+1)
	tests := []struct {
		name string
		m    Message
		want error
	}{
		{"rid too long", RoomOpen{RID: long}, ErrFieldTooLong},
		{"model too long", Hello{Version: ProtocolVersion, Fingerprint: Fingerprint{Model: long}}, ErrFieldTooLong},
		{"dtype too long", Hello{Version: ProtocolVersion, Fingerprint: Fingerprint{DType: long}}, ErrFieldTooLong},
		{"short HELLO_OK proof", HelloOK{Proof: []byte{1}}, ErrFieldTooLong},
		{"pointer message", &Ping{}, ErrUnknownType},
		{"nil pointer message", (*Ping)(nil), ErrUnknownType},
		{"nil message", nil, ErrUnknownType},
	}
	for _, tt := range tests {
		prefix := []byte("keep")
		got, err := AppendFrame(prefix, tt.m)
		if !errors.Is(err, tt.want) {
			t.Errorf("%s: err = %v, want %v", tt.name, err, tt.want)
		}
		if string(got) != "keep" {
			t.Errorf("%s: buffer changed on error: %q", tt.name, got)
		}
	}
}

func TestLongReasonCutAtRuneBoundary(t *testing.T) {
	// "é" is two bytes; 4095 ASCII bytes put one across the limit.
	reason := strings.Repeat("a", MaxStringBytes-1) + "é" + "tail"
	for _, m := range []Message{Abort{Cause: outcome.Cause{Detail: reason}}, HelloErr{Reason: reason}} {
		got, err := DecodePayload(m.Type(), mustFrame(t, m)[HeaderBytes:])
		if err != nil {
			t.Fatal(err)
		}
		var r string
		switch g := got.(type) {
		case Abort:
			r = g.Cause.Detail
		case HelloErr:
			r = g.Reason
		}
		if want := strings.Repeat("a", MaxStringBytes-1); r != want {
			t.Errorf("%s reason: got %d bytes ending %q, want the 4095 ASCII bytes", m.Type(), len(r), r[max(0, len(r)-3):])
		}
	}
}

// FuzzDecodeFrame feeds arbitrary bytes to a FrameReader. Decoding must never
// panic, every error must be one of the documented kinds, and every frame that
// decodes must re-encode to exactly the bytes it was read from (the encoding
// is canonical) and decode again to an equal message.
func FuzzDecodeFrame(f *testing.F) {
	for _, m := range sampleMessages() {
		f.Add(mustFrame(f, m))
	}
	f.Add([]byte{0, 0, 0, 0, 4})
	f.Add(withPayload(200, []byte{1}))
	// Large enough for the largest HELLO; larger frames only repeat ROOM_RENEW
	// entries or KV_CHUNK data and slow the fuzzer down.
	const maxFrame = MaxHandshakeFrameBytes
	f.Fuzz(func(t *testing.T, data []byte) {
		r := bytes.NewReader(data)
		fr := NewFrameReader(r)
		for range 64 {
			before := r.Len()
			m, n, err := fr.ReadFrame(maxFrame)
			if err != nil {
				if err != io.EOF && !errors.Is(err, io.ErrUnexpectedEOF) && !errors.Is(err, ErrMalformed) &&
					!errors.Is(err, ErrFrameTooLarge) && !errors.Is(err, ErrUnknownType) {
					t.Fatalf("undocumented error: %v", err)
				}
				return
			}
			read := data[len(data)-before : len(data)-r.Len()]
			if n != len(read) {
				t.Fatalf("ReadFrame reported %d frame bytes, consumed %d", n, len(read))
			}
			again, err := AppendFrame(nil, m)
			if err != nil {
				t.Fatalf("re-encoding %#v: %v", m, err)
			}
			if !bytes.Equal(again, read) {
				t.Fatalf("re-encoded %s differs:\nread  %x\nwrote %x", m.Type(), read, again)
			}
			m2, err := ReadFrame(bytes.NewReader(again), maxFrame)
			if err != nil {
				t.Fatalf("decoding the re-encoded %s: %v", m.Type(), err)
			}
			if d := cmp.Diff(m, m2, cmpMsg); d != "" {
				t.Fatalf("re-decoded %s differs (-first +second):\n%s", m.Type(), d)
			}
		}
	})
}

func TestAllocData(t *testing.T) {
	frame := mustFrame(t, KVChunk{NPages: 1, Data: []byte("0123456789")})
	mine := make([]byte, 64)
	var asked []int
	fr := NewFrameReader(bytes.NewReader(append(append([]byte(nil), frame...), frame...)))
	fr.AllocData = func(n int) []byte {
		asked = append(asked, n)
		if len(asked) == 1 {
			return mine
		}
		return make([]byte, 3) // too short: the reader must not use it
	}
	for i := range 2 {
		m, _, err := fr.ReadFrame(100)
		if err != nil {
			t.Fatal(err)
		}
		data := m.(KVChunk).Data
		if string(data) != "0123456789" {
			t.Fatalf("frame %d: Data %q", i, data)
		}
		if inMine := &data[0] == &mine[0]; inMine != (i == 0) {
			t.Errorf("frame %d: Data in the AllocData buffer = %v, want %v", i, inMine, i == 0)
		}
	}
	if d := cmp.Diff([]int{10, 10}, asked); d != "" {
		t.Errorf("AllocData sizes (-want +got):\n%s", d)
	}
}
