// Package testbin builds a command of this module once per test binary, for
// tests that run it as processes (the processes are the system under test,
// so the build has no race detector).
package testbin

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"testing"
)

// Binary is a command built on first use.
type Binary struct {
	pkg  string
	once sync.Once
	dir  string
	path string
	err  error
}

// New returns a Binary for the main package pkg (an import path); nothing is
// built until Path.
func New(pkg string) *Binary { return &Binary{pkg: pkg} }

// Path builds the command (once) into a temporary directory and returns the
// executable's path. A failed build fails t, with the compiler's output.
func (b *Binary) Path(t testing.TB) string {
	t.Helper()
	b.once.Do(func() {
		b.dir, b.err = os.MkdirTemp("", "pdserve-test-")
		if b.err != nil {
			return
		}
		b.path = filepath.Join(b.dir, filepath.Base(b.pkg))
		if out, err := exec.Command("go", "build", "-o", b.path, b.pkg).CombinedOutput(); err != nil {
			b.err = fmt.Errorf("go build %s: %v\n%s", b.pkg, err, out)
		}
	})
	if b.err != nil {
		t.Fatal(b.err)
	}
	return b.path
}

// Remove deletes the built executable, if any; call it once every test that
// runs it has ended (from TestMain).
func (b *Binary) Remove() {
	if b.dir != "" {
		_ = os.RemoveAll(b.dir)
	}
}
