package tcp

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"os"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"go.uber.org/goleak"

	"github.com/pdserve/pdserve/internal/kvxfer"
	"github.com/pdserve/pdserve/internal/outcome"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

var cmpMsg = cmp.Options{
	cmp.Comparer(bytes.Equal),
	cmp.Comparer(func(a, b kvxfer.RoomGen) bool { return a == b }),
}

func TestHandshakeOK(t *testing.T) {
	p := newPair(t, nil)
	if got := p.decodeRec.waitKind(t, evUp, p.decodePeer).remote; got != p.addr {
		t.Errorf("decode PeerUp remote %q, want the dialed address %q", got, p.addr)
	}
	if got := p.decode.Remote(p.decodePeer); got != p.addr {
		t.Errorf("decode Remote = %q, want %q", got, p.addr)
	}
	up := p.prefillRec.waitKind(t, evUp, p.prefillPeer)
	if !strings.HasPrefix(up.remote, "127.0.0.1:") || up.remote == p.addr {
		t.Errorf("prefill PeerUp remote %q, want decode's 127.0.0.1 address", up.remote)
	}
	if got := p.prefill.Remote(p.prefillPeer); got != up.remote {
		t.Errorf("prefill Remote = %q, want %q", got, up.remote)
	}
	if again := p.decode.Connect(p.addr); again != p.decodePeer {
		t.Errorf("second Connect = peer %d, want the live connection %d", again, p.decodePeer)
	}
	if got := p.decode.Remote(12345); got != "" {
		t.Errorf("Remote of an unknown peer = %q, want empty", got)
	}
	ds, ps := p.decode.Stats(), p.prefill.Stats()
	if ds.Dials != 1 || ds.Up != 1 || ds.Sent[kvxfer.TypeHello].Frames != 1 || ds.Received[kvxfer.TypeHelloOK].Frames != 1 {
		t.Errorf("decode stats %+v", ds)
	}
	if ps.Accepts != 1 || ps.Up != 1 || ps.Received[kvxfer.TypeHello].Frames != 1 || ps.Sent[kvxfer.TypeHelloOK].Frames != 1 {
		t.Errorf("prefill stats %+v", ps)
	}
	if ps.Sent[kvxfer.TypeHelloOK].Bytes != kvxfer.HeaderBytes {
		t.Errorf("prefill sent HELLO_OK bytes = %d, want %d", ps.Sent[kvxfer.TypeHelloOK].Bytes, kvxfer.HeaderBytes)
	}
}

func TestHandshakeRefused(t *testing.T) {
	other := testFP
	other.PageSize = 32
	two := testFP
	two.DType, two.Layers = "bf16", 4
	right, wrong := []byte("the fleet's key, 32 bytes long.."), []byte("not the fleet's key, 32 bytes..")
	tests := []struct {
		name          string
		decode        Config
		prefillSecret []byte
		reason        string
		prefillFail   string // the reason prefill counts
		why           kvxfer.RefusalReason
	}{
		{"page size", Config{Fingerprint: other}, nil,
			"incompatible KV peer (decode vs prefill): page_size 32 vs 16", FailFingerprint, kvxfer.RefusedFingerprint},
		{"two fields", Config{Fingerprint: two}, nil,
			"incompatible KV peer (decode vs prefill): layers 4 vs 2, dtype bf16 vs f32", FailFingerprint, kvxfer.RefusedFingerprint},
		{"wrong secret", Config{Fingerprint: testFP, Secret: wrong}, right,
			"decode failed to prove the internal secret", FailBadProof, kvxfer.RefusedAuth},
		{"decode without the secret", Config{Fingerprint: testFP}, right,
			"this prefill requires the internal secret and decode has none (--internal-secret)", FailAuthMode, kvxfer.RefusedAuth},
		{"prefill without the secret", Config{Fingerprint: testFP, Secret: right}, nil,
			"decode has an internal secret and this prefill has none (--internal-secret must be set on both)", FailAuthMode, kvxfer.RefusedAuth},
		{"wrong secret and another model", Config{Fingerprint: other, Secret: wrong}, right,
			"decode failed to prove the internal secret", FailBadProof, kvxfer.RefusedAuth},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			prefill, prefillRec := newBackend(t, func(c *Config) { c.Secret = tt.prefillSecret })
			decode, decodeRec := newBackend(t, func(c *Config) {
				c.Fingerprint, c.Secret = tt.decode.Fingerprint, tt.decode.Secret
			})
			addr := listen(t, prefill)
			peer := decode.Connect(addr)

			err := decodeRec.waitKind(t, evLost, peer).err
			want := fmt.Sprintf("kv handshake with %s refused: %s", addr, tt.reason)
			if !errors.Is(err, ErrRefused) || err.Error() != want {
				t.Errorf("decode PeerLost err = %q, want ErrRefused %q", err, want)
			}
			// What the lifecycle machine tests, without knowing the transport.
			if !errors.Is(err, kvxfer.ErrRefused) {
				t.Errorf("decode PeerLost err = %q does not wrap kvxfer.ErrRefused", err)
			}
			lost := prefillRec.waitAny(t, evLost)
			if !errors.Is(lost.err, ErrRefused) || !strings.HasSuffix(lost.err.Error(), "refused: "+tt.reason) {
				t.Errorf("prefill PeerLost err = %q, want ErrRefused ending %q", lost.err, tt.reason)
			}
			for _, r := range []*recorder{decodeRec, prefillRec} {
				for _, e := range r.snapshot() {
					if e.kind == evUp {
						t.Errorf("PeerUp of peer %d after a refused handshake", e.peer)
					}
				}
			}
			if s := decode.Stats(); s.Refused != 1 || s.Lost != 1 || s.Up != 0 {
				t.Errorf("decode stats: refused %d lost %d up %d, want 1 1 0", s.Refused, s.Lost, s.Up)
			}
			if s := prefill.Stats(); s.Refused != 1 || s.Sent[kvxfer.TypeHelloErr].Frames != 1 {
				t.Errorf("prefill stats: refused %d, HELLO_ERR sent %d, want 1 1", s.Refused, s.Sent[kvxfer.TypeHelloErr].Frames)
			}
			if got := prefill.Stats().HandshakeFailures; got[tt.prefillFail] != 1 || sum(got) != 1 {
				t.Errorf("prefill handshake failures %v, want one %s", got, tt.prefillFail)
			}
			if got := decode.Stats().HandshakeFailures; got[FailPeerRefused] != 1 || sum(got) != 1 {
				t.Errorf("decode handshake failures %v, want one %s", got, FailPeerRefused)
			}
			for side, b := range map[string]*Backend{"decode": decode, "prefill": prefill} {
				if c := b.ConnCounts(); c.Live != 0 {
					t.Errorf("%s ConnCounts %+v, want none live", side, c)
				}
			}
			// Both sides classify the refusal alike: the one that refused
			// and the one that was told why.
			if why, detail, ok := kvxfer.RefusalOf(err); !ok || why != tt.why || detail != tt.reason {
				t.Errorf("RefusalOf(decode's error) = %s %q %v, want %s %q", why, detail, ok, tt.why, tt.reason)
			}
			if why, detail, ok := kvxfer.RefusalOf(lost.err); !ok || why != tt.why || detail != tt.reason {
				t.Errorf("RefusalOf(prefill's error) = %s %q %v, want %s %q", why, detail, ok, tt.why, tt.reason)
			}
		})
	}
}

