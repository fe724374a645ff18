// Command synthckpt writes the synthetic checkpoint with HuggingFaceTB/SmolLM2-135M's
// shape (llamatest.SmolLM2135M: 30 layers, hidden 576, 9 heads, 3 KV heads, vocab
// 49152, bf16, random weights; config.json and model.safetensors, no tokenizer)
// into a directory, for the scripts in tools/perf that serve a real model.
//
// Usage: go run ./tools/perf/synthckpt DIR
package main

import (
	"fmt"
	"os"

	"github.com/pdserve/pdserve/internal/model/llama/llamatest"
)

func main() {
	if len(os.Args) != 2 {
		fmt.Fprintln(os.Stderr, "usage: synthckpt DIR")
		os.Exit(2)
	}
	if err := llamatest.SmolLM2135M().Write(os.Args[1]); err != nil {
		fmt.Fprintln(os.Stderr, "synthckpt:", err)
		os.Exit(1)
	}
}
