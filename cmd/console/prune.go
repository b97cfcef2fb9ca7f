package main

import (
	"context"
	"fmt"
	"time"

	"github.com/sluice-dev/sluice/internal/auth"
	"github.com/sluice-dev/sluice/internal/config"
	"github.com/sluice-dev/sluice/internal/db"
	"github.com/sluice-dev/sluice/internal/inbox"
	"github.com/sluice-dev/sluice/internal/outbox"
)

func runPrune(ctx context.Context, e env, args []string) error {
	var c config.Prune
	if _, err := configure(e, "prune", "One pruning pass: deletes published outbox events and processed inbox message ids\n"+
		"past their retention, and console refusal-log rows older than 7 days, in batches of at most\n"+
		"PRUNE_BATCH_SIZE rows per statement.\n"+
		"Pending and dead outbox events are never deleted. Run it from cron.", &c, args, nil); err != nil {
		return err
	}
	pool, err := db.OpenCurrent(ctx, c.DatabaseURL)
	if err != nil {
		return err
	}
	defer pool.Close()
	// Retention is measured on the database's clock, the one that stamped
	// published_at and processed_at, so a skewed host cannot prune early.
	var now time.Time
	if err := pool.QueryRow(ctx, `SELECT now()`).Scan(&now); err != nil {
		return fmt.Errorf("read the database clock: %w", err)
	}
	n, err := outbox.Prune(ctx, pool, c.OutboxRetention, c.BatchSize, now)
	fmt.Fprintf(e.stdout, "outbox: deleted %d published events older than %s\n", n, c.OutboxRetention)
	if err != nil {
		return err
	}
	n, err = inbox.Prune(ctx, pool, c.InboxRetention, c.BatchSize, now)
	fmt.Fprintf(e.stdout, "inbox: deleted %d processed message ids older than %s\n", n, c.InboxRetention)
	if err != nil {
		return err
	}
	n, err = inbox.PruneEffects(ctx, pool, c.InboxRetention, c.BatchSize, now)
	fmt.Fprintf(e.stdout, "consume_effect: deleted %d reference-consumer effect rows older than %s\n", n, c.InboxRetention)
	if err != nil {
		return err
	}
	n, err = auth.PruneRefusals(ctx, pool, now, c.BatchSize)
	fmt.Fprintf(e.stdout, "console_refusal: deleted %d refusal-log rows older than %s\n", n, auth.RefusalRetention)
	return err
}
