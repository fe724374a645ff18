package grammar

import (
	"errors"
	"testing"
	"time"
)

// TestWithin: a compile that does not finish in time is ErrCompileTime (the
// caller does not wait for it); one that does gives its result; a panic is
// an error.
func TestWithin(t *testing.T) {
	release := make(chan struct{})
	finished := make(chan struct{})
	_, err := Within(time.Nanosecond, func() (int, error) {
		defer close(finished)
		<-release
		return 1, nil
	})
	if err != ErrCompileTime {
		t.Fatalf("err %v, want ErrCompileTime", err)
	}
	close(release)
	<-finished
	v, err := Within(time.Hour, func() (int, error) { return 7, nil })
	if v != 7 || err != nil {
		t.Fatalf("got %d, %v", v, err)
	}
	_, err = Within(time.Hour, func() (int, error) { panic("boom") })
	if err == nil || errors.Is(err, ErrCompileTime) {
		t.Fatalf("a panic gave %v", err)
	}
}
