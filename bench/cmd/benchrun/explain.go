package main

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/sluice-dev/sluice/internal/db"
)

// explainClaim preloads rows, drains half of them with the bare loop (so
// the table and its indexes hold the published history a running relay
// sees), then prints EXPLAIN (ANALYZE, BUFFERS) of the claim and of the
// mark, each in a transaction that is rolled back.
func explainClaim(ctx context.Context, pool *pgxpool.Pool, rows int, claimSQL string) error {
	if err := preloadOutbox(ctx, pool, rows); err != nil {
		return err
	}
	for left := rows / 2; left > 0; {
		n, err := bareOnce(ctx, pool, nil, 100)
		if err != nil {
			return err
		}
		left -= n
	}
	return db.WithTx(ctx, pool, func(tx pgx.Tx) error {
		token := uuid.New()
		args := []any{nil, 100, (30 * time.Second).Microseconds(), token}
		if err := printPlan(ctx, tx, "claim (ordered) with half of "+fmt.Sprint(rows)+" rows published", claimSQL, args...); err != nil {
			return err
		}
		var ids []uuid.UUID
		r, err := tx.Query(ctx, `SELECT id FROM outbox_event WHERE lock_token = $1`, token)
		if err != nil {
			return err
		}
		ids, err = pgx.CollectRows(r, pgx.RowTo[uuid.UUID])
		if err != nil {
			return err
		}
		if err := printPlan(ctx, tx, "mark published of that batch", bareMarkSQL, ids, token, nil); err != nil {
			return err
		}
		return errRollback
	})
}

var errRollback = fmt.Errorf("rollback")

func printPlan(ctx context.Context, tx pgx.Tx, title, sql string, args ...any) error {
	r, err := tx.Query(ctx, "EXPLAIN (ANALYZE, BUFFERS, COSTS OFF) "+sql, args...)
	if err != nil {
		return err
	}
	lines, err := pgx.CollectRows(r, pgx.RowTo[string])
	if err != nil {
		return err
	}
	fmt.Printf("\n-- %s\n%s\n", title, strings.Join(lines, "\n"))
	return nil
}
