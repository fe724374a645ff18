// Package lifecycle is the request state machine of one pdserve worker, for
// every role: prefill, decode and colocated.
//
// # Overview
//
// After etcd's raft: a [Machine] holds all request state of a worker and
// nothing else. Inputs go in through [Machine.Step] as events; side effects
// come out of [Machine.Ready] as an ordered list that the caller (the worker
// shell) executes. The machine has no goroutines, no clock and no I/O: time
// arrives with every event, so tests drive it step by step and replay seeded
// interleavings.
//
// Every non-terminal stage has a deadline, every stage that holds a peer's
// room is covered by a lease that the peer renews, and every terminal
// transition goes through one function (finish) that frees the request's
// pages exactly once, tells the peer unless the peer caused it, leaves a
// tombstone for failed rooms, and emits exactly one [Finalize] effect.
// Terminal states are absorbing: nothing that arrives later changes them.
//
// Prefill: Bootstrap → Waiting → Prefilling → Parked → Transferring → done;
// with optimistic prefill, Bootstrap → Prefilling → Parked before decode's
// ROOM_OPEN, with KV bound to the room only when it comes (optimistic.go).
// Decode: Prealloc → AwaitingKV → Queued → Decoding → done, and Decoding →
// Preempted → Prefilling → Decoding when older requests need its pages.
// Colocated: Waiting → Prefilling → Decoding → done, with the same
// preemption loop. A decode worker serves a request without a room (a
// local one: the router chose not to disaggregate it) the colocated way:
// Waiting → Prefilling → Decoding → done, with no peer and no KV channel.
//
// The machine is deterministic: the same events at the same times give the
// same effects in the same order. Whatever it emits about several requests
// or rooms follows their arrival order, never a map's, so a seeded test
// replays bit for bit and a transcript (testdata/*.txt) never flaps.
//
// # Layout
//
// One file per concern:
//
//   - events.go, effects.go: what goes in through Step and comes out of Ready.
//   - config.go: Config and its defaults; stage.go: roles and stages.
//   - request.go: the live request and the legal combinations of its state
//     in each role and stage.
//   - machine.go: the Machine, Step, stage bookkeeping and the timers (Tick).
//   - arrive.go: admission of a new request and page budgets.
//   - finish.go: finish, the single exit of every admitted request, with
//     aborts, shutdown and the first cause of a failure.
//   - peer.go: the KV channel both PD roles share: renewals, peer loss and a
//     peer's ABORT; tombstone.go: rooms remembered after they end.
//   - prefill.go, decode.go: each role's side of the room protocol;
//     optimistic.go: prefill computing before the room opens, and why it
//     cannot deadlock.
//   - scheduler.go: the batch scheduler of every role, preemption.
//   - prefix.go: the prefix cache: what a request takes from it when it
//     starts computing (or decode when it admits a room) and what is
//     published into it, when.
//   - stats.go: gauges, counters and the /debug/requests view.
//
// # Testing
//
// The tests drive machines step by step and check, after every step, the
// legal state of every request (checkLegal) and the page accounting:
//
//   - stages_test.go: every way to end (abort, deadline, lease, peer loss,
//     peer ABORT, cause) in every stage of every role.
//   - testdata/*.txt: transcripts of scenarios, events in and effects out,
//     run by TestTranscripts (its doc lists the commands) and regenerated
//     with -rewrite.
//   - pair_test.go: a prefill and a decode machine over many seeded
//     interleavings with faults; a failing seed prints its transcript,
//     which replays from testdata/.
//
// # Concurrency
//
// A Machine is not safe for concurrent use: one goroutine (the worker loop)
// calls Step and Ready. The forward pass of a [RunBatch] effect may run on
// another goroutine while the loop keeps stepping; the machine never frees the
// pages of a request in the running batch before the matching [BatchDone].
//
// # Ownership
//
// The machine owns the page Allocator (through a kvcache.Cache, which adds
// reference counts and the prefix cache's index): it alone allocates,
// shares and releases pages; a shared page is never written.
// The shell owns the page bytes and writes them only as effects direct
// (RunBatch, WriteKV), so a frame for a room that is no longer live is
// dropped here and can never land in reused pages. On prefill it also
// records with each page the hash of the prompt tokens computed into it
// (kvxfer.PageHash): KV_DONE's binding is built from those records, and
// decode takes KV only if that binding is its own request's.
package lifecycle