// TestHandshakeRefusedRaw covers what a Backend never sends: another
// protocol version and a first frame that is not HELLO.
func TestHandshakeRefusedRaw(t *testing.T) {
	tests := []struct {
		name   string
		first  []byte
		reason string
	}{
		{"version", frame(t, kvxfer.Hello{Version: 9, Fingerprint: testFP}), fmt.Sprintf("protocol version 9 vs %d (decode vs prefill)", kvxfer.ProtocolVersion)},
		{"not hello", frame(t, kvxfer.KVAck{}), "first frame is KV_ACK, want HELLO"},
		{"garbage", []byte("GET / HTTP/1.1\r\n\r\n"), "frame too large"},
		{"unknown type", []byte{0, 0, 0, 1, 77}, "unknown frame type: TYPE(77)"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			prefill, rec := newBackend(t, nil)
			raw := dialRaw(t, listen(t, prefill))
			raw.writeRaw(tt.first)
			m := raw.read()
			herr, ok := m.(kvxfer.HelloErr)
			if !ok || !strings.Contains(herr.Reason, tt.reason) {
				t.Fatalf("answer %#v, want HELLO_ERR containing %q", m, tt.reason)
			}
			if _, _, err := raw.fr.ReadFrame(100); err != io.EOF {
				t.Errorf("after HELLO_ERR: %v, want the connection closed (io.EOF)", err)
			}
			lost := rec.waitAny(t, evLost)
			if !errors.Is(lost.err, ErrRefused) || !strings.Contains(lost.err.Error(), tt.reason) {
				t.Errorf("PeerLost err = %q, want ErrRefused containing %q", lost.err, tt.reason)
			}
		})
	}
}

func sum(m map[string]uint64) uint64 {
	var n uint64
	for _, v := range m {
		n += v
	}
	return n
}

