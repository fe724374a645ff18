package fault

import (
	"bytes"
	"errors"
	"math"
	"slices"
	"testing"
	"testing/synctest"
	"time"

	"github.com/google/go-cmp/cmp"
	"go.uber.org/goleak"

	"github.com/pdserve/pdserve/internal/kvxfer"
	"github.com/pdserve/pdserve/internal/outcome"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func TestPassThrough(t *testing.T) {
	inner := newFakeInner()
	b := Wrap(inner, Config{Seed: 1})
	if got, _ := b.Listen("127.0.0.1:0"); got != "bound:127.0.0.1:0" {
		t.Errorf("Listen = %q", got)
	}
	if got := b.Connect("abc"); got != 3 {
		t.Errorf("Connect = %d", got)
	}
	if got := b.Remote(7); got != "remote-7" {
		t.Errorf("Remote = %q", got)
	}
	if b.Unwrap() != inner {
		t.Error("Unwrap is not the inner Backend")
	}
	for i := range 10 {
		if err := b.Send(1, ack(i)); err != nil {
			t.Fatal(err)
		}
	}
	if err := b.Send(1, kvxfer.Ping{}); err != nil { // not a room message: passed on as is
		t.Fatal(err)
	}
	ss := inner.snapshot()
	if len(ss) != 11 || !slices.Equal(acks(t, ss[:10]), seq(0, 10)) || ss[10].m != (kvxfer.Ping{}) {
		t.Errorf("inner got %v, want acks 0…9 then a PING, sent at once", ss)
	}
	inner.sendErr = errInner
	if err := b.Send(1, ack(10)); err != errInner {
		t.Errorf("Send err = %v, want the inner Backend's", err)
	}
	for k, v := range b.Injected() {
		if v != 0 {
			t.Errorf("Injected[%s] = %d with no faults", k, v)
		}
	}
	want := map[string]uint64{"malformed": 3, "injected_drop": 1}
	if diff := cmp.Diff(want, b.DroppedFrames()); diff != "" {
		t.Errorf("DroppedFrames (-want +got):\n%s", diff)
	}
	b.mu.Lock()
	running := b.running
	b.mu.Unlock()
	if running {
		t.Error("a release goroutine was started with nothing to hold")
	}
	if err := b.Close(); err != nil || inner.closed != 1 {
		t.Errorf("Close = %v, inner closed %d times, want nil and 1", err, inner.closed)
	}
}

// TestRates sends many frames with one fault at a time and checks that it
// strikes at about its probability and has its effect.
func TestRates(t *testing.T) {
	const n, p = 4000, 0.25
	tests := []struct {
		name string
		cfg  Config
		kind string
		rate float64 // expected fraction of frames
	}{
		{"drop", Config{Drop: p}, "drop", p},
		{"duplicate", Config{Duplicate: p}, "duplicate", p},
		{"corrupt", Config{Corrupt: p}, "corrupt", p},
		{"reset", Config{Reset: p}, "reset", p},
		{"delay", Config{Delay: p, MaxDelay: time.Millisecond}, "delay", p},
		// A frame that swaps with a waiting one is not picked itself, so
		// a fraction p/(1+p) of the frames swap.
		{"reorder", Config{Reorder: p, MaxDelay: time.Hour}, "reorder", p / (1 + p)},
		// A stall only starts outside a stall; each frame is a new peer.
		{"stall", Config{Stall: p, StallFor: time.Hour}, "stall", p},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				inner := newFakeInner()
				cfg := tt.cfg
				cfg.Seed = 42
				b := Wrap(inner, cfg)
				defer b.Close()
				for i := range n {
					peer := kvxfer.PeerID(1)
					if tt.kind == "stall" {
						peer = kvxfer.PeerID(i)
					}
					if err := b.Send(peer, ack(i)); err != nil {
						t.Fatal(err)
					}
				}
				got := b.Injected()[tt.kind]
				if r := float64(got) / n; math.Abs(r-tt.rate) > 0.03 {
					t.Errorf("%s struck %d of %d frames (%.3f), want about %.3f", tt.kind, got, n, r, tt.rate)
				}
				for k, v := range b.Injected() {
					if k != tt.kind && v != 0 {
						t.Errorf("Injected[%s] = %d, want 0", k, v)
					}
				}
				b.SetConfig(Config{}) // release what is held
				ss := inner.snapshot()
				switch tt.kind {
				case "drop":
					if len(ss) != n-int(got) {
						t.Errorf("%d frames delivered, want %d sent - %d dropped", len(ss), n, got)
					}
					if d := b.DroppedFrames()["injected_drop"]; d != got+1 { // +1 from the fake inner
						t.Errorf("DroppedFrames injected_drop = %d, want %d", d, got+1)
					}
				case "duplicate":
					if len(ss) != n+int(got) {
						t.Errorf("%d frames delivered, want %d + %d duplicates", len(ss), n, got)
					}
				case "reset":
					if len(ss) != n-int(got) || len(inner.closeCalls()) != int(got) {
						t.Errorf("%d frames delivered and %d resets, want %d and %d", len(ss), len(inner.closeCalls()), n-int(got), got)
					}
				default:
					if len(ss) != n {
						t.Errorf("%d frames delivered, want %d", len(ss), n)
					}
				}
			})
		})
	}
}

