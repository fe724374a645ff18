// Package llama_test holds the end-to-end acceptance tests of the Llama
// runner: the stories260K model against llama.cpp's reference outputs
// (directly, through `pdserve serve` and through `pdserve up`), and a
// SmolLM2-135M-shaped synthetic checkpoint served PD and colocated.
package llama_test

import (
	"testing"

	"go.uber.org/goleak"

	"github.com/pdserve/pdserve/internal/testbin"
)

var pdserve = testbin.New("github.com/pdserve/pdserve/cmd/pdserve")

func TestMain(m *testing.M) { goleak.VerifyTestMain(pdserve.RemovingAfter(m)) }
