package grammar

import (
	"fmt"
	"time"
)

// CompileLimit is how long a constraint may take to compile (Compile,
// Validate, NewConstraint) on the request's path: the largest schemas the
// size limits admit compile in seconds (20,000 properties: about 10 s on
// a 2-vCPU EPYC), and a request must never wait without a deadline.
const CompileLimit = 5 * time.Second

// ErrCompileTime is returned by Within when the compile ran out of time.
var ErrCompileTime = &Error{Msg: fmt.Sprintf("the constraint takes more than %v to compile", CompileLimit)}

// Within runs compile on its own goroutine and returns its result, or
// ErrCompileTime once limit has passed (compile then finishes in the
// background and its result is dropped: the work is bounded by the
// compiler's own limits). A panic of compile is returned as an error.
func Within[T any](limit time.Duration, compile func() (T, error)) (T, error) {
	type result struct {
		v   T
		err error
	}
	done := make(chan result, 1)
	go func() {
		var r result
		defer func() {
			if p := recover(); p != nil {
				r.err = fmt.Errorf("grammar: compiler panic: %v", p)
			}
			done <- r
		}()
		r.v, r.err = compile()
	}()
	t := time.NewTimer(limit)
	defer t.Stop()
	select {
	case r := <-done:
		return r.v, r.err
	case <-t.C:
		var zero T
		return zero, ErrCompileTime
	}
}