func TestDrop(t *testing.T) {
	inner := newFakeInner()
	b := Wrap(inner, Config{Drop: 1, Types: []kvxfer.Type{kvxfer.TypeKVAck}})
	defer b.Close()
	for i := range 5 {
		if err := b.Send(1, ack(i)); err != nil {
			t.Fatal(err)
		}
	}
	abort := kvxfer.Abort{Cause: outcome.Cause{Detail: "not faulted"}}
	if err := b.Send(1, abort); err != nil {
		t.Fatal(err)
	}
	if ss := inner.snapshot(); len(ss) != 1 || !cmp.Equal(ss[0].m, kvxfer.Message(abort)) {
		t.Errorf("delivered %v, want only the ABORT (KV_ACKs dropped, other types untouched)", ss)
	}
	if got := b.DroppedFrames()["injected_drop"]; got != 5+1 {
		t.Errorf("injected_drop = %d, want 5 (+1 from the inner Backend)", got)
	}
}

func TestDuplicate(t *testing.T) {
	inner := newFakeInner()
	b := Wrap(inner, Config{Duplicate: 1})
	defer b.Close()
	for i := range 4 {
		if err := b.Send(1, ack(i)); err != nil {
			t.Fatal(err)
		}
	}
	if got, want := acks(t, inner.snapshot()), []int{0, 0, 1, 1, 2, 2, 3, 3}; !slices.Equal(got, want) {
		t.Errorf("delivered %v, want %v", got, want)
	}
	if got := b.Injected()["duplicate"]; got != 4 {
		t.Errorf("Injected duplicate = %d, want 4", got)
	}
}

// TestDuplicateOwnsData: the two copies of a duplicated KVChunk carry
// equal bytes in different buffers, so a transport that hands written
// buffers back to the sender for reuse never sees one buffer twice.
func TestDuplicateOwnsData(t *testing.T) {
	inner := newFakeInner()
	b := Wrap(inner, Config{Duplicate: 1})
	defer b.Close()
	data := []byte("kv bytes")
	if err := b.Send(1, kvxfer.KVChunk{NPages: 1, Data: data}); err != nil {
		t.Fatal(err)
	}
	ss := inner.snapshot()
	if len(ss) != 2 {
		t.Fatalf("delivered %d frames, want 2", len(ss))
	}
	first, second := ss[0].m.(kvxfer.KVChunk).Data, ss[1].m.(kvxfer.KVChunk).Data
	if &first[0] != &data[0] {
		t.Errorf("first copy's Data is not the sender's buffer")
	}
	if string(second) != string(data) || &second[0] == &data[0] {
		t.Errorf("second copy's Data = %q at %p, want equal bytes in a buffer of its own (sender's at %p)", second, &second[0], &data[0])
	}
}

func TestReorder(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		inner := newFakeInner()
		b := Wrap(inner, Config{Reorder: 1, MaxDelay: 30 * time.Millisecond})
		defer b.Close()
		start := time.Now()
		for i := range 7 {
			if err := b.Send(1, ack(i)); err != nil {
				t.Fatal(err)
			}
		}
		ss := inner.waitSends(t, 7)
		if got, want := acks(t, ss), []int{1, 0, 3, 2, 5, 4, 6}; !slices.Equal(got, want) {
			t.Errorf("delivered %v, want %v (each pair swapped)", got, want)
		}
		for i, s := range ss[:6] {
			if s.at != start {
				t.Errorf("frame %d delivered after %v, want at once", i, s.at.Sub(start))
			}
		}
		// The last frame found no next one and went alone after MaxDelay.
		if d := ss[6].at.Sub(start); d != 30*time.Millisecond {
			t.Errorf("lone reordered frame delivered after %v, want 30ms", d)
		}
		if got := b.Injected()["reorder"]; got != 3 {
			t.Errorf("Injected reorder = %d, want 3 swaps", got)
		}
	})
}

func TestReorderDefaultHold(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		inner := newFakeInner()
		b := Wrap(inner, Config{Reorder: 1})
		defer b.Close()
		start := time.Now()
		if err := b.Send(1, ack(0)); err != nil {
			t.Fatal(err)
		}
		if d := inner.waitSends(t, 1)[0].at.Sub(start); d != DefaultReorderHold {
			t.Errorf("lone reordered frame delivered after %v, want DefaultReorderHold", d)
		}
	})
}

