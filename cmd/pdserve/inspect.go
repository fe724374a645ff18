package main

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"time"

	"github.com/spf13/cobra"

	"github.com/pdserve/pdserve/internal/inspect"
)

func newInspectCmd(stdout io.Writer) *cobra.Command {
	var (
		routerURL string
		asJSON    bool
		timeout   time.Duration
	)
	cmd := &cobra.Command{
		Use:   "inspect",
		Short: "List live requests on every worker behind a router: stage, age, deadline, peer, last event",
		Long: `Asks the router for its workers and every worker for its live requests, and
prints one table, oldest first. A request that has used more than half of its
stage's deadline is marked "!".`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if timeout <= 0 {
				return usagef("--timeout must be positive")
			}
			ctx, cancel := context.WithTimeout(cmd.Context(), timeout)
			defer cancel()
			rep, err := inspect.Collect(ctx, &http.Client{}, routerURL)
			if err != nil {
				return err
			}
			if asJSON {
				enc := json.NewEncoder(stdout)
				enc.SetIndent("", "  ")
				return enc.Encode(rep)
			}
			return inspect.Print(stdout, rep)
		},
	}
	fs := cmd.Flags()
	fs.StringVar(&routerURL, "router", "http://127.0.0.1:8000", "router base URL")
	fs.BoolVar(&asJSON, "json", false, "print JSON instead of a table")
	fs.DurationVar(&timeout, "timeout", 10*time.Second, "how long to wait for the router and workers")
	return cmd
}
