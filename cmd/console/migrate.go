package main

import (
	"context"
	"fmt"

	"github.com/sluice-dev/sluice/internal/config"
	"github.com/sluice-dev/sluice/internal/db"
)

func runMigrate(ctx context.Context, e env, args []string) error {
	var c config.Database
	action := "up"
	verb := func(rest []string) error {
		if len(rest) > 0 {
			action = rest[0]
			if len(rest) > 1 {
				return fmt.Errorf("unexpected arguments after %q: %v", action, rest[1:])
			}
		}
		if action != "up" && action != "status" {
			return fmt.Errorf("unknown action %q: use `migrate up` or `migrate status`", action)
		}
		return nil
	}
	if _, err := configure(e, "migrate", "Apply (`migrate up`, the default) or show (`migrate status`) the embedded schema migrations.\nMigrations are append-only and each runs in one transaction.", &c, args, verb); err != nil {
		return err
	}
	pool, err := db.Open(ctx, c.DatabaseURL)
	if err != nil {
		return err
	}
	defer pool.Close()
	if action == "status" {
		st, err := db.Status(ctx, pool)
		if err != nil {
			return err
		}
		pending := 0
		for _, s := range st {
			state := "applied"
			if !s.Applied {
				state = "pending"
				pending++
			}
			fmt.Fprintf(e.stdout, "%05d  %-8s %s\n", s.Version, state, s.Name)
		}
		if pending > 0 {
			fmt.Fprintf(e.stdout, "%d pending: run `console migrate up`\n", pending)
		} else {
			fmt.Fprintln(e.stdout, "schema is current")
		}
		return nil
	}
	n, err := db.Migrate(ctx, pool)
	if err != nil {
		return err
	}
	fmt.Fprintf(e.stdout, "applied %d migration(s); schema at version %d\n", n, db.LatestVersion())
	return nil
}
