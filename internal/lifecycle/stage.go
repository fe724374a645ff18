package lifecycle

import "fmt"

// Role is what a worker does.
type Role uint8

// Worker roles.
const (
	RolePrefill Role = iota + 1
	RoleDecode
	RoleColocated
)

func (r Role) String() string {
	switch r {
	case RolePrefill:
		return "prefill"
	case RoleDecode:
		return "decode"
	case RoleColocated:
		return "colocated"
	}
	return fmt.Sprintf("role(%d)", uint8(r))
}

// Stage is where a request is in its lifecycle.
type Stage uint8

// Stages. Which ones a role uses is given by [Role.Stages].
const (
	StageNone Stage = iota
	// StageBootstrap (prefill): waiting for decode's ROOM_OPEN. Holds nothing.
	StageBootstrap
	// StageWaiting (prefill, colocated; decode for a local request, one
	// without a room): waiting to be batched. Holds nothing.
	StageWaiting
	// StagePrefilling (prefill, colocated; decode after a preemption or for
	// a local request): KV being computed in chunks (on prefill also before ROOM_OPEN, with
	// optimistic prefill). Holds pages.
	StagePrefilling
	// StageParked (prefill): KV computed, waiting for decode's ROOM_READY
	// (or, optimistic, its ROOM_OPEN). Holds pages.
	StageParked
	// StageTransferring (prefill): KV sent, waiting for decode's KV_ACK. Holds pages.
	StageTransferring
	// StagePrealloc (decode): waiting for pages. Holds nothing.
	StagePrealloc
	// StageAwaitingKV (decode): pages allocated, receiving KV. Holds pages.
	StageAwaitingKV
	// StageQueued (decode): KV verified, waiting for a running-batch slot. Holds pages.
	StageQueued
	// StageDecoding (decode, colocated): generating tokens. Holds pages.
	StageDecoding
	// StagePreempted (decode, colocated): its pages were taken for older
	// requests; it waits for pages to recompute its KV locally (prompt and
	// output so far) and go on. Holds nothing.
	StagePreempted
	// StageDone: terminal. Holds nothing.
	StageDone
	numStages
)

var stageNames = [numStages]string{"none", "bootstrap", "waiting", "prefilling", "parked",
	"transferring", "prealloc", "awaiting_kv", "queued", "decoding", "preempted", "done"}

func (s Stage) String() string {
	if s < numStages {
		return stageNames[s]
	}
	return fmt.Sprintf("stage(%d)", uint8(s))
}

// Queued lists the stages of a role whose requests wait to start: prefill's
// bootstrap and waiting (not yet computing), decode's prealloc (waiting for
// pages) and queued (waiting for a running slot), a colocated worker's
// waiting; and preempted on decode and colocated workers (waiting for pages
// again). Config.MaxQueued bounds them.
func (r Role) Queued() []Stage {
	switch r {
	case RolePrefill:
		return []Stage{StageBootstrap, StageWaiting}
	case RoleDecode:
		return []Stage{StageWaiting, StagePrealloc, StageQueued, StagePreempted}
	case RoleColocated:
		return []Stage{StageWaiting, StagePreempted}
	}
	return nil
}

// Stages lists the non-terminal stages of a role, in lifecycle order.
func (r Role) Stages() []Stage {
	switch r {
	case RolePrefill:
		return []Stage{StageBootstrap, StageWaiting, StagePrefilling, StageParked, StageTransferring}
	case RoleDecode:
		return []Stage{StageWaiting, StagePrealloc, StageAwaitingKV, StageQueued, StageDecoding, StagePreempted, StagePrefilling}
	case RoleColocated:
		return []Stage{StageWaiting, StagePrefilling, StageDecoding, StagePreempted}
	}
	return nil
}