func frame(t testing.TB, m kvxfer.Message) []byte {
	t.Helper()
	b, err := kvxfer.AppendFrame(nil, m)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func TestMessagesInOrderBothWays(t *testing.T) {
	p := newPair(t, nil)
	big := make([]byte, 8<<20)
	rng := rand.New(rand.NewPCG(1, 2))
	for i := range big {
		big[i] = byte(rng.Uint32())
	}
	var toPrefill, toDecode []kvxfer.Message
	for i := range 100 {
		rg := roomGen(i)
		toPrefill = append(toPrefill,
			kvxfer.RoomOpen{RoomGen: rg, RID: fmt.Sprintf("rid-%d", i), NTokens: uint32(i), PromptHash: uint64(i) << 40},
			kvxfer.RoomReady{RoomGen: rg, NTokens: uint32(i)},
			kvxfer.RoomRenew{Rooms: []kvxfer.RoomGen{rg, roomGen(i + 1)}},
			kvxfer.KVAck{RoomGen: rg},
			kvxfer.Abort{RoomGen: rg, Cause: outcome.Cause{Detail: "client went away"}},
			kvxfer.AbortAck{RoomGen: rg},
		)
		data := big[i*1000 : i*1000+i*37]
		toDecode = append(toDecode,
			kvxfer.KVChunk{RoomGen: rg, Seq: uint32(i), FirstPage: uint32(2 * i), NPages: 2, Data: data},
			kvxfer.KVDone{RoomGen: rg, NChunks: 1, NPages: 2, NTokens: 30, Checksum: uint32(i), FirstToken: int32(-i),
				FirstLogprob: -1.5},
			kvxfer.AbortAck{RoomGen: rg},
		)
		if i == 50 {
			toDecode = append(toDecode, kvxfer.KVChunk{RoomGen: rg, Seq: 99, NPages: 512, Data: big})
		}
	}
	// Both directions at once, from several goroutines' worth of sends on
	// each side interleaved in one order per side.
	done := make(chan error, 2)
	go func() {
		for _, m := range toPrefill {
			if err := p.decode.Send(p.decodePeer, m); err != nil {
				done <- err
				return
			}
		}
		done <- nil
	}()
	go func() {
		for _, m := range toDecode {
			if err := p.prefill.Send(p.prefillPeer, m); err != nil {
				done <- err
				return
			}
		}
		done <- nil
	}()
	for range 2 {
		if err := <-done; err != nil {
			t.Fatal(err)
		}
	}
	gotPrefill := p.prefillRec.waitMessages(t, p.prefillPeer, len(toPrefill))
	gotDecode := p.decodeRec.waitMessages(t, p.decodePeer, len(toDecode))
	// Room control messages may overtake KV data (KV_CHUNK, KV_DONE); each
	// class arrives in the order it was sent.
	if d := cmp.Diff(toPrefill, gotPrefill, cmpMsg); d != "" {
		t.Errorf("decode → prefill (-sent +received):\n%s", d)
	}
	for _, data := range []bool{true, false} {
		if d := cmp.Diff(class(toDecode, data), class(gotDecode, data), cmpMsg); d != "" {
			t.Errorf("prefill → decode, data=%v (-sent +received):\n%s", data, d)
		}
	}

	var wantBytes uint64
	var wantFrames uint64
	for _, m := range toDecode {
		if c, ok := m.(kvxfer.KVChunk); ok {
			wantFrames++
			wantBytes += uint64(kvxfer.KVChunkHeaderBytes + len(c.Data))
		}
	}
	got := p.decode.Stats().Received[kvxfer.TypeKVChunk]
	if got != (FrameCounts{wantFrames, wantBytes}) {
		t.Errorf("decode received KV_CHUNK %+v, want %d frames of %d bytes", got, wantFrames, wantBytes)
	}
	// The writer counts a frame once written; after Close it has returned.
	p.prefill.Close()
	if got := p.prefill.Stats().Sent[kvxfer.TypeKVChunk]; got != (FrameCounts{wantFrames, wantBytes}) {
		t.Errorf("prefill sent KV_CHUNK %+v, want %d frames of %d bytes", got, wantFrames, wantBytes)
	}
}

func TestQueuedBeforeHandshake(t *testing.T) {
	ln := rawListener(t)
	decode, rec := newBackend(t, nil)
	peer := decode.Connect(ln.Addr().String())
	raw := accept(t, ln)
	hello, ok := raw.read().(kvxfer.Hello)
	want := kvxfer.Hello{Version: kvxfer.ProtocolVersion, Fingerprint: testFP, Auth: kvxfer.AuthNone, Nonce: hello.Nonce}
	if !ok || !cmp.Equal(hello, want) || hello.Nonce == ([kvxfer.NonceBytes]byte{}) {
		t.Fatalf("first frame %#v, want %#v with a random nonce", hello, want)
	}
	if again := decode.Connect(ln.Addr().String()); again != peer {
		t.Errorf("Connect while connecting = peer %d, want %d", again, peer)
	}
	// The handshake is not complete: these must be queued.
	sent := []kvxfer.Message{
		kvxfer.RoomOpen{RoomGen: roomGen(1), RID: "a", NTokens: 3},
		kvxfer.RoomReady{RoomGen: roomGen(1), NTokens: 3},
		kvxfer.RoomOpen{RoomGen: roomGen(2), RID: "b", NTokens: 4},
	}
	for _, m := range sent {
		if err := decode.Send(peer, m); err != nil {
			t.Fatalf("Send before the handshake: %v", err)
		}
	}
	// Nothing may be written before HELLO_OK.
	if err := raw.nc.SetReadDeadline(time.Now().Add(50 * time.Millisecond)); err != nil {
		t.Fatal(err)
	}
	if _, _, err := raw.fr.ReadFrame(1 << 20); !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("read before HELLO_OK: err = %v, want a timeout (nothing sent)", err)
	}
	if err := raw.nc.SetReadDeadline(time.Now().Add(waitTimeout)); err != nil {
		t.Fatal(err)
	}
	raw.write(kvxfer.HelloOK{})
	for i, w := range sent {
		if got := raw.readRoom(); !cmp.Equal(got, w, cmpMsg) {
			t.Fatalf("frame %d after HELLO_OK: %#v, want %#v", i, got, w)
		}
	}
	rec.waitKind(t, evUp, peer)
}

