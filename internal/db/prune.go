package db

import (
	"context"
	"fmt"
	"time"
)

// MaxDeleteBatch bounds one statement of DeleteInBatches: short statements
// keep row locks, WAL bursts and replica lag small, and leave room for the
// writers that share the table.
const MaxDeleteBatch = 5000

// DefaultDeleteBatch is the batch a pruner uses when nobody chose one
// (`console prune --batch-size`).
const DefaultDeleteBatch = 1000

// DeleteInBatches is every pruner's loop. deleteSQL deletes at most $2 rows
// older than the cutoff $1, walking an index oldest first; it runs as its
// own statement (autocommit on a pool) until one deletes fewer than batch
// rows, so no lock is held from one batch to the next. It returns how many
// rows it deleted; what names the work in errors.
func DeleteInBatches(ctx context.Context, q Querier, what, deleteSQL string, cutoff time.Time, batch int) (int64, error) {
	if batch <= 0 || batch > MaxDeleteBatch {
		return 0, fmt.Errorf("%s: batch must be 1–%d rows (got %d)", what, MaxDeleteBatch, batch)
	}
	var total int64
	for {
		tag, err := q.Exec(ctx, deleteSQL, cutoff, batch)
		if err != nil {
			return total, fmt.Errorf("%s: %w", what, err)
		}
		total += tag.RowsAffected()
		if tag.RowsAffected() < int64(batch) {
			return total, nil
		}
		if err := ctx.Err(); err != nil {
			return total, fmt.Errorf("%s: stopped after %d rows: %w", what, total, err)
		}
	}
}
