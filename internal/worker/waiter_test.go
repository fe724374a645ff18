package worker

import (
	"fmt"
	"testing"

	"github.com/pdserve/pdserve/internal/lifecycle"
)

// TestWaiterFinishReasons: a leg's finish reasons are one per choice: a
// choice that ended before the request (N > 1) its own, the others the
// request's; a failure names none.
func TestWaiterFinishReasons(t *testing.T) {
	w := newWaiter()
	w.push(lifecycle.Emit{Choice: 1, Finish: "stop"})
	w.push(lifecycle.Emit{Choice: 0}) // tokens, not an end
	fin := &lifecycle.Finalize{FinishReason: "length"}
	if got := fmt.Sprint(w.finishReasons(fin, 3)); got != "[length stop length]" {
		t.Errorf("reasons %s, want [length stop length]", got)
	}
	if got := fmt.Sprint(newWaiter().finishReasons(fin, 0)); got != "[length]" {
		t.Errorf("one choice: %s, want [length]", got)
	}
	if got := w.finishReasons(&lifecycle.Finalize{}, 3); got != nil {
		t.Errorf("a failure: %v, want none", got)
	}
	if got := w.finishReasons(nil, 3); got != nil {
		t.Errorf("no end: %v, want none", got)
	}
}