func TestDialRefused(t *testing.T) {
	ln := rawListener(t)
	addr := ln.Addr().String()
	ln.Close() // nothing listens there now
	decode, rec := newBackend(t, nil)
	first := decode.Connect(addr)
	err := rec.waitKind(t, evLost, first).err
	if !errors.Is(err, syscall.ECONNREFUSED) || err.Error() != "kv connect "+addr+": connect: connection refused" {
		t.Errorf("PeerLost err = %q, want ECONNREFUSED %q", err, "kv connect "+addr+": connect: connection refused")
	}
	if err := decode.Send(first, kvxfer.KVAck{}); !errors.Is(err, ErrUnknownPeer) && !errors.Is(err, ErrConnClosed) {
		t.Errorf("Send to a lost peer: err = %v, want ErrUnknownPeer or ErrConnClosed", err)
	}
	second := decode.Connect(addr)
	if second == first {
		t.Fatalf("Connect after a loss reused PeerID %d", first)
	}
	rec.waitKind(t, evLost, second)
	if s := decode.Stats(); s.Dials != 2 || s.Lost != 2 || s.Up != 0 {
		t.Errorf("stats: dials %d lost %d up %d, want 2 2 0", s.Dials, s.Lost, s.Up)
	}
}

func TestReconnectGetsNewPeerID(t *testing.T) {
	ln := rawListener(t)
	decode, rec := newBackend(t, nil)
	first := decode.Connect(ln.Addr().String())
	raw := acceptHandshake(t, ln)
	rec.waitKind(t, evUp, first)
	if c := decode.ConnCounts(); c.Live != 1 || c.Dials != 1 || c.Reconnects != 0 {
		t.Errorf("first connection up: %+v, want 1 live, 1 dial, no reconnect", c)
	}
	raw.nc.Close()
	err := rec.waitKind(t, evLost, first).err
	if c := decode.ConnCounts(); c.Live != 0 {
		t.Errorf("connection lost: %d live, want 0", c.Live)
	}
	if !errors.Is(err, io.EOF) || !strings.Contains(err.Error(), "closed the connection") {
		t.Errorf("PeerLost err = %q, want io.EOF 'closed the connection'", err)
	}
	second := decode.Connect(ln.Addr().String())
	if second == first {
		t.Fatalf("reconnect reused PeerID %d", first)
	}
	acceptHandshake(t, ln)
	rec.waitKind(t, evUp, second)
	if err := decode.Send(second, kvxfer.KVAck{RoomGen: roomGen(1)}); err != nil {
		t.Errorf("Send on the new connection: %v", err)
	}
	if c := decode.ConnCounts(); c.Live != 1 || c.Dials != 2 || c.Reconnects != 1 {
		t.Errorf("reconnected: %+v, want 1 live, 2 dials, 1 reconnect", c)
	}
}

func TestSilentServer(t *testing.T) {
	ln := rawListener(t)
	decode, rec := newBackend(t, func(c *Config) {
		c.HeartbeatInterval, c.HeartbeatMisses = 20*time.Millisecond, 3
	})
	peer := decode.Connect(ln.Addr().String())
	acceptHandshake(t, ln) // then never reads or writes again
	up := rec.waitKind(t, evUp, peer)
	lost := rec.waitKind(t, evLost, peer)
	want := fmt.Sprintf("kv peer %s silent for 60ms (3 missed heartbeats)", ln.Addr())
	if !errors.Is(lost.err, ErrSilent) || lost.err.Error() != want {
		t.Errorf("PeerLost err = %q, want ErrSilent %q", lost.err, want)
	}
	if d := lost.at.Sub(up.at); d < 60*time.Millisecond {
		t.Errorf("declared silent %v after the handshake, before interval × misses", d)
	}
}

func TestSilentClient(t *testing.T) {
	prefill, rec := newBackend(t, func(c *Config) {
		c.HeartbeatInterval, c.HeartbeatMisses = 10*time.Millisecond, 4
	})
	dialHandshake(t, listen(t, prefill)) // then silent
	up := rec.waitAny(t, evUp)
	lost := rec.waitKind(t, evLost, up.peer)
	if !errors.Is(lost.err, ErrSilent) || !strings.HasSuffix(lost.err.Error(), "silent for 40ms (4 missed heartbeats)") {
		t.Errorf("PeerLost err = %q, want ErrSilent 'silent for 40ms (4 missed heartbeats)'", lost.err)
	}
	if d := lost.at.Sub(up.at); d < 40*time.Millisecond {
		t.Errorf("declared silent %v after the handshake, before interval × misses", d)
	}
}

// TestHeartbeat checks that a Backend sends PINGs, answers PING with PONG,
// and stays up while only heartbeats flow for many times the silence bound.
func TestHeartbeat(t *testing.T) {
	ln := rawListener(t)
	decode, rec := newBackend(t, func(c *Config) {
		c.HeartbeatInterval, c.HeartbeatMisses = 10*time.Millisecond, 10
	})
	peer := decode.Connect(ln.Addr().String())
	raw := acceptHandshake(t, ln)
	rec.waitKind(t, evUp, peer)
	pings, pongs := 0, 0
	raw.write(kvxfer.Ping{Nonce: 1000})
	for pings < 40 { // ≥ 400ms, four times the 100ms silence bound
		switch m := raw.read().(type) {
		case kvxfer.Ping:
			pings++
			raw.write(kvxfer.Ping{Nonce: 1000 + uint64(pings)}) // our liveness
		case kvxfer.Pong:
			if m.Nonce != 1000+uint64(pongs) {
				t.Fatalf("PONG nonce %d, want %d", m.Nonce, 1000+pongs)
			}
			pongs++
		default:
			t.Fatalf("unexpected %s", m.Type())
		}
	}
	for _, e := range rec.snapshot() {
		if e.kind == evLost {
			t.Fatalf("peer lost while heartbeats flowed: %v", e.err)
		}
	}
	if pongs < pings-2 {
		t.Errorf("%d PONGs for %d PINGs", pongs, pings)
	}
}

