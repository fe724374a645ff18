package main

import (
	"errors"
	"io/fs"
	"os"
	"slices"
	"strings"

	"github.com/pdserve/pdserve/internal/cluster"
	"github.com/pdserve/pdserve/internal/kvcache"
	"github.com/pdserve/pdserve/internal/model"
	"github.com/pdserve/pdserve/internal/model/llama"
	"github.com/pdserve/pdserve/internal/model/llama/gguf"
	"github.com/pdserve/pdserve/internal/model/tokenizer"
)

// llamaFactory loads --model (a checkpoint directory or a GGUF file) once
// (so a bad model fails at startup, before any server listens) and returns
// a factory of instances sharing its memory-mapped weights. The loaded
// instance is kept for the life of the process.
func (f *modelFlags) llamaFactory() (cluster.ModelFactory, error) {
	const want = "want %q, a checkpoint directory (config.json + model.safetensors) or a GGUF file"
	if fi, err := os.Stat(f.model); err != nil {
		// Say why the path cannot be read ("no such file or directory",
		// "permission denied"), not what it is not.
		why := err.Error()
		var pe *fs.PathError
		if errors.As(err, &pe) {
			why = pe.Err.Error()
		}
		return nil, usagef("--model %q: %s; "+want, f.model, why, SimModel)
	} else if !(fi.IsDir() || fi.Mode().IsRegular()) {
		return nil, usagef("--model %q: "+want, f.model, SimModel)
	}
	dt := llama.DefaultKVDType
	if f.kvDType != kvDTypeAuto {
		var err error
		if dt, err = kvcache.ParseDType(f.kvDType); err != nil {
			return nil, usagef("--kv-cache-dtype %q: want auto, f32, bf16 or f16", f.kvDType)
		}
	}
	if f.threads < 0 {
		return nil, usagef("--threads must not be negative, got %d", f.threads)
	}
	if !slices.Contains(llama.KernelChoices, f.kernels) {
		return nil, usagef("--llama-kernels %q: want one of %s", f.kernels, strings.Join(llama.KernelChoices, ", "))
	}
	base, err := llama.Load(f.model, llama.Options{Name: f.servedName, KVDType: dt, Threads: f.threads,
		Kernels: f.kernels, LoadTokenizer: loadTokenizer, LoadGGUFTokenizer: loadGGUFTokenizer})
	if err != nil {
		return nil, err
	}
	return func() (model.Model, error) { return base.Clone() }, nil
}

// loadTokenizer loads a checkpoint's tokenizer.json (and
// tokenizer_config.json) with the Hugging Face tokenizer package. It
// returns an untyped nil on error, so the model never holds a typed-nil
// tokenizer.
func loadTokenizer(dir string) (model.Tokenizer, error) {
	t, err := tokenizer.Load(dir)
	if err != nil {
		return nil, err
	}
	return t, nil
}

// loadGGUFTokenizer builds a GGUF file's tokenizer from its tokenizer.ggml.*
// metadata (untyped nil on error, like loadTokenizer).
func loadGGUFTokenizer(f *gguf.File) (model.Tokenizer, error) {
	t, err := tokenizer.FromGGUF(f)
	if err != nil {
		return nil, err
	}
	return t, nil
}
