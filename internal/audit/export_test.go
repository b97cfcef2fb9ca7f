package audit

import (
	"context"

	"github.com/jackc/pgx/v5"

	"github.com/sluice-dev/sluice/internal/db"
)

// ChunksNamingSQL is ChunksNaming's statement, for its plan's test.
const ChunksNamingSQL = chunksNamingSQL

// RecomputeChain rewrites prev_hash and hash of every row in seq order so
// the chain verifies again, as someone with the table owner's rights would
// after editing a row. tx must have the triggers off.
func RecomputeChain(ctx context.Context, tx pgx.Tx) error {
	rows, err := tx.Query(ctx, `SELECT `+rowColumns+` FROM audit_event ORDER BY seq`)
	if err != nil {
		return err
	}
	var all []row
	for rows.Next() {
		r, _, _, err := scanRow(rows)
		if err != nil {
			rows.Close()
			return err
		}
		all = append(all, r)
	}
	if err := rows.Err(); err != nil {
		return err
	}
	prev := genesis
	for i := range all {
		h := chainHash(prev, &all[i])
		if _, err := tx.Exec(ctx, `UPDATE audit_event SET prev_hash = $2, hash = $3 WHERE seq = $1`, all[i].Seq, prev, h); err != nil {
			return err
		}
		prev = h
	}
	return nil
}

// ListSQL is List's statement for a plan test.
func ListSQL(ctx context.Context, q db.Querier, f Filter, after int64) (string, pgx.NamedArgs, error) {
	return listSQL(ctx, q, f, after > 0, after, 50)
}

// CountFrom is what Count counts, for a plan test.
var CountFrom = countFrom