func TestBadFrameFromClient(t *testing.T) {
	big := binary.BigEndian.AppendUint32(nil, 2<<20)
	tests := []struct {
		name string
		send []byte
		want string
		is   error
	}{
		{"unknown type", []byte{0, 0, 0, 3, 99, 1, 2}, "unknown frame type: TYPE(99)", kvxfer.ErrUnknownType},
		{"oversized", append(big, byte(kvxfer.TypeKVChunk)), "frame of 2097152 bytes exceeds the maximum of 1048576",
			kvxfer.ErrFrameTooLarge},
		{"short ping", []byte{0, 0, 0, 4, byte(kvxfer.TypePing), 1, 2, 3}, "PING payload is 3 bytes, want 8",
			kvxfer.ErrMalformed},
		{"zero length", []byte{0, 0, 0, 0}, "zero frame length", kvxfer.ErrMalformed},
		{"hello again", frame(t, kvxfer.Hello{Version: kvxfer.ProtocolVersion, Fingerprint: testFP}),
			"protocol violation: HELLO after the handshake", ErrProtocol},
		{"hello ok", frame(t, kvxfer.HelloOK{}), "protocol violation: HELLO_OK after the handshake", ErrProtocol},
		{"truncated renew", []byte{0, 0, 0, 9, byte(kvxfer.TypeRoomRenew), 1, 0, 0, 0, 1, 2, 3, 4},
			"ROOM_RENEW count 1 needs 20 bytes", kvxfer.ErrMalformed},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			prefill, rec := newBackend(t, func(c *Config) { c.MaxFrameBytes = 1 << 20 })
			addr := listen(t, prefill)
			raw := dialHandshake(t, addr)
			peer := rec.waitAny(t, evUp).peer
			// A good message first, then the bad frame.
			raw.write(kvxfer.KVAck{RoomGen: roomGen(7)})
			raw.writeRaw(tt.send)
			lost := rec.waitKind(t, evLost, peer)
			if !errors.Is(lost.err, tt.is) || !strings.Contains(lost.err.Error(), tt.want) {
				t.Errorf("PeerLost err = %q, want %v containing %q", lost.err, tt.is, tt.want)
			}
			if got := rec.messages(peer); len(got) != 1 || got[0] != (kvxfer.KVAck{RoomGen: roomGen(7)}) {
				t.Errorf("messages delivered: %#v, want only the KV_ACK before the bad frame", got)
			}
			if n := prefill.Stats().Malformed; n != 1 {
				t.Errorf("Malformed = %d, want 1", n)
			}
			// The Backend still serves new connections.
			decode, drec := newBackend(t, nil)
			ok := decode.Connect(addr)
			drec.waitKind(t, evUp, ok)
		})
	}
}

func TestBadFrameFromServer(t *testing.T) {
	ln := rawListener(t)
	decode, rec := newBackend(t, nil)
	peer := decode.Connect(ln.Addr().String())
	raw := acceptHandshake(t, ln)
	raw.write(kvxfer.AbortAck{RoomGen: roomGen(3)})
	raw.writeRaw([]byte{0, 0, 0, 2, byte(kvxfer.TypeKVAck), 0})
	lost := rec.waitKind(t, evLost, peer)
	want := fmt.Sprintf("kv peer %s sent a bad frame: kvxfer: malformed frame: KV_ACK payload is 1 bytes, want 20",
		ln.Addr())
	if !errors.Is(lost.err, kvxfer.ErrMalformed) || lost.err.Error() != want {
		t.Errorf("PeerLost err = %q, want %q", lost.err, want)
	}
	if got := rec.messages(peer); len(got) != 1 {
		t.Errorf("delivered %d messages, want the 1 before the bad frame", len(got))
	}
}

func TestHandshakeTimeouts(t *testing.T) {
	t.Run("client sends no HELLO", func(t *testing.T) {
		prefill, rec := newBackend(t, func(c *Config) { c.HandshakeTimeout = 30 * time.Millisecond })
		dialRaw(t, listen(t, prefill)) // connects, sends nothing
		lost := rec.waitAny(t, evLost)
		if !errors.Is(lost.err, ErrSilent) || !strings.Contains(lost.err.Error(), "silent for 30ms (no HELLO)") {
			t.Errorf("PeerLost err = %q, want ErrSilent 'silent for 30ms (no HELLO)'", lost.err)
		}
	})
	t.Run("server never answers", func(t *testing.T) {
		ln := rawListener(t)
		decode, rec := newBackend(t, func(c *Config) { c.HandshakeTimeout = 30 * time.Millisecond })
		peer := decode.Connect(ln.Addr().String())
		raw := accept(t, ln)
		raw.read() // HELLO, never answered
		lost := rec.waitKind(t, evLost, peer)
		want := fmt.Sprintf("kv handshake with %s: peer silent for 30ms (no HELLO_OK)", ln.Addr())
		if !errors.Is(lost.err, ErrSilent) || !strings.HasPrefix(lost.err.Error(), want) {
			t.Errorf("PeerLost err = %q, want ErrSilent starting %q", lost.err, want)
		}
	})
	t.Run("server closes", func(t *testing.T) {
		ln := rawListener(t)
		decode, rec := newBackend(t, nil)
		peer := decode.Connect(ln.Addr().String())
		raw := accept(t, ln)
		raw.read()
		raw.nc.Close()
		lost := rec.waitKind(t, evLost, peer)
		if !strings.Contains(lost.err.Error(), "connection closed before HELLO_OK") {
			t.Errorf("PeerLost err = %q, want 'connection closed before HELLO_OK'", lost.err)
		}
	})
}

