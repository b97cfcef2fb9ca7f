package inbox

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
)

// Execer runs one statement (a pool or a transaction).
type Execer interface {
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
}

// DefaultRetention is how long a processed message id is kept: well above the
// longest redelivery delay (relay backoff, broker redelivery: hours), because a
// duplicate arriving after its id was pruned would apply its effect again.
const DefaultRetention = 7 * 24 * time.Hour

// MaxPruneBatch bounds one pruning statement.
const MaxPruneBatch = 5000

// Prune deletes inbox rows processed before now-retention, at most batch rows
// per statement (oldest first along inbox_message_processed_idx), until none
// are left, and returns how many it deleted. Rows inside the window are never
// touched. Counters and aggregate versions are kept: they are what the
// console shows and what stale detection needs.
func Prune(ctx context.Context, q Execer, retention time.Duration, batch int, now time.Time) (int64, error) {
	return pruneInBatches(ctx, q, "prune", `
		DELETE FROM inbox_message m
		 USING (SELECT consumer, message_id FROM inbox_message
		         WHERE processed_at < $1
		         ORDER BY processed_at
		         LIMIT $2) old
		 WHERE m.consumer = old.consumer AND m.message_id = old.message_id
		   AND m.processed_at < $1`, retention, batch, now)
}

// PruneEffects deletes the reference consumer's consume_effect rows applied
// before now-retention, in batches like Prune. Use the inbox's retention: an
// effect row outlives the dedupe row that guarded it by no more than that.
func PruneEffects(ctx context.Context, q Execer, retention time.Duration, batch int, now time.Time) (int64, error) {
	return pruneInBatches(ctx, q, "prune effects", `
		DELETE FROM consume_effect
		 WHERE effect_id IN (SELECT effect_id FROM consume_effect
		                      WHERE applied_at < $1
		                      ORDER BY applied_at
		                      LIMIT $2)`, retention, batch, now)
}

// pruneInBatches runs deleteSQL ($1 = cutoff, $2 = batch) until a statement
// deletes fewer than batch rows, and returns the total deleted.
func pruneInBatches(ctx context.Context, q Execer, what, deleteSQL string, retention time.Duration, batch int, now time.Time) (int64, error) {
	if batch <= 0 || batch > MaxPruneBatch {
		return 0, fmt.Errorf("inbox: prune batch must be 1–%d (got %d)", MaxPruneBatch, batch)
	}
	if retention < 0 {
		return 0, fmt.Errorf("inbox: retention must not be negative (got %s)", retention)
	}
	cutoff := now.Add(-retention)
	var total int64
	for {
		tag, err := q.Exec(ctx, deleteSQL, cutoff, batch)
		if err != nil {
			return total, fmt.Errorf("inbox: %s: %w", what, err)
		}
		total += tag.RowsAffected()
		if tag.RowsAffected() < int64(batch) {
			return total, nil
		}
	}
}
