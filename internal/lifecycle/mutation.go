package lifecycle

// mutation breaks one rule of the machine on purpose. The model checker's
// TestModelCheckMutations sets one on the machines it explores and must
// find a violation for each: a checker that cannot fail proves nothing.
// Every real machine has mutNone (the zero value); nothing outside the
// package's tests can set another.
type mutation uint8

const (
	mutNone mutation = iota
	// mutNoAbortTombstone: an abort for a request the machine does not
	// know yet leaves no tombstone, so the request is admitted when it
	// arrives after its abort (SGLang's pinned-request bug).
	mutNoAbortTombstone
	// mutNoGenCheck: a room message of another gen of a live room is taken
	// as the live gen's, so a retry's pages take the old attempt's KV.
	mutNoGenCheck
	// mutStaleGenSupersedes: a leg of an older gen than the room's live
	// one supersedes it (the check that a retry's gen is newer is skipped),
	// so a late leg of a failed attempt takes the room from its retry.
	mutStaleGenSupersedes
	// mutNoBootstrapDeadline: prefill's bootstrap stage has no deadline, so
	// a request whose decode never opens the room waits for its time limit.
	mutNoBootstrapDeadline
	// mutNoLease: rooms are never released for a peer that stopped
	// renewing them (tick and NextTimer skip the lease), so a leg whose
	// peer vanished without a word waits for its time limit.
	mutNoLease
	// mutLeakSuperseded: a request a retry supersedes forgets its pages
	// instead of freeing them.
	mutLeakSuperseded
	// mutFreeWhilePinned: an ended request's pages are freed while page I/O
	// still uses them, so a KV write lands in pages another request holds.
	mutFreeWhilePinned

	numMutations
)

var mutationNames = [numMutations]string{"none", "no-abort-tombstone", "no-gen-check", "stale-gen-supersedes", "no-bootstrap-deadline", "no-lease", "leak-superseded", "free-while-pinned"}

func (x mutation) String() string { return mutationNames[x] }

// suffix names x in a test's report: empty for mutNone.
func (x mutation) suffix() string {
	if x == mutNone {
		return ""
	}
	return ", mutation " + x.String()
}