func TestDelay(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const maxDelay = 100 * time.Millisecond
		inner := newFakeInner()
		b := Wrap(inner, Config{Seed: 3, Delay: 0.3, MaxDelay: maxDelay})
		defer b.Close()
		start := time.Now()
		sentAt := make([]time.Duration, 40)
		for i := range 40 {
			sentAt[i] = time.Since(start)
			if err := b.Send(1, ack(i)); err != nil {
				t.Fatal(err)
			}
			time.Sleep(5 * time.Millisecond) // advances the bubble's clock: a steady sender
		}
		ss := inner.waitSends(t, 40)
		if got := acks(t, ss); !slices.Equal(got, seq(0, 40)) {
			t.Fatalf("delivered %v, want 0…39 in order", got)
		}
		delayed, late := 0, 0
		for i, s := range ss {
			lag := s.at.Sub(start) - sentAt[i]
			switch {
			case lag < 0:
				t.Errorf("frame %d delivered before it was sent", i)
			case lag >= maxDelay:
				t.Errorf("frame %d held %v, more than MaxDelay", i, lag)
			case lag > 0:
				late++
			}
			if i > 0 && s.at.Before(ss[i-1].at) {
				t.Errorf("frame %d delivered before frame %d", i, i-1)
			}
		}
		delayed = int(b.Injected()["delay"])
		if delayed < 5 || late <= delayed {
			// Frames behind a delayed one wait too, so more frames are
			// late than were picked.
			t.Errorf("%d frames picked for delay, %d delivered late; want several, and more late than picked", delayed, late)
		}
	})
}

func TestStall(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const stallFor = 300 * time.Millisecond
		inner := newFakeInner()
		b := Wrap(inner, Config{Stall: 1, StallFor: stallFor, Types: []kvxfer.Type{kvxfer.TypeKVChunk}})
		defer b.Close()
		start := time.Now()
		chunk := kvxfer.KVChunk{Seq: 99, NPages: 1, Data: []byte("kv")}
		if err := b.Send(1, chunk); err != nil { // starts the stall of peer 1
			t.Fatal(err)
		}
		for i := range 5 {
			time.Sleep(10 * time.Millisecond)         // advances the bubble's clock
			if err := b.Send(1, ack(i)); err != nil { // not faulted, but held behind the stall
				t.Fatal(err)
			}
			if err := b.Send(2, ack(100+i)); err != nil { // another peer flows
				t.Fatal(err)
			}
		}
		ss := inner.waitSends(t, 11)
		var one, two []sent
		for _, s := range ss {
			if s.peer == 1 {
				one = append(one, s)
			} else {
				two = append(two, s)
			}
		}
		if got := acks(t, two); !slices.Equal(got, seq(100, 105)) {
			t.Errorf("peer 2 got %v, want 100…104", got)
		}
		for i, s := range two {
			if d := s.at.Sub(start); d != time.Duration(i+1)*10*time.Millisecond {
				t.Errorf("peer 2 frame %d delivered at %v, want when sent", i, d)
			}
		}
		if len(one) != 6 || !cmp.Equal(one[0].m, kvxfer.Message(chunk), cmp.Comparer(bytes.Equal)) {
			t.Fatalf("peer 1 got %v, want the chunk then 5 acks", one)
		}
		if got := acks(t, one[1:]); !slices.Equal(got, seq(0, 5)) {
			t.Errorf("peer 1 acks %v, want 0…4", got)
		}
		for i, s := range one {
			if d := s.at.Sub(start); d != stallFor {
				t.Errorf("peer 1 frame %d delivered at %v, want all at the end of the stall (%v)", i, d, stallFor)
			}
		}
		if got := b.Injected()["stall"]; got != 1 {
			t.Errorf("Injected stall = %d, want 1", got)
		}
		// After the stall the next faulted frame starts another.
		if err := b.Send(1, chunk); err != nil {
			t.Fatal(err)
		}
		now := time.Now()
		if d := inner.waitSends(t, 12)[11].at.Sub(now); d != stallFor {
			t.Errorf("second stall lasted %v, want %v", d, stallFor)
		}
	})
}

