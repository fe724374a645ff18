package testbin

import (
	"strings"
	"testing"
)

func TestTailKeepsTheEndAndSeesARaceReport(t *testing.T) {
	w := &tail{max: 16}
	for _, s := range []string{"starting\n", "==================\nWARNING: DA", "TA RACE\nRead at 0x00c0"} {
		if _, err := w.Write([]byte(s)); err != nil {
			t.Fatal(err)
		}
	}
	if got := w.String(); got != "E\nRead at 0x00c0" {
		t.Errorf("kept %q, want the last 16 bytes", got)
	}
	if !w.sawRace() {
		t.Error("a race report written in two pieces went unseen")
	}
	quiet := &tail{max: 64}
	for range 10 {
		_, _ = quiet.Write([]byte(strings.Repeat("WARNING: DATA ", 3)))
	}
	if quiet.sawRace() {
		t.Error("saw a race report in output without one")
	}
}
