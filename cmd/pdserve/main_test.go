package main

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/spf13/pflag"
)

func env(m map[string]string) func(string) (string, bool) {
	return func(k string) (string, bool) {
		v, ok := m[k]
		return v, ok
	}
}

func runArgs(t *testing.T, e map[string]string, args ...string) (int, string, string) {
	t.Helper()
	var out, errOut bytes.Buffer
	ctx, cancel := context.WithCancel(context.Background())
	cancel() // a server command returns as soon as it is up
	code := run(ctx, args, env(e), &out, &errOut)
	return code, out.String(), errOut.String()
}

func TestExitCodes(t *testing.T) {
	cases := []struct {
		name string
		env  map[string]string
		args []string
		code int
		want string // in stderr (or stdout for help)
	}{
		{"help", nil, []string{"--help"}, 0, "Available Commands"},
		{"help of up", nil, []string{"up", "--help"}, 0, "--prefill-workers"},
		{"unknown command", nil, []string{"frobnicate"}, 2, "unknown command"},
		{"extra argument", nil, []string{"up", "extra"}, 2, "extra"},
		{"unknown flag", nil, []string{"up", "--no-such-flag"}, 2, "no-such-flag"},
		{"bad flag value", nil, []string{"up", "--port", "eighty"}, 2, "port"},
		{"port out of range", nil, []string{"up", "--port", "70000"}, 2, "--port"},
		{"bad memory", nil, []string{"serve", "--kv-cache-memory", "lots"}, 2, "--kv-cache-memory"},
		{"unknown model", nil, []string{"serve", "--model", "gpt-9"}, 2, "gpt-9"},
		{"missing model path", nil, []string{"serve", "--model", "/no/such/file"}, 2, `--model "/no/such/file": no such file or directory`},
		{"missing model path (up)", nil, []string{"up", "--model", "/no/such/file"}, 2, `--model "/no/such/file": no such file or directory`},
		{"model path of the wrong kind", nil, []string{"serve", "--model", os.DevNull}, 2, `--model "` + os.DevNull + `": want "sim"`},
		{"bad dtype", nil, []string{"serve", "--sim-dtype", "int3"}, 2, "int3"},
		{"negative timeout", nil, []string{"serve", "--queue-timeout", "-1s"}, 2, "queue timeout"},
		{"bad env value", map[string]string{"PDSERVE_PORT": "x"}, []string{"serve"}, 2, "PDSERVE_PORT"},
		{"bad log level", nil, []string{"serve", "--log-level", "loud"}, 2, "log-level"},
		{"router without workers", nil, []string{"router"}, 2, "--prefill"},
		{"zero workers", nil, []string{"up", "--prefill-workers", "0"}, 2, "prefill-workers"},
		{"unknown sim profile", nil, []string{"serve", "--sim-profile", "tpu-v9"}, 2, "h100-llama3-8b"},
		{"profile and latency", nil, []string{"serve", "--sim-profile", "h100-llama3-8b", "--sim-decode-ms-per-step", "5"}, 2, "one or the other"},
		{"memory beyond the machine", nil, []string{"serve", "--kv-cache-memory", "100PiB"}, 2, "exceeds this machine's memory"},
		{"absurd geometry", nil, []string{"serve", "--sim-layers", "10000000"}, 2, "invalid KV geometry"},
		{"negative queue bound", nil, []string{"serve", "--max-queued-requests", "-1"}, 2, "max queued requests must not be negative"},
		{"unknown pair policy", nil, []string{"router", "--prefill", "http://p:1", "--decode", "http://d:1", "--prefill-policy", "random"}, 2, "--prefill-policy"},
		{"negative drain timeout (up)", nil, []string{"up", "--drain-timeout", "-1s"}, 2, "--drain-timeout"},
		{"negative drain timeout (worker)", nil, []string{"decode", "--drain-timeout", "-5s"}, 2, "--drain-timeout"},
		{"negative drain timeout (router)", nil, []string{"router", "--prefill", "http://p:1", "--decode", "http://d:1", "--drain-timeout", "-1m"}, 2, "--drain-timeout"},
		{"health interval too short", nil, []string{"router", "--prefill", "http://p:1", "--decode", "http://d:1", "--health-interval", "1ms"}, 2, "--health-interval must be at least 10ms"},
		{"etcd endpoints with static discovery", nil, []string{"router", "--prefill", "http://p:1", "--decode", "http://d:1", "--etcd-endpoints", "http://127.0.0.1:2379"}, 2, "--etcd-endpoints"},
		{"unlisted grace with static discovery", nil, []string{"router", "--prefill", "http://p:1", "--decode", "http://d:1", "--unlisted-grace", "10s"}, 2, "--unlisted-grace"},
		{"negative unlisted grace", nil, []string{"router", "--discovery", "etcd", "--etcd-endpoints", "http://127.0.0.1:1", "--unlisted-grace", "-1s"}, 2, "--unlisted-grace"},
		{"etcd verify interval too short", nil, []string{"router", "--discovery", "etcd", "--etcd-endpoints", "http://127.0.0.1:1", "--etcd-verify-interval", "1ms"}, 2, "--etcd-verify-interval"},
		{"worker port not a number", nil, []string{"router", "--prefill", "http://host:notaport", "--decode", "http://d:1"}, 2, `worker URL "http://host:notaport": port "notaport" is not a number` + "\n"},
		{"worker port out of range", nil, []string{"router", "--prefill", "http://p:70000", "--decode", "http://d:1"}, 2, "65535"},
		{"advertised KV address without etcd", nil, []string{"prefill", "--advertise-kv-addr", "10.0.0.1:8998"}, 2, "--advertise-kv-addr"},
		{"bad advertised KV address", nil, []string{"prefill", "--etcd-endpoints", "http://127.0.0.1:1", "--advertise-kv-addr", "10.0.0.1:99999"}, 2, "--advertise-kv-addr"},
		{"misspelled flag", nil, []string{"up", "--prefil-workers", "2"}, 2, "unknown flag: --prefil-workers (did you mean --prefill-workers?)\n"},
		{"unknown flag nothing like any", nil, []string{"up", "--zzzzzzzzzzzz", "2"}, 2, "unknown flag: --zzzzzzzzzzzz\n"},
		{"inspect router not a URL", nil, []string{"inspect", "--router", "not-a-url"}, 2, `--router "not-a-url": want http://host:port or https://host:port` + "\n"},
		{"inspect router port not a number", nil, []string{"inspect", "--router", "http://host:notaport"}, 2, `--router "http://host:notaport": port "notaport" is not a number` + "\n"},
		{"unknown inspect stage", nil, []string{"inspect", "--stage", "bogus", "--router", "http://127.0.0.1:1"}, 2, `--stage "bogus": want one of legs, streaming, bootstrap, waiting, prefilling, parked, transferring, prealloc, awaiting_kv, queued, decoding, preempted` + "\n"},
		{"known inspect stage (the router is not asked: the context is done)", nil, []string{"inspect", "--stage", "awaiting_kv", "--router", "http://127.0.0.1:1"}, 1, "context canceled"},
		{"absurd page size", nil, []string{"serve", "--page-size", "70368744177664"}, 2, "--page-size must be between"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			code, out, errOut := runArgs(t, tc.env, tc.args...)
			if code != tc.code || !strings.Contains(out+errOut, tc.want) {
				t.Fatalf("exit %d (want %d), output %q %q, want it to mention %q", code, tc.code, out, errOut, tc.want)
			}
		})
	}
}

