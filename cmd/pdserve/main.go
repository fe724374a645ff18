// Command pdserve is an LLM inference server with prefill/decode
// disaggregation. Run `pdserve --help` for its commands.
//
// This package only parses flags, validates them and runs; the wiring lives
// in internal/cluster.
package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strings"
	"syscall"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
)

func main() {
	// The first SIGINT or SIGTERM ends ctx: the command drains (finishes
	// what it admitted, takes nothing new) and exits. A second one ends
	// the drain at once: what is left gets an error answer.
	sigs := make(chan os.Signal, 2)
	signal.Notify(sigs, os.Interrupt, syscall.SIGTERM)
	ctx, stop := context.WithCancel(context.Background())
	force, forceStop := context.WithCancel(context.Background())
	go func() {
		<-sigs
		stop()
		<-sigs
		forceStop()
	}()
	// SIGHUP reloads the TLS certificates (without dropping connections).
	hups := make(chan os.Signal, 1)
	signal.Notify(hups, syscall.SIGHUP)
	reload := &reloaders{}
	go func() {
		for range hups {
			reload.reload()
		}
	}()
	code := run(withReloaders(withForce(ctx, force), reload), os.Args[1:], os.LookupEnv, os.Stdout, os.Stderr)
	signal.Stop(sigs)
	signal.Stop(hups)
	os.Exit(code)
}

type forceKey struct{}

// withForce attaches to ctx the context that a second signal ends.
func withForce(ctx, force context.Context) context.Context {
	return context.WithValue(ctx, forceKey{}, force)
}

// forced returns the context a second signal ends (never ends if main did
// not set one, as in tests).
func forced(ctx context.Context) context.Context {
	if f, ok := ctx.Value(forceKey{}).(context.Context); ok {
		return f
	}
	return context.Background()
}

// usageError marks a bad command line: exit status 2.
type usageError struct{ err error }

func (u usageError) Error() string { return u.err.Error() }
func (u usageError) Unwrap() error { return u.err }

func usagef(format string, args ...any) error { return usageError{fmt.Errorf(format, args...)} }

// EnvPrefix prefixes the environment variable of every flag: --kv-cache-memory
// is also read from PDSERVE_KV_CACHE_MEMORY. A flag given on the command line
// wins over the environment.
const EnvPrefix = "PDSERVE_"

func envName(flag string) string {
	return EnvPrefix + strings.ToUpper(strings.ReplaceAll(flag, "-", "_"))
}

// applyEnv sets every flag of fs that was not given on the command line
// from its environment variable, if that is set.
func applyEnv(fs *pflag.FlagSet, lookupEnv func(string) (string, bool)) error {
	var errs []error
	fs.VisitAll(func(f *pflag.Flag) {
		if f.Changed || f.Name == "help" || f.Name == "version" {
			return
		}
		if v, ok := lookupEnv(envName(f.Name)); ok {
			if err := fs.Set(f.Name, v); err != nil {
				errs = append(errs, fmt.Errorf("%s=%q: %w", envName(f.Name), v, err))
			}
		}
	})
	return errors.Join(errs...)
}

// run executes the command line args and returns the exit status: 0 on
// success, 2 on a bad command line, 1 on failure.
func run(ctx context.Context, args []string, lookupEnv func(string) (string, bool), stdout, stderr io.Writer) int {
	root := newRoot(ctx, lookupEnv, stdout, stderr)
	root.SetArgs(args)
	err := root.Execute()
	if err == nil {
		return 0
	}
	fmt.Fprintln(stderr, "pdserve:", err)
	var u usageError
	// cobra reports an unknown command or extra arguments without a type.
	if errors.As(err, &u) || strings.HasPrefix(err.Error(), "unknown command") || strings.Contains(err.Error(), "accepts ") {
		return 2
	}
	return 1
}

func newRoot(ctx context.Context, lookupEnv func(string) (string, bool), stdout, stderr io.Writer) *cobra.Command {
	root := &cobra.Command{
		Use:   "pdserve",
		Short: "LLM inference server with prefill/decode disaggregation",
		Long: `pdserve serves an OpenAI-compatible API. In disaggregated mode every request
goes router -> prefill worker -> KV cache over TCP -> decode worker -> back to
the client; no request can be pinned: every stage has a deadline, aborts reach
both workers, and lost peers are detected within seconds.

Every flag can also be set with an environment variable: --kv-cache-memory is
PDSERVE_KV_CACHE_MEMORY. The command line wins.`,
		Version:       versionLine(),
		SilenceUsage:  true,
		SilenceErrors: true,
		PersistentPreRunE: func(cmd *cobra.Command, _ []string) error {
			if err := applyEnv(cmd.Flags(), lookupEnv); err != nil {
				return usageError{err}
			}
			return nil
		},
	}
	root.CompletionOptions.DisableDefaultCmd = true
	root.SetVersionTemplate("{{.Version}}\n")
	root.SetContext(ctx)
	root.SetOut(stdout)
	root.SetErr(stderr)
	root.SetFlagErrorFunc(func(c *cobra.Command, err error) error {
		if name, ok := strings.CutPrefix(err.Error(), "unknown flag: --"); ok {
			if near := nearestFlag(c, name); near != "" {
				return usagef("%v (did you mean --%s?)", err, near)
			}
		}
		return usageError{err}
	})
	root.AddCommand(
		newUpCmd(stdout, stderr),
		newWorkerCmd("prefill", stdout, stderr),
		newWorkerCmd("decode", stdout, stderr),
		newWorkerCmd("serve", stdout, stderr),
		newRouterCmd(stdout, stderr),
		newInspectCmd(stdout),
		newConvertCmd(stdout),
		newBenchCmd(stdout, stderr),
		newVersionCmd(stdout),
	)
	return root
}

// nearestFlag is the flag of c whose name is closest to name, a flag c does
// not have, by edit distance: "" when none is within a third of name's
// length (at least 1, at most 3 edits), as cobra suggests commands.
func nearestFlag(c *cobra.Command, name string) string {
	best, bestD := "", min(3, max(1, len(name)/3))+1
	c.Flags().VisitAll(func(f *pflag.Flag) {
		if f.Hidden {
			return
		}
		if d := editDistance(name, f.Name); d < bestD {
			best, bestD = f.Name, d
		}
	})
	return best
}

// editDistance is the Levenshtein distance between a and b (bytes).
func editDistance(a, b string) int {
	prev := make([]int, len(b)+1)
	cur := make([]int, len(b)+1)
	for j := range prev {
		prev[j] = j
	}
	for i := 1; i <= len(a); i++ {
		cur[0] = i
		for j := 1; j <= len(b); j++ {
			sub := prev[j-1]
			if a[i-1] != b[j-1] {
				sub++
			}
			cur[j] = min(sub, prev[j]+1, cur[j-1]+1)
		}
		prev, cur = cur, prev
	}
	return prev[len(b)]
}
