// Package openaitest runs requests on an openai.Engine for tests: it reads
// a request's stream to its end and gathers what each choice got, so that
// two engines (a prefill/decode pair's router and a colocated worker) can
// be compared whole.
package openaitest

import (
	"context"
	"errors"
	"fmt"
	"io"

	"github.com/pdserve/pdserve/internal/model"
	"github.com/pdserve/pdserve/internal/openai"
)

// Answer is everything an engine streamed for one request: each choice's
// tokens (with their logprobs and top logprobs) and finish reason, and the
// prompt's logprobs. How the tokens were cut into chunks is not part of
// it: two engines may chunk the same output differently.
type Answer struct {
	Tokens map[int][]openai.Token
	Finish map[int]string
	Prompt []model.PositionLogprobs
}

// IDs returns choice c's token ids.
func (a Answer) IDs(c int) []int32 {
	out := make([]int32, len(a.Tokens[c]))
	for i, t := range a.Tokens[c] {
		out[i] = t.ID
	}
	return out
}

// Run runs g on e and reads its stream to the end. It returns the engine's
// error, or one for a stream that breaks the contract: prompt logprobs
// twice, tokens of a choice after its finish, a choice that never
// finished.
func Run(ctx context.Context, e openai.Engine, g openai.GenerateRequest) (Answer, error) {
	st, err := e.Generate(ctx, &g)
	if err != nil {
		return Answer{}, err
	}
	defer st.Close()
	a := Answer{Tokens: map[int][]openai.Token{}, Finish: map[int]string{}}
	n := max(1, g.N)
	for {
		c, err := st.Recv()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return a, err
		}
		if c.PromptLogprobs != nil {
			if a.Prompt != nil {
				return a, errors.New("the prompt's logprobs came twice")
			}
			a.Prompt = c.PromptLogprobs
		}
		if _, done := a.Finish[c.Index]; done && len(c.Tokens) > 0 {
			return a, fmt.Errorf("tokens of choice %d after it finished", c.Index)
		}
		if c.Index < 0 || c.Index >= n {
			return a, fmt.Errorf("a chunk of choice %d of %d", c.Index, n)
		}
		if len(c.Tokens) > 0 {
			a.Tokens[c.Index] = append(a.Tokens[c.Index], c.Tokens...)
		}
		if c.FinishReason != "" {
			a.Finish[c.Index] = c.FinishReason
		}
		if c.Done || (n == 1 && c.FinishReason != "") {
			break
		}
	}
	if len(a.Finish) != n {
		return a, fmt.Errorf("%d of %d choices finished: %v", len(a.Finish), n, a.Finish)
	}
	return a, nil
}
