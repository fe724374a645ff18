package lifecycle

import (
	"time"

	"github.com/pdserve/pdserve/internal/kvxfer"
	"github.com/pdserve/pdserve/internal/outcome"
)

// tombstone remembers how a room or request ended on this side (outcome)
// and its first failure (cause), so that late arrivals fail at once with
// the root cause.
type tombstone struct {
	gen     uint32
	outcome outcome.Outcome
	cause   outcome.Cause
	until   time.Time
}

type tombKey struct {
	room kvxfer.Room
	rid  string
}

func (m *Machine) addTomb(k tombKey, gen uint32, o outcome.Outcome, cause outcome.Cause) {
	if k.room.IsZero() && k.rid == "" {
		return
	}
	if _, exists := m.tombs[k]; !exists {
		m.tombOrder = append(m.tombOrder, k)
	}
	m.tombs[k] = tombstone{gen: gen, outcome: o, cause: cause, until: m.now.Add(m.cfg.TombstoneTTL)}
	for len(m.tombs) > m.cfg.MaxTombstones && len(m.tombOrder) > 0 {
		delete(m.tombs, m.tombOrder[0])
		m.tombOrder = m.tombOrder[1:]
	}
}

// tombFor finds a tombstone that covers (rid, room, gen): a room tombstone
// covers its gen and older ones (gen 0 covers every gen).
func (m *Machine) tombFor(rid string, room kvxfer.Room, gen uint32) (tombstone, bool) {
	if !room.IsZero() {
		if t, ok := m.tombs[tombKey{room: room}]; ok && (t.gen == 0 || gen <= t.gen) {
			return t, true
		}
	}
	if rid != "" {
		if t, ok := m.tombs[tombKey{rid: rid}]; ok && (t.gen == 0 || gen <= t.gen) {
			return t, true
		}
	}
	return tombstone{}, false
}
