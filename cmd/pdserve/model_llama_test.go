package main

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/spf13/pflag"

	"github.com/pdserve/pdserve/internal/kvcache"
	"github.com/pdserve/pdserve/internal/model/llama"
	"github.com/pdserve/pdserve/internal/model/llama/llamatest"
)

// TestLlamaKernelsFlag checks that --llama-kernels (or PDSERVE_LLAMA_KERNELS)
// reaches the model, and that a bad value is a usage error.
func TestLlamaKernelsFlag(t *testing.T) {
	dir := llamatest.Tiny().WriteT(t)
	fs := pflag.NewFlagSet("t", pflag.ContinueOnError)
	var mf modelFlags
	mf.add(fs)
	if err := fs.Parse([]string{"--model", dir}); err != nil {
		t.Fatal(err)
	}
	if err := applyEnv(fs, env(map[string]string{"PDSERVE_LLAMA_KERNELS": "go"})); err != nil {
		t.Fatal(err)
	}
	newModel, err := mf.factory()
	if err != nil {
		t.Fatal(err)
	}
	m, err := newModel()
	if err != nil {
		t.Fatal(err)
	}
	lm := m.(*llama.Model)
	defer lm.Close()
	if k := lm.Kernels(); k != llama.KernelsGo {
		t.Fatalf("PDSERVE_LLAMA_KERNELS=go: the model uses %q kernels", k)
	}
	for _, tc := range []struct {
		env  map[string]string
		args []string
	}{
		{nil, []string{"serve", "--model", dir, "--llama-kernels", "sse9"}},
		{map[string]string{"PDSERVE_LLAMA_KERNELS": "sse9"}, []string{"serve", "--model", dir}},
	} {
		code, out, errOut := runArgs(t, tc.env, tc.args...)
		if code != 2 || !strings.Contains(errOut, `--llama-kernels "sse9"`) {
			t.Errorf("%v %v: exit %d, output %q %q; want a usage error naming --llama-kernels", tc.env, tc.args, code, out, errOut)
		}
	}
}

// TestConvertAndServeGGUF converts a checkpoint with `pdserve convert gguf`
// and serves the file with `pdserve serve --model FILE.gguf`.
func TestConvertAndServeGGUF(t *testing.T) {
	spec := llamatest.Tiny()
	spec.Vocab = 300
	dir := spec.WriteT(t)
	out := filepath.Join(t.TempDir(), "tiny-q4_0.gguf")
	code, stdout, stderr := runArgs(t, nil, "convert", "gguf", dir, out, "--type", "q4_0")
	if code != 0 || !strings.Contains(stdout, "Q4_0") {
		t.Fatalf("convert: exit %d, %q %q", code, stdout, stderr)
	}
	for _, typ := range []string{"q4_1", "q5_0", "q5_1", "iq4_nl", "q4_k_m", "q5_k_m", "q3_k_m", "q2_k", "iq4_xs"} {
		o := filepath.Join(t.TempDir(), "tiny-"+typ+".gguf")
		if code, stdout, stderr := runArgs(t, nil, "convert", "gguf", dir, o, "--type", typ); code != 0 || !strings.Contains(stdout, strings.ToUpper(typ)) {
			t.Fatalf("convert --type %s: exit %d, %q %q", typ, code, stdout, stderr)
		}
	}
	if code, _, stderr := runArgs(t, nil, "convert", "gguf", dir, out, "--type", "q3"); code != 2 || !strings.Contains(stderr, `--type "q3"`) {
		t.Fatalf("convert --type q3: exit %d, %q", code, stderr)
	}
	code, stdout, stderr = runArgs(t, nil, "serve", "--model", out, "--port", "0", "--kv-cache-memory", "16MiB")
	if code != 0 || !strings.Contains(stdout, "ready") {
		t.Fatalf("serve: exit %d, stdout %q, stderr %q", code, stdout, stderr)
	}
	bad := filepath.Join(t.TempDir(), "bad.gguf")
	if err := os.WriteFile(bad, []byte("GGUF\x03\x00\x00\x00"), 0o644); err != nil {
		t.Fatal(err)
	}
	if code, _, stderr := runArgs(t, nil, "serve", "--model", bad, "--port", "0"); code != 1 || !strings.Contains(stderr, "truncated") {
		t.Fatalf("serve a truncated file: exit %d, %q", code, stderr)
	}
}

