package fault

import "github.com/pdserve/pdserve/internal/kvxfer"

// corrupt returns m with one bit flipped in a field its receiver checks
// (see Config.Corrupt), chosen by r, and whether it changed anything. It
// never modifies m's Data or Rooms: they are copied first.
func corrupt(m kvxfer.Message, r uint64) (kvxfer.Message, bool) {
	bit8 := byte(1) << (r >> 32 % 8)
	bit32 := uint32(1) << (r >> 40 % 32)
	bit64 := uint64(1) << (r >> 48 % 64)
	switch x := m.(type) {
	case kvxfer.KVChunk:
		if len(x.Data) == 0 {
			x.NPages ^= bit32
			return x, true
		}
		data := make([]byte, len(x.Data))
		copy(data, x.Data)
		data[r%uint64(len(data))] ^= bit8
		x.Data = data
		return x, true
	case kvxfer.KVDone:
		x.Checksum ^= bit32
		return x, true
	case kvxfer.RoomOpen:
		x.PromptHash ^= bit64
		return x, true
	case kvxfer.RoomReady:
		x.NTokens ^= bit32
		return x, true
	case kvxfer.RoomRenew:
		if len(x.Rooms) == 0 {
			return m, false
		}
		rooms := append([]kvxfer.RoomGen(nil), x.Rooms...)
		rooms[r%uint64(len(rooms))].Gen ^= bit32
		x.Rooms = rooms
		return x, true
	case kvxfer.KVAck:
		x.Gen ^= bit32
		return x, true
	case kvxfer.Abort:
		x.Gen ^= bit32
		return x, true
	case kvxfer.AbortAck:
		x.Gen ^= bit32
		return x, true
	}
	return m, false
}