func TestCorrupt(t *testing.T) {
	rg := kvxfer.RoomGen{Room: kvxfer.Room{1, 2, 3}, Gen: 5}
	tests := []struct {
		m kvxfer.Message
		// restore copies the field corruption may change from the original
		// into the corrupted message, which must then equal the original.
		restore func(orig, got kvxfer.Message) kvxfer.Message
	}{
		{kvxfer.KVChunk{RoomGen: rg, Seq: 1, NPages: 0}, func(o, g kvxfer.Message) kvxfer.Message {
			x := g.(kvxfer.KVChunk)
			x.NPages = o.(kvxfer.KVChunk).NPages
			return x
		}},
		{kvxfer.KVDone{RoomGen: rg, NChunks: 2, NPages: 3, Checksum: 0xdeadbeef}, func(o, g kvxfer.Message) kvxfer.Message {
			x := g.(kvxfer.KVDone)
			x.Checksum = o.(kvxfer.KVDone).Checksum
			return x
		}},
		{kvxfer.RoomOpen{RoomGen: rg, RID: "r", NTokens: 9, PromptHash: 77}, func(o, g kvxfer.Message) kvxfer.Message {
			x := g.(kvxfer.RoomOpen)
			x.PromptHash = o.(kvxfer.RoomOpen).PromptHash
			return x
		}},
		{kvxfer.RoomReady{RoomGen: rg, NTokens: 9}, func(o, g kvxfer.Message) kvxfer.Message {
			x := g.(kvxfer.RoomReady)
			x.NTokens = o.(kvxfer.RoomReady).NTokens
			return x
		}},
		{kvxfer.KVAck{RoomGen: rg}, func(o, g kvxfer.Message) kvxfer.Message {
			x := g.(kvxfer.KVAck)
			x.Gen = o.(kvxfer.KVAck).Gen
			return x
		}},
		{kvxfer.Abort{RoomGen: rg, Cause: outcome.Cause{Detail: "why"}}, func(o, g kvxfer.Message) kvxfer.Message {
			x := g.(kvxfer.Abort)
			x.Gen = o.(kvxfer.Abort).Gen
			return x
		}},
		{kvxfer.AbortAck{RoomGen: rg}, func(o, g kvxfer.Message) kvxfer.Message {
			x := g.(kvxfer.AbortAck)
			x.Gen = o.(kvxfer.AbortAck).Gen
			return x
		}},
	}
	for _, tt := range tests {
		t.Run(tt.m.Type().String(), func(t *testing.T) {
			inner := newFakeInner()
			b := Wrap(inner, Config{Seed: 9, Corrupt: 1})
			defer b.Close()
			for range 20 {
				if err := b.Send(1, tt.m); err != nil {
					t.Fatal(err)
				}
			}
			for _, s := range inner.snapshot() {
				if cmp.Equal(s.m, tt.m) {
					t.Errorf("delivered %+v unchanged", s.m)
				}
				if diff := cmp.Diff(tt.m, tt.restore(tt.m, s.m)); diff != "" {
					t.Errorf("a field other than the corrupted one changed (-orig +got):\n%s", diff)
				}
			}
			if got := b.Injected()["corrupt"]; got != 20 {
				t.Errorf("Injected corrupt = %d, want 20", got)
			}
		})
	}
}

func TestCorruptChunkData(t *testing.T) {
	inner := newFakeInner()
	b := Wrap(inner, Config{Seed: 11, Corrupt: 1})
	defer b.Close()
	data := []byte("0123456789abcdefghijklmnopqrstuvwxyz")
	orig := bytes.Clone(data)
	chunk := kvxfer.KVChunk{RoomGen: kvxfer.RoomGen{Gen: 2}, Seq: 4, FirstPage: 1, NPages: 1, Data: data}
	positions := map[int]bool{}
	for range 50 {
		if err := b.Send(1, chunk); err != nil {
			t.Fatal(err)
		}
	}
	for _, s := range inner.snapshot() {
		got := s.m.(kvxfer.KVChunk)
		if &got.Data[0] == &data[0] {
			t.Fatal("corrupted the caller's buffer in place")
		}
		var diffs []int
		for i := range got.Data {
			if got.Data[i] != orig[i] {
				diffs = append(diffs, i)
			}
		}
		if len(diffs) != 1 || len(got.Data) != len(orig) {
			t.Fatalf("Data differs at %v, want exactly one byte", diffs)
		}
		positions[diffs[0]] = true
		got.Data = orig
		if !cmp.Equal(kvxfer.Message(got), kvxfer.Message(chunk), cmp.Comparer(bytes.Equal)) {
			t.Errorf("a field other than Data changed: %+v", got)
		}
	}
	if !bytes.Equal(data, orig) {
		t.Errorf("the caller's buffer changed: %q", data)
	}
	if len(positions) < 10 {
		t.Errorf("corruption hit only %d distinct bytes of 36 in 50 frames", len(positions))
	}
}

func TestCorruptRoomRenew(t *testing.T) {
	inner := newFakeInner()
	b := Wrap(inner, Config{Corrupt: 1})
	defer b.Close()
	rooms := []kvxfer.RoomGen{{Gen: 1}, {Gen: 2}, {Gen: 3}}
	orig := slices.Clone(rooms)
	if err := b.Send(1, kvxfer.RoomRenew{Rooms: rooms}); err != nil {
		t.Fatal(err)
	}
	if err := b.Send(1, kvxfer.RoomRenew{}); err != nil { // nothing to corrupt
		t.Fatal(err)
	}
	ss := inner.snapshot()
	got := ss[0].m.(kvxfer.RoomRenew).Rooms
	changed := 0
	for i := range got {
		if got[i].Room != orig[i].Room {
			t.Errorf("room %d changed", i)
		}
		if got[i].Gen != orig[i].Gen {
			changed++
		}
	}
	if changed != 1 || !slices.Equal(rooms, orig) {
		t.Errorf("%d gens changed (want 1); caller's slice now %v (want unchanged %v)", changed, rooms, orig)
	}
	if len(ss[1].m.(kvxfer.RoomRenew).Rooms) != 0 || b.Injected()["corrupt"] != 1 {
		t.Errorf("empty ROOM_RENEW: delivered %+v, corrupt count %d; want it untouched and not counted",
			ss[1].m, b.Injected()["corrupt"])
	}
}

