package main

import (
	"context"

	"github.com/sluice-dev/sluice/internal/config"
	"github.com/sluice-dev/sluice/internal/demo"
)

func runDemo(ctx context.Context, e env, args []string) error {
	var c config.Demo
	if _, err := configure(e, "demo", "Run the whole system on this machine: a throwaway PostgreSQL (or a database of its own on\nDATABASE_URL), embedded NATS JetStream, the development OIDC provider, the payments service with a\nfaulty simulated provider, workloads, relays, the consumer and the console. Ctrl-C stops everything\nand removes what it created.", &c, args, nil); err != nil {
		return err
	}
	d, err := demo.Start(ctx, c, e.stdout, newLogger(e.stderr, c.LogLevel))
	if err != nil {
		return err
	}
	runErr := d.Run(ctx)
	closeErr := d.Close()
	if runErr != nil {
		return runErr
	}
	return closeErr
}
