// Package fault injects seeded, reproducible faults into the KV channel, for
// chaos and robustness tests.
//
// # Overview
//
// Two layers:
//
//   - Wrap decorates any kvxfer.Backend. Each room message this side SENDS
//     may be delayed, dropped, duplicated, reordered with the next one,
//     corrupted, stalled (with every later frame to that peer) or may reset
//     its connection, each with a probability per frame (Config); a room's
//     whole KV stream may be replaced by another room's finished stream,
//     relabelled with this room's (room, gen) (Config.Replay). Wrapping
//     both workers of a pair covers both directions. Transport frames
//     (HELLO, PING, PONG) are never touched, so a stall starves room leases
//     without looking like a lost peer.
//   - NewNet / Dialer wrap the dialing side's net.Conns (tcp.Config.DialContext):
//     a connection may freeze (no byte in or out for a while, so heartbeat
//     detection fires on both sides; even closing it reaches the peer only
//     when the freeze ends) or be reset, at random or on demand
//     (Net.FreezeAll, Net.ResetAll).
//
// # Determinism
//
// Each Backend and each Net draws from one random stream seeded by its
// Config's Seed, under a mutex, and draws a fixed number of values per
// frame (per dial for a Net) whatever the outcome (a fixed number for a
// given Config). So for the same seed and
// the same sequence of calls (Send, SetConfig; Dial) the same decisions are
// made. Timing is not part of the decision: a delayed frame is released by
// a timer, so when it arrives relative to frames sent later by the other
// side depends on the scheduler.
//
// # Concurrency
//
// Backend and Net are safe for concurrent use. Backend.Send never blocks:
// frames it holds go to a per-peer queue that one goroutine, started with
// the first held frame, releases on timers. Backend.Close stops that
// goroutine and waits for it. A frame that may go at once (e.g. the second
// of a swapped pair) is handed over by Send itself, so the goroutine only
// acts when a timer is due. A Net starts no goroutines of its own: its
// connections' scheduled faults and thaws are timers, stopped when the
// connection is closed (a thaw, once the freeze of a connection closed while
// frozen ends; ThawAll ends such freezes at once).
//
// # Ownership
//
// The Backend never modifies a message passed to Send: a corrupted
// KVChunk's Data (or RoomRenew's Rooms) is copied before the change, and a
// duplicated KVChunk's second copy carries its own copy of Data. Like
// the transports, it keeps a reference to KVChunk.Data until the frame is
// handed to the inner Backend, so the caller must not modify Data after
// Send.
package fault