func TestReset(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		inner := newFakeInner()
		b := Wrap(inner, Config{Delay: 1, MaxDelay: time.Hour, Types: []kvxfer.Type{kvxfer.TypeKVAck}})
		defer b.Close()
		if err := b.Send(1, ack(0)); err != nil { // held for up to an hour
			t.Fatal(err)
		}
		b.SetConfig(Config{Reset: 1, Types: []kvxfer.Type{kvxfer.TypeAbort}}) // releases ack 0
		if err := b.Send(1, kvxfer.Abort{Cause: outcome.Cause{Detail: "x"}}); err != nil {
			t.Fatal(err)
		}
		calls := inner.closeCalls()
		if len(calls) != 1 || calls[0].peer != 1 || !errors.Is(calls[0].err, ErrReset) {
			t.Fatalf("ClosePeer calls %v, want one for peer 1 wrapping ErrReset", calls)
		}
		if got := acks(t, inner.snapshot()); !slices.Equal(got, []int{0}) {
			t.Errorf("delivered %v, want only ack 0 (the resetting frame is lost)", got)
		}
		if got := b.Injected()["reset"]; got != 1 {
			t.Errorf("Injected reset = %d, want 1", got)
		}
	})
}

func TestResetDiscardsHeld(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		inner := newFakeInner()
		b := Wrap(inner, Config{Stall: 1, StallFor: time.Hour})
		defer b.Close()
		for i := range 3 {
			if err := b.Send(1, ack(i)); err != nil { // held by the stall
				t.Fatal(err)
			}
		}
		b.mu.Lock()
		b.cfg.Reset = 1 // what SetConfig would do, without releasing the stall
		b.mu.Unlock()
		if err := b.Send(1, ack(3)); err != nil {
			t.Fatal(err)
		}
		b.SetConfig(Config{}) // would release anything still held
		if ss := inner.snapshot(); len(ss) != 0 {
			t.Errorf("delivered %v after a reset, want the held frames discarded", acks(t, ss))
		}
		if calls := inner.closeCalls(); len(calls) != 1 {
			t.Errorf("ClosePeer calls %v, want 1", calls)
		}
	})
}

// TestResetWithoutPeerCloser: an inner Backend that cannot close one peer
// gets no resets.
func TestResetWithoutPeerCloser(t *testing.T) {
	inner := newFakeInner()
	b := Wrap(struct{ kvxfer.Backend }{inner}, Config{Reset: 1})
	defer b.Close()
	if err := b.Send(1, ack(0)); err != nil {
		t.Fatal(err)
	}
	if len(inner.snapshot()) != 1 || b.Injected()["reset"] != 0 {
		t.Errorf("delivered %d frames, %d resets; want 1 and 0", len(inner.snapshot()), b.Injected()["reset"])
	}
	if _, ok := b.DroppedFrames()["malformed"]; ok {
		t.Error("DroppedFrames merged counts of an inner Backend that is not a DropCounter")
	}
}

func TestClosePeerDiscardsHeld(t *testing.T) {
	inner := newFakeInner()
	b := Wrap(inner, Config{Delay: 1, MaxDelay: time.Hour})
	defer b.Close()
	for i := range 3 {
		if err := b.Send(1, ack(i)); err != nil {
			t.Fatal(err)
		}
	}
	cause := errors.New("operator")
	b.ClosePeer(1, cause)
	b.SetConfig(Config{})
	if ss := inner.snapshot(); len(ss) != 0 {
		t.Errorf("delivered %v after ClosePeer, want nothing", acks(t, ss))
	}
	if calls := inner.closeCalls(); len(calls) != 1 || calls[0].err != cause {
		t.Errorf("ClosePeer calls %v, want one passed through", calls)
	}
}