// TestWriteStall: a peer that keeps sending (so it is not silent) but never
// reads must not block the writer forever.
func TestWriteStall(t *testing.T) {
	ln := rawListener(t)
	decode, rec := newBackend(t, func(c *Config) {
		c.HeartbeatInterval, c.HeartbeatMisses = 5*time.Millisecond, 2000 // silence bound 10s
		c.WriteTimeout = 50 * time.Millisecond
	})
	peer := decode.Connect(ln.Addr().String())
	raw := acceptHandshake(t, ln)
	rec.waitKind(t, evUp, peer)
	stop := make(chan struct{})
	pinger := make(chan struct{})
	go func() { // liveness for decode; never reads
		defer close(pinger)
		tick := time.NewTicker(5 * time.Millisecond)
		defer tick.Stop()
		for n := uint64(0); ; n++ {
			select {
			case <-stop:
				return
			case <-tick.C:
				if kvxfer.WriteFrame(raw.nc, kvxfer.Ping{Nonce: n}) != nil {
					return
				}
			}
		}
	}()
	defer func() { close(stop); <-pinger }()
	data := make([]byte, 1<<20)
	for i := range 256 { // far more than any socket buffers hold
		if err := decode.Send(peer, kvxfer.KVChunk{RoomGen: roomGen(i), NPages: 1, Data: data}); err != nil {
			break // the connection may already have failed
		}
	}
	lost := rec.waitKind(t, evLost, peer)
	if !errors.Is(lost.err, ErrSilent) || !errors.Is(lost.err, os.ErrDeadlineExceeded) ||
		!strings.Contains(lost.err.Error(), "accepted no data for 50ms") {
		t.Errorf("PeerLost err = %q, want ErrSilent 'accepted no data for 50ms'", lost.err)
	}
}

func TestSendErrors(t *testing.T) {
	p := newPair(t, func(c *Config) { c.MaxFrameBytes = 1 << 16 })
	tests := []struct {
		name string
		peer kvxfer.PeerID
		m    kvxfer.Message
		want error
	}{
		{"unknown peer", 999, kvxfer.KVAck{}, ErrUnknownPeer},
		{"ping", p.decodePeer, kvxfer.Ping{}, ErrProtocol},
		{"hello", p.decodePeer, kvxfer.Hello{}, ErrProtocol},
		{"too large", p.decodePeer, kvxfer.KVChunk{Data: make([]byte, 1<<16)}, kvxfer.ErrFrameTooLarge},
		{"rid too long", p.decodePeer, kvxfer.RoomOpen{RID: strings.Repeat("r", 5000)}, kvxfer.ErrFieldTooLong},
		{"pointer", p.decodePeer, &kvxfer.KVAck{}, kvxfer.ErrUnknownType},
		{"nil", p.decodePeer, nil, kvxfer.ErrUnknownType},
	}
	for _, tt := range tests {
		if err := p.decode.Send(tt.peer, tt.m); !errors.Is(err, tt.want) {
			t.Errorf("%s: Send err = %v, want %v", tt.name, err, tt.want)
		}
	}
	// The largest frame that fits is sent.
	fits := kvxfer.KVChunk{Data: make([]byte, 1<<16-(kvxfer.KVChunkHeaderBytes-kvxfer.LengthBytes))}
	if err := p.decode.Send(p.decodePeer, fits); err != nil {
		t.Fatalf("Send of a frame of exactly MaxFrameBytes: %v", err)
	}
	p.prefillRec.waitMessages(t, p.prefillPeer, 1)
}

func TestClose(t *testing.T) {
	p := newPair(t, nil)
	ln := rawListener(t)
	connecting := p.decode.Connect(ln.Addr().String()) // handshake never answered
	accept(t, ln)
	if err := p.decode.Send(connecting, kvxfer.KVAck{}); err != nil {
		t.Fatal(err)
	}
	if err := p.decode.Close(); err != nil {
		t.Fatal(err)
	}
	// Close waited for every goroutine, so every PeerLost has been called.
	for _, peer := range []kvxfer.PeerID{p.decodePeer, connecting} {
		var lost []event
		for _, e := range p.decodeRec.snapshot() {
			if e.kind == evLost && e.peer == peer {
				lost = append(lost, e)
			}
		}
		if len(lost) != 1 || !errors.Is(lost[0].err, ErrClosed) {
			t.Errorf("peer %d: PeerLost calls %v, want one with ErrClosed", peer, lost)
		}
	}
	if err := p.decode.Send(p.decodePeer, kvxfer.KVAck{}); !errors.Is(err, ErrUnknownPeer) {
		t.Errorf("Send after Close: err = %v, want ErrUnknownPeer", err)
	}
	if _, err := p.decode.Listen("127.0.0.1:0"); !errors.Is(err, ErrClosed) {
		t.Errorf("Listen after Close: err = %v, want ErrClosed", err)
	}
	late := p.decode.Connect(p.addr)
	if late == p.decodePeer || late == connecting {
		t.Errorf("Connect after Close reused PeerID %d", late)
	}
	if err := p.decodeRec.waitKind(t, evLost, late).err; !errors.Is(err, ErrClosed) {
		t.Errorf("PeerLost of a Connect after Close: %v, want ErrClosed", err)
	}
	// The prefill side sees decode go away.
	if err := p.prefillRec.waitKind(t, evLost, p.prefillPeer).err; !errors.Is(err, io.EOF) {
		t.Errorf("prefill PeerLost: %v, want io.EOF", err)
	}
	if err := p.decode.Close(); err != nil {
		t.Errorf("second Close: %v", err)
	}
}

