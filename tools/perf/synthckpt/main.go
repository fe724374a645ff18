// Command synthckpt writes the synthetic checkpoint with HuggingFaceTB/SmolLM2-135M's
// shape (llamatest.SmolLM2135M: 30 layers, hidden 576, 9 heads, 3 KV heads, vocab
// 49152, bf16, random weights; config.json and model.safetensors, no tokenizer)
// into a directory, for the scripts in tools/perf that serve a real model.
//
// With -tokenizer, the checkpoint takes the vocabulary of a real tokenizer:
// the tokenizer directory's tokenizer.json and tokenizer_config.json (or
// their .json.gz, as the repository's fixtures keep them, decompressed) are
// copied next to the weights, and vocab_size, bos_token_id and
// eos_token_id become the tokenizer's. The layers keep SmolLM2-135M's shape;
// only the embedding (tied to the output head) grows or shrinks with the
// vocabulary. A checkpoint with a tokenizer serves chat completions and
// structured outputs, which need one.
//
// Usage:
//
//	go run ./tools/perf/synthckpt [-tokenizer TOKDIR] DIR
//
// For example, the Llama 3 vocabulary (128,256 tokens):
//
//	go run ./tools/perf/synthckpt -tokenizer internal/model/tokenizer/testdata/llama3 /tmp/smol-llama3
package main

import (
	"compress/gzip"
	"errors"
	"flag"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"

	"github.com/pdserve/pdserve/internal/model/llama/llamatest"
	"github.com/pdserve/pdserve/internal/model/tokenizer"
)

func main() {
	tokDir := flag.String("tokenizer", "", "directory of a tokenizer (tokenizer.json and tokenizer_config.json, or their .gz) whose vocabulary the checkpoint takes")
	flag.Usage = func() {
		fmt.Fprintln(os.Stderr, "usage: synthckpt [-tokenizer TOKDIR] DIR")
		flag.PrintDefaults()
	}
	flag.Parse()
	if flag.NArg() != 1 {
		flag.Usage()
		os.Exit(2)
	}
	if err := write(flag.Arg(0), *tokDir); err != nil {
		fmt.Fprintln(os.Stderr, "synthckpt:", err)
		os.Exit(1)
	}
}

// tokenizerFiles are the files copied from -tokenizer's directory; each
// must be there, as itself or gzipped.
var tokenizerFiles = []string{"tokenizer.json", "tokenizer_config.json"}

// write writes the checkpoint into dir, with the tokenizer of tokDir when
// it is not empty.
func write(dir, tokDir string) error {
	spec := llamatest.SmolLM2135M()
	if tokDir != "" {
		if err := os.MkdirAll(dir, 0o755); err != nil {
			return err
		}
		for _, name := range tokenizerFiles {
			if err := copyMaybeGzipped(filepath.Join(tokDir, name), filepath.Join(dir, name)); err != nil {
				return err
			}
		}
		tok, err := tokenizer.Load(dir)
		if err != nil {
			return err
		}
		spec.Vocab = tok.VocabSize()
		bos, ok := tok.BOS()
		if !ok {
			return fmt.Errorf("%s: the tokenizer has no BOS token", tokDir)
		}
		spec.BOS = int(bos)
		eos := tok.EOS()
		if len(eos) == 0 {
			return fmt.Errorf("%s: the tokenizer has no EOS token", tokDir)
		}
		spec.EOS = spec.EOS[:0:0]
		for _, id := range eos {
			spec.EOS = append(spec.EOS, int(id))
		}
	}
	return spec.Write(dir)
}

// copyMaybeGzipped copies src to dst, or, when src does not exist,
// decompresses src+".gz" into dst.
func copyMaybeGzipped(src, dst string) error {
	in, err := os.Open(src)
	var r io.Reader = in
	if errors.Is(err, fs.ErrNotExist) {
		if in, err = os.Open(src + ".gz"); err != nil {
			return fmt.Errorf("neither %s nor %s.gz: %w", src, src, err)
		}
		zr, err := gzip.NewReader(in)
		if err != nil {
			in.Close()
			return fmt.Errorf("%s.gz: %v", src, err)
		}
		r = zr
	} else if err != nil {
		return err
	}
	defer in.Close()
	out, err := os.Create(dst)
	if err != nil {
		return err
	}
	if _, err := io.Copy(out, r); err != nil {
		out.Close()
		return fmt.Errorf("%s: %v", dst, err)
	}
	return out.Close()
}