// TestSetConfigReleases: switching faults off hands every held frame to
// the inner Backend before SetConfig returns, in order per peer.
func TestSetConfigReleases(t *testing.T) {
	inner := newFakeInner()
	b := Wrap(inner, Config{Seed: 5, Delay: 0.5, MaxDelay: time.Hour, Stall: 0.05, StallFor: time.Hour,
		Reorder: 0.2, Duplicate: 0.1})
	defer b.Close()
	const n = 200
	for i := range n {
		if err := b.Send(kvxfer.PeerID(1+i%3), ack(i)); err != nil {
			t.Fatal(err)
		}
	}
	b.SetConfig(Config{})
	inj := b.Injected()
	if inj["delay"] == 0 || inj["stall"] == 0 || inj["reorder"] == 0 {
		t.Fatalf("Injected %v: want delays, stalls and reorders held", inj)
	}
	byPeer := map[kvxfer.PeerID][]int{}
	for _, s := range inner.snapshot() {
		byPeer[s.peer] = append(byPeer[s.peer], int(s.m.(kvxfer.KVAck).Gen))
	}
	total := 0
	for p, got := range byPeer {
		total += len(got)
		// In order but for adjacent swaps and duplicates.
		for i := 1; i < len(got); i++ {
			if got[i] < got[i-1]-3 {
				t.Errorf("peer %d: frame %d after %d", p, got[i], got[i-1])
			}
		}
	}
	if want := n + int(inj["duplicate"]); total != want {
		t.Errorf("%d frames delivered, want %d", total, want)
	}
	b.mu.Lock()
	held := len(b.links)
	b.mu.Unlock()
	if held != 0 {
		t.Errorf("%d links still held after SetConfig(Config{})", held)
	}
	// From now on frames go at once.
	if err := b.Send(1, ack(n)); err != nil {
		t.Fatal(err)
	}
	if ss := inner.snapshot(); acks(t, ss[len(ss)-1:])[0] != n {
		t.Errorf("frame sent after SetConfig(Config{}) not delivered at once")
	}
}

// TestCloseWithHeldFrames: Close returns at once, drops what is held,
// stops the release goroutine (goleak checks) and closes the inner Backend.
func TestCloseWithHeldFrames(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		inner := newFakeInner()
		b := Wrap(inner, Config{Delay: 1, MaxDelay: time.Hour, Stall: 1, StallFor: time.Hour})
		for i := range 10 {
			if err := b.Send(kvxfer.PeerID(i%2), ack(i)); err != nil {
				t.Fatal(err)
			}
		}
		start := time.Now()
		if err := b.Close(); err != nil {
			t.Fatal(err)
		}
		if d := time.Since(start); d != 0 {
			t.Errorf("Close took %v of the bubble's time, want at once", d)
		}
		if len(inner.snapshot()) != 0 || inner.closed != 1 {
			t.Errorf("after Close: %d frames delivered, inner closed %d times; want 0 and 1", len(inner.snapshot()), inner.closed)
		}
		// After Close, Send passes straight through (the inner Backend
		// refuses it in real life).
		inner.sendErr = errInner
		if err := b.Send(1, ack(99)); err != errInner {
			t.Errorf("Send after Close = %v, want the inner Backend's error", err)
		}
		b.SetConfig(Config{}) // harmless
		if err := b.Close(); err != nil {
			t.Errorf("second Close: %v", err)
		}
		// synctest.Test fails if a goroutine of the bubble is still running.
	})
}

// TestDeterministic: the same seed and calls give the same decisions and
// deliveries; another seed does not.
func TestDeterministic(t *testing.T) {
	// MaxDelay and StallFor are not multiples of the sender's 1ms steps:
	// a frame arriving at the very instant a reordered frame gives up
	// waiting is a real race, which the bubble's clock would make common.
	cfg := Config{Delay: 0.2, MaxDelay: 20*time.Millisecond + 317*time.Microsecond, Drop: 0.1, Duplicate: 0.1,
		Reorder: 0.1, Corrupt: 0.1, Reset: 0.02, Stall: 0.01, StallFor: 50*time.Millisecond + 123*time.Microsecond,
		Replay: 0.3}
	run := func(seed uint64) (map[string]uint64, []sent) {
		var inj map[string]uint64
		var ss []sent
		synctest.Test(t, func(t *testing.T) {
			inner := newFakeInner()
			c := cfg
			c.Seed = seed
			b := Wrap(inner, c)
			defer b.Close()
			start := time.Now()
			for i := range 1000 {
				m, peer := kvxfer.Message(ack(i)), kvxfer.PeerID(i%3)
				// Every 8 frames a room's one-chunk KV stream, to one peer.
				rg := kvxfer.RoomGen{Room: kvxfer.Room{byte(i / 8), byte(i / 8 >> 8)}, Gen: 1}
				switch i % 8 {
				case 0:
					m, peer = kvxfer.KVChunk{RoomGen: rg, NPages: 1, Data: []byte{1, 2, 3, byte(i)}}, kvxfer.PeerID(i/8%3)
				case 4:
					m, peer = kvxfer.KVDone{RoomGen: rg, NChunks: 1, NPages: 1, Checksum: uint32(i)}, kvxfer.PeerID(i/8%3)
				}
				if err := b.Send(peer, m); err != nil {
					t.Fatal(err)
				}
				if i%10 == 0 {
					time.Sleep(time.Millisecond) // advances the bubble's clock
				}
			}
			b.SetConfig(Config{Seed: seed})
			inj = b.Injected()
			// Per peer, in order: frames released at one instant to
			// several peers go in map order.
			all := inner.snapshot()
			for i := range all {
				all[i].at = time.Time{}.Add(all[i].at.Sub(start))
			}
			for p := range kvxfer.PeerID(3) {
				for _, s := range all {
					if s.peer == p {
						ss = append(ss, s)
					}
				}
			}
			ss = append(ss, sent{m: kvxfer.Abort{Cause: outcome.Cause{Detail: "closes"}}})
			for _, c := range inner.closeCalls() {
				ss = append(ss, sent{peer: c.peer})
			}
		})
		return inj, ss
	}
	inj1, ss1 := run(77)
	inj2, ss2 := run(77)
	opts := cmp.Options{cmp.AllowUnexported(sent{}), cmp.Comparer(bytes.Equal),
		cmp.Comparer(func(a, b kvxfer.RoomGen) bool { return a == b })}
	if diff := cmp.Diff(inj1, inj2); diff != "" {
		t.Errorf("same seed, different Injected (-first +second):\n%s", diff)
	}
	if diff := cmp.Diff(ss1, ss2, opts); diff != "" {
		t.Errorf("same seed, different deliveries (-first +second):\n%s", diff)
	}
	for k, v := range inj1 {
		if v == 0 {
			t.Errorf("Injected[%s] = 0; the test should exercise every kind", k)
		}
	}
	inj3, ss3 := run(78)
	if cmp.Equal(inj1, inj3) && cmp.Equal(ss1, ss3, opts) {
		t.Error("seeds 77 and 78 made the same decisions")
	}
}

