package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/pdserve/pdserve/internal/inspect"
	"github.com/pdserve/pdserve/internal/lifecycle"
	"github.com/pdserve/pdserve/internal/metrics"
	"github.com/pdserve/pdserve/internal/netaddr"
)

func newInspectCmd(stdout io.Writer) *cobra.Command {
	var (
		routerURL string
		asJSON    bool
		timeout   time.Duration
		stage     string
		olderThan time.Duration
		limit     int
		apiKey    string
	)
	cmd := &cobra.Command{
		Use:   "inspect",
		Short: "List live requests on a router and every worker behind it: stage, age, deadline, peer, last event",
		Long: `Asks the router for the requests it serves and for its workers, and every
worker for its live requests, and prints a summary per stage (count, oldest,
past half their deadline), then one table, oldest first. A request that has used more than half of its
stage's deadline is marked "!". Workers are asked at once; if any does not
answer within --timeout, the others are still listed and the exit status is 1.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if timeout <= 0 {
				return usagef("--timeout must be positive")
			}
			if limit < 0 || olderThan < 0 {
				return usagef("--limit and --older-than must not be negative")
			}
			if u, err := url.Parse(routerURL); err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
				if p, ok := netaddr.NonNumericPort(routerURL); ok {
					return usagef("--router %q: port %q is not a number", routerURL, p)
				}
				return usagef("--router %q: want http://host:port or https://host:port", routerURL)
			}
			if stages := inspectStages(); stage != "" && !slices.Contains(stages, stage) {
				return usagef("--stage %q: want one of %s", stage, strings.Join(stages, ", "))
			}
			ctx, cancel := context.WithTimeout(cmd.Context(), timeout)
			defer cancel()
			rep, err := inspect.Collect(ctx, &http.Client{Transport: bearer(apiKey, routerURL, http.DefaultTransport)}, routerURL)
			if err != nil {
				return err
			}
			rep = rep.Filter(stage, olderThan, limit)
			if asJSON {
				enc := json.NewEncoder(stdout)
				enc.SetIndent("", "  ")
				err = enc.Encode(rep)
			} else {
				err = inspect.Print(stdout, rep)
			}
			if err == nil && len(rep.Errors) > 0 {
				// The list is incomplete: say so in the exit status.
				err = fmt.Errorf("%d of the router's workers did not answer; their requests are not listed", len(rep.Errors))
			}
			return err
		},
	}
	fs := cmd.Flags()
	fs.StringVar(&routerURL, "router", "http://127.0.0.1:8000", "router base URL")
	fs.StringVar(&apiKey, "admin-api-key", "", "key sent to the router (Authorization: Bearer): its admin key (its --admin-api-key); an API key does not reach /debug")
	fs.StringVar(&apiKey, "api-key", "", "the same as --admin-api-key (the key's older name here)")
	fs.BoolVar(&asJSON, "json", false, "print JSON instead of a table")
	fs.DurationVar(&timeout, "timeout", 10*time.Second, "how long to wait for the router and workers")
	fs.StringVar(&stage, "stage", "", "list only requests in this stage (e.g. awaiting_kv, parked, legs); the summary counts all")
	fs.DurationVar(&olderThan, "older-than", 0, "list only requests that have been in their stage at least this long")
	fs.IntVar(&limit, "limit", 0, "list at most this many requests, oldest first (0: all)")
	return cmd
}

// inspectStages lists the stages --stage accepts: the router's (legs,
// streaming), then the non-terminal stages of every worker role, in
// lifecycle order, each once.
func inspectStages() []string {
	out := slices.Clone(metrics.RouterStages)
	for _, r := range []lifecycle.Role{lifecycle.RolePrefill, lifecycle.RoleDecode, lifecycle.RoleColocated} {
		for _, s := range r.Stages() {
			if n := s.String(); !slices.Contains(out, n) {
				out = append(out, n)
			}
		}
	}
	return out
}

// bearer sends key (if any) as "Authorization: Bearer" on requests to the
// host of base only, through rt.
func bearer(key, base string, rt http.RoundTripper) http.RoundTripper {
	if key == "" {
		return rt
	}
	host := ""
	if u, err := url.Parse(base); err == nil {
		host = u.Host
	}
	return roundTripFunc(func(r *http.Request) (*http.Response, error) {
		if r.URL.Host == host {
			r = r.Clone(r.Context())
			r.Header.Set("Authorization", "Bearer "+key)
		}
		return rt.RoundTrip(r)
	})
}

type roundTripFunc func(*http.Request) (*http.Response, error)

func (f roundTripFunc) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }
