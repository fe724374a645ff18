package main

import (
	"errors"
	"strings"
	"testing"

	"github.com/spf13/pflag"
)

// TestParserFlags: --tool-call-parser and --reasoning-parser take vLLM's
// names (auto and none too) and refuse others as usage errors naming the
// flag.
func TestParserFlags(t *testing.T) {
	for _, tc := range []struct {
		args            []string
		tool, reasoning string
		err             string
	}{
		{args: nil, tool: "auto", reasoning: ""},
		{args: []string{"--tool-call-parser", "hermes", "--reasoning-parser", "qwen3"}, tool: "hermes", reasoning: "qwen3"},
		{args: []string{"--tool-call-parser=llama3_json", "--reasoning-parser=deepseek_r1"}, tool: "llama3_json", reasoning: "deepseek_r1"},
		{args: []string{"--tool-call-parser=mistral", "--reasoning-parser=none"}, tool: "mistral", reasoning: "none"},
		{args: []string{"--tool-call-parser=none"}, tool: "none"},
		{args: []string{"--tool-call-parser=pythonic"}, err: "--tool-call-parser: unknown tool call parser \"pythonic\""},
		{args: []string{"--reasoning-parser=granite"}, err: "--reasoning-parser: unknown reasoning parser \"granite\""},
	} {
		var f apiFlags
		fs := pflag.NewFlagSet("t", pflag.ContinueOnError)
		f.add(fs)
		if err := fs.Parse(tc.args); err != nil {
			t.Fatal(err)
		}
		o, err := f.options()
		if tc.err != "" {
			var ue usageError
			if err == nil || !strings.Contains(err.Error(), tc.err) || !errors.As(err, &ue) {
				t.Errorf("%v: err %v, want a usage error containing %q", tc.args, err, tc.err)
			}
			continue
		}
		if err != nil || o.ToolCallParser != tc.tool || o.ReasoningParser != tc.reasoning {
			t.Errorf("%v: %q, %q, %v; want %q, %q", tc.args, o.ToolCallParser, o.ReasoningParser, err, tc.tool, tc.reasoning)
		}
	}
}