// TestSetConfigSeed: SetConfig continues the random stream for the same
// seed and restarts it for a new one.
func TestSetConfigSeed(t *testing.T) {
	draws := func(b *Backend, n int) []decision {
		b.mu.Lock()
		defer b.mu.Unlock()
		var out []decision
		for range n {
			out = append(out, b.decideLocked())
		}
		return out
	}
	cfg := Config{Seed: 1, Drop: 0.5}
	a, b := Wrap(newFakeInner(), cfg), Wrap(newFakeInner(), cfg)
	defer a.Close()
	defer b.Close()
	first := draws(a, 5)
	a.SetConfig(cfg)
	cont := draws(a, 5)
	if want := draws(b, 10); !cmp.Equal(append(first, cont...), want, cmp.AllowUnexported(decision{})) {
		t.Error("SetConfig with the same seed restarted the random stream")
	}
	a.SetConfig(Config{Seed: 2, Drop: 0.5})
	c := Wrap(newFakeInner(), Config{Seed: 2, Drop: 0.5})
	defer c.Close()
	if !cmp.Equal(draws(a, 5), draws(c, 5), cmp.AllowUnexported(decision{})) {
		t.Error("SetConfig with a new seed did not restart the stream from it")
	}
}

func TestEmptyTypesFaultsNothing(t *testing.T) {
	inner := newFakeInner()
	b := Wrap(inner, Config{Drop: 1, Types: []kvxfer.Type{}})
	defer b.Close()
	if err := b.Send(1, ack(0)); err != nil {
		t.Fatal(err)
	}
	if len(inner.snapshot()) != 1 {
		t.Error("a frame was dropped with Types empty (not nil)")
	}
}

func TestConfigClamped(t *testing.T) {
	got := Config{Delay: -1, Drop: 2, Duplicate: math.NaN(), Reorder: 0.5}.normalized()
	if got.Delay != 0 || got.Drop != 1 || got.Duplicate != 0 || got.Reorder != 0.5 {
		t.Errorf("normalized %+v", got)
	}
}

// kvStreamOf returns a room's KV stream of n one-page chunks whose bytes
// start with tag.
func kvStreamOf(room byte, gen uint32, n int, tag byte) []kvxfer.Message {
	rg := kvxfer.RoomGen{Room: kvxfer.Room{room}, Gen: gen}
	var out []kvxfer.Message
	for i := range n {
		out = append(out, kvxfer.KVChunk{RoomGen: rg, Seq: uint32(i), FirstPage: uint32(i), NPages: 1,
			Data: []byte{tag, byte(i), 0, 0}})
	}
	return append(out, kvxfer.KVDone{RoomGen: rg, NChunks: uint32(n), NPages: uint32(n), NTokens: uint32(4 * n),
		Binding: kvxfer.Binding{tag}, Checksum: uint32(tag)})
}

// relabelled is stream with every frame's (room, gen) set to rg.
func relabelled(stream []kvxfer.Message, rg kvxfer.RoomGen) []kvxfer.Message {
	var out []kvxfer.Message
	for _, m := range stream {
		switch x := m.(type) {
		case kvxfer.KVChunk:
			x.RoomGen = rg
			m = x
		case kvxfer.KVDone:
			x.RoomGen = rg
			m = x
		}
		out = append(out, m)
	}
	return out
}

