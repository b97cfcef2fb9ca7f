package main

import (
	"context"

	"github.com/sluice-dev/sluice/internal/config"
	"github.com/sluice-dev/sluice/internal/demo"
)

func runDemo(ctx context.Context, e env, args []string) error {
	cfg, err := config.ParseDemo(args, e.lookup, e.stderr)
	if err != nil {
		return err
	}
	d, err := demo.Start(ctx, cfg, e.stdout, newLogger(e.stderr, cfg.LogLevel))
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
