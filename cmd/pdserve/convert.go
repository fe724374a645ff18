package main

import (
	"fmt"
	"io"

	"github.com/spf13/cobra"

	"github.com/pdserve/pdserve/internal/model/llama2c"
)

func newConvertCmd(stdout io.Writer) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "convert",
		Short: "Convert a checkpoint from another format to a directory --model can serve",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return usagef("convert needs a source format: pdserve convert llama2c IN.bin OUT_DIR")
		},
	}
	cmd.AddCommand(&cobra.Command{
		Use:   "llama2c IN.bin OUT_DIR",
		Short: "Convert a llama2.c checkpoint (legacy format) to config.json + model.safetensors (f32)",
		Long: `Reads a checkpoint written by Karpathy's llama2.c (the legacy version-0 format:
a 7-int header, then float32 tensors) and writes OUT_DIR/config.json and
OUT_DIR/model.safetensors in the Hugging Face Llama layout, permuting the q and
k projections from interleaved RoPE to rotate-half. The classifier is tied to
the embedding when the header's vocab_size is positive. llama2.c checkpoints
carry no tokenizer, so the result serves token-id prompts
(pdserve serve --model OUT_DIR).`,
		Args: cobra.ExactArgs(2),
		RunE: func(_ *cobra.Command, args []string) error {
			h, err := llama2c.Convert(args[0], args[1])
			if err != nil {
				return err
			}
			tied := "tied"
			if !h.Shared {
				tied = "separate"
			}
			fmt.Fprintf(stdout, "converted %s: dim %d, hidden %d, %d layers, %d heads (%d KV), vocab %d (%s classifier), %d positions\n",
				args[0], h.Dim, h.HiddenDim, h.Layers, h.Heads, h.KVHeads, h.Vocab, tied, h.SeqLen)
			fmt.Fprintf(stdout, "wrote %s/config.json and %s/model.safetensors\n", args[1], args[1])
			return nil
		},
	})
	return cmd
}
