package fault

import (
	"slices"

	"github.com/pdserve/pdserve/internal/kvxfer"
)

// Bounds of what Config.Replay records, per peer.
const (
	// maxOpenStreams bounds the KV streams recorded while they are sent;
	// a new one beyond it forgets the oldest.
	maxOpenStreams = 64
	// maxStreamBytes bounds the KV_CHUNK data recorded for one stream; a
	// longer stream is not recorded (so never replayed).
	maxStreamBytes = 64 << 20
	// maxReplayPeers bounds the peers with recorded streams; a new one
	// beyond it forgets the one recorded first.
	maxReplayPeers = 16
)

// kvStream is one room's KV stream as it was sent: its KV_CHUNKs in Seq
// order (with their own copies of Data) and, once sent, its KV_DONE.
type kvStream struct {
	rg     kvxfer.RoomGen
	chunks []kvxfer.KVChunk
	done   kvxfer.KVDone
	bytes  int
}

// replayPeer is what Config.Replay keeps for the frames to one peer.
type replayPeer struct {
	open  map[kvxfer.RoomGen]*kvStream // streams whose KV_DONE was not sent yet
	order []kvxfer.RoomGen             // open streams, oldest first
	// last is the last stream whose KV_DONE was sent: the one replayed.
	last *kvStream
	// active maps each room being replaced to the stream replacing it.
	active map[kvxfer.RoomGen]*kvStream
}

func (b *Backend) replayPeerLocked(peer kvxfer.PeerID) *replayPeer {
	if rp := b.replays[peer]; rp != nil {
		return rp
	}
	if len(b.replayOrder) >= maxReplayPeers {
		delete(b.replays, b.replayOrder[0])
		b.replayOrder = b.replayOrder[1:]
	}
	rp := &replayPeer{open: make(map[kvxfer.RoomGen]*kvStream), active: make(map[kvxfer.RoomGen]*kvStream)}
	b.replays[peer] = rp
	b.replayOrder = append(b.replayOrder, peer)
	return rp
}

func (b *Backend) forgetReplayLocked(peer kvxfer.PeerID) {
	if _, ok := b.replays[peer]; ok {
		delete(b.replays, peer)
		b.replayOrder = slices.DeleteFunc(b.replayOrder, func(p kvxfer.PeerID) bool { return p == peer })
	}
}

// replayLocked records the KV frame m sent to peer and returns what goes
// on the wire instead: m, or the frame of the same place in the stream
// that replaces m's room, relabelled with m's (room, gen). start is the
// random decision of this frame; it starts a replacement at a room's first
// KV_CHUNK when a finished stream of another room (or gen) with the same
// first chunk is recorded for the peer.
func (b *Backend) replayLocked(peer kvxfer.PeerID, m kvxfer.Message, start bool) kvxfer.Message {
	switch x := m.(type) {
	case kvxfer.KVChunk:
		rp := b.replayPeerLocked(peer)
		rp.recordChunk(x)
		if x.Seq == 0 {
			delete(rp.active, x.RoomGen)
			if src := rp.last; start && src != nil && src.rg != x.RoomGen &&
				src.chunks[0].FirstPage == x.FirstPage && src.chunks[0].NPages == x.NPages {
				rp.active[x.RoomGen] = src
				b.injected[kindReplay]++
			}
		}
		src := rp.active[x.RoomGen]
		if src == nil || int(x.Seq) >= len(src.chunks) {
			return m
		}
		c := src.chunks[x.Seq]
		if c.FirstPage != x.FirstPage || c.NPages != x.NPages {
			return m // the streams part ways: the room's own chunk
		}
		c.RoomGen = x.RoomGen
		// Each frame handed on owns its Data: the inner Backend may give a
		// written frame's buffer back to its sender for reuse.
		c.Data = slices.Clone(c.Data)
		return c
	case kvxfer.KVDone:
		rp := b.replays[peer]
		if rp == nil {
			return m
		}
		src := rp.active[x.RoomGen]
		delete(rp.active, x.RoomGen)
		rp.recordDone(x)
		if src == nil {
			return m
		}
		d := src.done
		d.RoomGen = x.RoomGen
		return d
	}
	return m
}

// recordChunk adds a sent KV_CHUNK to its room's open stream: Seq 0 starts
// one; a chunk out of sequence, or past maxStreamBytes, drops it.
func (rp *replayPeer) recordChunk(x kvxfer.KVChunk) {
	s := rp.open[x.RoomGen]
	if x.Seq == 0 {
		if s == nil {
			if len(rp.order) >= maxOpenStreams {
				delete(rp.open, rp.order[0])
				rp.order = rp.order[1:]
			}
			rp.order = append(rp.order, x.RoomGen)
		}
		s = &kvStream{rg: x.RoomGen}
		rp.open[x.RoomGen] = s
	}
	if s == nil {
		return
	}
	if int(x.Seq) != len(s.chunks) || s.bytes+len(x.Data) > maxStreamBytes {
		rp.close(x.RoomGen)
		return
	}
	x.Data = slices.Clone(x.Data)
	s.chunks = append(s.chunks, x)
	s.bytes += len(x.Data)
}

// recordDone ends a room's open stream: if every chunk KV_DONE counts was
// recorded, the stream becomes the one to replay.
func (rp *replayPeer) recordDone(x kvxfer.KVDone) {
	s := rp.open[x.RoomGen]
	if s == nil {
		return
	}
	rp.close(x.RoomGen)
	if len(s.chunks) > 0 && int(x.NChunks) == len(s.chunks) {
		s.done = x
		rp.last = s
	}
}

func (rp *replayPeer) close(rg kvxfer.RoomGen) {
	delete(rp.open, rg)
	rp.order = slices.DeleteFunc(rp.order, func(o kvxfer.RoomGen) bool { return o == rg })
}
