package grammar

import (
	"math/rand/v2"
	"testing"
)

// TestPartitionClasses: bytes of one class have the same derivative, at an
// expression and at its derivatives, for random expressions over a few
// byte ranges with every operator.
func TestPartitionClasses(t *testing.T) {
	r := rand.New(rand.NewPCG(12, 13))
	s := newExprSet()
	var gen func(depth int) eid
	gen = func(depth int) eid {
		if depth == 0 || r.IntN(4) == 0 {
			lo := byte(r.IntN(256))
			hi := lo + byte(r.IntN(40))
			if hi < lo {
				hi = 255
			}
			return s.byteRange(lo, hi)
		}
		switch r.IntN(6) {
		case 0:
			return s.concat(gen(depth-1), gen(depth-1))
		case 1:
			return s.or(gen(depth-1), gen(depth-1))
		case 2:
			return s.and(gen(depth-1), s.repeat(gen(depth-1), 0, -1))
		case 3:
			return s.not(gen(depth - 1))
		default:
			return s.repeat(gen(depth-1), int32(r.IntN(2)), int32(1+r.IntN(3)))
		}
	}
	for range 200 {
		e := gen(4)
		p := s.partition(e)
		frontier := []eid{e}
		for step := 0; step < 3 && len(frontier) > 0; step++ {
			var next []eid
			for _, x := range frontier {
				for b := range 256 {
					want := s.derive(x, p.reps[p.class[b]])
					if got := s.derive(x, byte(b)); got != want {
						t.Fatalf("byte %#x and its class's representative %#x differ (kind %d)", b, p.reps[p.class[b]], s.nodes[x].kind)
					}
				}
				for _, c := range p.reps {
					next = append(next, s.derive(x, c))
				}
			}
			frontier = next[:min(len(next), 8)]
		}
	}
}
