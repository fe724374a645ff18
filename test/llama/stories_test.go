package llama_test

import (
	"testing"

	"github.com/pdserve/pdserve/internal/model/llama"
	"github.com/pdserve/pdserve/internal/model/llama/llamatest"
)

// storiesRequests are the greedy completion requests of the reference
// sequences: token-id prompts, 48 tokens, temperature 0, ignore_eos (ids 1
// and 2 are ordinary tokens in the references).
func storiesRequests(refs []llamatest.Reference) []completionRequest {
	reqs := make([]completionRequest, len(refs))
	for i, r := range refs {
		reqs[i] = completionRequest{Prompt: r.Tokens, MaxTokens: len(r.Greedy), Temperature: 0, IgnoreEOS: true}
	}
	return reqs
}

func checkGreedy(t *testing.T, refs []llamatest.Reference, outs [][]int32) {
	t.Helper()
	for i, r := range refs {
		if !equal(outs[i], r.Greedy) {
			t.Errorf("%s: greedy continuation\n got %v\nwant %v", r.Name, outs[i], r.Greedy)
		}
	}
}

// TestStories260KServe runs the reference sequences through a colocated
// worker (`pdserve serve --model DIR`) over the OpenAI API, all at once and
// prefilled in chunks of at most 64 tokens, and compares the greedy
// continuations with llama.cpp's.
func TestStories260KServe(t *testing.T) {
	t.Parallel()
	refs := llamatest.References(t)
	newModel, _ := factory(t, llamatest.Stories260K(t), llama.Options{})
	s := startServe(t, newModel, machine(64))
	checkGreedy(t, refs, completeAll(t, s.URL, storiesRequests(refs)))
}

// TestStories260KPD runs the reference sequences through a router, a
// prefill and a decode worker (`pdserve up --model DIR`): prompt KV is
// computed on the prefill worker and streamed to the decode worker's pages.
func TestStories260KPD(t *testing.T) {
	t.Parallel()
	refs := llamatest.References(t)
	newModel, _ := factory(t, llamatest.Stories260K(t), llama.Options{})
	c := startPD(t, newModel, machine(64))
	checkGreedy(t, refs, completeAll(t, c.URL(), storiesRequests(refs)))
}
