package main

import (
	"strings"
	"testing"

	"github.com/spf13/pflag"
)

// TestMetricsCompatFlag: --metrics-compat takes "sglang" or none, from the
// command line or PDSERVE_METRICS_COMPAT, and refuses anything else with a
// usage error naming the flag.
func TestMetricsCompatFlag(t *testing.T) {
	for _, tc := range []struct {
		args    []string
		env     map[string]string
		compat  string // the workers' MetricsCompat when accepted
		errWant string // in the error when refused
	}{
		{args: nil, compat: ""},
		{args: []string{"--metrics-compat", "sglang"}, compat: "sglang"},
		{args: []string{"--metrics-compat", "none"}, compat: ""},
		{env: map[string]string{"PDSERVE_METRICS_COMPAT": "sglang"}, compat: "sglang"},
		{args: []string{"--metrics-compat", "vllm"}, errWant: `--metrics-compat "vllm"`},
		{env: map[string]string{"PDSERVE_METRICS_COMPAT": "SGLang"}, errWant: `--metrics-compat "SGLang"`},
	} {
		var wf workerFlags
		fs := pflag.NewFlagSet("t", pflag.ContinueOnError)
		wf.add(fs)
		if err := fs.Parse(tc.args); err != nil {
			t.Fatal(err)
		}
		if err := applyEnv(fs, env(tc.env)); err != nil {
			t.Fatal(err)
		}
		wo, err := wf.options()
		if tc.errWant != "" {
			if err == nil || !strings.Contains(err.Error(), tc.errWant) {
				t.Errorf("%v %v: error %v, want %s", tc.args, tc.env, err, tc.errWant)
			}
			continue
		}
		if err != nil || wo.MetricsCompat != tc.compat {
			t.Errorf("%v %v: MetricsCompat %q, %v; want %q", tc.args, tc.env, wo.MetricsCompat, err, tc.compat)
		}
	}
	// `pdserve up` takes it too, for its workers.
	code, _, errOut := runArgs(t, nil, "up", "--metrics-compat", "bogus")
	if code != 2 || !strings.Contains(errOut, "--metrics-compat") {
		t.Fatalf("up --metrics-compat bogus: exit %d, %s", code, errOut)
	}
}
