package testbin

import (
	"os/exec"
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

// TestPathSharesTheCachedExecutable: two Binaries of one package (as two
// test packages would have) get one executable, from the build cache, and
// it runs.
func TestPathSharesTheCachedExecutable(t *testing.T) {
	const pkg = "github.com/pdserve/pdserve/internal/testbin/testdata/hello"
	a, b := New(pkg), New(pkg)
	pa, pb := a.Path(t), b.Path(t)
	defer a.Remove()
	defer b.Remove()
	if pa != pb {
		t.Errorf("two builds of one package: %s and %s, want one cached executable", pa, pb)
	}
	if a.dir != "" {
		t.Errorf("built into %s, not taken from the build cache", a.dir)
	}
	out, err := exec.Command(pa, "x", "y").Output()
	if err != nil || strings.TrimSpace(string(out)) != "[x y]" {
		t.Errorf("running %s: %q, %v", pa, out, err)
	}
}