// TestReplay: with Replay, a room's KV stream goes out as the last finished
// stream sent to that peer, relabelled with the room's (room, gen), whole
// and consistent (chunks, counts, checksum, binding); the stream recorded
// is always the genuine one; a stream whose first chunk covers other pages,
// another peer's stream and other frames are left alone; ClosePeer forgets
// what was recorded for a peer.
func TestReplay(t *testing.T) {
	inner := newFakeInner()
	b := Wrap(inner, Config{Seed: 5, Replay: 1})
	defer b.Close()
	send := func(peer kvxfer.PeerID, ms []kvxfer.Message) []kvxfer.Message {
		t.Helper()
		before := len(inner.snapshot())
		for _, m := range ms {
			if err := b.Send(peer, m); err != nil {
				t.Fatal(err)
			}
		}
		var out []kvxfer.Message
		for _, s := range inner.snapshot()[before:] {
			if s.peer != peer {
				t.Fatalf("sent to peer %d, want %d", s.peer, peer)
			}
			out = append(out, s.m)
		}
		return out
	}
	opts := cmp.Options{cmp.Comparer(bytes.Equal), cmp.Comparer(func(a, b kvxfer.RoomGen) bool { return a == b })}
	same := func(what string, got, want []kvxfer.Message) {
		t.Helper()
		if d := cmp.Diff(want, got, opts); d != "" {
			t.Errorf("%s (-want +got):\n%s", what, d)
		}
	}
	a, bb := kvStreamOf(1, 1, 2, 0xa), kvStreamOf(2, 1, 2, 0xb)
	same("the first stream (nothing to replay yet)", send(1, a), a)
	bRG := kvxfer.RoomGen{Room: kvxfer.Room{2}, Gen: 1}
	got := send(1, slices.Concat([]kvxfer.Message{kvxfer.RoomReady{RoomGen: bRG, NTokens: 8}}, bb))
	same("room 2's stream", got, slices.Concat([]kvxfer.Message{kvxfer.RoomReady{RoomGen: bRG, NTokens: 8}},
		relabelled(a, bRG)))
	if bb[0].(kvxfer.KVChunk).Data[0] != 0xb {
		t.Error("the caller's Data changed")
	}
	got[1].(kvxfer.KVChunk).Data[0] = 0xff // what was handed on is not the recording

	// A retry of room 2 (gen 2) gets room 2's genuine gen-1 stream: the
	// same bytes, under another gen.
	b2 := kvxfer.RoomGen{Room: kvxfer.Room{2}, Gen: 2}
	same("room 2's retry", send(1, kvStreamOf(2, 2, 2, 0xc)), relabelled(bb, b2))
	// A stream whose first chunk covers other pages is not replaced.
	c := kvStreamOf(3, 1, 1, 0xd)
	ch := c[0].(kvxfer.KVChunk)
	ch.NPages, ch.Data = 2, []byte{0xd, 0, 0, 0, 0, 0, 0, 0}
	c[0], c[1] = ch, kvxfer.KVDone{RoomGen: ch.RoomGen, NChunks: 1, NPages: 2, Checksum: 0xd}
	same("a stream of another layout", send(1, c), c)
	// Another peer has its own recordings.
	same("another peer's first stream", send(2, kvStreamOf(4, 1, 2, 0xe)), kvStreamOf(4, 1, 2, 0xe))
	if got := b.Injected()["replay"]; got != 2 {
		t.Errorf("Injected replay = %d, want 2", got)
	}
	b.ClosePeer(1, errors.New("gone"))
	same("after ClosePeer", send(1, kvStreamOf(5, 1, 2, 0xf)), kvStreamOf(5, 1, 2, 0xf))
}

// TestReplayOff: without Replay nothing is recorded, and with Replay set
// but KV frames outside Types nothing is replaced.
func TestReplayOff(t *testing.T) {
	for _, cfg := range []Config{{Seed: 1, Drop: 0.1}, {Seed: 1, Replay: 1, Types: []kvxfer.Type{kvxfer.TypeKVAck}}} {
		inner := newFakeInner()
		b := Wrap(inner, cfg)
		for room := range byte(5) {
			for _, m := range kvStreamOf(room, 1, 2, room) {
				if err := b.Send(1, m); err != nil {
					t.Fatal(err)
				}
			}
		}
		if got := b.Injected()["replay"]; got != 0 {
			t.Errorf("%+v: %d replays", cfg, got)
		}
		b.mu.Lock()
		recorded := len(b.replays)
		b.mu.Unlock()
		if (cfg.Replay == 0) != (recorded == 0) {
			t.Errorf("%+v: streams recorded for %d peers", cfg, recorded)
		}
		for _, s := range inner.snapshot() {
			if c, ok := s.m.(kvxfer.KVChunk); ok && c.Data[0] != c.Room[0] {
				t.Errorf("%+v: room %d sent room %d's bytes", cfg, c.Room[0], c.Data[0])
			}
		}
		b.SetConfig(Config{Seed: 1})
		b.mu.Lock()
		recorded = len(b.replays)
		b.mu.Unlock()
		if recorded != 0 {
			t.Errorf("recordings kept after Replay was turned off")
		}
		b.Close()
	}
}
