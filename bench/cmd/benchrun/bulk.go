package main

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/sluice-dev/sluice/internal/db"
	"github.com/sluice-dev/sluice/internal/outbox"
)

// B1 (issue 9): the relay while an operator's bulk job runs. The same drain
// as R1's relay, while an outbox.JobRunner (the console's) discards
// bulkDeadFactor × rows dead events of other aggregates in chunks of 1,000,
// each chunk its own transaction. The ratio against R1's idle relay in the
// same run shows what a bulk job costs the publishing path (goal: at least
// half the idle rate).
const bulkDeadFactor = 2

// preloadOutboxAndJob is preloadOutbox plus the dead events and the job.
func preloadOutboxAndJob(ctx context.Context, pool *pgxpool.Pool, rows int) error {
	if err := preloadOutbox(ctx, pool, rows); err != nil {
		return err
	}
	if _, err := pool.Exec(ctx, `TRUNCATE outbox_job`); err != nil {
		return err
	}
	// Dead events of aggregates of their own (they hold nothing the relay
	// drains), ids after the pending ones like later writes.
	if _, err := pool.Exec(ctx, `
		INSERT INTO outbox_event (id, aggregate_type, aggregate_id, aggregate_seq, topic, event_type, payload, status, dead_at, dead_reason, attempts)
		SELECT gen_random_uuid(), 'order', 'dead-' || g, 1, 'orders', 'order.placed.v1', '{}'::jsonb, 'dead', now(), 'bench', 10
		  FROM generate_series(1, $1) g`, bulkDeadFactor*rows); err != nil {
		return fmt.Errorf("dead events: %w", err)
	}
	if _, err := db.WithTxV(ctx, pool, func(tx pgx.Tx) (outbox.Job, error) {
		return outbox.CreateJob(ctx, tx, outbox.JobRequest{Kind: outbox.JobDiscard, Filter: outbox.Filter{Status: outbox.StatusDead},
			Reason: "bench B1", RequestedBy: "bench", ChunkSize: 1000})
	}); err != nil {
		return fmt.Errorf("create the bulk job: %w", err)
	}
	return settle(ctx, pool, "outbox_event", "outbox_aggregate", "outbox_job")
}

// runRelayUnderJob drains as runRelay does while the job runner works, and
// refuses a run in which the job did not overlap the drain (the figure
// would then be an idle one).
func runRelayUnderJob(ctx context.Context, pool *pgxpool.Pool, pub outbox.Publisher, rows, relays, batch int) (time.Duration, error) {
	runner, err := outbox.NewJobRunner(pool, outbox.JobRunnerConfig{PollInterval: 10 * time.Millisecond}, nil)
	if err != nil {
		return 0, err
	}
	jctx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- runner.Run(jctx) }()
	d, err := runRelay(ctx, pool, pub, rows, relays, batch, true)
	jobs, lerr := outbox.ListJobs(ctx, pool, 1)
	stop()
	<-done
	if err != nil {
		return d, err
	}
	if lerr != nil || len(jobs) != 1 {
		return d, fmt.Errorf("read the bulk job: %v (%d jobs)", lerr, len(jobs))
	}
	// Matched is an estimate past the dry run's cap: the job's state, not
	// its count, says whether it was still running.
	if j := jobs[0]; j.Done == 0 || j.Finished() {
		return d, fmt.Errorf("the bulk job did not overlap the drain (%d done, %s, when the drain ended): no figure", j.Done, j.State)
	}
	return d, nil
}
