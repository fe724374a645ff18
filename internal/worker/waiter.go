package worker

import (
	"context"
	"sync"
	"time"

	"github.com/pdserve/pdserve/internal/lifecycle"
	"github.com/pdserve/pdserve/internal/model"
)

// waiter carries one request's output from the loop to its HTTP handler.
// The loop appends tokens and finishes it once; the handler takes whatever
// has accumulated each time it is woken, so a slow client never blocks the
// loop (output is bounded by max_tokens).
type waiter struct {
	mu     sync.Mutex
	tokens []model.SeqOutput
	final  *lifecycle.Finalize
	notify chan struct{}

	// loop-only
	arrived      time.Time
	lastAt       time.Time
	promptTokens int
}

func newWaiter() *waiter { return &waiter{notify: make(chan struct{}, 1)} }

func (w *waiter) wake() {
	select {
	case w.notify <- struct{}{}:
	default:
	}
}

func (w *waiter) push(t []model.SeqOutput) {
	w.mu.Lock()
	w.tokens = append(w.tokens, t...)
	w.mu.Unlock()
	w.wake()
}

func (w *waiter) finish(f lifecycle.Finalize) {
	w.mu.Lock()
	w.final = &f
	w.mu.Unlock()
	w.wake()
}

// next waits until there are tokens or the request ended, and returns what
// accumulated. final is non-nil once the request ended (tokens then holds
// everything that came before it). It returns ctx.Err() if ctx ends first.
func (w *waiter) next(ctx context.Context) ([]model.SeqOutput, *lifecycle.Finalize, error) {
	for {
		w.mu.Lock()
		toks, fin := w.tokens, w.final
		w.tokens = nil
		w.mu.Unlock()
		if len(toks) > 0 || fin != nil {
			return toks, fin, nil
		}
		select {
		case <-w.notify:
		case <-ctx.Done():
			return nil, nil, ctx.Err()
		}
	}
}

// wait waits for the final outcome, discarding tokens.
func (w *waiter) wait(ctx context.Context) (*lifecycle.Finalize, error) {
	for {
		_, fin, err := w.next(ctx)
		if err != nil || fin != nil {
			return fin, err
		}
	}
}
