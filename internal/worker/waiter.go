package worker

import (
	"context"
	"sync"
	"time"

	"github.com/pdserve/pdserve/internal/lifecycle"
	"github.com/pdserve/pdserve/internal/model"
)

// piece is one Emit of a request's output: tokens of one choice, or the end
// of one choice of several (finish), or the prompt's logprobs (prompt).
type piece struct {
	choice int
	tokens []model.SeqOutput
	finish string
	prompt []model.PositionLogprobs
}

// waiter carries one request's output from the loop to its HTTP handler.
// The loop appends pieces and finishes it once; the handler takes whatever
// has accumulated each time it is woken, so a slow client never blocks the
// loop (output is bounded by max_tokens).
type waiter struct {
	mu     sync.Mutex
	pieces []piece
	final  *lifecycle.Finalize
	notify chan struct{}
	// reasons are the finish reasons of the choices of a request with
	// N > 1, by choice, as each ended ("" until then).
	reasons []string

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

// push appends e's piece of output: consecutive tokens of one choice join
// the last piece.
func (w *waiter) push(e lifecycle.Emit) {
	w.mu.Lock()
	n := len(w.pieces)
	if n > 0 && e.Finish == "" && e.Prompt == nil && w.pieces[n-1].choice == e.Choice && w.pieces[n-1].finish == "" &&
		w.pieces[n-1].prompt == nil {
		w.pieces[n-1].tokens = append(w.pieces[n-1].tokens, e.Tokens...)
	} else {
		w.pieces = append(w.pieces, piece{choice: e.Choice, tokens: e.Tokens, finish: e.Finish, prompt: e.Prompt})
	}
	if e.Finish != "" && e.Choice >= 0 {
		for len(w.reasons) <= e.Choice {
			w.reasons = append(w.reasons, "")
		}
		w.reasons[e.Choice] = e.Finish
	}
	w.mu.Unlock()
	w.wake()
}

// finishReasons is the finish reason of each of the n choices of a request
// that ended with fin: a choice's own when it ended before the request
// (N > 1), else the request's. Nil when fin names none (a failure).
func (w *waiter) finishReasons(fin *lifecycle.Finalize, n int) []string {
	if fin == nil || fin.FinishReason == "" {
		return nil
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	out := make([]string, max(n, 1))
	for i := range out {
		out[i] = fin.FinishReason
		if i < len(w.reasons) && w.reasons[i] != "" {
			out[i] = w.reasons[i]
		}
	}
	return out
}

func (w *waiter) finish(f lifecycle.Finalize) {
	w.mu.Lock()
	w.final = &f
	w.mu.Unlock()
	w.wake()
}

// next waits until there is output or the request ended, and returns what
// accumulated. final is non-nil once the request ended (pieces then holds
// everything that came before it). It returns ctx.Err() if ctx ends first.
func (w *waiter) next(ctx context.Context) ([]piece, *lifecycle.Finalize, error) {
	ps, fin, _, err := w.nextOr(ctx, nil)
	return ps, fin, err
}

// nextOr is next that also returns, with fired true and nothing else,
// when a value comes on fire first (nil: never).
func (w *waiter) nextOr(ctx context.Context, fire <-chan time.Time) (ps []piece, fin *lifecycle.Finalize, fired bool, err error) {
	for {
		w.mu.Lock()
		ps, fin := w.pieces, w.final
		w.pieces = nil
		w.mu.Unlock()
		if len(ps) > 0 || fin != nil {
			return ps, fin, false, nil
		}
		select {
		case <-w.notify:
		case <-fire:
			return nil, nil, true, nil
		case <-ctx.Done():
			// The request may have ended as the caller left (select picks
			// either when both are ready): then its end is the answer, and
			// no abort goes to a request the machine no longer knows (which
			// would leave a tombstone for a normal end).
			w.mu.Lock()
			ps, fin := w.pieces, w.final
			w.pieces = nil
			w.mu.Unlock()
			if fin != nil {
				return ps, fin, false, nil
			}
			return nil, nil, false, ctx.Err()
		}
	}
}

// wait waits for the final outcome, discarding output.
func (w *waiter) wait(ctx context.Context) (*lifecycle.Finalize, error) {
	for {
		_, fin, err := w.next(ctx)
		if err != nil || fin != nil {
			return fin, err
		}
	}
}
