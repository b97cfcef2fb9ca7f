package audit

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5"

	"github.com/sluice-dev/sluice/internal/db"
)

// ExportBatch is how many rows Export reads per statement.
const ExportBatch = 1000

// Export hands every row matching f to emit, oldest first (chain order), and
// returns how many it emitted. The set is fixed when Export starts: rows up
// to the chain head at that moment. It reads keyset batches of ExportBatch
// rows by seq, each its own short statement, so memory stays that of one
// batch whatever the number of rows, no transaction or snapshot is held for
// the length of a download, and a slow reader holds no connection between
// batches. emit's error stops the export.
func Export(ctx context.Context, q db.Querier, f Filter, emit func(*Stored) error) (int64, error) {
	args := pgx.NamedArgs{"batch": ExportBatch}
	where, err := f.where(ctx, q, args)
	if err != nil {
		return 0, err
	}
	var head int64
	if err := q.QueryRow(ctx, `SELECT coalesce(max(seq), 0) FROM audit_event`).Scan(&head); err != nil {
		return 0, fmt.Errorf("audit: export: head: %w", err)
	}
	args["head"] = head
	sql := `SELECT ` + storedColumns + ` FROM audit_event e
	 WHERE ` + where + `
	   AND e.seq > @after AND e.seq <= @head
	 ORDER BY e.seq
	 LIMIT @batch`
	var (
		n     int64
		after int64
		batch = make([]Stored, 0, ExportBatch)
	)
	for {
		args["after"] = after
		rows, err := q.Query(ctx, sql, db.PlanEachCall, args)
		if err != nil {
			return n, fmt.Errorf("audit: export: %w", err)
		}
		// The batch is read whole before emit writes it, so the connection
		// goes back to the pool while the client reads.
		batch = batch[:0]
		for rows.Next() {
			batch = append(batch, Stored{})
			if err := scanStored(rows, &batch[len(batch)-1]); err != nil {
				rows.Close()
				return n, fmt.Errorf("audit: export: %w", err)
			}
		}
		rows.Close()
		if err := rows.Err(); err != nil {
			return n, fmt.Errorf("audit: export: %w", err)
		}
		for i := range batch {
			if err := emit(&batch[i]); err != nil {
				return n, err
			}
			n++
		}
		if len(batch) < ExportBatch {
			return n, nil
		}
		after = batch[len(batch)-1].Seq
	}
}