// blockingDial is a Config.DialContext that reports each dial on dialing
// and blocks until its context ends.
func blockingDial(dialing chan<- string) func(context.Context, string, string) (net.Conn, error) {
	return func(ctx context.Context, _, addr string) (net.Conn, error) {
		dialing <- addr
		<-ctx.Done()
		return nil, ctx.Err()
	}
}

func TestCloseWhileDialing(t *testing.T) {
	dialing := make(chan string, 1)
	decode, rec := newBackend(t, func(c *Config) { c.DialContext = blockingDial(dialing) })
	peer := decode.Connect("10.1.2.3:8998")
	if got := <-dialing; got != "10.1.2.3:8998" {
		t.Fatalf("dialed %q", got)
	}
	if err := decode.Send(peer, kvxfer.KVAck{}); err != nil {
		t.Fatalf("Send while dialing: %v", err)
	}
	decode.Close() // must cancel the dial, or it would wait for DialTimeout (5s)
	if err := rec.waitKind(t, evLost, peer).err; err != ErrClosed {
		t.Errorf("PeerLost err = %v, want ErrClosed", err)
	}
}

func TestDialTimeout(t *testing.T) {
	dialing := make(chan string, 1)
	decode, rec := newBackend(t, func(c *Config) {
		c.DialContext, c.DialTimeout = blockingDial(dialing), 20*time.Millisecond
	})
	peer := decode.Connect("10.1.2.3:8998")
	<-dialing
	err := rec.waitKind(t, evLost, peer).err
	want := "kv connect 10.1.2.3:8998: no connection within 20ms: context deadline exceeded"
	if !errors.Is(err, context.DeadlineExceeded) || err.Error() != want {
		t.Errorf("PeerLost err = %q, want %q", err, want)
	}
}

