package inbox

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/sluice-dev/sluice/internal/db"
)

// DefaultRetention is how long a processed message id is kept: well above the
// longest redelivery delay (relay backoff, broker redelivery: hours), because a
// duplicate arriving after its id was pruned would apply its effect again.
const DefaultRetention = 7 * 24 * time.Hour

// Prune deletes inbox rows processed before now-retention, at most batch rows
// per statement (oldest first along inbox_message_processed_idx), until none
// are left, and returns how many it deleted. Rows inside the window are never
// touched. Counters and aggregate versions are kept: they are what the
// console shows and what stale detection needs.
func Prune(ctx context.Context, q db.Querier, retention time.Duration, batch int, now time.Time) (int64, error) {
	n, err := pruneBefore(ctx, q, "inbox: prune", retention, batch, now, `
		DELETE FROM inbox_message m
		 USING (SELECT consumer, message_id FROM inbox_message
		         WHERE processed_at < $1
		         ORDER BY processed_at
		         LIMIT $2) old
		 WHERE m.consumer = old.consumer AND m.message_id = old.message_id
		   AND m.processed_at < $1`)
	if err != nil {
		return n, err
	}
	// The pass is recorded only once it finished: "last pruned" means every
	// row past the retention was gone at that time.
	if _, err := q.Exec(ctx, `
		INSERT INTO inbox_prune_run (pruned_at, retention, deleted) VALUES ($1, $2::interval, $3)
		ON CONFLICT (only_row) DO UPDATE SET pruned_at = excluded.pruned_at, retention = excluded.retention, deleted = excluded.deleted`,
		now, retention, n); err != nil {
		return n, fmt.Errorf("inbox: record the pruning pass: %w", err)
	}
	return n, nil
}

// PruneRun is the last finished pruning pass of the inbox.
type PruneRun struct {
	At        time.Time
	Retention time.Duration
	Deleted   int64
}

// LastPrune reads the last finished pruning pass; ok is false when the
// inbox was never pruned.
func LastPrune(ctx context.Context, q db.RowQuerier) (run PruneRun, ok bool, err error) {
	var secs float64
	err = q.QueryRow(ctx, `SELECT pruned_at, extract(epoch FROM retention)::float8, deleted FROM inbox_prune_run`).Scan(&run.At, &secs, &run.Deleted)
	if errors.Is(err, pgx.ErrNoRows) {
		return PruneRun{}, false, nil
	}
	if err != nil {
		return PruneRun{}, false, fmt.Errorf("inbox: last pruning pass: %w", err)
	}
	run.Retention = time.Duration(secs * float64(time.Second))
	return run, true, nil
}

// PruneEffects deletes the reference consumer's consume_effect rows applied
// before now-retention, in batches like Prune. Use the inbox's retention: an
// effect row outlives the dedupe row that guarded it by no more than that.
func PruneEffects(ctx context.Context, q db.Querier, retention time.Duration, batch int, now time.Time) (int64, error) {
	return pruneBefore(ctx, q, "inbox: prune effects", retention, batch, now, `
		DELETE FROM consume_effect
		 WHERE effect_id IN (SELECT effect_id FROM consume_effect
		                      WHERE applied_at < $1
		                      ORDER BY applied_at
		                      LIMIT $2)`)
}

func pruneBefore(ctx context.Context, q db.Querier, what string, retention time.Duration, batch int, now time.Time, deleteSQL string) (int64, error) {
	if retention < 0 {
		return 0, fmt.Errorf("%s: retention must not be negative (got %s)", what, retention)
	}
	return db.DeleteInBatches(ctx, q, what, deleteSQL, now.Add(-retention), batch)
}
