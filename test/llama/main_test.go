// Package llama_test holds the end-to-end acceptance tests of the Llama
// runner: the stories260K model against llama.cpp's reference outputs
// (directly, through `pdserve serve` and through `pdserve up`), and a
// SmolLM2-135M-shaped synthetic checkpoint served PD and colocated.
package llama_test

import (
	"testing"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}
