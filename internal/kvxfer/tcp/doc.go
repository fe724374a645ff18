// Package tcp is the TCP Backend of the KV channel (see package kvxfer for
// the protocol).
//
// # Overview
//
// A Backend listens (prefill side) and connects (decode side). Each
// connection gets a PeerID unique within the Backend; a reconnect gets a new
// one. The transport handles HELLO, PING and PONG itself and hands every room
// message (ROOM_OPEN … ABORT_ACK) to the Handler in the order received.
//
// # Concurrency
//
// A Backend is safe for concurrent use. Each connection has one reader
// goroutine, which runs the dial and handshake and then calls the Handler
// (PeerUp, HandleMessage, PeerLost — in that order, never concurrently for one
// connection), and one writer goroutine, which writes queued frames in order
// and sends heartbeats. Send never blocks: it appends to an unbounded
// per-connection queue.
//
// Every connection, accepted or from Connect, gets exactly one PeerLost,
// after its last HandleMessage — also one whose dial or handshake failed and
// so never had PeerUp. Handler methods must return promptly (a slow handler
// stops reading from that connection) and must not call Close, which waits
// for the goroutine calling them.
//
// # Ownership
//
// Send keeps a reference to KVChunk.Data until the frame is written; the
// caller must not modify Data after Send. A received KVChunk's Data is a
// fresh allocation (or one from Config.AllocData) owned by the Handler.
//
// # Liveness
//
// Every connection sends PING every HeartbeatInterval and answers PING with
// PONG. Any received byte counts as liveness: a connection that receives
// nothing for HeartbeatInterval × HeartbeatMisses is closed with an error
// wrapping ErrSilent. A write that makes no progress (each system write call
// carries at most 4 MiB) within WriteTimeout closes the connection the same
// way, so a stalled peer can never block a writer forever.
package tcp