func TestEnvironmentSetsFlags(t *testing.T) {
	fs := pflag.NewFlagSet("t", pflag.ContinueOnError)
	var wf workerFlags
	wf.add(fs)
	port := fs.Int("port", 1, "")
	if err := fs.Parse([]string{"--port", "9"}); err != nil {
		t.Fatal(err)
	}
	e := env(map[string]string{"PDSERVE_PORT": "7", "PDSERVE_KV_CACHE_MEMORY": "512MiB", "PDSERVE_QUEUE_TIMEOUT": "5s"})
	if err := applyEnv(fs, e); err != nil {
		t.Fatal(err)
	}
	if *port != 9 {
		t.Fatalf("the command line must win over the environment: port %d", *port)
	}
	if wf.kvCacheMemory != "512MiB" || wf.queueTimeout != 5*time.Second {
		t.Fatalf("environment not applied: %q %s", wf.kvCacheMemory, wf.queueTimeout)
	}
	o, err := wf.options()
	if err != nil || o.KVCacheMemory != 512<<20 {
		t.Fatalf("options: %+v %v", o.KVCacheMemory, err)
	}
}

// TestServeStartsAndStops runs `pdserve serve` on a free port with its
// context already cancelled: it must come up, print ready, and shut down
// cleanly.
func TestServeStartsAndStops(t *testing.T) {
	code, out, errOut := runArgs(t, nil, "serve", "--port", "0", "--kv-cache-memory", "64MiB", "--sim-layers", "2")
	if code != 0 || !strings.Contains(out, "ready") || !strings.Contains(out, "OpenAI API http://127.0.0.1:") {
		t.Fatalf("exit %d, stdout %q, stderr %q", code, out, errOut)
	}
}

// TestSecondSignalExitsWithAnError: a drain cut short by a second signal
// still shuts down, and is an error (exit status 1); a drain that ends by
// itself, or by its timeout, is not.
func TestSecondSignalExitsWithAnError(t *testing.T) {
	first, stop := context.WithCancel(context.Background())
	stop()
	force, forceStop := context.WithCancel(context.Background())
	ctx := withForce(first, force)
	log := slog.New(slog.DiscardHandler)
	shutdowns := 0
	shutdown := func(context.Context) error { shutdowns++; return nil }
	drained := func(context.Context) error { return nil }
	waits := func(ctx context.Context) error { <-ctx.Done(); return ctx.Err() }
	if err := runUntilSignal(ctx, nil, log, time.Minute, drained, shutdown); err != nil {
		t.Fatalf("drain that finished: %v", err)
	}
	if err := runUntilSignal(ctx, nil, log, time.Millisecond, waits, shutdown); err != nil {
		t.Fatalf("drain cut short by its timeout: %v", err)
	}
	forceStop()
	err := runUntilSignal(ctx, nil, log, time.Minute, waits, shutdown)
	if !errors.Is(err, errForced) || shutdowns != 3 {
		t.Fatalf("second signal: %v after %d shutdowns, want errForced and a shutdown each time", err, shutdowns)
	}
}