// TestConvertRefusesGGUF: a GGUF file given to `convert llama2c` or
// `convert gguf` is a usage error saying it is a GGUF file already and how
// to serve it, not a llama2.c header error.
func TestConvertRefusesGGUF(t *testing.T) {
	spec := llamatest.Tiny()
	spec.Vocab = 300 // ExportGGUF's placeholder vocabulary needs 259
	dir := spec.WriteT(t)
	in := filepath.Join(t.TempDir(), "tiny.gguf")
	if code, stdout, stderr := runArgs(t, nil, "convert", "gguf", dir, in, "--type", "f32"); code != 0 {
		t.Fatalf("convert: exit %d, %q %q", code, stdout, stderr)
	}
	for _, args := range [][]string{
		{"convert", "llama2c", in, t.TempDir()},
		{"convert", "gguf", in, filepath.Join(t.TempDir(), "out.gguf")},
	} {
		code, _, stderr := runArgs(t, nil, args...)
		want := in + " is already a GGUF file: serve it as it is (pdserve serve --model " + in + ")"
		if code != 2 || !strings.Contains(stderr, want) || strings.Count(stderr, "\n") != 1 {
			t.Errorf("%v: exit %d, %q; want exit 2 and one line saying %q", args, code, stderr, want)
		}
	}
}

// TestKVCacheDTypeFlag: --kv-cache-dtype reaches the model's KV geometry
// (auto, the default: llama.DefaultKVDType for a checkpoint, --sim-dtype
// for the simulated model), an explicit value sets the simulated model's
// dtype too unless --sim-dtype disagrees, and a bad value is a usage error
// naming the flag.
func TestKVCacheDTypeFlag(t *testing.T) {
	dir := llamatest.Tiny().WriteT(t)
	for _, tc := range []struct {
		args    []string
		want    kvcache.DType
		errWant string
	}{
		{args: []string{"--model", dir}, want: llama.DefaultKVDType},
		{args: []string{"--model", dir, "--kv-cache-dtype", "auto"}, want: llama.DefaultKVDType},
		{args: []string{"--model", dir, "--kv-cache-dtype", "f32"}, want: kvcache.F32},
		{args: []string{"--model", dir, "--kv-cache-dtype", "bf16"}, want: kvcache.BF16},
		{args: []string{"--model", dir, "--kv-cache-dtype", "f16"}, want: kvcache.F16},
		{args: []string{"--model", dir, "--kv-cache-dtype", "q8_0"}, errWant: `--kv-cache-dtype "q8_0"`},
		{args: nil, want: kvcache.BF16},
		{args: []string{"--sim-dtype", "f16"}, want: kvcache.F16},
		{args: []string{"--kv-cache-dtype", "f32"}, want: kvcache.F32},
		{args: []string{"--kv-cache-dtype", "f16", "--sim-dtype", "f16"}, want: kvcache.F16},
		{args: []string{"--kv-cache-dtype", "f16", "--sim-dtype", "bf16"}, errWant: "disagree"},
		{args: []string{"--kv-cache-dtype", "int4"}, errWant: `--kv-cache-dtype "int4"`},
	} {
		fs := pflag.NewFlagSet("t", pflag.ContinueOnError)
		var mf modelFlags
		mf.add(fs)
		if err := fs.Parse(tc.args); err != nil {
			t.Fatal(err)
		}
		newModel, err := mf.factory()
		if tc.errWant != "" {
			var ue usageError
			if !errors.As(err, &ue) || !strings.Contains(err.Error(), tc.errWant) {
				t.Errorf("%v: error %v, want a usage error containing %q", tc.args, err, tc.errWant)
			}
			continue
		}
		if err != nil {
			t.Fatalf("%v: %v", tc.args, err)
		}
		m, err := newModel()
		if err != nil {
			t.Fatal(err)
		}
		if got := m.Info().Geometry.DType; got != tc.want {
			t.Errorf("%v: KV dtype %v, want %v", tc.args, got, tc.want)
		}
		if c, ok := m.(interface{ Close() error }); ok {
			if err := c.Close(); err != nil {
				t.Fatal(err)
			}
		}
	}
}
