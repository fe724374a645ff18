package main

import (
	"errors"
	"fmt"
	"io"
	"os"
	"slices"
	"strings"

	"github.com/dustin/go-humanize"
	"github.com/spf13/cobra"

	"github.com/pdserve/pdserve/internal/model/llama"
	"github.com/pdserve/pdserve/internal/model/llama2c"
)

func newConvertCmd(stdout io.Writer) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "convert",
		Short: "Convert a checkpoint from another format to a directory --model can serve",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return usagef("convert needs a target: pdserve convert llama2c IN.bin OUT_DIR, or pdserve convert gguf IN OUT.gguf --type q8_0")
		},
	}
	cmd.AddCommand(newConvertGGUFCmd(stdout))
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
				return alreadyGGUF(args[0], err)
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

func newConvertGGUFCmd(stdout io.Writer) *cobra.Command {
	var typ string
	cmd := &cobra.Command{
		Use:   "gguf IN OUT.gguf",
		Short: "Write a checkpoint as a GGUF file (f32, f16, bf16, or quantized q8_0, q4_0, q4_1, q5_0, q5_1, iq4_nl, q4_k_m, q5_k_m, q3_k_m, q2_k, iq4_xs) that --model and llama.cpp load",
		Long: `Reads IN, a Hugging Face checkpoint directory (config.json + safetensors) or
a llama2.c checkpoint (.bin), and writes OUT.gguf (GGUF v3, llama.cpp's
"llama" architecture, or "qwen3", "qwen3moe", "gemma2", "gemma3" or "phi3"
for a Qwen3ForCausalLM, Qwen3MoeForCausalLM, Gemma2ForCausalLM,
Gemma3ForCausalLM or Phi3ForCausalLM checkpoint; a Qwen3-MoE checkpoint's
experts, mlp.experts.E.* or the fused mlp.experts.gate_up_proj and
down_proj, are stacked into ffn_*_exps, its router kept f32; a
MixtralForCausalLM becomes "llama" with experts) with its matrices in --type: f32, f16 or bf16 (exact
when the checkpoint has that dtype), quantized with ggml's reference
quantizers, q8_0 (8 bits per weight plus a scale per 32), q4_0 (4 bits),
q4_1 (4 bits, a scale and an offset per 32), q5_0 (5 bits) or q5_1 (5 bits
and an offset); iq4_nl (4-bit indices into a non-uniform grid; a plain
fitted-scale quantizer, not llama.cpp's search); or llama.cpp's K-quant
mixes (its choice of type per tensor for a dense model; experts' ffn_down_exps
count as ffn_down, llama.cpp's rules for 8 experts are not applied): q4_k_m, Q4_K and
Q6_K (plain range quantizers, not llama.cpp's searched scales); q5_k_m,
Q5_K and Q6_K; q3_k_m, Q3_K, Q4_K, Q5_K and Q6_K; q2_k, Q2_K, Q3_K, Q4_K and
Q6_K (Q5_K, Q3_K and Q2_K with ggml's reference quantizers); iq4_xs,
llama.cpp's IQ4_XS mix without an importance matrix (IQ4_XS, ggml's
reference quantizer; Q5_K for attn_v with 4 or more query heads per KV head
and for ffn_down in the first eighth of the layers; Q6_K classifier).
Matrices whose rows are not a multiple of the block stay f32 (the 32-element
types) or, as llama.cpp does, become q5_0 (for q4_k), q5_1 (for q5_k), q4_0
(for q3_k and q2_k), q8_0 (for q6_k) or iq4_nl (for iq4_xs). Norms are f32. The
vocabulary written is a placeholder (token-id prompts only).`,
		Args: cobra.ExactArgs(2),
		RunE: func(_ *cobra.Command, args []string) error {
			t := llama.FileType(strings.ToUpper(typ))
			if !slices.Contains(llama.FileTypes, t) {
				return usagef("--type %q: want f32, f16, bf16, q8_0, q4_0, q4_1, q5_0, q5_1, iq4_nl, q4_k_m, q5_k_m, q3_k_m, q2_k or iq4_xs", typ)
			}
			in := args[0]
			fi, err := os.Stat(in)
			if err != nil {
				return usagef("%v", err)
			}
			if !fi.IsDir() {
				tmp, err := os.MkdirTemp("", "pdserve-convert-")
				if err != nil {
					return err
				}
				defer os.RemoveAll(tmp)
				if _, err := llama2c.Convert(in, tmp); err != nil {
					return alreadyGGUF(in, err)
				}
				in = tmp
			}
			rep, err := llama.WriteGGUF(in, args[1], t)
			if err != nil {
				return err
			}
			fmt.Fprintf(stdout, "wrote %s: %d tensors, %s, %s\n", args[1], rep.Tensors, t, humanize.IBytes(uint64(rep.Bytes)))
			if len(rep.Fallback) > 0 {
				fmt.Fprintf(stdout, "kept in another type (rows not a multiple of the block): %s\n", strings.Join(rep.Fallback, ", "))
			}
			return nil
		},
	}
	cmd.Flags().StringVar(&typ, "type", "q8_0", "element type of the matrices: f32, f16, bf16, q8_0, q4_0, q4_1, q5_0, q5_1, iq4_nl, q4_k_m, q5_k_m, q3_k_m, q2_k, iq4_xs")
	return cmd
}

// alreadyGGUF turns llama2c.Convert's error for a GGUF file in into a usage
// error that says what to do with it instead; other errors pass unchanged.
func alreadyGGUF(in string, err error) error {
	if !errors.Is(err, llama2c.ErrGGUF) {
		return err
	}
	return usagef("%s is already a GGUF file: serve it as it is (pdserve serve --model %s); convert reads llama2.c checkpoints and Hugging Face checkpoint directories, it does not re-quantize a GGUF file", in, in)
}