func TestNilHandlerAndLogger(t *testing.T) {
	prefill := New(Config{Fingerprint: testFP})
	defer prefill.Close()
	addr, err := prefill.Listen("127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	decode, rec := newBackend(t, nil)
	peer := decode.Connect(addr)
	rec.waitKind(t, evUp, peer)
	if err := decode.Send(peer, kvxfer.KVAck{}); err != nil {
		t.Fatal(err)
	}
}

func TestListenError(t *testing.T) {
	b, _ := newBackend(t, nil)
	if _, err := b.Listen("127.0.0.1:notaport"); err == nil || !strings.HasPrefix(err.Error(), "kv listen 127.0.0.1:notaport:") {
		t.Errorf("Listen on a bad address: err = %v", err)
	}
}

func TestAllocDataUsed(t *testing.T) {
	buf := make([]byte, 4096)
	allocs := make(chan int, 1)
	p := newPair(t, func(c *Config) {
		c.AllocData = func(n int) []byte {
			allocs <- n
			return buf[:n]
		}
	})
	if err := p.prefill.Send(p.prefillPeer, kvxfer.KVChunk{NPages: 1, Data: []byte("kv bytes")}); err != nil {
		t.Fatal(err)
	}
	got := p.decodeRec.waitMessages(t, p.decodePeer, 1)[0].(kvxfer.KVChunk).Data
	if string(got) != "kv bytes" || &got[0] != &buf[0] {
		t.Errorf("Data %q at %p, want \"kv bytes\" in the AllocData buffer at %p", got, &got[0], &buf[0])
	}
	if n := <-allocs; n != len("kv bytes") {
		t.Errorf("AllocData(%d), want %d", n, len("kv bytes"))
	}
}

// TestSentDataReturnsWrittenBuffers: a KVChunk's Data comes back through
// SentData once written, the same buffer; frames without data do not.
func TestSentDataReturnsWrittenBuffers(t *testing.T) {
	sent := make(chan []byte, 4)
	p := newPair(t, func(c *Config) { c.SentData = func(b []byte) { sent <- b } })
	data := []byte("kv bytes")
	if err := p.prefill.Send(p.prefillPeer, kvxfer.KVChunk{NPages: 1, Data: data}); err != nil {
		t.Fatal(err)
	}
	if err := p.prefill.Send(p.prefillPeer, kvxfer.KVAck{}); err != nil {
		t.Fatal(err)
	}
	p.decodeRec.waitMessages(t, p.decodePeer, 2)
	select {
	case b := <-sent:
		if len(b) != len(data) || &b[0] != &data[0] {
			t.Errorf("SentData got %q at %p, want the sent buffer at %p", b, &b[0], &data[0])
		}
	case <-time.After(10 * time.Second):
		t.Fatal("SentData was not called for a written KVChunk")
	}
	if len(sent) != 0 {
		t.Errorf("SentData called %d more times, want once (only the KVChunk carries data)", len(sent))
	}
}

func TestClosePeer(t *testing.T) {
	p := newPair(t, nil)
	cause := errors.New("injected reset")
	p.decode.ClosePeer(p.decodePeer, cause)
	p.decode.ClosePeer(p.decodePeer, errors.New("second close")) // no-op: already closed
	if err := p.decodeRec.waitKind(t, evLost, p.decodePeer).err; err != cause {
		t.Errorf("decode PeerLost err = %v, want exactly the ClosePeer error %v", err, cause)
	}
	if err := p.prefillRec.waitKind(t, evLost, p.prefillPeer).err; !errors.Is(err, io.EOF) {
		t.Errorf("prefill PeerLost err = %v, want io.EOF", err)
	}
	if err := p.decode.Send(p.decodePeer, kvxfer.KVAck{}); !errors.Is(err, ErrUnknownPeer) && !errors.Is(err, ErrConnClosed) {
		t.Errorf("Send after ClosePeer: err = %v, want ErrUnknownPeer or ErrConnClosed", err)
	}
	p.decode.ClosePeer(p.decodePeer, cause) // forgotten by now: no-op
	p.decode.ClosePeer(12345, cause)        // never known: no-op

	// The address can be connected again, with a new PeerID.
	again := p.decode.Connect(p.addr)
	if again == p.decodePeer {
		t.Fatalf("Connect after ClosePeer reused PeerID %d", again)
	}
	p.decodeRec.waitKind(t, evUp, again)
	if err := p.decode.Send(again, kvxfer.KVAck{RoomGen: roomGen(7)}); err != nil {
		t.Fatalf("Send on the new connection: %v", err)
	}
	p.decode.Close() // PeerLost of every connection has returned
	if s := p.decode.Stats(); s.Lost != 2 || s.Up != 2 {
		t.Errorf("decode stats: lost %d up %d, want 2 2", s.Lost, s.Up)
	}
	// checkContract (at cleanup) verifies exactly one PeerLost per peer.
}

func TestClosePeerNilError(t *testing.T) {
	p := newPair(t, nil)
	p.prefill.ClosePeer(p.prefillPeer, nil)
	err := p.prefillRec.waitKind(t, evLost, p.prefillPeer).err
	if !errors.Is(err, ErrConnClosed) || !strings.Contains(err.Error(), "by ClosePeer") {
		t.Errorf("prefill PeerLost err = %q, want ErrConnClosed 'by ClosePeer'", err)
	}
	if err := p.decodeRec.waitKind(t, evLost, p.decodePeer).err; !errors.Is(err, io.EOF) {
		t.Errorf("decode PeerLost err = %v, want io.EOF", err)
	}
}

func TestClosePeerWhileDialing(t *testing.T) {
	dialing := make(chan string, 1)
	decode, rec := newBackend(t, func(c *Config) { c.DialContext = blockingDial(dialing) })
	peer := decode.Connect("10.1.2.3:8998")
	<-dialing
	cause := errors.New("give up")
	decode.ClosePeer(peer, cause) // cancels the dial
	if err := rec.waitKind(t, evLost, peer).err; err != cause {
		t.Errorf("PeerLost err = %v, want %v", err, cause)
	}
	for _, e := range rec.snapshot() {
		if e.kind == evUp {
			t.Errorf("PeerUp of peer %d after ClosePeer while dialing", e.peer)
		}
	}
}

// class keeps the KV data messages (data) or the others, in order.
func class(ms []kvxfer.Message, data bool) []kvxfer.Message {
	var out []kvxfer.Message
	for _, m := range ms {
		if isData := m.Type() == kvxfer.TypeKVChunk || m.Type() == kvxfer.TypeKVDone; isData == data {
			out = append(out, m)
		}
	}
	return out
}

// TestControlOvertakesData: a room control message sent after a large KV
// backlog is delivered before the backlog drains, so renewals and aborts
// are not delayed by other rooms' transfers.
func TestControlOvertakesData(t *testing.T) {
	p := newPair(t, nil)
	chunk := make([]byte, 4<<20)
	const chunks = 32 // 128 MiB queued at once
	for i := range chunks {
		if err := p.prefill.Send(p.prefillPeer, kvxfer.KVChunk{RoomGen: roomGen(1), Seq: uint32(i), NPages: 1, Data: chunk}); err != nil {
			t.Fatal(err)
		}
	}
	if err := p.prefill.Send(p.prefillPeer, kvxfer.RoomRenew{Rooms: []kvxfer.RoomGen{roomGen(2)}}); err != nil {
		t.Fatal(err)
	}
	got := p.decodeRec.waitMessages(t, p.decodePeer, chunks+1)
	renewAt := -1
	for i, m := range got {
		if m.Type() == kvxfer.TypeRoomRenew {
			renewAt = i
		}
	}
	if renewAt < 0 || renewAt >= chunks/2 {
		t.Fatalf("the renewal arrived after %d of %d chunks", renewAt, chunks)
	}
}
