package main

import (
	"strings"
	"testing"

	"github.com/spf13/pflag"

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
